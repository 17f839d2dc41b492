"""engine=llamacpp (engines/llamacpp/, docs/llamacpp.md): what it refuses (one line, before any model loads), its
step accounting, the tiny pair as GGUF files and the cross-engine baseline run here without the binding. Marker
``llamacpp`` (the binding installed: bash .ci/llamacpp.sh): the tiny pair decoded by llama.cpp beside the native
engine in one +compare, its records, resume, the ratios of the report, greedy sd against its own ar, p_min, and
the GGUF's logits against the tiny target's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mars_bench import engines
from mars_bench.base.errors import ConfigError
from mars_bench.config.settings import method_of
from mars_bench.config.spec import spec_of
from mars_bench.config.validation import validate
from mars_bench.engines.llamacpp.engine import outcome
from mars_bench.models import llamacpp

from .conftest import ROOT
from .test_cli import tiny_cfg


# ---- without the binding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides,line", [
    (["method=mars"], "rule=mars cannot run on engine=llamacpp (llama.cpp has no relaxed acceptance); allowed: exact"),
    (["method=sd", "rule=topk_delta"], "rule=topk_delta cannot run on engine=llamacpp"),
    (["method=sd_tree"], "method=sd_tree cannot run on engine=llamacpp; allowed: ar, sd"),
    (["method=lookup"], "method=lookup cannot run on engine=llamacpp; allowed: ar, sd"),
    (["method=ar", "temperature=0.7"], "temperature=0.7 cannot run on engine=llamacpp; allowed: 0 (greedy)"),
    (["method=ar", "batch_size=4"], "batch_size=4 cannot run on engine=llamacpp; allowed: 1"),
    (["method=ar", "protocol.budget=after_step"], "protocol.budget=after_step cannot run on engine=llamacpp"),
    (["method=sd", "model.draft_vocab=300"], "model.draft_vocab=300 cannot run on engine=llamacpp"),
    (["method=ar", "engine.max_model_len=0"], "engine.max_model_len=0; allowed: an integer >= 1 or null"),
])
def test_what_it_cannot_run_is_refused_in_one_line(tmp_path, overrides, line):
    cfg = tiny_cfg(tmp_path, "engine=llamacpp", "task=prompts", *overrides)
    method = validate(cfg)
    with pytest.raises(ConfigError) as e:
        engines.validate(cfg, method)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_hub_model_is_refused(tmp_path):
    cfg = tiny_cfg(tmp_path, "engine=llamacpp", "task=prompts", "method=ar")
    cfg.model.source = "hf"
    with pytest.raises(ConfigError, match=r"^model.source=hf cannot run on engine=llamacpp; allowed: embedded, tiny"):
        engines.validate(cfg, method_of(cfg))


def test_it_is_an_engine_and_its_draft_runs_as_stored(tmp_path):
    assert "llamacpp" in engines.names()
    cfg = tiny_cfg(tmp_path, "engine=llamacpp", "task=prompts", "method=sd", "model.draft_quant=q8")
    if llamacpp.unavailable() is None:
        engines.validate(cfg, method_of(cfg))
        assert cfg.model.draft_quant == "none" and cfg.engine.version == llamacpp.version()
    else:   # refused with the binding's absence, after the settings passed
        with pytest.raises(ConfigError, match=r"^engine=llamacpp: llama-cpp-python not installed"):
            engines.validate(cfg, method_of(cfg))


def test_steps_prefill_first_then_one_per_draft_call():
    # prompt of 3; tokens a b c d e at positions 3..7; the prefill commits a; call 1 drafts at 4: b matches, x does
    # not (b + the target's c: 2 tokens); call 2 drafts at 6: d e both match, then the stop cut the step
    a, b, c, d, e, x = 10, 11, 12, 13, 14, 99
    proposed, accepted = llamacpp.steps_of(3, [a, b, c, d, e], [(4, [b, x]), (6, [d, e, x])])
    assert proposed == [0, 2, 3] and accepted == [0, 1, 2]
    assert outcome(proposed, accepted) == "AXAAX"
    assert llamacpp.steps_of(3, [a], []) == ([0], [0])


def test_the_tiny_pair_as_gguf_holds_its_weights(tmp_path):
    import gguf

    from mars_bench.models.tiny import tiny_pair

    target_path, draft_path = llamacpp.tiny_gguf_pair(seed=0, noise=0.05, root=str(tmp_path))
    assert llamacpp.tiny_gguf_pair(seed=0, noise=0.05, root=str(tmp_path)) == (target_path, draft_path)   # reused
    target, draft, tok = tiny_pair(seed=0, noise=0.05)
    for path, model in ((target_path, target), (draft_path, draft)):
        reader = gguf.GGUFReader(str(path))
        found = {t.name: np.asarray(t.data) for t in reader.tensors}
        want = {llamacpp.gguf_name(n): p.detach().numpy()[:len(tok)] if n in ("model.embed_tokens.weight",
                                                                              "lm_head.weight") else p.detach().numpy()
                for n, p in model.state_dict().items()}
        assert sorted(found) == sorted(want)
        for name, w in want.items():
            assert np.array_equal(found[name].reshape(w.shape), w), name
        assert int(reader.fields["qwen2.block_count"].parts[-1][0]) == model.config.num_hidden_layers
    with pytest.raises(ValueError, match=r"^tensor 'model.vision.x'; allowed: a Qwen2 tensor"):
        llamacpp.gguf_name("model.vision.x")


def test_the_baseline_is_its_engines_ar_and_native_gives_ours(tmp_path):
    cfg = tiny_cfg(tmp_path, "engine=llamacpp", "task=prompts", "method=sd")
    cfg.engine.version = "9.9"
    spec = spec_of(cfg, 24)
    assert spec.engine == "llamacpp" and spec.baseline().engine == "llamacpp" and spec.baseline().engine_version == "9.9"
    native = spec_of(tiny_cfg(tmp_path, "task=prompts", "method=ar"), 24)
    assert spec.baseline(native=True) == native
    assert spec.baseline().dir_name != native.dir_name


# ---- with the binding ----------------------------------------------------------------------------------------
def cli(*args, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "mars_bench.cli", *args, "model=tiny", "progress=false"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


ENTRIES = ("interleave=[['method=ar'],['method=sd','method.k=4'],['method=ar','engine=llamacpp'],"
           "['method=sd','method.k=4','engine=llamacpp']]")


def runs_of(root) -> dict:
    """Run directory -> (spec dict, records)."""
    out = {}
    for f in root.rglob("samples.jsonl"):
        spec = json.loads((f.parent / "run.json").read_text())
        out[f.parent.name] = (spec, [json.loads(line) for line in f.read_text().splitlines()])
    return out


def pick(runs: dict, scheme: str, engine: str):
    return next(v for v in runs.values() if v[0]["scheme"] == scheme and v[0]["engine"] == engine)


def ids_of(recs) -> dict:
    return {r["id"]: r["turns"][0]["output_ids"] for r in recs}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """The tiny pair, ar and sd on each engine, interleaved in one run over 4 prompts; then resumed to 6."""
    root = tmp_path_factory.mktemp("runs")
    os.environ.setdefault("MARS_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    common = ["task=prompts", "max_new_tokens=24", f"results_dir={root}", ENTRIES]
    first = cli(*common, "limit=4")
    assert first.returncode == 0, first.stderr[-3000:]
    before = runs_of(root)
    second = cli(*common, "limit=6")
    assert second.returncode == 0, second.stderr[-3000:]
    return root, before, runs_of(root), second.stderr + second.stdout


@pytest.mark.llamacpp
def test_it_runs_beside_the_native_engine_with_records_and_specs(compared):
    root, _, runs, _ = compared
    assert len(runs) == 4
    nat_ar, ll_ar, ll_sd = pick(runs, "ar", "native"), pick(runs, "ar", "llamacpp"), pick(runs, "sd", "llamacpp")
    for spec, recs in (ll_ar, ll_sd):
        assert spec["engine_version"] == llamacpp.version() and spec["model"] == nat_ar[0]["model"]
        assert spec["draft_quant"] is None and len(recs) == 6
        assert {r["fast_kernel"] for r in recs} == {f"llama.cpp-{llamacpp.version()}"}
        assert all(r["wall_s"] >= r["prefill_s"] > 0 and r["new_tokens"] == len(r["turns"][0]["output_ids"])
                   for r in recs)
    assert ll_sd[0]["draft_model"] == pick(runs, "sd", "native")[0]["draft_model"] and ll_sd[0]["k"] == 4
    for r in ll_ar[1]:                          # ar: one step per token, nothing drafted
        assert r["steps"] == r["new_tokens"] and r["n_proposed"] == 0
    for r in ll_sd[1]:                          # sd: the prefill, then one step per draft call, each <= k drafts
        t = r["turns"][0]
        assert t["proposed"][0] == 0 and all(0 <= p <= 4 for p in t["proposed"][1:])
        assert all(0 <= a <= p for p, a in zip(t["proposed"], t["accepted"]))
        assert r["new_tokens"] <= sum(a + 1 for a in t["accepted"]) and r["steps"] == len(t["proposed"])
    assert sum(r["n_accepted"] for r in ll_sd[1]) > 0 and sum(r["steps"] for r in ll_sd[1]) < sum(
        r["new_tokens"] for r in ll_sd[1])
    summary = json.loads(next(root.rglob(f"{next(k for k, v in runs.items() if v is ll_sd)}/summary.json")).read_text())
    assert summary["speedup"]["n_common"] == 6     # over llama.cpp's own ar


@pytest.mark.llamacpp
def test_greedy_sd_gives_its_own_ar_tokens_on_the_f32_pair(compared):
    """The tiny pair's GGUF is F32: llama.cpp's batched and 1-token evaluations agree to the argmax here, so its
    speculative output is its ar's on every sample (on Q4_K_M they need not: the slow tier counts)."""
    _, _, runs, _ = compared
    ar, sd = ids_of(pick(runs, "ar", "llamacpp")[1]), ids_of(pick(runs, "sd", "llamacpp")[1])
    assert sd == ar


