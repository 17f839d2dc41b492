"""Uncertainty, computed once: confidence intervals (CI), paired tests and minimum detectable effects (MDE).

The one statistics module of mars-bench: ``summary.py`` stores its results in ``summary.json``; the report,
the notebook and W&B read them (the report calls it only for old results that lack them). Pure functions
over numpy arrays / lists. Every result is a plain dict:

    estimate: {value, lo, hi, n, level, method, note}
    test:     {value, value_lo, value_hi, base, base_lo, base_hi, delta, lo, hi, p_value, mde, n, level,
               test, note}          (value = the method's, base = the baseline's, delta = value - base)

Degenerate input (n = 0, n = 1, a statistic equal in every resample) gives ``note`` and None bounds,
never an exception or a NaN. All intervals are two-sided at ``level``; tests are two-sided at
alpha = 1 - level. Percentile bootstrap: lo, hi = the alpha/2 and 1 - alpha/2 quantiles of the statistic
over ``n_boot`` resamples of sample ids (with replacement), drawn once per run from ``seed``.

Non-inferiority (``noninferiority`` inside every paired quality test): the margin is declared before
looking, relative to the baseline's score: margin = ni_margin * |base| (default 0.02: the method keeps
>= 98 % of the baseline's score, FLy's retention convention). H0: the method is worse by margin or more.
The one-sided (1 - alpha) bound of delta on the worse side is the matching end of the two-sided interval
at level 1 - 2 alpha built by the same machinery as the test's CI (Newcombe's paired score interval for
binary scores; the percentile of the paired bootstrap, or of sacrebleu's paired resamples, otherwise);
passes = bound > -margin (higher is better; for lower-is-better metrics bound is the upper end and passes =
bound < margin). The one-sided p-value inverts that same interval: for the bootstrap, the share of
resampled deltas at or beyond the margin, (1 + #{delta* <= -margin}) / (n_boot + 1); for Newcombe, the
tail level t at which the interval's end equals -margin. So p < alpha when the bound clears the margin
(exactly for Newcombe; up to one resample for the bootstrap).
    noninferiority: {margin_rel, margin, bound, p_value, passes, n, level, method, note}
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np


@dataclass(frozen=True)
class StatsSettings:
    n_boot: int = 10_000   # bootstrap resamples per interval (sacrebleu's paired test uses as many)
    seed: int = 0          # seed of the resampling generator: every statistic of a run sees the same ids
    level: float = 0.95    # confidence level of every interval; tests are at alpha = 1 - level
    power: float = 0.8     # power at which the MDE is computed
    ni_margin: float = 0.02   # non-inferiority margin, relative to the baseline's score (keeps >= 98 %)

    def __post_init__(self):
        if isinstance(self.n_boot, bool) or not isinstance(self.n_boot, int) or self.n_boot < 100:
            raise ValueError(f"stats.n_boot={self.n_boot!r}; allowed: an integer >= 100")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"stats.seed={self.seed!r}; allowed: an integer >= 0")
        for name in ("level", "power", "ni_margin"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"stats.{name}={v!r}; allowed: a number in (0, 1)")

    @property
    def alpha(self) -> float:
        return 1.0 - self.level

    @classmethod
    def from_cfg(cls, cfg=None) -> "StatsSettings":
        """From ``cfg.stats`` (a Hydra group built from this dataclass) when present, else the defaults."""
        node = cfg.get("stats") if cfg is not None and hasattr(cfg, "get") else None
        if node is None:
            return cls()
        known = {f.name for f in fields(cls)}
        items = dict(node.items()) if hasattr(node, "items") else {}
        bad = sorted(set(items) - known)
        if bad:
            raise ValueError(f"unknown key stats.{bad[0]}; allowed: {', '.join(sorted(known))}")
        return cls(**items)

    def as_dict(self) -> dict:
        return asdict(self)


def _z(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def mde(se: float | None, settings: StatsSettings) -> float | None:
    """Minimum detectable effect: MDE = (z_{1-alpha/2} + z_{power}) * SE of the paired difference
    (two-sided test at alpha = 1 - level; 0.05 and 0.8 give 2.80 * SE). None when SE is None."""
    if se is None or not math.isfinite(se):
        return None
    return (_z(1 - settings.alpha / 2) + _z(settings.power)) * float(se)


def _few(n: int) -> str | None:
    if n == 0:
        return "n = 0: no samples, no interval"
    if n == 1:
        return "n = 1: one sample, no interval"
    return None


def _estimate(value, n, settings, method, lo=None, hi=None, note=None) -> dict:
    value = None if value is None or not math.isfinite(value) else float(value)
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return {"value": value, "lo": float(lo) if ok else None, "hi": float(hi) if ok else None, "n": int(n),
            "level": settings.level, "method": method, "note": note}


# ---- bootstrap over sample ids ---------------------------------------------------------------------
def resample_sums(columns: np.ndarray, settings: StatsSettings, chunk: int = 1000) -> np.ndarray:
    """(n_boot, k) sums of the k columns of ``columns`` (n, k) over resampled ids: row b is
    sum_i c_bi * x_i with c_b the counts of a draw of n ids with replacement. Same seed, same ids."""
    x = np.asarray(columns, dtype=float)
    n = x.shape[0]
    rng = np.random.default_rng(settings.seed)
    out = np.empty((settings.n_boot, x.shape[1]))
    for start in range(0, settings.n_boot, chunk):
        m = min(chunk, settings.n_boot - start)
        idx = rng.integers(0, n, size=(m, n)) + (np.arange(m) * n)[:, None]
        counts = np.bincount(idx.ravel(), minlength=m * n).reshape(m, n)
        out[start:start + m] = counts @ x
    return out


def _percentile(boot: np.ndarray, point: float, n: int, settings: StatsSettings, method: str) -> dict:
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return _estimate(point, n, settings, method, note="no finite resample (zero denominators)")
    if np.ptp(boot) <= 1e-12 * max(1.0, abs(point)):
        return _estimate(point, n, settings, method,
                         note=f"the statistic is the same in every resample (all {n} samples alike): no interval")
    lo, hi = np.quantile(boot, [settings.alpha / 2, 1 - settings.alpha / 2])
    return _estimate(point, n, settings, method, lo, hi)


def ratio_ci(num, den, settings: StatsSettings) -> dict:
    """sum(num) / sum(den) over samples (tau = tokens / steps, tokens/s = tokens / wall s), with its
    percentile-bootstrap CI: the ratio of sums recomputed on each resample of sample ids."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    n = len(num)
    point = num.sum() / den.sum() if n and den.sum() else float("nan")
    if _few(n):
        return _estimate(point, n, settings, "bootstrap percentile", note=_few(n))
    s = resample_sums(np.column_stack([num, den]), settings)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _percentile(s[:, 0] / s[:, 1], point, n, settings, "bootstrap percentile")


