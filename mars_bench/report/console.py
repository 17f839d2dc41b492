"""The console view of a results tree: one compact table per settings group, its shared settings above it.

    model pair, task, temperature, budget, k, CPU kernel   (printed once per group)
    method | n | tokens/s | τ | speedup [CI] | quality [CI] | Δ vs ar [CI] | p | non-inferior | identical to ar

Rendered with ``rich`` at a fixed width (120 columns, no colour) unless it prints to a terminal; the full
tables (every column, every θ) are the files ``mars-bench-report`` writes (``tables.py``).
"""
from __future__ import annotations

import io
import sys

import pandas as pd
from rich import box
from rich.console import Console, Group
from rich.table import Table as RichTable
from rich.text import Text

from mars_bench.report.columns import val
from mars_bench.report.definitions import TRUNCATION_LIMIT
from mars_bench.report.frames import DEFAULT_THETA, at_theta, groups, headline, rows
from mars_bench.report.writer import ARROW, fmt_cell

WIDTH = 120   # columns when the output is not a terminal (files, pipes, tests)
CAPTION = ("v [lo, hi]: value and 95% CI; speedup = tokens/s over ar's on the same samples; τ = tokens per target "
           "forward; Δ = paired difference vs ar, p = its paired test.")
NI_CAPTION = "non-inf.: the Δ's lower bound clears the non-inferiority margin."
FIDELITY_CAPTION = "= ar: share of outputs identical to ar's."


def _cell(run, key: str, fmt: str, suffix: str = "", interval: bool = True) -> str:
    """'v [lo, hi]' of a frame column and its interval; the bare value without one; '–' without a value."""
    v, lo, hi = val(run, key), val(run, key + "_lo"), val(run, key + "_hi")
    if v is None:
        return "–"
    return format(v, fmt) + suffix + (f" [{format(lo, fmt)}, {format(hi, fmt)}]"
                                      if interval and lo is not None and hi is not None else "")


def _quality_fmt(runs: pd.DataFrame, metric: str | None) -> str:
    """Three decimals for shares and scores in [0, 1], one for 0-100 scales (BLEU, chrF)."""
    values = [abs(v) for r in rows(runs) if metric for v in [val(r, f"quality/{metric}")] if v is not None]
    return ".1f" if values and max(values) > 1.5 else ".3f"


METHOD_WIDTH = 24   # the method column folds past this, so the numeric columns keep their digits at 120


def _shared_flags(runs: pd.DataFrame) -> list[str]:
    """Flags every speculative run of the group carries (e.g. the int8 draft): said once, above the table."""
    spec = [tuple(r["flags"]) for r in rows(runs) if r["method"] != "ar"]
    return [f for f in spec[0] if all(f in x for x in spec)] if spec else []


def settings_line(runs: pd.DataFrame) -> str:
    """What every row of a group shares, on two lines: model pair and task; decoding, budget, k, draft,
    CPU kernel and the machine(s) the runs decoded on (CPU model, instruction sets, threads)."""
    first = runs.iloc[0]
    version = val(first, "task_version")
    task = f"{val(first, 'task') or first['task_dir']} v{version}" if version else first["task_dir"]
    task += f" (subset {first['subset']})" if val(first, "subset") else ""
    task += f", limit {int(first['limit'])}" if val(first, "limit") else ""
    ks = sorted({int(r["k"]) for r in rows(runs) if val(r, "k") is not None})
    kernels = sorted({k for r in rows(runs) for k in (val(r, "fast_kernel") or [])})
    decoding = "greedy (T=0)" if first["temperature"] == 0 else f"T={first['temperature']:g} top_p={first['top_p']:g}"
    parts = [decoding, f"budget {first['max_new_tokens']} new tokens", f"seed {first['seed']}"]
    parts += [f"b={first['batch_size']}"] if val(first, "batch_size", 1) > 1 else []
    parts += [f"k={'/'.join(str(k) for k in ks)}"] if ks else []
    parts += [f"draft {f[len('draft'):]}" if f.startswith("draft") else f for f in _shared_flags(runs)]
    parts += [f"CPU kernel {', '.join(kernels)}"] if kernels else []
    machines = sorted({m for r in rows(runs) for m in (val(r, "machines") or [])} - {"unrecorded"})
    parts += [f"on {' / '.join(machines)}"] if machines else []
    return f"model pair: {first['title'].split(' | ')[0]} | task: {task}\n" + " | ".join(parts)


def _label(run, shared_k: bool, shared_flags: list[str]) -> str:
    """The run's label without what the settings line already says (a shared k, shared flags)."""
    k = val(run, "k")
    label = run["label"].replace(f" k={k}", "") if shared_k and k is not None else run["label"]
    for f in shared_flags:
        label = label.replace(f" {f}", "")
    return label


