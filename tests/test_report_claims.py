"""claims.trend: a trend is worded only as far as the intervals go (ends, every step, refuted, not resolved), and
non-monotone point estimates are said."""
from __future__ import annotations

from mars_bench.report.claims import trend


def _rows(*values):
    """(theta, value, half-width) -> rows as the study frames hold them."""
    return [{"theta": th, "x": v, "x_lo": v - w, "x_hi": v + w} for th, v, w in values]


def test_every_step_resolved():
    verdict, ev = trend(_rows((0.96, 1.0, 0.1), (0.9, 2.0, 0.1), (0.84, 3.0, 0.1)), "x")
    assert verdict == "resolved at every step" and "not monotone" not in ev


def test_ends_only_and_non_monotone_middle():
    verdict, ev = trend(_rows((0.96, 1.0, 0.1), (0.9, 2.5, 0.8), (0.88, 2.6, 0.8), (0.84, 2.4, 0.1)), "x")
    assert verdict == "resolved between the ends"
    assert "not monotone in θ (θ 0.84 vs 0.88)" in ev and "3 of 3 neighbouring steps not resolved" not in ev


def test_overlapping_ends_are_not_resolved_and_the_reverse_is_refuted():
    assert trend(_rows((0.96, 1.0, 0.5), (0.84, 1.4, 0.5)), "x")[0] == "not resolved"
    assert trend(_rows((0.96, 2.0, 0.1), (0.84, 1.0, 0.1)), "x")[0] == "refuted"
    # a loss that grows: the value falls as θ falls
    assert trend(_rows((0.96, -1.0, 0.1), (0.84, -3.0, 0.1)), "x", rising=False)[0] == "resolved at every step"


def test_missing_intervals_never_resolve():
    rows = [{"theta": 0.96, "x": 1.0}, {"theta": 0.84, "x": 3.0}]
    assert trend(rows, "x")[0] == "not resolved"
