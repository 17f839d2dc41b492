"""`make bench` through the runner: `+compare=bench` (and `+compare=bench_batch`) compose and validate for
both tasks, the bench's runner invocation writes records on the tiny pair, and scripts/bench.py's table
builder turns that results tree and reference rows into the expected rows (no timing asserts)."""
from __future__ import annotations

import importlib.util
import json
import re
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from mars_bench import config as C

from .conftest import ROOT, data_dir

sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
sys.modules.setdefault("bench", bench)
spec = importlib.util.spec_from_file_location("bench_batch", ROOT / "scripts" / "bench_batch.py")
bench_batch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_batch)

# conf/compare/bench.yaml, entry by entry: (method name, scheme, k, rule, theta, p_min, tree)
EXPECTED = [("ar", "ar", None, None, 0.0, None),
            ("sd", "sd", 6, "exact", 0.0, None),
            ("mars", "sd", 8, "mars", 0.0, None),
            ("mars", "sd", 8, "mars", 0.0, None),
            ("sd", "sd", 10, "exact", 0.75, None),
            ("sd_tree", "sd_tree", None, "exact", 0.0, (3, 3, 10)),
            ("lookup", "lookup", 4, "exact", 0.0, None)]
THETAS = [None, None, 0.9, 1.0, None, None, None]
LABELS = ["ar", "lookup k=4 max_ngram=3 min_ngram=1", "sd k=6", "sd k=10 pmin0.75", "sd_tree d3-w3-t10",
          "mars θ=0.9 k=8", "mars θ=1 k=8"]   # load_frames' order: ar, lossless methods, lossy rules


@pytest.fixture(scope="module")
def hydra_ctx():
    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield


def variants(overrides: list[str]) -> list:
    """The runner's own composition of the interleave entries (runner.variant_configs), as `mars-bench` would."""
    from mars_bench.runner import variant_configs

    cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg, variant_configs(cfg)


@pytest.mark.parametrize("task", bench.TASKS)
def test_compare_bench_composes_and_validates(hydra_ctx, task, monkeypatch):
    from mars_bench.runner import Job

    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(data_dir()))
    cfg, vs = variants(["+compare=bench", f"task={task}", "limit=5", "max_new_tokens=48"])
    C.validate(cfg)
    assert cfg.model.dtype == "bf16" and cfg.model.source == "embedded"   # the embedded default pair
    assert len(vs) == len(EXPECTED)
    dirs = []
    for v, (name, scheme, k, rule, p_min, tree), theta in zip(vs, EXPECTED, THETAS):
        C.validate(v)
        m = C.method_of(v)
        assert (v.method.name, m.name, v.task.name, v.limit, v.max_new_tokens) == (name, scheme, task, 5, 48)
        assert v.temperature == 0.0 and v.model.dtype == "bf16"
        if k is not None:
            assert m.k == k
        if scheme != "ar":
            assert m.rule == rule and m.p_min == p_min and m.rule_kwargs.get("theta") == theta
        if tree:
            assert (m.tree["depth"], m.tree["top_k"], m.tree["total_tokens"]) == tree
        job = Job(v, interleaved=True)   # what the runner builds before any model loads: task, samples, run dir
        assert len(job.samples) == 5
        dirs.append(job.run_dir.name)
    assert len(set(dirs)) == len(dirs)
    # one dtype per invocation: the runner refuses a model override in an entry, so fp32 is another invocation
    _, vs = variants(["+compare=bench", f"task={task}", "model.dtype=fp32"])
    assert {v.model.dtype for v in vs} == {"fp32"}


