"""Per-position logit figures from the z1 / z2 / outcome lists of each turn record.

At every verified draft position the run records the target's two largest raw logits z1 >= z2 and the
outcome: 'A' exact-accepted (draft == target top-1), 'R' relaxed-accepted (draft == top-2 and
r = z2/z1 > theta), 'X' rejected. r is only meaningful where z1 > 0 (for z1 <= 0 the ratio flips its
sense), so the r figure leaves those positions out and says how many.

    r_distribution(run, samples)   paper Fig. 1d: r at A / R / X positions
    z1_histogram(run, samples)     paper Fig. 4a: top-1 logits z1

``run``: a row of ``Frames.runs``; ``samples``: ``Frames.samples`` (the run's rows are used; their z1, z2 and
outcome columns hold the positions of every turn).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from mars_bench.report.columns import val
from mars_bench.report.frames import DEFAULT_THETA, rows

OUTCOMES = {"A": ("exact-accepted", "#2ca02c"), "R": ("relaxed-accepted", "#ff7f0e"), "X": ("rejected", "#d62728")}


def positions(samples: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(z1, z2, outcome) over every verified draft position of the given sample rows."""
    z1 = [x for xs in samples.get("z1", []) for x in xs]
    z2 = [x for xs in samples.get("z2", []) for x in xs]
    out = [o for os_ in samples.get("outcome", []) for o in os_]
    return np.asarray(z1, float), np.asarray(z2, float), np.asarray(out, dtype="<U1")


def r_values(samples: pd.DataFrame) -> dict:
    """r = z2/z1 per outcome over positions with z1 > 0, and how many positions had z1 <= 0."""
    z1, z2, out = positions(samples)
    ok = z1 > 0
    r = np.divide(z2, z1, out=np.full_like(z2, np.nan), where=ok)
    return {"r": {o: r[ok & (out == o)] for o in OUTCOMES}, "n_total": int(z1.size),
            "n_nonpositive": int((~ok).sum())}


def _of(run, samples: pd.DataFrame) -> pd.DataFrame:
    return samples[samples["run"] == run["run"]] if len(samples) else samples


def logit_run(group: pd.DataFrame, samples: pd.DataFrame, theta: float = DEFAULT_THETA):
    """The run whose positions are drawn: mars at ``theta`` (else another margin-aware method at ``theta``,
    else the one with most samples), else a lossless run (sd first)."""
    drawn = set(samples.loc[[bool(o) for o in samples.get("outcome", [])], "run"]) if len(samples) else set()
    cands = [r for r in rows(group) if r["method"] != "ar" and r["run"] in drawn]
    for pick in ([r for r in cands if r["method"] == "mars" and r["theta"] == theta],
                 [r for r in cands if r["relaxed"] and r["theta"] == theta],
                 sorted((r for r in cands if r["relaxed"]), key=lambda r: (r["method"] != "mars", -val(r, "n", 0))),
                 sorted(cands, key=lambda r: r["method"] != "sd")):
        if pick:
            return pick[0]
    return None


def _title(fig: Figure, what: str, run) -> None:
    fig.suptitle(f"{what}: {run['label']}, {val(run, 'n', 0)} sample(s)\n{run['title']}  ({run['settings_label']})",
                 fontsize=12)


def r_distribution(run, samples: pd.DataFrame, theta: float | None = None) -> Figure | None:
    v = r_values(_of(run, samples))
    rs = v["r"]
    if not any(x.size for x in rs.values()):
        return None
    theta = val(run, "theta", theta)
    allr = np.concatenate([x for x in rs.values() if x.size])
    lo = max(float(np.min(allr)), -1.0)
    lo = min(lo, (theta or 1.0) - 0.1)
    bins = np.linspace(lo, 1.0, 41)
    fig = Figure(figsize=(8.5, 4.8), layout="constrained")
    ax = fig.subplots()
    ax.grid(alpha=0.3)
    for o, (name, color) in OUTCOMES.items():
        x = np.clip(rs[o], lo, 1.0)
        if x.size:
            ax.hist(x, bins=bins, density=True, histtype="stepfilled", alpha=0.25, color=color)
            ax.hist(x, bins=bins, density=True, histtype="step", lw=1.8, color=color,
                    label=f"{name} ({o}), n={x.size}")
    if theta is not None:
        ax.axvline(theta, color="k", ls=":", lw=1.5,
                   label=f"θ={theta:g}" + (" (default)" if theta == DEFAULT_THETA else ""))
    ax.set_xlabel("r = z2 / z1 (top-2 over top-1 raw target logit; dimensionless)")
    ax.set_ylabel("density (each outcome normalised to 1)")
    ax.set_xlim(lo, 1.0)
    note = (f"r is only meaningful where z1 > 0:\n{v['n_nonpositive']} of {v['n_total']} positions with "
            f"z1 ≤ 0 left out" + ("; r < -1 drawn at -1" if float(np.min(allr)) < -1.0 else ""))
    ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", ha="left", fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"})
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.80))
    _title(fig, "r = z2/z1 at verified draft positions", run)
    return fig


def z1_histogram(run, samples: pd.DataFrame) -> Figure | None:
    z1, _, out = positions(_of(run, samples))
    if not z1.size:
        return None
    fig = Figure(figsize=(8.5, 4.8), layout="constrained")
    ax = fig.subplots()
    ax.grid(alpha=0.3)
    bins = np.linspace(min(float(z1.min()), 0.0) - 0.5, float(z1.max()) + 0.5, 41)
    ax.hist(z1, bins=bins, color="0.75", label=f"all positions, n={z1.size}")
    for o, (name, color) in OUTCOMES.items():
        if (out == o).any():
            ax.hist(z1[out == o], bins=bins, histtype="step", lw=1.8, color=color,
                    label=f"{name} ({o}), n={int((out == o).sum())}")
    ax.axvline(0.0, color="k", ls=":", lw=1.5, label="z1 = 0 (r undefined at or below)")
    share = float((z1 <= 0).mean())
    ax.text(0.98, 0.97, f"z1 ≤ 0 at {100 * share:.1f}% of positions", transform=ax.transAxes, va="top",
            ha="right", fontsize=9, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85,
                                          "edgecolor": "0.7"})
    ax.set_xlabel("z1: top-1 raw target logit (logit units, before temperature)")
    ax.set_ylabel("verified draft positions (count)")
    ax.legend(loc="upper left")
    _title(fig, "Top-1 target logit z1", run)
    return fig
