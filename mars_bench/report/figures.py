"""Paper figures from ``Frames`` (matplotlib, object API: no pyplot state, any backend).

One figure per settings group (``frames.groups``: model pair, task and settings); each function takes the
group's rows of ``Frames.runs`` and returns a ``Figure`` (or None when the group lacks the runs it needs);
``layout.make_figures`` writes PNG and PDF files, each figure once for the phase that answers it.

    speedup_tau(group)         speedup over ar (ours; the authors' formula as a marker) and tau per method
    theta_sensitivity(group)   speedup, tau and the paired quality change vs ar against theta, sd (lossless)
                               as a reference line, the non-inferiority margin and the most aggressive
                               theta that passes it
    fidelity_vs_theta(group)   agreement with ar outputs vs theta, sd as a reference line
    acceptance_by_depth(group) acceptance rate per draft position
    rules_frontier(group)      speedup against the paired quality change vs ar and against chrF to ar,
                               one line per lossy rule through its knob
    r_distribution(run, samples), z1_histogram(run, samples)   from .logits (paper Fig. 1d and Fig. 4a)
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from mars_bench.report.columns import val
from mars_bench.report.frames import DEFAULT_THETA, headline, rows
from mars_bench.report.logits import logit_run, r_distribution, z1_histogram
from mars_bench.report.writer import ARROW

COLORS = {"ar": "#7f7f7f", "sd": "#1f77b4", "mars": "#ff7f0e"}
plt_rc = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9}


def _new(ncols: int, width: float = 5.0, height: float = 4.2) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, list(axes)


def _suptitle(fig: Figure, what: str, run) -> None:
    fig.suptitle(f"{what}\n{run['title']}  ({run['settings_label']})", fontsize=12)


def _ci(run, key: str) -> tuple[float, float] | None:
    """The 95% CI of the frame column ``key`` (its ``_lo`` / ``_hi``), None when there is none."""
    lo, hi = val(run, f"{key}_lo"), val(run, f"{key}_hi")
    return (lo, hi) if lo is not None and hi is not None else None


def _yerr(values, cis) -> list[list[float]]:
    """matplotlib's 2 x N asymmetric error bars; 0 where a value has no interval."""
    lo = [v - c[0] if v is not None and c else 0.0 for v, c in zip(values, cis)]
    hi = [c[1] - v if v is not None and c else 0.0 for v, c in zip(values, cis)]
    return [lo, hi]


def _n_label(runs: list) -> str:
    ns = sorted({val(r, "n", 0) for r in runs})
    return f"n = {ns[0]} samples" if len(ns) == 1 else f"n = {ns[0]}-{ns[-1]} samples"


def _mark_default(ax, theta: float) -> None:
    ax.axvline(theta, color="k", ls=":", lw=1.2, label=f"default θ={theta:g}")


