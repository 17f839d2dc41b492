"""`make bench` through the runner: `+compare=bench` (and `+compare=bench_batch`) compose and validate for
both tasks, the bench's runner invocation writes records on the tiny pair, and scripts/bench.py and
bench_batch.py build their tables from that results tree (mars_bench/run/bench.py: summary.json's numbers, paired
ratios from mars_bench/stats.py; no timing asserts). No script imports another."""
from __future__ import annotations

import ast
import importlib.util
import json
import re

import pytest
from hydra import compose, initialize_config_dir

from mars_bench.run import bench as B
from mars_bench.config import schema as C
from mars_bench.config.settings import method_of
from mars_bench.config.validation import validate

from .conftest import ROOT, data_dir


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = script("bench")
bench_batch = script("bench_batch")

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
    """The CLI's own composition of the interleave entries (cli.app.variant_configs), as `mars-bench` would."""
    from mars_bench.cli.app import variant_configs

    cfg = compose("config", overrides=overrides, return_hydra_config=True)
    return cfg, variant_configs(cfg, list(cfg.hydra.overrides.task))


@pytest.mark.parametrize("task", B.TASKS)
def test_compare_bench_composes_and_validates(hydra_ctx, task, monkeypatch):
    from mars_bench.run.runner import Job

    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(data_dir()))
    cfg, vs = variants(["+compare=bench", f"task={task}", "limit=5", "max_new_tokens=48"])
    validate(cfg)
    assert cfg.model.dtype == "bf16" and cfg.model.source == "embedded"   # the embedded default pair
    assert len(vs) == len(EXPECTED)
    dirs = []
    for v, (name, scheme, k, rule, p_min, tree), theta in zip(vs, EXPECTED, THETAS):
        validate(v)
        m = method_of(v)
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


@pytest.mark.parametrize("task", B.TASKS)
def test_compare_bench_batch_composes_and_validates(hydra_ctx, task):
    cfg, vs = variants(["+compare=bench_batch", f"task={task}", "batch_size=4"])
    validate(cfg)
    assert [(method_of(v).name, method_of(v).k, v.batch_size) for v in vs] == [("ar", 4, 4), ("sd", 4, 4),
                                                                                   ("sd", 4, 4)]
    for v in vs:
        validate(v)
    assert method_of(vs[2]).rule_kwargs["theta"] == 0.9


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """The bench's runner invocation on the tiny pair (GSM8K, 2 prompts, 6 new tokens) and its peak RSS."""
    import os

    runs = B.fresh_runs_dir(tmp_path_factory.mktemp("bench") / "runs")
    old = os.environ.get("MARS_BENCH_DATA_DIR")
    os.environ["MARS_BENCH_DATA_DIR"] = str(data_dir())
    try:
        peak = B.run_compare("bench", "gsm8k", runs, ["model=tiny", "limit=2", "max_new_tokens=6", "progress=false"],
                             threads=1, quiet=True)
    finally:
        if old is None:
            os.environ.pop("MARS_BENCH_DATA_DIR")
        else:
            os.environ["MARS_BENCH_DATA_DIR"] = old
    return runs, peak


def test_runner_invocation_writes_records(tiny_runs):
    runs, peak = tiny_runs
    assert peak > 0.05   # GB: the child's own ru_maxrss (torch alone is more)
    task_dir = runs / "tiny_fp32_cpu" / "gsm8k-v2"
    dirs = sorted(p for p in task_dir.iterdir() if p.is_dir())
    assert len(dirs) == len(EXPECTED)
    for d in dirs:
        recs = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
        assert len(recs) == 2 and {r["timing"] for r in recs} == {"interleaved"}
        assert all(r["new_tokens"] >= 1 and r["task"] == "gsm8k" for r in recs)
        assert json.loads((d / "summary.json").read_text())["totals"]["n_samples"] == 2
    # a second bench clears its own runs folder, and refuses to clear one it did not make
    (runs.parent / "other").mkdir()
    (runs.parent / "other" / "keep.txt").write_text("x")
    with pytest.raises(SystemExit, match="no bench script wrote"):
        B.fresh_runs_dir(runs.parent / "other")
    with pytest.raises(SystemExit, match=r"(?s)task=gsm8k failed \(exit [1-9]\d*\).*no_such_model"):
        B.run_compare("bench", "gsm8k", runs.parent / "bad", ["model=no_such_model"], threads=1, quiet=True)