def _has(runs: pd.DataFrame, prefix: str) -> bool:
    """Whether any run has a value in a column starting with ``prefix``."""
    return any(runs[c].notna().any() for c in runs.columns if c.startswith(prefix))


def group_table(group: pd.DataFrame, theta: float = DEFAULT_THETA) -> tuple[RichTable, list[str]]:
    """The rich table of one settings group and the lines under it: legend, then warnings (⚠)."""
    runs = at_theta(group, theta)
    metric = next((headline(r) for r in rows(runs) if headline(r)), None)
    fmt = _quality_fmt(runs, metric)
    direction = ARROW.get(next((val(r, "metric_directions", {})[metric] for r in rows(runs)
                                if metric in val(r, "metric_directions", {})), ""), "")
    ni = bool(metric) and _has(runs, f"vs_ar/{metric}/ni_")
    fid = "n_compared" in runs and runs["n_compared"].notna().any()
    t = RichTable(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    t.add_column("method", overflow="fold", max_width=METHOD_WIDTH)   # a long label folds; numbers never do
    heads = ["n", "tokens/s", "τ", "speedup"] + ([f"{metric} {direction}".strip(), "Δ vs ar", "p"] if metric else [])
    for head in heads + (["non-inf."] if ni else []) + (["= ar"] if fid else []):
        t.add_column(head, justify="right", no_wrap=True)
    shared_k, flags = len({val(r, "k") for r in rows(runs) if val(r, "k") is not None}) <= 1, _shared_flags(runs)
    cut_at, unreadable = [], []
    for r in rows(runs):
        ar, label = r["method"] == "ar", _label(r, shared_k, flags)
        cells = [label, str(val(r, "n", 0)), _cell(r, "tokens_per_s", ".2f", interval=False),
                 _cell(r, "tau", ".2f", interval=False), _cell(r, "speedup", ".2f", "×")]
        if metric:
            test = f"vs_ar/{metric}"
            cells += [_cell(r, f"quality/{metric}", fmt), "–" if ar else _cell(r, f"{test}/delta", "+" + fmt),
                      fmt_cell(val(r, f"{test}/p_value"), "p")]
        if ni:
            cells.append("–" if ar else {True: "yes", False: "no"}.get(val(r, f"vs_ar/{metric}/ni_passes"), "–"))
        if fid:
            pct = val(r, "pct_identical")
            cells.append("–" if pct is None else f"{pct:.0f}%")
        t.add_row(*cells)
        cut = val(r, "truncated")
        if cut is not None and cut > TRUNCATION_LIMIT:
            cut_at.append(f"{label} {cut:.0%}")
        if val(r, "problems"):
            unreadable.append(f"{label} {len(r['problems'])}")
    warnings = [CAPTION + (f" {NI_CAPTION}" if ni else "") + (f" {FIDELITY_CAPTION}" if fid else "")]
    if cut_at:
        warnings.append(f"⚠ samples stopped at max_new_tokens={runs.iloc[0]['max_new_tokens']} (> "
                        f"{TRUNCATION_LIMIT:.0%} flagged): {', '.join(cut_at)}; their quality reflects the token "
                        "budget")
    if unreadable:
        warnings.append(f"⚠ unreadable sample lines skipped: {', '.join(unreadable)} (listed on stderr)")
    hidden = len(group) - len(runs)
    if hidden:
        warnings.append(f"{hidden} more run(s) at other θ values: see tables/theta.md")
    return t, warnings


def render(runs, theta: float = DEFAULT_THETA, width: int | None = WIDTH, color: bool = False) -> str:
    """Every group's settings line, table and warnings as text of at most ``width`` columns."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system="standard" if color else None, force_terminal=color,
                      highlight=False, emoji=False)
    _print(console, runs, theta)
    return buf.getvalue()


def _print(console: Console, runs, theta: float) -> None:
    for group in groups(getattr(runs, "runs", runs)).values():
        table, warnings = group_table(group, theta)
        parts = [Text(settings_line(group), style="bold"), table]
        parts += [Text(w, style="yellow" if w.startswith("⚠") else "dim") for w in warnings]
        console.print(Group(*parts))
        console.print()


def print_console(runs, theta: float = DEFAULT_THETA, file=None) -> None:
    """To a terminal: its own width, in colour. Elsewhere: ``WIDTH`` columns, plain text."""
    file = file or sys.stdout
    if file.isatty():
        _print(Console(file=file, highlight=False, emoji=False), runs, theta)
    else:
        file.write(render(runs, theta))