@pytest.mark.llamacpp
def test_it_resumes_like_every_engine(compared):
    _, before, after, log = compared
    assert "(8 decodes to do)" in log                       # 2 new samples x 4 methods
    for name, (_, recs) in before.items():
        assert after[name][1][:4] == recs                     # the first 4 records kept as written


@pytest.mark.llamacpp
def test_the_report_gives_speedups_over_both_ars(compared):
    from mars_bench.report.frames import load_frames

    root = compared[0]
    runs = load_frames([root]).runs
    ll = runs[runs["spec"].map(lambda s: s.engine) == "llamacpp"]
    nat = runs[runs["spec"].map(lambda s: s.engine) == "native"]
    assert len(ll) == 2 and ll["n_vs_native"].tolist() == [6, 6]
    assert ll["speedup_vs_native"].notna().all() and (ll["speedup_vs_native_lo"] <= ll["speedup_vs_native_hi"]).all()
    sd = ll[ll["method"] == "sd"].iloc[0]
    assert sd["speedup"] is not None and sd["baseline"] == ll[ll["method"] == "ar"].iloc[0]["run"]
    assert "speedup_vs_native" not in nat or nat["speedup_vs_native"].isna().all()


@pytest.mark.llamacpp
def test_an_entry_with_a_rule_it_cannot_run_is_refused_in_one_line(tmp_path):
    res = cli("task=prompts", "limit=1", f"results_dir={tmp_path}",
              "interleave=[['method=ar'],['method=mars','engine=llamacpp']]")
    assert res.returncode == 2 and "rule=mars cannot run on engine=llamacpp" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.fixture(scope="module")
