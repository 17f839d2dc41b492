"""The console comparison (mars_bench.report.console) on the hand-made results tree tests/fixtures/results
(numbers derived by hand in tests/test_report.py) plus a second, realistic settings group built from it:
the embedded pair's long names, a WMT19 BLEU scale, kernels, non-inferiority tests."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
from rich.cells import cell_len

from mars_bench.cli.report import main
from mars_bench.report import load_frames
from mars_bench.report.console import WIDTH, render

FIX = Path(__file__).resolve().parent / "fixtures" / "results"


@pytest.fixture(scope="module")
def fixture_runs():
    return load_frames(FIX).runs


def realistic_group(runs):
    """The fixture's runs as a second group: WMT19 on the embedded pair at 512 tokens, BLEU on a 0-100 scale,
    the CPU kernel in the summary, an int8 draft in the tags, a non-inferiority verdict on every paired test."""
    out = runs.drop(columns=[c for c in runs.columns if c.startswith(("quality/", "vs_ar/", "vs_sd/"))])
    out["model_dir"], out["model"], out["task_dir"], out["task"], out["task_version"] = (
        "qwen2.5-coder-0.5b-1.5b_bf16_cpu", "qwen2.5-coder-0.5b-1.5b", "wmt19_zh_en-v2", "wmt19_zh_en", 2)
    out["title"] = "qwen2.5-coder-0.5b-1.5b (bf16, cpu) | wmt19_zh_en v2"
    out["group"] = "qwen2.5-coder-0.5b-1.5b_bf16_cpu/wmt19_zh_en-v2/ar-T0-p1-n8-s0"
    out["fast_kernel"] = [["panel-avx512-bf16"]] * len(out)
    out["subset"], out["limit"] = "paper", 6
    spec = out["method"] != "ar"
    out["flags"] = [tuple(f) + ("draftint8row",) if s else f for f, s in zip(out["flags"], spec)]
    out["label"] = [lab + " draftint8row" if s else lab for lab, s in zip(out["label"], spec)]
    out["metric_directions"], out["metrics"] = [{"bleu": "higher"}] * len(out), [["bleu"]] * len(out)
    out["quality/bleu"] = 23.456 + out["theta"].fillna(0)
    test = {"delta": -1.234, "delta_lo": -12.345, "delta_hi": 10.987, "p_value": 0.4321, "n": 3, "ni_margin": 0.47}
    for k, v in test.items():
        out[f"vs_ar/bleu/{k}"] = [v if s else None for s in spec]
    out["vs_ar/bleu/ni_passes"] = [m == "sd" if s else None for m, s in zip(out["method"], spec)]
    out["truncated"], out["stop/max_new_tokens"], out["stop/eos"], out["stop/stop_string"] = 0.0, 0.0, 1.0, 0.0
    return out


def test_table_fits_120_columns_and_cuts_nothing(fixture_runs):
    text = render(pd.concat([fixture_runs, realistic_group(fixture_runs)], ignore_index=True))
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= WIDTH == 120
    assert "…" not in text                                          # no cell shortened to fit
    # the shared settings once per group, above the table; the rows do not repeat them
    assert text.count("model pair:") == 2 and text.count("qwen2.5-coder-0.5b-1.5b") == 1
    assert "task: wmt19_zh_en v2 (subset paper), limit 6" in text and "budget 8 new tokens" in text
    assert "CPU kernel panel-avx512-bf16" in text and "| draft int8row |" in text and "k=2" in text
    assert "draftint8row" not in text                               # a flag every row shares is said once
    row = {line.split()[0] + (" " + line.split()[1] if line.startswith("mars") else ""): line
           for line in lines if line.startswith(("ar ", "sd ", "mars "))}
    assert len(lines) > 10 and set(row) == {"ar", "sd", "mars θ=0.9"}


def test_cells_by_hand(fixture_runs):
    text = render(fixture_runs)
    sd = next(line for line in text.splitlines() if line.startswith("sd "))
    mars = next(line for line in text.splitlines() if line.startswith("mars θ=0.9"))
    # test_report: sd speedup 20/11 = 1.82 with paired-bootstrap CI [4/3, 2]; tau 2; tokens/s 4
    assert "1.82× [1.33, 2.00]" in sd and sd.split()[1:4] == ["3", "4.00", "2.00"]
    # mars th0.9: speedup 2.5 [2, 4]; delta vs ar -1/3 with McNemar p = 1; 1 of 3 outputs identical to ar
    assert "2.50× [2.00, 4.00]" in mars and "-0.333 [" in mars and "1.000" in mars and mars.endswith("33%")
    assert "mars θ=0.8" not in text and "1 more run(s) at other θ values" in text
    # every sample of the fixture stopped at max_new_tokens = 8: flagged once, naming each run
    assert text.count("⚠ samples stopped at max_new_tokens=8") == 1 and "mars θ=0.9 100%" in text
    verdict = {True: "yes", False: "no", None: "–"}                  # the report's own paired tests (stats)
    for line, tag in ((sd, "sd-k2-T0-p1-n8-s0"), (mars, "mars-k2-th0.9-T0-p1-n8-s0")):
        run = fixture_runs[fixture_runs["tag"] == tag].iloc[0]
        assert line.split()[-2] == verdict[run["vs_ar/accuracy_strict/ni_passes"]]


def test_noninferiority_column(fixture_runs):
    text = render(realistic_group(fixture_runs))
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("ar ", "sd ", "mars "))}
    assert "non-inf." in text and rows["sd"].split()[-2] == "yes" and rows["mars"].split()[-2] == "no"
    assert "-1.2 [-12.3, +11.0]" in rows["mars"] and "0.432" in rows["mars"]   # BLEU scale: one decimal
    assert "⚠ samples stopped" not in text


def test_cli_prints_the_console_table_when_not_a_terminal(tmp_path, capsys, fixture_runs):
    assert main([str(FIX), "--out", str(tmp_path / "rep"), "--no-figures"]) == 0
    out, _ = capsys.readouterr()
    assert out == render(fixture_runs)
    buf = io.StringIO()                                              # not a tty: the same plain text
    from mars_bench.report.console import print_console

    print_console(fixture_runs, file=buf)
    assert buf.getvalue() == out and "\x1b[" not in out