def speedup_tau(group: pd.DataFrame, theta: float = DEFAULT_THETA) -> Figure | None:
    runs = [r for r in rows(group) if val(r, "tau")]
    if not runs or all(r["method"] == "ar" for r in runs):
        return None
    fig = Figure(figsize=(max(7.0, 0.75 * len(runs) + 3.0), 7.6), layout="constrained")
    a1, a2 = fig.subplots(2, 1, sharex=True)
    x = list(range(len(runs)))
    colors = [COLORS.get(r["method"], "#ff7f0e" if r["relaxed"] else "#17becf") for r in runs]
    hatch = ["//" if r["relaxed"] and r["theta"] == theta else "" for r in runs]
    sp = [val(r, "speedup") for r in runs]   # ar: 1
    mean = [1.0 if r["method"] == "ar" else val(r, "speedup_authors") for r in runs]
    tau = [val(r, "tau") for r in runs]
    sp_ci = [None if r["method"] == "ar" else _ci(r, "speedup") for r in runs]
    tau_ci = [_ci(r, "tau") for r in runs]
    a1.bar(x, [v or 0 for v in sp], color=colors, hatch=hatch, edgecolor="k", lw=0.6,
           label="ratio of total tokens/s (bar)")
    a1.errorbar(x, [v or 0 for v in sp], yerr=_yerr(sp, sp_ci), fmt="none", ecolor="k", capsize=4, lw=1,
                label="95% CI (paired bootstrap)")
    if any(v is not None for r, v in zip(runs, mean) if r["method"] != "ar"):
        a1.scatter([i for i, v in zip(x, mean) if v is not None], [v for v in mean if v is not None], marker="D",
                   color="k", zorder=3, s=22, label="authors' formula (◆): mean tokens/s over ar's")
    a1.axhline(1.0, color=COLORS["ar"], ls="--", lw=1, label="ar = 1×")
    top = max([v or 0 for v in sp + mean] + [c[1] for c in sp_ci if c] + [1.0])
    for i, (v, m, c) in enumerate(zip(sp, mean, sp_ci)):
        a1.annotate("n/a: no ar run" if v is None else f"{v:.2f}×", (i, max(v or 0, m or 0, c[1] if c else 0)
                    + 0.03 * top), ha="center", va="bottom", fontsize=8)
    a1.set_ylim(0, top * 1.45)
    a1.set_ylabel("speedup over ar (×)")
    a1.set_title("speedup (same samples, same settings)")
    a2.bar(x, tau, color=colors, hatch=hatch, edgecolor="k", lw=0.6)
    a2.errorbar(x, tau, yerr=_yerr(tau, tau_ci), fmt="none", ecolor="k", capsize=4, lw=1)
    for i, (v, c) in enumerate(zip(tau, tau_ci)):
        a2.annotate(f"{v:.2f}", (i, c[1] if c else v), ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                    textcoords="offset points")
    a2.set_ylim(0, max([t for t in tau] + [c[1] for c in tau_ci if c]) * 1.3)
    a2.set_ylabel("τ (tokens per target forward)")
    a2.set_title("τ = accepted drafts + 1, per verification step (error bars: 95% CI)")
    a2.set_xticks(x, [f"{r['label']}\nn={val(r, 'n', 0)}" for r in runs], rotation=30, ha="right")
    a2.set_xlabel("method")
    handles, labels = a1.get_legend_handles_labels()
    if any(hatch):
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor=COLORS["mars"], hatch="//", edgecolor="k"))
        labels.append(f"mars at the default θ={theta:g}")
    a1.legend(handles, labels, loc="upper left", ncol=2)
    _suptitle(fig, f"Speedup and τ per method ({_n_label(runs)}, error bars: 95% CI)", runs[0])
    return fig


PALETTE = ["#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22"]
REF_PALETTE = ["#1f77b4", "#17becf", "#7f7f7f", "#d62728"]


def _theta_series(group: pd.DataFrame) -> tuple[list[tuple[str, list, str]], list[tuple[str, object, str]]]:
    """([(family label, runs by theta, color)] of margin-aware methods, [(label, run, color)] of the
    lossless references: sd, or tree / EAGLE variants without theta)."""
    fams: dict = {}
    for r in rows(group):
        if r["relaxed"] and val(r, "theta") is not None:      # rules with a theta (mars, mars_prob)
            fams.setdefault(r["family"], []).append(r)
    ordered = sorted(fams.values(), key=lambda rs: (rs[0]["method"] != "mars", rs[0]["family"]))
    series = [(rs[0]["family"], sorted(rs, key=lambda r: r["theta"]), PALETTE[i % len(PALETTE)])
              for i, rs in enumerate(ordered)]
    refs = sorted((r for r in rows(group) if r["lossless"]), key=lambda r: (r["method"] != "sd", r["label"]))
    return series, [(r["label"], r, REF_PALETTE[i % len(REF_PALETTE)]) for i, r in enumerate(refs)]