def speedup_ci(tokens, wall, ar_tokens, ar_wall, settings: StatsSettings) -> dict:
    """speedup = (sum tokens / sum wall)_method / (sum tokens / sum wall)_ar over the paired samples
    (row i of every array = the same sample id), CI by paired bootstrap: each resample of ids recomputes
    both ratios of sums on the same ids."""
    x = np.column_stack([np.asarray(a, float) for a in (tokens, wall, ar_tokens, ar_wall)]) if len(tokens) \
        else np.zeros((0, 4))
    n = x.shape[0]
    t = x.sum(0)
    point = (t[0] / t[1]) / (t[2] / t[3]) if n and t[1] and t[2] and t[3] else float("nan")
    if _few(n):
        return _estimate(point, n, settings, "paired bootstrap percentile", note=_few(n))
    s = resample_sums(x, settings)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _percentile((s[:, 0] / s[:, 1]) / (s[:, 2] / s[:, 3]), point, n, settings,
                           "paired bootstrap percentile")


def speedup_authors_ci(tokens, wall, ar_tokens, ar_wall, settings: StatsSettings) -> dict:
    """The authors' speedup (5SSjw/MARS, mars/evaluation/speed.py): mean over samples of the method's
    tokens/s divided by the mean over samples of ar's tokens/s, a ratio of means (the caller counts ar's
    tokens their way). Row i of every array = the same sample id; pairs where either wall time is 0 are
    left out (their scripts skip wall_time 0). CI by paired bootstrap: both means on the same resampled ids."""
    x = np.column_stack([np.asarray(a, float) for a in (tokens, wall, ar_tokens, ar_wall)]) if len(tokens) \
        else np.zeros((0, 4))
    x = x[(x[:, 1] > 0) & (x[:, 3] > 0)]
    rates = np.column_stack([x[:, 0] / x[:, 1], x[:, 2] / x[:, 3]])
    n = rates.shape[0]
    point = rates[:, 0].mean() / rates[:, 1].mean() if n and rates[:, 1].sum() else float("nan")
    if _few(n):
        return _estimate(point, n, settings, "paired bootstrap percentile", note=_few(n))
    s = resample_sums(rates, settings)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _percentile(s[:, 0] / s[:, 1], point, n, settings, "paired bootstrap percentile")