def test_table_is_the_runners_summaries(tiny_runs, tmp_path):
    runs, peak = tiny_runs
    table = bench.table_of(B.runner_rows(runs))
    assert list(table["row"]) == LABELS and set(table["task"]) == {"gsm8k"}
    assert set(table["block"]) == {"runner, fp32"} and set(table["precision"]) == {"fp32"}
    assert list(table["n"]) == [2] * len(LABELS) and table["identical_to_ar"].iloc[0] == 2
    # speedup, its CI, tokens/s and tau are summary.json's, not recomputed
    task_dir = runs / "tiny_fp32_cpu" / "gsm8k-v2"
    summaries = [json.loads((d / "summary.json").read_text()) for d in task_dir.iterdir()]
    sd = next(s for s in summaries if s["method"] == "sd" and s["k"] == 6)
    row = table[table["row"] == "sd k=6"].iloc[0]
    assert row["vs_ar"] == sd["speedup"]["speedup"] and row["tokens_per_s"] == sd["totals"]["tokens_per_s"]
    assert row["vs_ar_lo"] == sd["stats"]["speedup"]["lo"] and row["tau"] == sd["totals"]["tau"]
    assert table[table["row"] == "ar"]["vs_ar"].iloc[0] == 1.0
    assert table[table["row"] == "sd k=6"]["identical_to_ar"].iloc[0] == 2   # greedy sd: ar's tokens
    costs = {"fp32 plain": {1: 2.0, 4: 3.0}, "fp32 panel": {1: 1.5, 4: 1.8}, "draft (none, fp32)": {1: 1.0, 4: 1.2}}
    md = bench.write(tmp_path, table, costs, {"fp32": {"gsm8k": peak}},
                     {"runs": "x", "kernels": {"fp32 target": "off"}, "llama_cpp_skipped": "--no-llama"})
    assert re.search(r"\| gsm8k +\| runner, fp32 +\| sd k=6 +\| fp32 +\|", md)
    assert re.search(r"\| 4 +\| 3.0 \(1.50\) +\| 1.8 \(1.20\) +\| 1.2 \(1.20\) +\|", md)
    assert re.search(rf"\| fp32 +\| gsm8k +\| {peak:.2f} +\|", md) and "skipped: --no-llama" in md
    assert "goal" not in md.lower()
    assert (tmp_path / "bench.csv").read_text().count("\n") == len(table) + 1
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert len(saved["table"]) == len(table) and saved["forward_ms"]["fp32 panel"]["4"] == 1.8


def test_batch_table_reads_the_runner(tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(data_dir()))
    runs = B.fresh_runs_dir(tmp_path / "runs")
    for b in (1, 2):
        B.run_compare("bench_batch", "gsm8k", runs, ["model=tiny", "limit=2", "max_new_tokens=6",
                                                     f"batch_size={b}", "progress=false"], threads=1, quiet=True)
    t = bench_batch.batch_table(runs)
    assert [(m.split()[0], b) for m, b in zip(t["method"], t["batch_size"])] == \
        [("ar", 1), ("sd", 1), ("mars", 1), ("ar", 2), ("sd", 2), ("mars", 2)]
    assert list(t["same_as_b1"]) == [2] * 6 and list(t["vs_self_b1"][:3]) == [1.0] * 3
    assert list(t["vs_ar_same_b"][[0, 3]]) == [1.0, 1.0]
    # x itself (B=1) is stats.speedup_ci over the two runs' records, paired by sample id
    sd2 = t[(t["family"] == "sd") & (t["batch_size"] == 2)].iloc[0]
    sd1 = t[(t["family"] == "sd") & (t["batch_size"] == 1)].iloc[0]
    a, b = B.records_by_id(sd2["dirs"]), B.records_by_id(sd1["dirs"])
    tps = lambda rs: sum(r["new_tokens"] for r in rs.values()) / sum(r["wall_s"] for r in rs.values())  # noqa: E731
    assert sd2["vs_self_b1"] == pytest.approx(tps(a) / tps(b))
    md = bench_batch.write(tmp_path / "out", "batch_tiny", t, {"pair": "tiny", "limit": 2, "max_new_tokens": 6,
                                                               "threads": 1})
    assert re.search(r"\| gsm8k +\| sd k=4 +\| 1 +\|", md) and "mars over sd" in md and "Goal" not in md
    saved = json.loads((tmp_path / "out" / "batch_tiny.json").read_text())
    assert set(saved["mars_over_sd"]) == {"gsm8k B=1", "gsm8k B=2"}


def test_no_script_imports_another():
    names = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    for path in (ROOT / "scripts").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & names, f"{path.name} imports {sorted(imported & names)}"
        assert '"scripts"' not in path.read_text(), f"{path.name} puts scripts/ on sys.path"


def test_cpu_kernels_rows():
    """scripts/bench_cpu_kernels.py --rows: 1 always timed (the ratios' base), sorted, duplicates once; a bad list is
    refused in one line naming it before any model loads."""
    kernels = script("bench_cpu_kernels")
    assert kernels.parse_rows("16,5,8,5") == [1, 5, 8, 16]
    assert kernels.parse_rows("1") == [1]
    for bad in ("", "5,x", "0,8", "-4"):
        with pytest.raises(ValueError, match=r"--rows .*positive integers"):
            kernels.parse_rows(bad)
    with pytest.raises(SystemExit) as e:
        kernels.main(["--rows", "8,sixteen"])
    assert e.value.code == 2