def _panel(ax, series, refs, value, annotate=None, ci=None) -> None:
    """One line per margin-aware family vs theta, one dashed line per lossless reference; ``ci(run)``:
    its 95% CI (error bars on the lines, a shaded band around a reference), None where it has none."""
    ci = ci or (lambda r: None)
    for label, runs, color in series:
        ys = [value(r) for r in runs]
        ax.errorbar([r["theta"] for r in runs], [float("nan") if y is None else y for y in ys],
                    yerr=_yerr(ys, [ci(r) for r in runs]), fmt="o-", color=color, capsize=3, label=label)
        for r, y in zip(runs, ys):
            if annotate and y is not None:
                ax.annotate(annotate(r), (r["theta"], y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for label, r, color in refs:
        if value(r) is not None:
            ax.axhline(value(r), color=color, ls="--", lw=1.5, label=f"{label} (lossless)")
            if ci(r):
                ax.axhspan(*ci(r), color=color, alpha=0.12, lw=0)


def swept(series) -> bool:
    """Whether a family holds two or more values of θ (a figure against θ needs them; one point says nothing)."""
    return any(len({r["theta"] for r in runs}) >= 2 for _, runs, _ in series)


def theta_sensitivity(group: pd.DataFrame, theta: float = DEFAULT_THETA, what: str | None = None) -> Figure | None:
    series, refs = _theta_series(group)
    if not swept(series):
        return None
    fig, (a1, a2, a3) = _new(3, width=4.6, height=4.6)
    th = [r["theta"] for _, runs, _ in series for r in runs]
    _panel(a1, series, refs, lambda r: val(r, "speedup"), ci=lambda r: _ci(r, "speedup"))
    for label, runs, color in series:
        authors = [val(r, "speedup_authors") for r in runs]
        if any(v is not None for v in authors):
            a1.plot([r["theta"] for r in runs], [float("nan") if v is None else v for v in authors],
                    "D:", color=color, ms=4, label=f"{label}: authors' speedup formula")
        clean = [val(r, "speedup_no_budget") for r in runs]
        if any(c is not None and c != val(r, "speedup") for c, r in zip(clean, runs)):   # runaway samples
            a1.plot([r["theta"] for r in runs], [float("nan") if v is None else v for v in clean],
                    "s--", color=color, ms=4, mfc="none", label=f"{label}: without samples that hit the budget")
    a1.axhline(1.0, color=COLORS["ar"], ls="-.", lw=1, label="ar = 1×")
    a1.set_ylabel("speedup over ar (×)")
    a1.set_title("speedup vs θ")
    _panel(a2, series, refs, lambda r: val(r, "tau"), ci=lambda r: _ci(r, "tau"))
    a2.set_ylabel("τ (tokens per target forward)")
    a2.set_title("τ vs θ")
    first = series[0][1]
    runs_all = [r for _, runs, _ in series for r in runs] + [r for _, r, _ in refs]
    metric = next((headline(r) for r in runs_all if headline(r)), None)
    if metric and any(delta_vs_ar(r, metric) is not None for r in runs_all):
        _delta_panel(a3, series, refs, metric, _direction(first[0], metric))
    elif metric:   # no paired test vs ar (no ar run beside them): absolute quality
        arrow = ARROW.get(_direction(first[0], metric), "")
        _panel(a3, series, refs, lambda r: val(r, f"quality/{metric}"),
               annotate=lambda r: f"n={val(r, 'quality_n', val(r, 'n'))}", ci=lambda r: _ci(r, f"quality/{metric}"))
        a3.set_ylabel(f"{metric} ({arrow} better)")
        a3.set_title("quality vs θ (no ar run: no paired Δ; bars: 95% CI)")
    else:   # no quality metric (e.g. the prompts set): acceptance instead
        _panel(a3, series, refs, lambda r: val(r, "acceptance_rate"))
        a3.set_ylabel("acceptance rate (accepted / proposed drafts)")
        a3.set_title(f"acceptance vs θ (task {first[0]['task']}: no quality metric)")
    for ax in (a1, a2, a3):
        _mark_default(ax, theta)
        ax.set_xlabel("θ (relax when r = z2/z1 > θ)")
        ax.set_xlim(*_theta_limits(th, theta))
    _shared_legend(fig, (a1, a2, a3))
    _suptitle(fig, f"θ sensitivity of mars ({what or _n_label(runs_all)}, error bars: 95% CI)", first[0])
    return fig


def _direction(run, metric: str) -> str | None:
    return val(run, "metric_directions", {}).get(metric)


def delta_vs_ar(run, metric: str) -> float | None:
    """The paired quality change of ``metric`` (run - ar on the same samples); None without a paired test."""
    return val(run, f"vs_ar/{metric}/delta")


def delta_ci(run, metric: str) -> tuple[float, float] | None:
    return _ci(run, f"vs_ar/{metric}/delta")


def ni_margin(runs: list, metric: str) -> tuple[float, float | None] | None:
    """(margin, margin_rel) of the group's non-inferiority tests (one ar score, so one margin); None if absent."""
    return next(((val(r, f"vs_ar/{metric}/ni_margin"), val(r, f"vs_ar/{metric}/ni_margin_rel")) for r in runs
                 if val(r, f"vs_ar/{metric}/ni_margin") is not None), None)


def most_aggressive_passing(runs: list, metric: str):
    """The lowest θ (the most relaxation) whose paired test passes non-inferiority; None when none does."""
    ok = [r for r in runs if val(r, f"vs_ar/{metric}/ni_passes") is True]
    return min(ok, key=lambda r: r["theta"], default=None)


def _zero_and_margin(ax, runs: list, metric: str, direction: str | None) -> None:
    """ar's line (Δ = 0) and, when the tests carry one, the non-inferiority margin on the worse side."""
    ax.axhline(0.0, color=COLORS["ar"], ls="-.", lw=1.5, label="ar (Δ = 0)")
    margin = ni_margin(runs, metric)
    if margin is not None:
        worse = margin[0] if direction == "lower" else -margin[0]
        rel = "" if margin[1] is None else f", {100 * margin[1]:g}% of ar's score"
        ax.axhline(worse, color="#d62728", ls=":", lw=1.5, label=f"non-inferiority margin (Δ = {worse:+.3g}{rel})")


def _delta_panel(ax, series, refs, metric: str, direction: str | None) -> None:
    """Paired Δ vs ar per θ with its 95% CI (what the statistics test), ar's zero line, the margin, the
    significant differences and, per family, the most aggressive θ that passes non-inferiority."""
    _panel(ax, series, refs, lambda r: delta_vs_ar(r, metric),
           annotate=lambda r: f"n={val(r, f'vs_ar/{metric}/n', val(r, 'n'))}", ci=lambda r: delta_ci(r, metric))
    _zero_and_margin(ax, [r for _, rs, _ in series for r in rs] + [r for _, r, _ in refs], metric, direction)
    sig = [(r["theta"], delta_vs_ar(r, metric)) for _, rs, _ in series for r in rs
           if delta_vs_ar(r, metric) is not None and val(r, f"vs_ar/{metric}/p_value", 1.0) < 1 - _level(r)]
    if sig:
        ax.scatter(*zip(*sig), marker="*", s=160, color="#d62728", zorder=4,
                   label="differs from ar (p < 0.05, paired test)")
    for _, rs, _ in series:
        best = most_aggressive_passing(rs, metric)
        if best is not None:
            y = delta_vs_ar(best, metric)
            ax.scatter([best["theta"]], [y], s=260, facecolors="none", edgecolors="#2ca02c", lw=2.2, zorder=5,
                       label="most aggressive θ passing non-inferiority")
            ax.annotate(f"θ={best['theta']:g} passes", (best["theta"], y), fontsize=7, color="#2ca02c", ha="right",
                        xytext=(-6, -12), textcoords="offset points")
    ax.set_ylabel(f"Δ {metric} vs ar (paired; {ARROW.get(direction, '')} better)")
    ax.set_title("quality change vs θ (paired Δ vs ar, 95% CI)")


def _level(run) -> float:
    return float(val(run, "level", 0.95))


def _theta_limits(th: list[float], theta: float) -> tuple[float, float]:
    lo, hi = min(th + [theta]), max(th + [theta])
    pad = max(0.01, 0.05 * (hi - lo))
    return lo - pad, hi + pad


def _shared_legend(fig: Figure, axes) -> None:
    """One legend under the panels (entries with the same label drawn once)."""
    seen = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    width = max(len(lab) for lab in seen) if seen else 1
    ncol = max(1, min(len(seen), int(fig.get_figwidth() * 11 / (width + 6))))   # ~11 characters per inch
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol)


def fidelity_vs_theta(group: pd.DataFrame, theta: float = DEFAULT_THETA) -> Figure | None:
    series, refs = _theta_series(group)
    series = [(label, [r for r in runs if val(r, "n_compared") is not None], c) for label, runs, c in series]
    series = [x for x in series if x[1]]
    if not swept(series):
        return None
    fig, axes = _new(3, width=4.6, height=4.6)
    th = [r["theta"] for _, runs, _ in series for r in runs]
    keys = [("pct_identical", "outputs identical to ar (%)"),
            ("median_first_divergence", "median first divergence (token index)"),
            ("mean_chrf_to_ar", "mean chrF of output vs ar (0-100)")]
    for ax, (key, ylabel) in zip(axes, keys):
        _panel(ax, series, refs, lambda r, key=key: val(r, key), ci=lambda r, key=key: _ci(r, key))
        _mark_default(ax, theta)
        ax.set_xlabel("θ (relax when r = z2/z1 > θ)")
        ax.set_ylabel(ylabel)
        ax.set_xlim(*_theta_limits(th, theta))
    _shared_legend(fig, axes)
    axes[1].set_title("over samples that differ from ar")
    axes[0].set_ylim(-3, 103)
    first = series[0][1][0]
    _suptitle(fig, f"Fidelity to ar vs θ (n={val(first, 'n_compared')} samples compared)", first)
    return fig


def acceptance_by_depth(group: pd.DataFrame, theta: float = DEFAULT_THETA) -> Figure | None:
    runs = [r for r in rows(group) if r["method"] != "ar" and val(r, "acceptance_per_depth")]
    if not runs:
        return None
    fig, (ax,) = _new(1, width=8.5, height=5.5)
    cmap = __import__("matplotlib").colormaps["viridis"]
    mars = [r["run"] for r in runs if r["relaxed"]]
    for r in runs:
        acc = r["acceptance_per_depth"]
        if r["relaxed"]:
            i = mars.index(r["run"])
            style = {"color": cmap(i / max(1, len(mars) - 1) * 0.9), "marker": "o",
                     "lw": 2.5 if r["theta"] == theta else 1.2}
        else:
            style = {"color": COLORS.get(r["method"], "#17becf"), "marker": "s", "ls": "--", "lw": 2}
        ax.plot(range(1, len(acc) + 1), acc, label=r["label"] + (" (default)" if r["theta"] == theta else ""), **style)
    ax.set_xlabel("draft position (depth)")
    ax.set_ylabel("acceptance rate at depth")
    ax.set_ylim(0, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _shared_legend(fig, [ax])
    _suptitle(fig, "Acceptance per draft position", runs[0])
    return fig


def rules_frontier(group: pd.DataFrame, theta: float = DEFAULT_THETA) -> Figure | None:
    """Verification rules side by side: speedup over ar (x) against the paired quality change vs ar (with
    the non-inferiority margin; absolute quality when no run has a paired test) and against fidelity (chrF
    to ar) (y), one line per lossy rule through its sweep knob's values, the lossless run as the
    reference point; error bars are the stored 95% CIs. Drawn when the group holds >= 2 lossy rules."""
    lossy = [r for r in rows(group) if r["relaxed"] and val(r, "sweep_value") is not None]
    if len({r["rule"] for r in lossy}) < 2:
        return None
    fams: dict = {}
    for r in lossy:
        fams.setdefault(r["family"], []).append(r)
    refs = [r for r in rows(group) if r["lossless"] and r["scheme"] == lossy[0]["scheme"]]
    metric = next((headline(r) for r in lossy if headline(r)), None)
    fig, axes = _new(2 if metric else 1, width=5.6, height=4.8)
    direction = _direction(lossy[0], metric)
    paired = metric is not None and any(delta_vs_ar(r, metric) is not None for r in lossy + refs)
    if paired:
        panels = [(axes[0], lambda r: delta_vs_ar(r, metric), lambda r: delta_ci(r, metric),
                   f"Δ {metric} vs ar (paired; {ARROW.get(direction, '')} better)")]
    else:
        panels = ([(axes[0], lambda r: val(r, f"quality/{metric}"), lambda r: _ci(r, f"quality/{metric}"),
                    f"{metric} ({ARROW.get(direction, '')} better)")] if metric else [])
    panels.append((axes[-1], lambda r: val(r, "mean_chrf_to_ar"), lambda r: _ci(r, "mean_chrf_to_ar"),
                   "chrF to the ar output (100 = identical)"))
    sp = lambda r: val(r, "speedup")  # noqa: E731
    for ax, y, yci, ylabel in panels:
        for i, (fam, runs) in enumerate(sorted(fams.items(), key=lambda kv: (kv[1][0]["method"] != "mars", kv[0]))):
            runs = sorted(runs, key=lambda r: r["sweep_value"])
            xs, ys = [sp(r) for r in runs], [y(r) for r in runs]
            ax.errorbar([float("nan") if v is None else v for v in xs], [float("nan") if v is None else v for v in ys],
                        xerr=_yerr(xs, [_ci(r, "speedup") for r in runs]), yerr=_yerr(ys, [yci(r) for r in runs]),
                        fmt="o-", color=PALETTE[i % len(PALETTE)], capsize=3, label=fam)
            for r, xv, yv in zip(runs, xs, ys):
                if xv is not None and yv is not None:
                    ax.annotate(f"{r['sweep_knob']}={r['sweep_value']:g}", (xv, yv), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
        for j, r in enumerate(refs):
            xv, yv = sp(r), y(r)
            if xv is not None and yv is not None:
                ax.errorbar([xv], [yv], xerr=_yerr([xv], [_ci(r, "speedup")]), yerr=_yerr([yv], [yci(r)]), fmt="*",
                            ms=13, color=REF_PALETTE[j % len(REF_PALETTE)], capsize=3, label=f"{r['label']} (lossless)")
        ar = next((r for r in rows(group) if r["method"] == "ar" and y(r) is not None), None)
        if paired and ax is not axes[-1]:
            _zero_and_margin(ax, lossy + refs, metric, direction)
        elif ar is not None and ax is not axes[-1]:
            ax.axhline(y(ar), color=COLORS["ar"], ls="-.", lw=1.2, label="ar (quality)")
            if yci(ar):
                ax.axhspan(*yci(ar), color=COLORS["ar"], alpha=0.12, lw=0)
        ax.set_xlabel("speedup over ar (×)")
        ax.set_ylabel(ylabel)
    _shared_legend(fig, axes)
    _suptitle(fig, f"Verification rules: speed against quality ({_n_label(lossy + refs)}, bars: 95% CI)", lossy[0])
    return fig


FIGURES = {"speedup_tau": speedup_tau, "theta_sensitivity": theta_sensitivity, "rules_frontier": rules_frontier,
           "fidelity_vs_theta": fidelity_vs_theta, "acceptance_by_depth": acceptance_by_depth}


def slug(run) -> str:
    """The file name part of a settings group: model dir, task dir and the baseline's settings."""
    settings = run["spec"].baseline().label.removeprefix("ar-")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{run['model_dir']}__{run['task_dir']}__{settings}")


def group_figures(group: pd.DataFrame, samples: pd.DataFrame, theta: float = DEFAULT_THETA) -> dict[str, Figure]:
    """Every figure of one settings group (its rows of ``Frames.runs``; ``samples``: ``Frames.samples``)."""
    out = {name: fn(group, theta) for name, fn in FIGURES.items()}
    run = logit_run(group, samples, theta)
    if run is not None:
        out["r_distribution"] = r_distribution(run, samples, theta)
        out["z1_histogram"] = z1_histogram(run, samples)
    return {k: v for k, v in out.items() if v is not None}


def save(fig: Figure, path_stem: Path) -> list[Path]:
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [path_stem.parent / f"{path_stem.name}.png", path_stem.parent / f"{path_stem.name}.pdf"]
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1])
    return paths