def mean_ci(x, settings: StatsSettings) -> dict:
    """Mean with its percentile-bootstrap CI (e.g. sentence chrF of each output against ar's)."""
    x = np.asarray(x, float)
    n = len(x)
    point = x.mean() if n else float("nan")
    if _few(n):
        return _estimate(point, n, settings, "bootstrap percentile", note=_few(n))
    return _percentile(resample_sums(x[:, None], settings)[:, 0] / n, point, n, settings, "bootstrap percentile")


def log_ratio_t_ci(ratios, settings: StatsSettings) -> dict:
    """Geometric mean of ``ratios`` (one per repeated round, e.g. a throughput ratio measured R times) with the
    t-interval of their logs: exp(mean(log r) -+ t_{n-1, 1-alpha/2} * sd(log r) / sqrt(n)), an interval over
    rounds (not samples), which holds whatever the requests of one round share (a call's wall time). Fewer than
    2 rounds: no interval (note)."""
    from scipy.stats import t

    x = np.log(np.asarray(ratios, float))
    n = len(x)
    method = "t-interval on log ratios over rounds"
    point = float(np.exp(x.mean())) if n else None
    if n < 2:
        return _estimate(point, n, settings, method, note=f"n = {n} round{'s' if n != 1 else ''}: no interval")
    half = float(t.ppf(1 - settings.alpha / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    if half <= 0:
        return _estimate(point, n, settings, method, note=f"the same ratio in all {n} rounds: no interval")
    return _estimate(point, n, settings, method, math.exp(x.mean() - half), math.exp(x.mean() + half))


def proportion_ci(k: int, n: int, settings: StatsSettings) -> dict:
    """k / n with the Wilson score interval (scipy). Used for shares such as 'identical to ar', where a
    bootstrap degenerates at 0 % and 100 %."""
    from scipy.stats import binomtest

    if _few(n):
        return _estimate(k / n if n else None, n, settings, "Wilson score", note=_few(n))
    ci = binomtest(int(k), int(n)).proportion_ci(settings.level, method="wilson")
    return _estimate(k / n, n, settings, "Wilson score", ci.low, ci.high)


# ---- paired quality tests --------------------------------------------------------------------------
def _test(value, base, delta, n, settings, test, lo=None, hi=None, p=None, se=None, note=None,
          value_ci=(None, None), base_ci=(None, None)) -> dict:
    e = _estimate(delta, n, settings, test, lo, hi, note)
    fin = lambda v: None if v is None or not math.isfinite(v) else float(v)  # noqa: E731
    return {"value": fin(value), "value_lo": fin(value_ci[0]), "value_hi": fin(value_ci[1]),
            "base": fin(base), "base_lo": fin(base_ci[0]), "base_hi": fin(base_ci[1]),
            "delta": e["value"], "lo": e["lo"], "hi": e["hi"], "p_value": fin(p),
            "mde": fin(mde(se, settings)) if se is not None and se > 0 else None,
            "n": int(n), "level": settings.level, "test": test, "note": note}


def _ni(base, n, settings, higher, method, bound=None, p=None, note=None) -> dict:
    """The ``noninferiority`` dict of a paired test (see the module doc); note says why passes is None."""
    margin = None if base is None or not math.isfinite(base) else settings.ni_margin * abs(float(base))
    if note is None and margin is None:
        note = "no baseline score: no margin"
    ok = note is None and bound is not None and p is not None
    passes = (bool(bound > -margin) if higher else bool(bound < margin)) if ok else None
    return {"margin_rel": settings.ni_margin, "margin": margin, "bound": float(bound) if ok else None,
            "p_value": float(p) if ok else None, "passes": passes, "n": int(n), "level": settings.level,
            "method": method, "note": note}


def _one_sided_level(settings: StatsSettings) -> str | None:
    return None if settings.level > 0.5 else f"stats.level={settings.level} <= 0.5: no one-sided bound"


def ni_bootstrap(dif, base, n, settings: StatsSettings, higher: bool = True,
                 method: str = "paired bootstrap percentile") -> dict:
    """Non-inferiority from resampled deltas ``dif``: bound = their alpha (higher is better) or 1 - alpha
    quantile, p = (1 + #{resamples at or beyond the margin on the worse side}) / (resamples + 1)."""
    dif = np.asarray(dif, float)
    dif = dif[np.isfinite(dif)]
    note = _few(n) or _one_sided_level(settings) or (None if dif.size else "no finite resample")
    if note or base is None:
        return _ni(base, n, settings, higher, method, note=note)
    margin = settings.ni_margin * abs(float(base))
    bound = np.quantile(dif, settings.alpha if higher else 1 - settings.alpha)
    worse = np.sum(dif <= -margin) if higher else np.sum(dif >= margin)
    return _ni(base, n, settings, higher, method, bound, (1 + worse) / (dif.size + 1))


def ni_newcombe(a: int, b: int, c: int, d: int, settings: StatsSettings, higher: bool = True) -> dict:
    """Non-inferiority of paired binary scores: bound = the lower (higher is better) or upper end of
    Newcombe's paired interval at level 1 - 2 alpha; p = the tail level t at which the interval's end
    reaches the margin (``_newcombe_cdf``), i.e. the interval inverted."""
    from scipy.optimize import brentq

    n = a + b + c + d
    base = (a + c) / n if n else None
    method = "Newcombe paired score bound"
    note = _few(n) or _one_sided_level(settings)
    if note:
        return _ni(base, n, settings, higher, method, note=note)
    margin = settings.ni_margin * base
    target = -margin if higher else margin
    lo, hi = newcombe_paired(a, b, c, d, 1 - 2 * settings.alpha)
    cdf = lambda t: _newcombe_cdf(a, b, c, d, t) - target  # noqa: E731
    eps = 1e-12
    if cdf(eps) >= 0:
        t = eps
    elif cdf(1 - eps) <= 0:
        t = 1 - eps
    else:
        t = brentq(cdf, eps, 1 - eps, xtol=1e-12)
    return _ni(base, n, settings, higher, method, lo if higher else hi, t if higher else 1 - t)


def _newcombe_cdf(a: int, b: int, c: int, d: int, t: float) -> float:
    """The end of Newcombe's interval with tail t below it: the lower end at level 1 - 2t (t < 1/2), the
    upper end at level 2t - 1 (t > 1/2), the point estimate at t = 1/2; increasing in t."""
    if abs(t - 0.5) < 1e-15:
        return (b - c) / (a + b + c + d)
    lo, hi = newcombe_paired(a, b, c, d, abs(1 - 2 * t))
    return lo if t < 0.5 else hi


def newcombe_paired(a: int, b: int, c: int, d: int, level: float) -> tuple[float, float]:
    """Newcombe's (1998, method 10) hybrid score interval for p1 - p2 with paired binary data.
    Table: a = both 1, b = method 1 / base 0, c = method 0 / base 1, d = both 0; n = a+b+c+d;
    p1 = (a+b)/n, p2 = (a+c)/n, D = p1 - p2 = (b-c)/n; [l_i, u_i] the Wilson intervals of p_i;
    phi = C / sqrt((a+b)(c+d)(a+c)(b+d)) with C = ad-bc - n/2 if ad-bc > n/2, ad-bc if ad-bc < 0, else 0
    (phi = 0 when a margin is empty);
    lo = D - sqrt((p1-l1)^2 - 2 phi (p1-l1)(u2-p2) + (u2-p2)^2),
    hi = D + sqrt((p2-l2)^2 - 2 phi (p2-l2)(u1-p1) + (u1-p1)^2)."""
    from scipy.stats import binomtest

    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    w1 = binomtest(a + b, n).proportion_ci(level, method="wilson")
    w2 = binomtest(a + c, n).proportion_ci(level, method="wilson")
    l1, u1, l2, u2 = w1.low, w1.high, w2.low, w2.high
    marg = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    cc = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = cc / math.sqrt(marg) if marg > 0 else 0.0
    dd = p1 - p2
    lo = dd - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = dd + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return max(-1.0, lo), min(1.0, hi)


def binary_delta(method, base, settings: StatsSettings, higher: bool = True) -> dict:
    """Paired binary scores (GSM8K correct, HumanEval passed at greedy): delta = mean(method) - mean(base),
    CI by Newcombe's paired hybrid score interval (``newcombe_paired``), exact McNemar p-value
    = scipy.stats.binomtest(b, b + c, 0.5) on the discordant counts (1.0 when b + c = 0).
    MDE: SE = sqrt(((b+c)/n - ((b-c)/n)^2) / n); with no discordant pair the discordance share
    (b+c)/n is replaced by 3/n (the 'rule of three' 95 % upper bound on a share seen 0 times in n),
    i.e. SE = sqrt(3) / n, so that a null result still states the loss this n could have seen.
    An MDE above 1 (tiny n) is reported as None with a note: no difference in a share is detectable.
    ``noninferiority``: ``ni_newcombe`` (``higher``: the metric's direction)."""
    from scipy.stats import binomtest

    x, y = np.asarray(method, int), np.asarray(base, int)
    n = len(x)
    value, base_v = (x.mean(), y.mean()) if n else (None, None)
    if _few(n):
        return {**_test(value, base_v, (value - base_v) if n else None, n, settings, "McNemar exact",
                        note=_few(n)), "noninferiority": _ni(base_v, n, settings, higher, "Newcombe paired score bound",
                                                   note=_few(n))}
    a, b = int(np.sum((x == 1) & (y == 1))), int(np.sum((x == 1) & (y == 0)))
    c, d = int(np.sum((x == 0) & (y == 1))), int(np.sum((x == 0) & (y == 0)))
    p = binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
    lo, hi = newcombe_paired(a, b, c, d, settings.level)
    share = (b + c) / n if b + c else 3.0 / n
    se = math.sqrt(max(0.0, share - ((b - c) / n) ** 2) / n)
    vc, bc = proportion_ci(a + b, n, settings), proportion_ci(a + c, n, settings)
    notes = ([] if b + c else ["no discordant pair (McNemar p = 1)"]) + (
        [f"n = {n} is too small to detect any difference in a share (MDE > 1)"] if mde(se, settings) > 1 else [])
    out = _test(value, base_v, (b - c) / n, n, settings, "McNemar exact; Newcombe paired score CI", lo, hi, p,
                se, "; ".join(notes) or None, (vc["lo"], vc["hi"]), (bc["lo"], bc["hi"]))
    if out["mde"] is not None and out["mde"] > 1:
        out["mde"] = None
    return {**out, "discordant": [b, c], "noninferiority": ni_newcombe(a, b, c, d, settings, higher)}


def mean_delta(method, base, settings: StatsSettings, higher: bool = True) -> dict:
    """Paired real scores (MT-Bench judge score per sample): delta = mean(method - base), CI by paired
    bootstrap percentile of the mean difference; p-value of the shifted bootstrap,
    p = (1 + #{|delta* - delta| >= |delta|}) / (n_boot + 1); MDE with SE = sd(differences) / sqrt(n).
    ``noninferiority``: ``ni_bootstrap`` on the same resampled mean differences."""
    x, y = np.asarray(method, float), np.asarray(base, float)
    n = len(x)
    dif = x - y
    value, base_v, delta = (x.mean(), y.mean(), dif.mean()) if n else (None, None, None)
    if _few(n):
        return {**_test(value, base_v, delta, n, settings, "paired bootstrap", note=_few(n)),
                "noninferiority": _ni(base_v, n, settings, higher, "paired bootstrap percentile", note=_few(n))}
    s = resample_sums(np.column_stack([x, y, dif]), settings) / n
    est = _percentile(s[:, 2], delta, n, settings, "paired bootstrap")
    if est["note"]:
        return {**_test(value, base_v, delta, n, settings, "paired bootstrap", note=est["note"]),
                "noninferiority": _ni(base_v, n, settings, higher, "paired bootstrap percentile", note=est["note"])}
    p = (1 + np.sum(np.abs(s[:, 2] - delta) >= abs(delta))) / (settings.n_boot + 1)
    q = [settings.alpha / 2, 1 - settings.alpha / 2]
    return {**_test(value, base_v, delta, n, settings, "paired bootstrap", est["lo"], est["hi"], p,
                    float(dif.std(ddof=1) / math.sqrt(n)), value_ci=np.quantile(s[:, 0], q),
                    base_ci=np.quantile(s[:, 1], q)),
            "noninferiority": ni_bootstrap(s[:, 2], base_v, n, settings, higher)}


def corpus_delta(method_hyps: list[str], base_hyps: list[str], references: list[str],
                 settings: StatsSettings, higher: bool = True) -> dict[str, dict]:
    """BLEU and chrF of ``method_hyps`` vs ``base_hyps`` (same segments, same order) by sacrebleu's own
    paired bootstrap: ``PairedTest(..., test_type="bs", n_samples=n_boot)`` gives each score, each
    system's CI (its resample mean +- half-width) and the p-value. PairedTest does not return the
    resampled differences, so the delta CI comes from sacrebleu's ``_bootstrap_resample`` on each
    system's sufficient statistics: with sacrebleu's seed (``$SACREBLEU_SEED``, default 12345; our
    ``seed`` does not reach it) both systems get the very resampled segments PairedTest used, and
    lo, hi are the percentiles of the paired differences; MDE with SE = sd of those differences.
    ``noninferiority``: ``ni_bootstrap`` on those paired differences (``higher``: both metrics' direction)."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest, _bootstrap_resample

    n = len(method_hyps)
    out = {}
    metrics = {"bleu": BLEU(), "chrf": CHRF()}
    if _few(n) or list(method_hyps) == list(base_hyps):
        note = _few(n) or f"all {n} hypotheses equal the baseline's: delta is 0, no interval"
        for name, m in metrics.items():
            v = m.corpus_score(list(method_hyps), [list(references)]).score if n else None
            out[name] = {**_test(v, v, 0.0 if n else None, n, settings, "sacrebleu paired bootstrap", note=note),
                         "noninferiority": _ni(v, n, settings, higher, "sacrebleu paired bootstrap percentile",
                                               note=note)}
        return out
    _, scores = PairedTest([("base", list(base_hyps)), ("method", list(method_hyps))], metrics=metrics,
                           references=[list(references)], test_type="bs", n_samples=settings.n_boot)()
    q = [settings.alpha / 2, 1 - settings.alpha / 2]
    for (name, metric), key in zip(metrics.items(), [k for k in scores if k != "System"]):
        base_r, sys_r = scores[key]
        boot = [np.array([s.score for s in _bootstrap_resample(
            metric._extract_corpus_statistics(h, [list(references)]), metric, settings.n_boot)[1]])
            for h in (list(base_hyps), list(method_hyps))]
        dif = boot[1] - boot[0]
        est = _percentile(dif, sys_r.score - base_r.score, n, settings, "sacrebleu paired bootstrap")
        out[name] = {**_test(sys_r.score, base_r.score, sys_r.score - base_r.score, n, settings,
                             "sacrebleu paired bootstrap", est["lo"], est["hi"],
                             None if est["note"] else sys_r.p_value,   # sacrebleu says p = 1/(B+1) then
                             float(dif.std(ddof=1)), est["note"],
                             np.quantile(boot[1], q), np.quantile(boot[0], q)),
                     "sacrebleu_mean": sys_r.mean, "sacrebleu_ci": sys_r.ci,
                     "noninferiority": ni_bootstrap(dif, base_r.score, n, settings, higher,
                                                    "sacrebleu paired bootstrap percentile")}
    return out


def corpus_ci(hyps: list[str], references: list[str], settings: StatsSettings) -> dict[str, dict]:
    """Corpus BLEU and chrF of one system with percentile CIs over sacrebleu's own bootstrap resamples
    (``_bootstrap_resample``, the function behind ``corpus_score(n_bootstrap=...)``; sacrebleu's seed)."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import _bootstrap_resample

    n, out = len(hyps), {}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        point = metric.corpus_score(list(hyps), [list(references)]).score if n else None
        if _few(n):
            out[name] = _estimate(point, n, settings, "sacrebleu bootstrap", note=_few(n))
            continue
        stats = metric._extract_corpus_statistics(list(hyps), [list(references)])
        boot = np.array([s.score for s in _bootstrap_resample(stats, metric, settings.n_boot)[1]])
        out[name] = _percentile(boot, point, n, settings, "sacrebleu bootstrap")
    return out


def reading(t: dict | None, direction: str = "higher") -> str | None:
    """One line for a quality test: a significant change, or 'no loss larger than MDE at n = N'."""
    if not t or t.get("delta") is None:
        return None
    if t.get("p_value") is not None and t["p_value"] < 1 - t["level"]:
        worse = (t["delta"] < 0) == (direction == "higher")
        return f"{'loss' if worse else 'gain'} of {abs(t['delta']):.3g} (p = {t['p_value']:.3g}, n = {t['n']})"
    if t.get("mde") is not None:
        return f"no loss larger than {t['mde']:.3g} at n = {t['n']}"
    note = f": {t['note']}" if t.get("note") else ""
    if t.get("p_value") is not None:
        return f"inconclusive at n = {t['n']} (p = {t['p_value']:.3g}){note}"
    return f"not tested at n = {t['n']}{note}"


def no_test(n: int, note: str, settings: StatsSettings, test: str = "none") -> dict:
    """A test that could not be run (e.g. no references for BLEU): the note says why."""
    return {**_test(None, None, None, n, settings, test, note=note),
            "noninferiority": _ni(None, n, settings, True, test, note=note)}