@pytest.mark.parametrize("task", bench.TASKS)
def test_compare_bench_batch_composes_and_validates(hydra_ctx, task):
    cfg, vs = variants(["+compare=bench_batch", f"task={task}", "batch_size=4"])
    C.validate(cfg)
    assert [(C.method_of(v).name, C.method_of(v).k, v.batch_size) for v in vs] == [("ar", 4, 4), ("sd", 4, 4),
                                                                                   ("sd", 4, 4)]
    for v in vs:
        C.validate(v)
    assert C.method_of(vs[2]).rule_kwargs["theta"] == 0.9


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """The bench's runner invocation on the tiny pair (GSM8K, 2 prompts, 6 new tokens)."""
    import os

    runs = bench.fresh_runs_dir(tmp_path_factory.mktemp("bench") / "runs")
    old = os.environ.get("MARS_BENCH_DATA_DIR")
    os.environ["MARS_BENCH_DATA_DIR"] = str(data_dir())
    try:
        bench.run_compare("bench", "gsm8k", runs, ["model=tiny", "limit=2", "max_new_tokens=6", "progress=false"],
                          threads=1, quiet=True)
    finally:
        if old is None:
            os.environ.pop("MARS_BENCH_DATA_DIR")
        else:
            os.environ["MARS_BENCH_DATA_DIR"] = old
    return runs


def test_runner_invocation_writes_records(tiny_runs):
    task_dir = tiny_runs / "tiny_fp32_cpu" / "gsm8k-v2"
    dirs = sorted(p for p in task_dir.iterdir() if p.is_dir())
    assert len(dirs) == len(EXPECTED)
    for d in dirs:
        recs = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
        assert len(recs) == 2 and {r["timing"] for r in recs} == {"interleaved"}
        assert all(r["new_tokens"] >= 1 and r["task"] == "gsm8k" for r in recs)
        assert json.loads((d / "summary.json").read_text())["totals"]["n_samples"] == 2
    # a second bench clears its own runs folder, and refuses to clear one it did not make
    (tiny_runs.parent / "other").mkdir()
    (tiny_runs.parent / "other" / "keep.txt").write_text("x")
    with pytest.raises(SystemExit, match="did not write"):
        bench.fresh_runs_dir(tiny_runs.parent / "other")


def references(tasks=("gsm8k",)) -> dict:
    """Reference rows as bench.measure returns them: per row, one dict per prompt."""
    rows = {"ar (fp32 plain)": (10, 2.0, 10, 1.9), bench.REF_AR: (10, 2.0, 10, 1.9),
            "transformers generate (fp32)": (10, 1.9, None, None), "transformers assisted (fp32, int8 draft)":
            (10, 1.0, None, None), "llama.cpp ar (Q4_K_M)": (10, 0.5, 10, None),
            "llama.cpp speculative k=6 (Q4_K_M, Q4_K_M draft)": (10, 0.45, 3, None)}
    out = {}
    for name, (n, wall, steps, fwd) in rows.items():
        out[name] = [{"tokens": list(range(n)) if "speculative" not in name or i == 0 else [7] * n,
                      "wall_s": wall * (1 + 0.1 * i), "steps": steps, "forward_s": fwd, "task": t, "id": f"{t}{i}"}
                     | ({"prefill_s": 0.05} if fwd is not None else {})
                     for t in tasks for i in range(2)]
    return out