def tiny_runner(tmp_path_factory):
    target, draft = llamacpp.tiny_gguf_pair(root=str(tmp_path_factory.mktemp("gguf")))
    return llamacpp.LlamaCppRunner(str(target), str(draft), k=4, threads=1, n_ctx=256)


@pytest.mark.llamacpp
def test_p_min_cuts_the_drafts_and_changes_no_token(tiny_runner):
    prompt = [5, 6, 7, 8, 9]
    ar = tiny_runner.run(prompt, 20, speculative=False)
    tiny_runner.set_draft(4, 0.0)
    every = tiny_runner.run(prompt, 20)
    tiny_runner.set_draft(4, 1.0)      # no draft token reaches probability 1: nothing proposed, ar's steps
    none = tiny_runner.run(prompt, 20)
    assert every["tokens"] == none["tokens"] == ar["tokens"]
    assert set(every["proposed"][1:]) == {4} and set(none["proposed"]) == {0} and none["steps"] == len(ar["tokens"])


@pytest.mark.llamacpp
def test_the_gguf_target_computes_the_tiny_targets_logits(tiny_runner):
    from mars_bench.models.tiny import tiny_pair

    target, _, _ = tiny_pair()
    ids = [5, 6, 7, 8, 9, 100, 200, 42]
    tiny_runner.llm.reset()
    tiny_runner.llm.eval(ids)
    ours = np.asarray(tiny_runner.llm.scores[:len(ids)])
    with torch.no_grad():
        ref = target(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - ref).max() <= 1e-3 * np.abs(ref).max()
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


