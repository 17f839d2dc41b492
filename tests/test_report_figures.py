"""Quality panels of the theta and rules figures draw what the statistics test: the paired Δ vs ar with
its CI, ar at 0, the non-inferiority margin at -margin, and the most aggressive θ that passes it.
Runs: the hand-made results tree tests/fixtures/results (tests/test_report.py derives its numbers)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from mars_bench.report import load_frames
from mars_bench.report.figures import rules_frontier, speedup_tau, theta_sensitivity

FIX = Path(__file__).resolve().parent / "fixtures" / "results"
METRIC = "accuracy_strict"
MARGIN = 0.05


@pytest.fixture(scope="module")
def group():
    return load_frames(FIX).runs


def with_verdicts(runs, passing: set[float]):
    """A copy whose paired tests carry a non-inferiority verdict: passes for the thetas in ``passing``."""
    out = runs.copy()
    tested = out[f"vs_ar/{METRIC}/n"].notna()
    verdict = {"margin_rel": 0.075, "margin": MARGIN, "bound": -0.01, "p_value": 0.01, "note": None}
    for k, v in verdict.items():
        out[f"vs_ar/{METRIC}/ni_{k}"] = [v if t else None for t in tested]
    out[f"vs_ar/{METRIC}/ni_passes"] = [(th in passing) if t else None for th, t in zip(out["theta"], tested)]
    out[f"vs_ar/{METRIC}/ni_n"] = out[f"vs_ar/{METRIC}/n"]
    return out


def line_by_label(ax, start: str):
    return [ln for ln in ax.get_lines() if ln.get_label().startswith(start)]


def deltas(runs):
    return {r["theta"]: r[f"vs_ar/{METRIC}/delta"] for _, r in runs.iterrows() if r["relaxed"]}


def test_theta_quality_panel_draws_paired_deltas_and_margin(group):
    runs = with_verdicts(group, passing={0.9})
    fig = theta_sensitivity(runs)
    ax = fig.axes[2]
    # mars th0.9 vs ar (test_report): strict answers discordant 0/1 over 3 samples -> delta -1/3
    assert deltas(runs)[0.9] == pytest.approx(-1 / 3)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    (mars,) = [c for c in bars if c.get_label().startswith("mars")]
    xs, ys = mars.lines[0].get_data()
    assert dict(zip(xs, ys)) == pytest.approx(deltas(runs))                   # deltas, not absolute quality
    segs = {round(s[0][0], 6): (s[0][1], s[1][1]) for s in mars.lines[2][0].get_segments()}
    t9 = runs[runs["theta"] == 0.9].iloc[0]
    assert segs[0.9] == pytest.approx((t9[f"vs_ar/{METRIC}/delta_lo"], t9[f"vs_ar/{METRIC}/delta_hi"]))  # its paired CI
    (zero,) = line_by_label(ax, "ar (Δ = 0)")
    (margin,) = line_by_label(ax, "non-inferiority margin")
    assert list(zero.get_ydata()) == [0.0, 0.0] and list(margin.get_ydata()) == pytest.approx([-MARGIN, -MARGIN])
    (sd,) = line_by_label(ax, "sd k=2 (lossless)")                          # sd: same answers as ar
    assert list(sd.get_ydata()) == [0.0, 0.0]
    assert "Δ accuracy_strict vs ar" in ax.get_ylabel()


@pytest.mark.parametrize("passing, marked", [({0.9}, 0.9), ({0.8, 0.9}, 0.8), (set(), None)])
def test_most_aggressive_passing_theta_is_marked(group, passing, marked):
    runs = with_verdicts(group, passing)
    ax = theta_sensitivity(runs).axes[2]
    rings = [c for c in ax.collections if c.get_label() == "most aggressive θ passing non-inferiority"]
    if marked is None:
        assert rings == []
    else:
        (ring,) = rings
        assert ring.get_offsets()[0].tolist() == pytest.approx([marked, deltas(runs)[marked]])


def test_theta_panel_without_verdicts_draws_no_margin(group):
    runs = group.drop(columns=[c for c in group.columns if "/ni_" in c])   # summaries before the verdict existed
    ax = theta_sensitivity(runs).axes[2]
    assert line_by_label(ax, "ar (Δ = 0)") and not line_by_label(ax, "non-inferiority margin")


def test_rules_frontier_quality_panel_is_the_paired_delta(group):
    runs = with_verdicts(group, passing={0.9})
    prob = runs[runs["relaxed"]].copy()                          # the same runs as if verified by mars_prob
    prob["rule"], prob["method"], prob["run"] = "mars_prob", "sd+mars_prob", prob["run"] + "+mars_prob"
    prob["family"] = "sd+mars_prob " + prob["family"].str.removeprefix("mars ")
    fig = rules_frontier(pd.concat([runs, prob], ignore_index=True))
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and "mars" in c.get_label()]
    assert len(bars) == 2
    speed = {r["theta"]: r["speedup"] for _, r in runs.iterrows() if r["relaxed"]}
    for c in bars:
        xs, ys = c.lines[0].get_data()
        points, expected = sorted(zip(xs, ys)), sorted((speed[t], d) for t, d in deltas(runs).items())
        assert len(points) == len(expected) == 2 and all(p == pytest.approx(e) for p, e in zip(points, expected))
    (margin,) = line_by_label(ax, "non-inferiority margin")
    assert list(margin.get_ydata()) == pytest.approx([-MARGIN, -MARGIN])
    assert "Δ accuracy_strict vs ar" in ax.get_ylabel()


def test_speedup_marker_is_the_authors_formula(group):
    ax = speedup_tau(group.copy()).axes[0]
    (marks,) = [c for c in ax.collections if "authors' formula" in c.get_label()]
    by_label = {r["label"]: r for _, r in group.iterrows()}
    order = [t.get_text().split("\n")[0] for t in speedup_tau(group).axes[1].get_xticklabels()]
    expected = [1.0 if by_label[lab]["method"] == "ar" else by_label[lab]["speedup_authors"] for lab in order]
    assert marks.get_offsets()[:, 1].tolist() == pytest.approx(expected)
