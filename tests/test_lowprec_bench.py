"""scripts/bench.py's tables for bf16 and fp32 rows, llama.cpp's forward costs and the runner processes' memory,
on synthetic numbers (the bench itself needs the real pair): every table written from the numbers given, and
no goal of an old ticket printed."""
import importlib.util
import json
import re

import pandas as pd

from mars_bench.run import bench as B

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def row(name, tps, vs_ar, tau=None, dtype="bf16", same=2, theta=None, share=0.01, task="gsm8k"):
    return {"task": task, "block": f"runner, {dtype}", "row": name, "precision": B.PRECISION[dtype],
            "tokens_per_s": tps, "tau": tau, "vs_ar": vs_ar, "vs_ar_lo": vs_ar * 0.9, "vs_ar_hi": vs_ar * 1.1,
            "identical_to_ar": same, "n": 2, "outside_forward_share": share, "method": name.split()[0], "k": None,
            "theta": theta}


def synthetic():
    table = bench.table_of(pd.DataFrame([
        row("ar", 5.1, 1.0, 1.0, task="humaneval"),
        row("ar", 7.5, 1.0, 1.0), row("sd k=6", 12.0, 1.6, 4.4),
        row("mars θ=0.9 k=8", 14.0, 1.87, 5.5, same=1, theta=0.9),
        row("ar", 3.8, 1.0, 1.0, dtype="fp32"), row("sd k=6", 6.0, 1.58, 4.4, dtype="fp32")]))
    costs = {"fp32 plain": {1: 250.0, 8: 700.0}, "fp32 panel": {1: 140.0, 8: 180.0},
             "bf16": {1: 70.0, 8: 80.0}, "llama.cpp Q4_K_M": {1: 43.0, 8: 270.0}, "draft (q8, bf16)": {1: 9.0, 8: 12.0}}
    rss = {"bf16": {"gsm8k": 6.1, "humaneval": 6.2}, "fp32": {"gsm8k": 15.0, "humaneval": 15.1}}
    return table, costs, rss


def test_tables_name_precision_kernels_memory_and_costs(tmp_path):
    table, costs, rss = synthetic()
    assert list(table["task"]) == ["gsm8k"] * 5 + ["humaneval"]   # TASKS' order, the runner's order within
    meta = {"prompts_per_task": 2, "max_new_tokens": 32, "draft_quant": "q8", "runs": "results/bench_runs/decode",
            "kernels": {"fp32 target": "panel-avx512", "bf16 target": "panel-amx-bf16"}, "llama_cpp_skipped": None}
    md = bench.write(tmp_path, table, costs, rss, meta)
    cells = lambda *xs: r"\|\s*" + r"\s*\|\s*".join(map(re.escape, xs)) + r"\s*\|"  # noqa: E731
    assert "bf16 target: panel-amx-bf16" in md
    assert re.search(cells("gsm8k", "runner, bf16", "mars θ=0.9 k=8", B.PRECISION["bf16"], "14.00", "5.50", "1.87",
                           "1.68-2.06", "1/2", "1.0%"), md)
    assert re.search(cells("n", "fp32 plain", "fp32 panel", "bf16", "llama.cpp Q4_K_M", "draft (q8, bf16)"), md)
    assert re.search(cells("8", "700.0 (2.80)", "180.0 (1.29)", "80.0 (1.14)", "270.0 (6.28)", "12.0 (1.33)"), md)
    assert re.search(cells("fp32", "humaneval", "15.10"), md) and "skipped" not in md
    assert "goal" not in md.lower()
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["peak_rss_gb"]["bf16"]["gsm8k"] == 6.1 and saved["meta"]["kernels"]["bf16 target"] == "panel-amx-bf16"
    assert (tmp_path / "bench.csv").read_text().count("\n") == len(table) + 1
    md = bench.write(tmp_path, table, {}, rss, dict(meta, llama_cpp_skipped="llama-cpp-python not installed"))
    assert "llama.cpp forward costs skipped: llama-cpp-python not installed." in md and "Forward cost" not in md