# ---- the embedded Q4_K_M pair (llamacpp and slow) --------------------------------------------------------------
NEAR_TIE = 1.0   # logits: a rounding difference between llama.cpp's batched and 1-token kernels flips only a near tie


@pytest.mark.llamacpp
@pytest.mark.slow
def test_on_the_q4km_pair_sd_leaves_ar_only_at_near_ties(tmp_path):
    """llama.cpp's greedy sd against its own ar on the embedded pair (8 prompts, 96 tokens): the samples where the
    tokens differ are counted (printed), and at each first difference ar's token and sd's are the target's top two
    under the 1-token evaluation, within NEAR_TIE of each other. The replay of ar's path is checked on every
    sample: its argmax at the middle of the output is ar's token there."""
    from mars_bench.engines.llamacpp.engine import gguf_paths
    from mars_bench.run.bench import model_cfg

    res = subprocess.run([sys.executable, "-m", "mars_bench.cli", "task=prompts", "limit=8", "max_new_tokens=96",
                          "progress=false", f"results_dir={tmp_path}",
                          "interleave=[['method=ar','engine=llamacpp'],['method=sd','method.k=6','engine=llamacpp']]"],
                         cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = runs_of(tmp_path)
    ar, sd = (pick(runs, s, "llamacpp")[1] for s in ("ar", "sd"))
    by_id = {r["id"]: r for r in ar}
    target, _ = gguf_paths(model_cfg(), need_draft=False)
    one = llamacpp.LlamaCppRunner(str(target), threads=torch.get_num_threads(), n_ctx=1024)
    gaps = []
    for r in sd:
        a, s = by_id[r["id"]]["turns"][0]["output_ids"], r["turns"][0]["output_ids"]
        ids = one_prompt(tmp_path, r["id"])
        assert len(ids) == by_id[r["id"]]["turns"][0]["prompt_tokens"]
        mid = len(a) // 2
        assert int(np.argmax(ar_path_logits(one, ids, a[:mid]))) == a[mid]
        if a == s:
            continue
        j = next(i for i, (x, y) in enumerate(zip(a, s)) if x != y)
        z = ar_path_logits(one, ids, a[:j])
        assert sorted([a[j], s[j]]) == sorted(np.argsort(z)[-2:].tolist()), (r["id"], j)
        gaps.append(float(z[a[j]] - z[s[j]]))
        assert abs(gaps[-1]) < NEAR_TIE, (r["id"], j, gaps[-1])
    one.close()
    print(f"llama.cpp greedy sd left its ar's tokens on {len(gaps)} of {len(sd)} samples, at logit gaps {gaps}")


def ar_path_logits(one, ids, prefix) -> np.ndarray:
    """The target's logits after ``ids`` + ``prefix`` as ar computes them: the prompt in one batch, then one token
    at a time."""
    import llama_cpp

    one.llm.reset()
    one.llm.eval(ids)
    for t in prefix:
        one.llm.eval([t])
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(one.llm.ctx, -1), shape=(one.llm.n_vocab(),)).copy()


def one_prompt(results_dir, sample_id) -> list[int]:
    """The prompt ids the engine decoded for a sample of the prompts task (its run's config, its tokenizer)."""
    from omegaconf import OmegaConf

    from mars_bench.engines.llamacpp.engine import tokenizer_of
    from mars_bench.tasks import build_messages, get_task

    cfg = OmegaConf.load(next(results_dir.rglob("config.yaml")))
    tok, chat, _ = tokenizer_of(cfg.model)
    task = get_task("prompts")
    sample = next(s for s in task.load(os.environ.get("MARS_BENCH_DATA_DIR") or cfg.data_dir, limit=8)
                  if s.id == sample_id)
    return tok.apply_chat_template(build_messages(task, sample, [], 0), add_generation_prompt=True,
                                   return_dict=False, **chat)
