"""scripts/bench.py's goals and tables for the bf16 and llama.cpp rows, on synthetic numbers (the bench
itself needs the real pair): each goal computed from the numbers given, every table written."""
import importlib.util
import json
from argparse import Namespace

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def row(tps, tau=None, prec="fp32", same=2):
    return {"tokens": 10, "wall_s": 10 / tps, "tokens_per_s": tps, "tau": tau, "outside_forward_share": 0.01,
            "precision": prec, "vs_ar": tps / 4.0, "vs_hf_generate": tps / 3.9, "identical_to_hf_generate": 2,
            "identical_to_ar_same_precision": same}


def synthetic(bf16_1=70.0, bf16_8=80.0, sd_same=2):
    table = {"ar (fp32 plain)": row(3.8), bench.BASE: row(4.0), "transformers generate (fp32)": row(3.9),
             "transformers assisted (fp32, int8 draft)": row(5.0), "sd k=5 (fp32 panel, int8 draft)": row(7.0, 4.5),
             "mars k=6 theta=0.9 (fp32 panel, int8 draft)": row(8.5, 5.5),
             "ar (bf16)": row(7.5, prec="bf16"), "sd k=5 (bf16, int8 draft)": row(12.0, 4.4, "bf16", sd_same),
             "mars k=6 theta=1 (bf16, int8 draft)": row(12.1, 4.4, "bf16"),
             "llama.cpp ar (Q4_K_M)": row(20.0, prec="Q4_K_M", same=2)}
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
    g = goals_by_name(bench.check_goals(table, costs, rss, 2))
    v, ok = g["bf16: target forward(1) >= 1.8x faster than the fp32 panel path"]
    assert v == 2.0 and ok
    v, ok = g["bf16: target forward(8) / forward(1) <= 1.2"]
    assert abs(v - 80 / 70) < 1e-9 and ok
    assert g[f"peak RSS of the bf16 default (load + ar, sd, mars) <= {bench.RSS_GOAL_GB:.1f} GB"] == (6.1, True)
    sd = "sd k=5 (bf16, int8 draft): prompts with greedy tokens identical to ar (bf16), of 2"
    assert g[sd] == (2, True)
    table, costs, rss = synthetic(bf16_1=100.0, bf16_8=130.0, sd_same=1)
    g = goals_by_name(bench.check_goals(table, costs, rss, 2))
    assert not g["bf16: target forward(1) >= 1.8x faster than the fp32 panel path"][1]
    assert not g["bf16: target forward(8) / forward(1) <= 1.2"][1]
    assert g[sd] == (1, False)
    adaptive = "sd k<=10 p_min=0.75 (bf16, int8 draft)"
    for same, ok in ((2, True), (1, False)):   # adaptive draft length must stay lossless
        table[adaptive] = row(11.0, 4.0, "bf16", same)
        g = goals_by_name(bench.check_goals(table, costs, rss, 2))
        assert g[f"{adaptive}: prompts with greedy tokens identical to ar, same precision, of 2"] == (same, ok)


def test_tables_name_precision_kernels_memory_and_skipped_rows(tmp_path):
    table, costs, rss = synthetic()
    goals = bench.check_goals(table, costs, rss, 2)
    args = Namespace(out=str(tmp_path), max_new_tokens=32, sweep_prompts=1)
    bench.write(args, table, {"ar (bf16)": row(7.5)}, costs, {"sd": 5, "mars": 6}, 2, goals, "int8",
                {"fp32": "panel-avx512", "bf16": "panel-amx-bf16"}, rss, None,
                {"bf16": {"weight_gb": 3.09, "gb_per_s": 18.6}, "torch GEMV bf16": {"weight_gb": 0.47, "gb_per_s": 20.1}})
    md = (tmp_path / "bench.md").read_text()
    assert "| bf16 | 3.09 | 18.6 |" in md and "| torch GEMV bf16 | 0.47 | 20.1 |" in md
    assert "bf16 target: panel-amx-bf16" in md and "| llama.cpp ar (Q4_K_M) | Q4_K_M" in md
    assert "| n | fp32 plain | fp32 panel | bf16 | llama.cpp Q4_K_M |" in md and "| 8 | 700 (2.80) |" in md
    assert "| bf16 | panel-amx-bf16 | 4.80 | 5.00 | 6.10 | 6.10 |" in md
    assert "the llamacpp probe failed" in md
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["weight_streaming"]["bf16"]["gb_per_s"] == 18.6
    assert saved["peak_rss_gb"]["bf16"]["load"] == 4.8 and saved["fast_kernel"]["bf16"] == "panel-amx-bf16"
    assert (tmp_path / "bench.csv").read_text().count("\n") == len(table) + 1 and (tmp_path / "bench.png").exists()
