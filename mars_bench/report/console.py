"""The console view of a results tree: one compact table per settings group, its shared settings above it.

    model pair, task, temperature, budget, k, CPU kernel   (printed once per group)
    method | n | tokens/s | τ | speedup [CI] | quality [CI] | Δ vs ar [CI] | p | non-inferior | identical to ar

Rendered with ``rich`` at a fixed width (120 columns, no colour) unless it prints to a terminal; the full
tables (every column, every θ) are the files ``mars-bench-report`` writes (``tables.py``).
"""
from __future__ import annotations

import io
import sys

from rich import box
from rich.console import Console, Group
from rich.table import Table as RichTable
from rich.text import Text

from .load import DEFAULT_THETA, Run, groups
from .tables import ARROW, TRUNCATION_LIMIT, headline_metric, quality_ci, truncated_share

WIDTH = 120   # columns when the output is not a terminal (files, pipes, tests)
CAPTION = ("v [lo, hi]: value and 95% CI; speedup = tokens/s over ar's on the same samples; τ = tokens per target "
           "forward; Δ = paired difference vs ar, p = its paired test.")
NI_CAPTION = "non-inf.: the Δ's lower bound clears the non-inferiority margin."
FIDELITY_CAPTION = "= ar: share of outputs identical to ar's."


def _config(run: Run) -> dict:
    return (run.summary or {}).get("config") or {}


def _ci(est: dict | None, fmt: str, suffix: str = "") -> str:
    """'v [lo, hi]' of a stored estimate; the bare value without an interval; '–' without a value."""
    est = est or {}
    v = est.get("value")
    if v is None:
        return "–"
    out = format(v, fmt) + suffix
    if est.get("lo") is not None and est.get("hi") is not None:
        out += f" [{format(est['lo'], fmt)}, {format(est['hi'], fmt)}]"
    return out


def _p(v) -> str:
    return "–" if v is None else ("<0.001" if v < 0.001 else format(v, ".3f"))


def _quality_fmt(runs: list[Run], metric: str | None) -> str:
    """Three decimals for shares and scores in [0, 1], one for 0-100 scales (BLEU, chrF)."""
    values = [abs(r.quality[metric]) for r in runs if metric and r.quality.get(metric) is not None]
    return ".1f" if values and max(values) > 1.5 else ".3f"


def _noninferior(test: dict) -> str:
    ni = test.get("noninferiority") or {}
    passes = ni.get("passes")
    return "–" if passes is None else ("yes" if passes else "no")


METHOD_WIDTH = 24   # the method column folds past this, so the numeric columns keep their digits at 120


def shown_runs(group: list[Run], theta: float = DEFAULT_THETA) -> list[Run]:
    """ar, the lossless methods and each lossy family at ``theta`` (every value where that one is missing)."""
    at_theta = {r.family for r in group if r.relaxed and r.theta == theta}
    return [r for r in group if not (r.relaxed and r.family in at_theta and r.theta != theta)]


def _shared_flags(runs: list[Run]) -> list[str]:
    """Tag flags every speculative run of the group carries (e.g. the int8 draft): said once, above the table."""
    spec = [r for r in runs if r.method != "ar"]
    return [f for f in spec[0].flags if all(f in r.flags for r in spec)] if spec else []


def settings_line(runs: list[Run]) -> str:
    """What every row of a group shares, on two lines: model pair and task; decoding, budget, k, draft
    and CPU kernel."""
    first = runs[0]
    cfg = _config(first)
    task = f"{first.task or first.task_dir} v{first.task_version}" if first.task_version else first.task_dir
    task += f" (subset {cfg['subset']})" if cfg.get("subset") else ""
    task += f", limit {cfg['limit']}" if cfg.get("limit") else ""
    ks = sorted({r.k for r in runs if r.k is not None})
    kernels = sorted({k for r in runs for k in ((r.summary or {}).get("fast_kernel") or [])})
    decoding = "greedy (T=0)" if first.temperature == 0 else f"T={first.temperature:g} top_p={first.top_p:g}"
    parts = [decoding, f"budget {first.max_new_tokens} new tokens", f"seed {first.seed}"]
    parts += [f"k={'/'.join(str(k) for k in ks)}"] if ks else []
    parts += [f"draft {f[len('draft'):]}" if f.startswith("draft") else f for f in _shared_flags(runs)]
    parts += [f"CPU kernel {', '.join(kernels)}"] if kernels else []
    return f"model pair: {first.title.split(' | ')[0]} | task: {task}\n" + " | ".join(parts)


def _label(run: Run, shared_k: bool, shared_flags: list[str]) -> str:
    """The run's label without what the settings line already says (a shared k, shared flags)."""
    label = run.label.replace(f" k={run.k}", "") if shared_k and run.k is not None else run.label
    for f in shared_flags:
        label = label.replace(f" {f}", "")
    return label


