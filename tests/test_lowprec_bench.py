"""scripts/bench.py's goals and tables for the bf16 and llama.cpp rows, on synthetic numbers (the bench
itself needs the real pair): each goal computed from the numbers given, every table written."""
import importlib.util
import json
import re

import pandas as pd

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

OURS16 = f"{bench.OURS}, bf16"


def row(name, tps, vs_ar, tau=None, block=OURS16, prec="bf16", same=2, theta=None, relaxed=False, share=0.01):
    return {"task": "gsm8k", "block": block, "row": name, "precision": bench.PRECISION[prec], "tokens_per_s": tps,
            "tau": tau, "vs_ar": vs_ar, "vs_ar_lo": vs_ar * 0.9, "vs_ar_hi": vs_ar * 1.1, "identical_to_ar": same,
            "n": 2, "outside_forward_share": share, "theta": theta, "relaxed": relaxed}


def synthetic(bf16_1=70.0, bf16_8=80.0, sd_same=2, adaptive_same=2):
    ref = dict(block=bench.REFS, prec="fp32", share=None)
    table = pd.DataFrame([
        row("ar", 7.5, 1.0, 1.0), row("sd k=6 draftint8row", 12.0, 1.6, 4.4, same=sd_same),
        row("sd k=10 pmin0.75 draftint8row", 11.0, 1.47, 4.0, same=adaptive_same),
        row("mars θ=0.9 k=8 draftint8row", 14.0, 1.87, 5.5, same=1, theta=0.9, relaxed=True),
        row("mars θ=1 k=8 draftint8row", 12.1, 1.61, 4.4, theta=1.0, relaxed=True),
        row("ar (fp32 plain)", 3.8, 0.95, **ref), row(bench.REF_AR, 4.0, 1.0, **ref),
        row("transformers generate (fp32)", 3.9, 0.975, **ref),
        row("llama.cpp ar (Q4_K_M)", 20.0, 5.0, **{**ref, "prec": "Q4_K_M"})])
    costs = {"fp32 plain": {1: 250.0, 8: 700.0}, "fp32 panel": {1: 140.0, 8: 180.0},
             "bf16": {1: bf16_1, 8: bf16_8}, "llama.cpp Q4_K_M": {1: 43.0, 8: 270.0}}
    rss = {"fp32": {"load": 12.4, "ar": 12.5, "sd": 15.0, "mars": 15.1, "fast_kernel": "panel-avx512"},
           "bf16": {"load": 4.8, "ar": 5.0, "sd": 6.1, "mars": 6.1, "fast_kernel": "panel-amx-bf16"},
           "llamacpp": {"error": "the llamacpp probe failed: exit status -11"}}
    return table, costs, rss


def goals_by_name(goals):
    return {g: (v, ok) for g, v, ok in goals}


def test_issue14_goals_follow_the_numbers():
    table, costs, rss = synthetic()
    g = goals_by_name(bench.check_goals(table, costs, rss))
    v, ok = g["bf16: target forward(1) >= 1.8x faster than the fp32 panel path"]
    assert v == 2.0 and ok
    v, ok = g["bf16: target forward(8) / forward(1) <= 1.2"]
    assert abs(v - 80 / 70) < 1e-9 and ok
    assert g[f"peak RSS of the bf16 default (load + ar, sd, mars) <= {bench.RSS_GOAL_GB:.1f} GB"] == (6.1, True)
    sd = f"gsm8k, {OURS16}: sd k=6 draftint8row, samples identical to ar, of 2"
    adaptive = f"gsm8k, {OURS16}: sd k=10 pmin0.75 draftint8row, samples identical to ar, of 2"
    assert g[sd] == (2, True) and g[adaptive] == (2, True)
    assert g[f"gsm8k, {OURS16}: mars θ=1 k=8 draftint8row, samples identical to ar, of 2"] == (2, True)
    assert not any("θ=0.9 k=8 draftint8row, samples identical" in name for name in g)   # lossy: no such goal
    assert g[f"gsm8k, {OURS16}: sd k=6 draftint8row >= 1.3x ar"] == (1.6, True)
    v, ok = g[f"gsm8k, {OURS16}: mars θ=0.9 k=8 draftint8row >= 1.15x sd k=6 draftint8row, with a higher tau"]
    assert abs(v - 14 / 12) < 1e-9 and ok
    v, ok = g["gsm8k: ar (fp32 plain) within 5% of transformers generate"]
    assert abs(v - 3.8 / 3.9) < 1e-9 and ok
    assert g[f"gsm8k: {bench.REF_AR} faster than transformers generate"][1]
    table, costs, rss = synthetic(bf16_1=100.0, bf16_8=130.0, sd_same=1, adaptive_same=1)
    g = goals_by_name(bench.check_goals(table, costs, rss))
    assert not g["bf16: target forward(1) >= 1.8x faster than the fp32 panel path"][1]
    assert not g["bf16: target forward(8) / forward(1) <= 1.2"][1]
    assert g[sd] == (1, False) and g[adaptive] == (1, False)   # greedy sd and adaptive length stay lossless


def test_tables_name_precision_kernels_memory_and_skipped_rows(tmp_path):
    table, costs, rss = synthetic()
    goals = bench.check_goals(table, costs, rss)
    meta = {"prompts_per_task": 2, "max_new_tokens": 32, "draft_quant": "int8", "runs": "results/bench_runs/decode",
            "kernels": {"fp32 target": "panel-avx512", "bf16 target": "panel-amx-bf16"},
            "llama_cpp_skipped": None}
    bench.write(tmp_path, table, goals, costs, rss, meta)
    md = (tmp_path / "bench.md").read_text()
    cells = lambda *xs: r"\|\s*" + r"\s*\|\s*".join(map(re.escape, xs)) + r"\s*\|"  # noqa: E731
    assert "bf16 target: panel-amx-bf16" in md
    assert re.search(cells("llama.cpp ar (Q4_K_M)", "Q4_K_M blocks (llama.cpp)"), md)
    assert re.search(cells("n", "fp32 plain", "fp32 panel", "bf16", "llama.cpp Q4_K_M"), md)
    assert re.search(cells("8", "700 (2.80)"), md)
    assert re.search(cells("bf16", "panel-amx-bf16", "4.80", "5.00", "6.10", "6.10"), md)
    assert "the llamacpp probe failed" in md
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["peak_rss_gb"]["bf16"]["load"] == 4.8 and saved["meta"]["kernels"]["bf16 target"] == "panel-amx-bf16"
    assert (tmp_path / "bench.csv").read_text().count("\n") == len(table) + 1
