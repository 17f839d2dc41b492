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


def test_the_n_to_decide_gives_the_stated_power_by_monte_carlo():
    """n_to_decide from a pilot's estimate and 95% interval: at that n, a paired t-test (scipy) on fresh samples whose
    true mean is the pilot's estimate rejects the null in ~80% of 4,000 simulated studies; for a ratio (log scale,
    null 1) the same."""
    import math

    import numpy as np
    from scipy import stats

    from mars_bench.report.claims import n_to_decide

    rng = np.random.default_rng(0)
    for log, effect, null, sd in ((False, 0.3, 0.0, 1.0), (False, -0.05, 0.02, 0.2), (True, 1.08, 1.0, 0.25)):
        n = 40
        centre = math.log(effect) if log else effect
        half = 1.959964 * sd / math.sqrt(n)       # the pilot's 95% interval for a known sd
        lo, hi = ((math.exp(centre - half), math.exp(centre + half)) if log else (centre - half, centre + half))
        need = math.ceil(n_to_decide(n, effect, lo, hi, null, log=log))
        x = rng.normal(centre, sd, size=(4000, need))
        p = stats.ttest_1samp(x, math.log(null) if log else null, axis=1).pvalue
        power = float(np.mean(p < 0.05))
        assert 0.76 < power < 0.84, (log, effect, need, power)
        assert n_to_decide(n, effect, lo, hi, null, log=log) > n    # none of these is decided at the pilot's n


def test_the_n_to_decide_is_none_without_an_interval_and_inf_at_the_null():
    import math

    from mars_bench.report.claims import n_to_decide

    assert n_to_decide(10, 0.5, None, 0.7) is None and n_to_decide(None, 0.5, 0.3, 0.7) is None
    assert math.isinf(n_to_decide(10, 1.0, 0.9, 1.1, 1.0, log=True))
    assert n_to_decide(10, 1.0, 0.9, 1.1, 0.0, log=True) is None     # no log of a null of 0


def test_an_undecided_quality_claim_says_the_n_that_decides_its_margin():
    """Δ BLEU -1.0 [-3.0, +1.0] at n 100 against a 0.5 margin: SE 2.0 / 1.96, distance to the margin 0.5, so
    n' = 100 (2.8016 x 1.0204 / 0.5)^2 = 3,269.1 -> ~3,270; a non-inferior or refuted claim says no n; a
    lower-is-better metric measures its distance to +margin."""
    from mars_bench.report.claims import quality_verdict

    def row(d, lo, hi, margin=0.5, ni=False, direction="higher"):
        return {"vs_ar/bleu/delta": d, "vs_ar/bleu/delta_lo": lo, "vs_ar/bleu/delta_hi": hi, "vs_ar/bleu/p_value": 0.3,
                "vs_ar/bleu/mde": 2.86, "vs_ar/bleu/ni_margin": margin, "vs_ar/bleu/ni_passes": ni,
                "vs_ar/bleu/n": 100, "metric_directions": {"bleu": direction}}

    verdict, ev = quality_verdict(row(-1.0, -3.0, 1.0), "bleu")
    assert verdict.startswith("no change"), verdict
    assert ev.endswith("at n ~3,270 if the estimate is the effect (32.7x this n)"), ev
    assert "decided with" not in quality_verdict(row(0.1, -0.2, 0.4, ni=True), "bleu")[1]
    assert "decided with" not in quality_verdict(row(-3.0, -4.0, -2.0), "bleu")[1]     # refuted
    ev = quality_verdict(row(1.0, -1.0, 3.0, direction="lower"), "bleu")[1]           # distance 0.5 to +0.5
    assert "n ~3,270 " in ev, ev