def group_table(group: list[Run], theta: float = DEFAULT_THETA) -> tuple[RichTable, list[str]]:
    """The rich table of one settings group and the lines under it: legend, then warnings (⚠)."""
    runs = shown_runs(group, theta)
    metric = next((headline_metric(r) for r in runs if headline_metric(r)), None)
    fmt = _quality_fmt(runs, metric)
    direction = ARROW.get(next((r.metric_directions[metric] for r in runs if metric in r.metric_directions), ""), "")
    ni = any((((r.stats or {}).get("quality_vs_ar") or {}).get(metric) or {}).get("noninferiority") for r in runs)
    fid = any(r.fidelity for r in runs)
    t = RichTable(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    t.add_column("method", overflow="fold", max_width=METHOD_WIDTH)   # a long label folds; numbers never do
    heads = ["n", "tokens/s", "τ", "speedup"] + ([f"{metric} {direction}".strip(), "Δ vs ar", "p"] if metric else [])
    for head in heads + (["non-inf."] if ni else []) + (["= ar"] if fid else []):
        t.add_column(head, justify="right", no_wrap=True)
    shared_k, flags = len({r.k for r in runs if r.k is not None}) <= 1, _shared_flags(runs)
    cut_at, unreadable = [], []
    for r in runs:
        st = r.stats or {}
        test = ((st.get("quality_vs_ar") or {}).get(metric) or {}) if metric else {}
        speed = {"value": 1.0} if r.method == "ar" else st.get("speedup") or {"value": (r.speedup or {}).get("speedup")}
        cells = [_label(r, shared_k, flags), str(r.n_samples),
                 _ci({"value": r.totals.get("tokens_per_s")}, ".2f"), _ci({"value": r.totals.get("tau")}, ".2f"),
                 _ci(speed, ".2f", "×")]
        if metric:
            lo_hi = quality_ci(r, metric)
            q = {"value": r.quality.get(metric), "lo": lo_hi[0] if lo_hi else None, "hi": lo_hi[1] if lo_hi else None}
            delta = {"value": test.get("delta"), "lo": test.get("lo"), "hi": test.get("hi")}
            cells += [_ci(q, fmt), "–" if r.method == "ar" else _ci(delta, "+" + fmt), _p(test.get("p_value"))]
        if ni:
            cells.append("–" if r.method == "ar" else _noninferior(test))
        if fid:
            pct = ((r.fidelity or {}).get("aggregate") or {}).get("pct_identical")
            cells.append("–" if pct is None else f"{pct:.0f}%")
        t.add_row(*cells)
        cut = truncated_share(r)
        if cut is not None and cut > TRUNCATION_LIMIT:
            cut_at.append(f"{_label(r, shared_k, flags)} {cut:.0%}")
        if r.problems:
            unreadable.append(f"{_label(r, shared_k, flags)} {len(r.problems)}")
    warnings = [CAPTION + (f" {NI_CAPTION}" if ni else "") + (f" {FIDELITY_CAPTION}" if fid else "")]
    if cut_at:
        warnings.append(f"⚠ samples stopped at max_new_tokens={runs[0].max_new_tokens} (> {TRUNCATION_LIMIT:.0%} "
                        f"flagged): {', '.join(cut_at)}; their quality reflects the token budget")
    if unreadable:
        warnings.append(f"⚠ unreadable sample lines skipped: {', '.join(unreadable)} (listed on stderr)")
    hidden = len(group) - len(runs)
    if hidden:
        warnings.append(f"{hidden} more run(s) at other θ values: see tables/theta.md")
    return t, warnings


def render(runs: list[Run], theta: float = DEFAULT_THETA, width: int | None = WIDTH, color: bool = False) -> str:
    """Every group's settings line, table and warnings as text of at most ``width`` columns."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system="standard" if color else None, force_terminal=color,
                      highlight=False, emoji=False)
    _print(console, runs, theta)
    return buf.getvalue()


def _print(console: Console, runs: list[Run], theta: float) -> None:
    for group in groups(runs).values():
        table, warnings = group_table(group, theta)
        parts = [Text(settings_line(group), style="bold"), table]
        parts += [Text(w, style="yellow" if w.startswith("⚠") else "dim") for w in warnings]
        console.print(Group(*parts))
        console.print()


def print_console(runs: list[Run], theta: float = DEFAULT_THETA, file=None) -> None:
    """To a terminal: its own width, in colour. Elsewhere: ``WIDTH`` columns, plain text."""
    file = file or sys.stdout
    if file.isatty():
        _print(Console(file=file, highlight=False, emoji=False), runs, theta)
    else:
        file.write(render(runs, theta))
