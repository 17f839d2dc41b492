"""The paper's claims as a study's intervals resolve them, worded from the numbers, never beyond them.

    claims_table(runs)   per study group (``frames.study_groups``): for a θ sweep (>= 3 thetas of one lossy family)
                         'τ rises as θ falls', 'speedup rises as θ falls' (with and without the samples that hit
                         the budget) and 'the quality loss grows as θ falls'; per lossy method 'quality within the
                         non-inferiority margin'; per speculative method 'faster than ar'; per lossy method
                         'faster than sd' (its speed over its lossless reference, paired on the same timed
                         samples). Each row: the claim,
                         its n, the evidence (values and 95% CIs) and the verdict; an undecided claim's evidence
                         ends with the n that would decide it (``n_to_decide``).

Verdicts: a trend is 'resolved between the ends' when the intervals at the lowest and highest θ are disjoint in
the claimed direction, 'resolved at every step' when every neighbouring pair is, 'refuted' when the ends are
disjoint the other way, else 'not resolved'; the evidence says where the point estimates are not monotone. A
quality claim is 'non-inferior' (the one-sided bound clears the margin), 'refuted' (the whole interval lies beyond
the margin), 'loss resolved, margin not decided', or 'no change larger than the MDE at n'.

Sizing by power (``n_to_decide``): an interval's half-width shrinks as 1/sqrt(n), so an estimate d at distance
|d - null| from the value the claim must clear (0 for a Δ, 1 for a ratio on the log scale, minus the margin for
non-inferiority) is decided at the 5% level with 80% power at n' = n ((z_0.975 + z_0.8) SE / |d - null|)^2, SE =
the interval's half-width / z_0.975. It assumes the estimate is the true effect and the new samples are like the
old: at T = 1 another seed over the same prompts adds draws that share their prompt, so n' / n seeds is a lower
bound of the seeds needed.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from mars_bench.stats import StatsSettings, mde

from mars_bench.report.columns import val
from mars_bench.report.frames import headline, study_groups
from mars_bench.report.definitions import SPEED_DEFS
from mars_bench.report.writer import Table


def _ci(r, key: str, fmt: str = ".2f") -> str:
    v, lo, hi = val(r, key), val(r, key + "_lo"), val(r, key + "_hi")
    if v is None:
        return "–"
    return format(v, fmt) + (f" [{format(lo, fmt)}, {format(hi, fmt)}]" if lo is not None and hi is not None else "")


def trend(rs: list, key: str, rising: bool = True, fmt: str = ".2f") -> tuple[str, str]:
    """(verdict, evidence) for 'key rises as θ falls' (``rising``; else 'falls as θ falls') over rows sorted by
    θ descending, from their intervals (see the module doc)."""
    rs = [r for r in sorted(rs, key=lambda r: -r["theta"]) if val(r, key) is not None]
    if len(rs) < 2:
        return "not resolved", "fewer than two thetas with a value"
    sign = 1 if rising else -1

    def above(a, b) -> bool | None:   # b's interval wholly beyond a's in the claimed direction (None: no CI)
        if None in (val(a, key + "_lo"), val(a, key + "_hi"), val(b, key + "_lo"), val(b, key + "_hi")):
            return None
        return val(b, key + "_lo") > val(a, key + "_hi") if sign > 0 else val(b, key + "_hi") < val(a, key + "_lo")

    ends, back = above(rs[0], rs[-1]), above(rs[-1], rs[0])
    steps = [above(a, b) for a, b in zip(rs, rs[1:])]
    values = [val(r, key) for r in rs]
    monotone = all(sign * (b - a) > 0 for a, b in zip(values, values[1:]))
    evidence = "; ".join(f"θ {r['theta']:g}: {_ci(r, key, fmt)}" for r in rs)
    if not monotone:
        breaks = [f"θ {b['theta']:g} vs {a['theta']:g}" for a, b in zip(rs, rs[1:])
                  if sign * (val(b, key) - val(a, key)) <= 0]
        evidence += f"; point estimates not monotone in θ ({', '.join(breaks)})"
    if ends and all(steps) and monotone:
        return "resolved at every step", evidence
    if ends:
        n_open = sum(not s for s in steps)
        return "resolved between the ends", evidence + f"; {n_open} of {len(steps)} neighbouring steps not resolved"
    if back:
        return "refuted", evidence
    return "not resolved", evidence + "; the intervals at the ends overlap"


def quality_verdict(r, m: str) -> tuple[str, str]:
    """(verdict, evidence) for 'quality within the non-inferiority margin' of one method (module doc)."""
    d, lo, hi = val(r, f"vs_ar/{m}/delta"), val(r, f"vs_ar/{m}/delta_lo"), val(r, f"vs_ar/{m}/delta_hi")
    p, mde, margin = val(r, f"vs_ar/{m}/p_value"), val(r, f"vs_ar/{m}/mde"), val(r, f"vs_ar/{m}/ni_margin")
    ni = val(r, f"vs_ar/{m}/ni_passes")
    higher = val(r, "metric_directions", {}).get(m, "higher") == "higher"
    ev = (f"Δ {m} {d:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else "")
          + (f", p {'< 0.001' if p < 0.001 else f'= {p:.3f}'}" if p is not None else "")
          + (f", MDE {mde:.3f}" if mde is not None else "")
          + (f", margin {margin:.3f}" if margin is not None else "")) if d is not None else "no paired test"
    if d is None:
        return "not tested", ev
    if ni:
        return "non-inferior", ev
    beyond = margin is not None and lo is not None and hi is not None and (
        hi < -margin if higher else lo > margin)
    if beyond:
        return "refuted (the whole interval is beyond the margin)", ev
    n = val(r, f"vs_ar/{m}/n") or val(r, "n")
    if margin is not None and n:
        ev += _sizing(int(n), d, lo, hi, -margin if higher else margin)
    if p is not None and p < 0.05 and ((d < 0) == higher):
        return "loss resolved, margin not decided", ev
    return "no change larger than the MDE at n; margin not decided", ev


def n_to_decide(n, est, lo, hi, null: float = 0.0, log: bool = False,
                settings: StatsSettings = StatsSettings()) -> float | None:
    """The n at which an effect of this estimate's size is told from ``null`` at the settings' level and power (module
    doc), from the estimate at n and its interval [lo, hi] (on the log scale when ``log``: a ratio, null 1). None
    without an interval or n, inf when the estimate equals the null."""
    if None in (n, est, lo, hi) or not n or (log and min(est, lo, hi, null) <= 0):
        return None
    from scipy.stats import norm

    f = math.log if log else float
    z = float(norm.ppf(1 - settings.alpha / 2))
    se = (f(hi) - f(lo)) / (2 * z)
    if not se > 0:
        return None
    d = abs(f(est) - f(null))
    return math.inf if d == 0 else n * (mde(se, settings) / d) ** 2   # the MDE at n' equals d


def _sizing(n, est, lo, hi, null: float = 0.0, log: bool = False) -> str:
    """'; decided with 80% power at n ~N if the estimate is the effect (x this n)' for an undecided claim."""
    need = n_to_decide(n, est, lo, hi, null, log)
    if need is None:
        return ""
    if math.isinf(need):
        return "; the estimate is the null: no n decides it at this effect"
    return (f"; decided with {StatsSettings().power:.0%} power at n ~{math.ceil(need):,} if the estimate is the effect "
            f"({need / n:,.{1 if need < 100 * n else 0}f}x this n)")


def _above_one(r, key: str) -> str:
    """'resolved' when the interval of the ratio ``key`` lies above 1, 'refuted' when below, else 'not resolved'."""
    lo, hi = val(r, f"{key}_lo"), val(r, f"{key}_hi")
    return "resolved" if lo is not None and lo > 1 else ("refuted" if hi is not None and hi < 1 else "not resolved")


def _sd_row(rows: list, r):
    """The group's row of ``r``'s lossless reference (sd for mars: the same drafting, exact verification), at any
    batch size (a study's sd row is its timed run, mars's row its quality run), if there."""
    want = replace(r["spec"], batch_size=1).lossless_reference()
    return next((x for x in rows if replace(x["spec"], batch_size=1) == want), None)


def _ratio_sizing(r, key: str, n_key: str, verdict: str) -> str:
    """The sizing of a 'faster than' claim its interval leaves open."""
    if verdict != "not resolved" or val(r, n_key) is None:
        return ""
    return _sizing(int(val(r, n_key)), val(r, key), val(r, f"{key}_lo"), val(r, f"{key}_hi"), 1.0, log=True)


def claims_table(runs: pd.DataFrame) -> Table:
    t = Table("Claims", "The paper's claims as this study's intervals resolve them (95% CIs; n = the samples of the "
              "phase the value comes from: quality and τ every sample, speedup the timed ones). A trend is "
              "'resolved between the ends' when the intervals at the lowest and highest θ are disjoint in the claimed "
              "direction, 'at every step' when every neighbouring pair is; a quality claim ('within the NI margin': "
              "non-inferiority at the margin declared before looking) is non-inferior, refuted "
              "(the interval wholly beyond the declared margin), a loss without a margin decision, or no change "
              "larger than the MDE; an undecided claim's evidence ends with the n that would decide it with 80% power "
              "if its estimate were the effect (the interval narrowing as 1/sqrt(n)). Nothing is claimed beyond "
              "these words. " + SPEED_DEFS,
              [("task", "task", ""), ("settings", "settings", ""), ("claim", "claim", ""), ("n", "n", ""),
               ("verdict", "verdict", ""), ("evidence", "evidence", "")])
    t.compact, t.aside = ["task", "settings", "claim", "n", "verdict", "evidence"], ("evidence",)
    out = []
    for g in study_groups(runs).values():
        rows = [r for _, r in g.iterrows()]
        base = {"task": rows[0]["task_dir"], "settings": rows[0]["settings_label"]}
        lossy = [r for r in rows if r["relaxed"] and val(r, "theta") is not None]
        families = {}
        for r in lossy:
            families.setdefault(r["family"], []).append(r)
        for fam, rs in families.items():
            if len(rs) < 3:
                continue
            nq, nt = sorted({int(val(r, "n")) for r in rs}), sorted({int(val(r, "n_timed")) for r in rs})
            for claim, key, n, rising, fmt in (
                    (f"{fam}: τ rises as θ falls", "tau", nq, True, ".2f"),
                    (f"{fam}: speedup rises as θ falls", "speedup", nt, True, ".2f"),
                    (f"{fam}: speedup rises as θ falls, budget hits left out", "speedup_no_budget",
                     nt, True, ".2f")):
                verdict, ev = trend(rs, key, rising, fmt)
                out.append({**base, "claim": claim, "n": "/".join(map(str, n)), "verdict": verdict, "evidence": ev,
                            "_relaxed": True})
            m = headline(rs[0])
            if m:
                for r in rs:   # the Δ columns under one name for trend()
                    for x in ("", "_lo", "_hi"):
                        r[f"_delta{x}"] = val(r, f"vs_ar/{m}/delta{x}")
                higher = val(rs[0], "metric_directions", {}).get(m, "higher") == "higher"
                verdict, ev = trend(rs, "_delta", rising=not higher, fmt=".2f")
                out.append({**base, "claim": f"{fam}: the {m} loss grows as θ falls", "n": "/".join(map(str, nq)),
                            "verdict": verdict, "evidence": f"Δ {m} vs ar: " + ev, "_relaxed": True})
        for r in rows:
            if r["method"] == "ar":
                continue
            base = {**base, "_relaxed": bool(r["relaxed"])}   # the compact view's cue (compact._relaxed_flags)
            m = headline(r)
            if r["relaxed"] and m:
                verdict, ev = quality_verdict(r, m)
                out.append({**base, "claim": f"{r['label']}: {m} within the NI margin",
                            "n": str(val(r, f"vs_ar/{m}/n") or val(r, "n")), "verdict": verdict, "evidence": ev})
            if val(r, "speedup") is not None:
                verdict = _above_one(r, "speedup")
                out.append({**base, "claim": f"{r['label']}: faster than ar", "n": str(val(r, "n_timed")),
                            "verdict": verdict, "evidence": f"speedup {_ci(r, 'speedup')}; without samples that hit "
                            f"the budget {_ci(r, 'speedup_no_budget')} (n = {val(r, 'n_no_budget')})"
                            + _ratio_sizing(r, "speedup", "n_timed", verdict)})
            sd = _sd_row(rows, r) if r["relaxed"] else None
            if sd is not None and val(r, "speedup_vs_sd") is not None:
                verdict = _above_one(r, "speedup_vs_sd")
                out.append({**base, "claim": f"{r['label']}: faster than {sd['label']}", "n": str(val(r, "n_vs_sd")),
                            "verdict": verdict,
                            "evidence": f"speed over {sd['label']} {_ci(r, 'speedup_vs_sd')}, paired on the same "
                            f"timed samples (over ar: {_ci(r, 'speedup')} against {_ci(sd, 'speedup')})"
                            + _ratio_sizing(r, "speedup_vs_sd", "n_vs_sd", verdict)})
    t.data = pd.DataFrame(out)
    return t
