"""The θ figure's data as rows (what ``figures.theta_sensitivity`` draws), for a tracker's table and line plots.

    theta_rows(group)   per margin-aware family (e.g. mars k=4) and θ, in θ order: speedup, τ and the paired quality
                        change vs ar (Δ, the group's headline metric) with their 95% CIs and n; [] unless a family
                        holds two or more θ (one point is no curve)
    run_group(run_dir)  the settings group of one run directory (``frames.groups``), read from its task folder
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars_bench.report.columns import val
from mars_bench.report.frames import headline, load_frames, rows

COLUMNS = ("family", "theta", "n", "speedup", "speedup_lo", "speedup_hi", "tau", "tau_lo", "tau_hi", "metric",
           "delta_quality", "delta_quality_lo", "delta_quality_hi", "p_value")


def theta_rows(group: pd.DataFrame) -> list[dict]:
    """The θ figure's points (module doc): one dict per run with a θ, keys ``COLUMNS``."""
    fams: dict[str, list] = {}
    for r in rows(group):
        if r["relaxed"] and val(r, "theta") is not None:
            fams.setdefault(r["family"], []).append(r)
    fams = {k: sorted(rs, key=lambda r: r["theta"]) for k, rs in fams.items() if len({r["theta"] for r in rs}) >= 2}
    metric = next((headline(r) for rs in fams.values() for r in rs if headline(r)), None)
    out = []
    for fam, rs in fams.items():
        for r in rs:
            d = {x: val(r, f"vs_ar/{metric}/delta{x}") if metric else None for x in ("", "_lo", "_hi")}
            out.append({"family": fam, "theta": float(r["theta"]), "n": val(r, "n"),
                        **{k: val(r, k) for k in ("speedup", "speedup_lo", "speedup_hi", "tau", "tau_lo", "tau_hi")},
                        "metric": metric, "delta_quality": d[""], "delta_quality_lo": d["_lo"],
                        "delta_quality_hi": d["_hi"], "p_value": val(r, f"vs_ar/{metric}/p_value") if metric else None})
    return out


def run_group(run_dir: str | Path) -> pd.DataFrame:
    """The runs of ``run_dir``'s settings group (its siblings in the task folder with the same ar baseline)."""
    run_dir = Path(run_dir).resolve()
    runs = load_frames(run_dir.parent).runs
    mine = runs[[any(Path(d).resolve() == run_dir for d in ds) for ds in runs["dirs"]]]
    return runs.iloc[:0] if mine.empty else runs[runs["group"] == mine.iloc[0]["group"]]
