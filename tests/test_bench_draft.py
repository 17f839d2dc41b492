"""scripts/bench_draft.py (`make bench`'s draft part): its runner rows compose and run on the tiny pair with a
quantized draft, the sweep keeps the fastest k, and the goals name what limits a missed one (no timing asserts)."""
from __future__ import annotations

import importlib.util
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from mars_bench import config as C
from mars_bench.models import quant

from .conftest import ROOT, data_dir

sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("bench_draft", ROOT / "scripts" / "bench_draft.py")
bd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bd)


def test_draft_settings_become_model_overrides():
    assert bd.overrides("q4+v32768") == ["model.draft_quant=q4", "model.draft_vocab=32768"]
    assert bd.overrides("int8") == ["model.draft_quant=int8", "model.draft_vocab=0"]
    m = bd.model_cfg("q8+v4096")
    assert (m.draft_quant, m.draft_vocab, m.source) == ("q8", 4096, "embedded")


def test_interleave_list_composes_to_the_swept_methods():
    from mars_bench.runner import variant_configs

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+compare=bench_draft", "task=gsm8k", *bd.overrides("q4+v32768"),
                                           bd.entries([4, 6], [8], [["method=lookup"]])], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        vs = variant_configs(cfg)
    got = [(C.method_of(v).name, C.method_of(v).k if v.method.name != "ar" else None,
            C.method_of(v).rule_kwargs.get("theta")) for v in vs]
    assert got == [("ar", None, None), ("sd", 4, None), ("sd", 6, None), ("sd", 8, 0.9), ("lookup", 4, None)]
    assert {(v.model.draft_quant, v.model.draft_vocab) for v in vs} == {("q4", 32768)}


@pytest.mark.skipif(not quant.available(), reason=f"no quant kernel here: {quant.unavailable()}")
def test_runner_rows_on_the_tiny_pair_with_a_q4_draft(tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(data_dir()))
    runs = tmp_path / "runs"
    rows = bd.runner_rows(runs, "q4", ["gsm8k"], bd.entries([2, 3], [3]), ["model=tiny", "limit=2",
                                                                           "max_new_tokens=6"], threads=1)
    assert sorted(zip(rows["method"], rows["k"].fillna(0).astype(int))) == [("ar", 0), ("mars", 3), ("sd", 2),
                                                                             ("sd", 3)]
    assert (rows["draft"] == "q4").all() and (rows["n"] == 2).all()
    sd = rows[rows["method"] == "sd"]
    assert (sd["identical_to_ar"] == 2).all()          # greedy sd with a q4 draft: ar's tokens
    summaries = list(runs.rglob("summary.json"))
    assert summaries and all('"draft_quant": "q4g32"' in p.read_text() for p in summaries if "/sd-" in str(p))


def test_best_k_is_the_fastest_mean_over_tasks():
    sweep = pd.DataFrame({"draft": ["q4"] * 6, "method": ["sd", "sd", "sd", "sd", "mars", "ar"],
                          "k": [4, 8, 4, 8, 6, None], "task": ["a", "a", "b", "b", "a", "a"],
                          "tokens_per_s": [5.0, 7.0, 6.0, 3.0, 9.0, 4.0]})
    chosen = bd.best_k(sweep)
    assert sorted(zip(chosen["method"], chosen["k"])) == [("mars", 6), ("sd", 4)]   # sd: 5.5 vs 5.0 mean


def test_goals_name_what_limits_a_missed_one():
    target = {1: 200.0, 5: 210.0, 8: 240.0}
    facts = {"q4": {"ms": 30.0, "ratio": 0.15, "linear_ms": 21.0, "weight_bytes": 280e6, "gb_per_s": 13.3,
                    "outside_ms": 9.0}, "target": {"kernel": "panel-amx-bf16"}}
    budget = pd.DataFrame([{"task": "gsm8k", "draft": "q4", "method": "sd", "row": "sd k=6", "theta": None,
                            "tau": 4.0, "k": 6, "vs_ar": 1.9, "vs_ar_lo": 1.8, "vs_ar_hi": 2.0, "n": 4,
                            "outside_forward_share": 0.05, "identical_to_ar": 4}])
    goals = {g[0]: g for g in bd.check_goals(target, facts, budget, None, "panel-amx-bf16")}
    g = goals["draft q4 forward(1) / target forward(1) <= 0.1"]
    assert g[1:3] == (0.15, False) and "21.0 in linears (280 MB at 13.3 GB/s) + 9.0 outside" in g[3]
    v5 = goals["target forward(5) / forward(1) <= 1.15"]
    assert v5[2] and "AVX512_BF16-only kind was not measured" in v5[3]
    sd = goals["GSM8K sd (q4 draft) >= 2.0x ar [CI 1.80, 2.00], n=4"]
    # bound: tau 4 x 200 ms against a 7-token verification (230 ms) + 6 drafts of 30 ms = 800 / 410
    assert not sd[2] and f"the cost table predicts {800 / 410:.2f}x" in sd[3]
    assert goals["gsm8k sd k=6 (q4 draft): tokens identical to ar, of 4"][2]
    fused = {"q4": {"path": "fused", "ms": 15.0, "ratio": 0.075, "weight_bytes": 280e6, "gb_per_s": 18.7,
                    "linear_ms": None, "outside_ms": None},
             "q4 (modules)": dict(facts["q4"], path="modules"),
             "target": {"kernel": "panel-amx-bf16", "stream_gb_per_s": 25.0,
                        "avx512_bf16_here_ms": {"1": 200.0, "5": 260.0, "8": 300.0}}}
    goals = {g[0]: g for g in bd.check_goals(target, fused, budget, None, "panel-amx-bf16")}
    g = goals["draft q4 forward(1) / target forward(1) <= 0.1"]
    assert g[1:3] == (0.075, True) and "at 18.7 GB/s over the whole forward; 280 MB at the machine's 25.0 GB/s" \
        " alone take 11.2 ms" in g[3]
    assert not any("(modules)" in name for name in goals)
    assert "its kernel (panel-avx512-bf16) on this machine: 1.30" in goals["target forward(5) / forward(1) <= 1.15"][3]


def test_render_rewrites_the_same_tables_from_the_saved_json(tmp_path):
    target = {1: 200.0, 5: 210.0, 8: 240.0}
    facts = {"q4": {"scheme": "q4g32", "ms": 30.0, "ratio": 0.15, "linear_ms": 21.0, "weight_bytes": 280e6,
                    "gb_per_s": 13.3, "outside_ms": 9.0},
             "target": {"kernel": "panel-amx-bf16", "weight_bytes": 3e9, "outside_ms": {1: 30.0, 5: 40.0, 8: 50.0}}}
    budget = pd.DataFrame([{"task": "gsm8k", "draft": "q4", "method": "sd", "row": "sd k=6", "theta": None,
                            "tau": 4.0, "k": 6, "vs_ar": 1.9, "vs_ar_lo": 1.8, "vs_ar_hi": 2.0, "n": 4,
                            "tokens_per_s": 9.0, "outside_forward_share": 0.05, "identical_to_ar": 4}])
    budget["k"] = budget["k"].astype("Int64")
    meta = {"machine": "test CPU", "budget": "4 prompts per task"}
    goals = bd.check_goals(target, facts, budget, None, "panel-amx-bf16")
    first = bd.write(tmp_path / "a", meta, target, facts, None, None, budget, None, None, goals)
    again = bd.render(tmp_path / "a" / "draft.json", tmp_path / "b")
    assert again == first and "| 1   | 200.0 | 1.00    | 30.0" in first
