"""scripts/bench_draft.py (`make bench`'s draft part): its runner rows compose and run on the tiny pair with a
quantized draft, the sweep keeps the fastest k, and draft.md is rewritten from a saved draft.json (no timing
asserts, no goals of old tickets)."""
from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from mars_bench.run import bench as B
from mars_bench.config import schema as C
from mars_bench.config.settings import method_of
from mars_bench.models import quant

from .conftest import ROOT, data_dir

spec = importlib.util.spec_from_file_location("bench_draft", ROOT / "scripts" / "bench_draft.py")
bd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bd)


def test_draft_settings_become_model_overrides():
    assert B.draft_overrides("q4+v32768") == ["model.draft_quant=q4", "model.draft_vocab=32768"]
    assert B.draft_overrides("int8") == ["model.draft_quant=int8", "model.draft_vocab=0"]
    m = B.model_cfg(B.draft_overrides("q8+v4096"))
    assert (m.draft_quant, m.draft_vocab, m.source) == ("q8", 4096, "embedded")
    assert B.model_cfg(["model=tiny", *B.draft_overrides("q4")]).source == "tiny"


def test_interleave_list_composes_to_the_swept_methods():
    from mars_bench.cli.app import variant_configs

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+compare=bench_draft", "task=gsm8k", *B.draft_overrides("q4+v32768"),
                                           bd.entries([4, 6], [8], [["method=lookup"]])], return_hydra_config=True)
        vs = variant_configs(cfg, list(cfg.hydra.overrides.task))
    got = [(method_of(v).name, method_of(v).k if v.method.name != "ar" else None,
            method_of(v).rule_kwargs.get("theta")) for v in vs]
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
    first = bd.write(tmp_path / "a", meta, target, facts, None, None, budget, None)
    again = bd.render(tmp_path / "a" / "draft.json", tmp_path / "b")
    assert again == first and "| 1   | 200.0 | 1.00    | 30.0" in first
    assert "| gsm8k  | q4      | sd k=6   | 4   | 9.00       | 4.00  | 1.90 [1.80, 2.00]" in first
    assert "goal" not in first.lower()