def test_table_builder_reads_the_runner_and_the_references(tiny_runs, tmp_path):
    ours = bench.our_rows(tiny_runs)
    assert list(ours["row"]) == LABELS and set(ours["task"]) == {"gsm8k"}
    assert set(ours["block"]) == {f"{bench.OURS}, fp32"} and set(ours["precision"]) == {"fp32"}
    assert list(ours["n"]) == [2] * len(LABELS) and ours["identical_to_ar"].iloc[0] == 2
    # speedup and its CI are summary.json's, not recomputed
    task_dir = tiny_runs / "tiny_fp32_cpu" / "gsm8k-v2"
    summaries = [json.loads((d / "summary.json").read_text()) for d in task_dir.iterdir()]
    sd = next(s for s in summaries if s["method"] == "sd" and s["k"] == 6)
    row = ours[ours["row"] == "sd k=6"].iloc[0]
    assert row["vs_ar"] == sd["speedup"]["speedup"] and row["tokens_per_s"] == sd["totals"]["tokens_per_s"]
    assert row["vs_ar_lo"] == sd["stats"]["speedup"]["lo"] and row["tau"] == sd["totals"]["tau"]
    assert ours[ours["row"] == "ar"]["vs_ar"].iloc[0] == 1.0
    refs = bench.reference_rows(references(("gsm8k", "humaneval")))
    table = bench.table_of(ours, refs)
    assert list(table["task"]) == ["gsm8k"] * (len(LABELS) + 6) + ["humaneval"] * 6
    assert list(table["row"][: len(LABELS)]) == LABELS and table["block"].iloc[len(LABELS)] == bench.REFS
    r = table[(table["task"] == "gsm8k") & (table["block"] == bench.REFS)].set_index("row")
    assert r.loc[bench.REF_AR, "vs_ar"] == pytest.approx(1.0)
    assert r.loc["transformers assisted (fp32, int8 draft)", "vs_ar"] == pytest.approx(2.0)
    assert r.loc["llama.cpp ar (Q4_K_M)", "precision"] == bench.PRECISION["Q4_K_M"]
    assert r.loc["llama.cpp speculative k=6 (Q4_K_M, Q4_K_M draft)", "identical_to_ar"] == 1   # vs llama.cpp ar
    assert r.loc["llama.cpp speculative k=6 (Q4_K_M, Q4_K_M draft)", "tau"] == pytest.approx(10 / 3)
    assert r.loc["transformers generate (fp32)", "identical_to_ar"] == 2
    assert pd.isna(r.loc["transformers generate (fp32)", "tau"])
    # walls 2.0 + 2.2, prefills 0.05 + 0.05: the share is of the loop's time, prefill excluded
    assert r.loc[bench.REF_AR, "outside_forward_share"] == pytest.approx(1 - 3.8 / 4.1)
    goals = {g for g, _, _ in bench.check_goals(table, {}, {})}
    assert "gsm8k, ours (runner), fp32: sd k=6, samples identical to ar, of 2" in goals
    assert "gsm8k, ours (runner), fp32: mars θ=1 k=8, samples identical to ar, of 2" in goals
    assert not any("θ=0.9 k=8, samples identical" in g for g in goals)   # a lossy rule: no identity goal
    assert "humaneval: ar (fp32 panel) faster than transformers generate" in goals
    md = bench.write(tmp_path, table, bench.check_goals(table, {}, {}), {}, {}, {"runs": "x"})
    assert re.search(r"\| gsm8k +\| ours \(runner\), fp32 +\| sd k=6 +\| fp32 +\|", md)
    assert "transformers assisted (fp32, int8 draft)" in md
    assert (tmp_path / "bench.csv").read_text().count("\n") == len(table) + 1
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert len(saved["table"]) == len(table)


def test_batch_table_reads_the_runner(tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(data_dir()))
    runs = bench.fresh_runs_dir(tmp_path / "runs")
    for b in (1, 2):
        bench.run_compare("bench_batch", "gsm8k", runs, ["model=tiny", "limit=2", "max_new_tokens=6",
                                                         f"batch_size={b}", "progress=false"], threads=1, quiet=True)
    t = bench_batch.batch_table(runs)
    assert [(m.split()[0], b) for m, b in zip(t["method"], t["batch_size"])] == \
        [("ar", 1), ("sd", 1), ("mars", 1), ("ar", 2), ("sd", 2), ("mars", 2)]
    assert list(t["same_as_b1"]) == [2] * 6 and list(t["vs_self_b1"][:3]) == [1.0] * 3
    assert list(t["vs_ar_same_b"][[0, 3]]) == [1.0, 1.0]
    md = bench_batch.write(tmp_path / "out", "batch_tiny", t, bench_batch.goals(t),
                           {"pair": "tiny", "limit": 2, "max_new_tokens": 6, "threads": 1})
    assert re.search(r"\| gsm8k +\| sd k=4 +\| 1 +\|", md) and "Goal (gsm8k): sd at its best B" in md
