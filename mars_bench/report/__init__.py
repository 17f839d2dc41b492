"""Tables and figures from results trees (reads results files only).

    mars-bench-report [ROOT ...] [--out DIR] [--theta 0.9] [--no-figures] [--pack FILE.tar.xz] [--results-md FILE.md]

prints a compact comparison per settings group to stdout (``console.py``: shared settings once, then method,
n, tokens/s, tau, speedup, quality and its paired delta vs ar; 120 columns unless a terminal) and writes
every table with rows (``.md``: the compact view, ``compact.py``; ``.csv``, ``.tex``: every column) and figure
(``.png``, ``.pdf``; each once, for the phase that answers it: ``layout.py``) to ``<first ROOT>/report/`` (or ``--out``), with
``report.md`` and ``report.html`` (one self-contained page: ``html.py``) showing them by question: speed, quality,
θ, fidelity, claims (a section only where there is data), the definitions once at the top.
A ROOT may be a packed results tree (``.tar.xz``, ``pack.py``); ``--pack`` writes the first ROOT's run files
into one (how the study's records are committed); ``--results-md`` rewrites the section of a markdown file
generated from each ROOT, a pack, and with several the section over all of them (``docs.py``: how
``docs/results.md``'s generated tables are regenerated).
Problems found while reading (corrupt or truncated sample lines) go to stderr and are marked in the tables.
Every number with uncertainty is shown as ``value [lo, hi]`` (95% CI), quality deltas with their p-value,
n and MDE, and runs with more than 5% of samples cut at max_new_tokens are flagged (``mars_bench.stats``).

Python API (also used by notebooks/analysis.ipynb): results as two pandas DataFrames (``frames.py``).

    from mars_bench.report import all_tables, group_figures, groups, load_frames
    frames = load_frames(["results", "other_worker/results"])
    frames.runs, frames.samples        # one row per run / per sample and run
"""
from __future__ import annotations

import argparse
import contextlib
import re
import sys
from pathlib import Path

from mars_bench.report.console import print_console, render
from mars_bench.report.docs import write_results_md
from mars_bench.report import serving
from mars_bench.report.figures import group_figures
from mars_bench.report.layout import make_figures
from mars_bench.report.frames import DEFAULT_THETA, Frames, groups, load_frames
from mars_bench.store.pack import SUFFIX, is_pack, pack, unpacked
from mars_bench.report.tables import all_tables, write_tables
from mars_bench.report.writer import Table

__all__ = ["Frames", "Table", "all_tables", "group_figures", "groups", "load_frames", "make_figures",
           "print_console", "render", "write_report", "run_figures"]


def write_report(roots, out: str | Path | None = None, theta: float = DEFAULT_THETA,
                 figures: bool = True, missing_shards: list[str] | None = None) -> dict:
    """Load ``roots``, write tables and figures under ``out``, and the two pages that show them, ``report.md`` and
    ``report.html``; returns {'frames', 'tables', 'paths', 'out', 'drawn', 'missing_shards'}.
    ``missing_shards``: the shards of a sharded study whose packs are not among ``roots`` (the caller knows the
    plan, ``run.shards.missing``); None for a study that is not sharded."""
    from mars_bench.report.layout import draw, page_tables

    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    out = Path(out) if out is not None else (Path(str(roots[0])[:-len(SUFFIX)]) if is_pack(roots[0])
                                             else Path(roots[0])) / "report"
    with contextlib.ExitStack() as stack:
        dirs = [stack.enter_context(unpacked(r)) if is_pack(r) else r for r in roots]
        frames = load_frames(dirs)
        served = serving.rows([run for d in dirs for run in serving.load(d)])   # engine.serve runs (vllm serve)
    tables = all_tables(frames.runs, theta)
    shown = {name: t for name, t in tables.items() if not t.empty}   # a table without rows is no file, no section
    paths = write_tables(shown, out / "tables")
    drawn = draw(frames, out / "figures", theta) if figures else []
    _remove_stale(out, [n for n in tables if n not in shown], [p for d in drawn for p in d.paths] if figures else None)
    pages = {name: t for name, t in page_tables(frames.runs, theta).items() if not t.empty}
    served_part = serving.write_rows(served, out / "serving" / "serving.md", figures) if not served.empty else None
    _write_pages(out, roots, frames, pages, drawn, missing_shards, served_part)
    return {"frames": frames, "tables": tables, "paths": paths + [p for d in drawn for p in d.paths], "out": out,
            "drawn": drawn, "missing_shards": missing_shards}


def _remove_stale(out: Path, empty: list[str], figures: list[Path] | None) -> None:
    """Files an earlier report wrote to ``out`` that this one does not: the tables now without rows, and (when
    figures were drawn) the figures not drawn now, so that the folder holds one report."""
    from mars_bench.report.figures import FIGURES

    stale = [out / "tables" / f"{n}.{ext}" for n in empty for ext in ("md", "csv", "tex")]
    if figures is not None:
        kinds = (*FIGURES, "study_theta", "r_distribution", "z1_histogram")
        stale += [p for p in (out / "figures").glob("*__*") if p.name.split("__")[0] in kinds and p not in figures]
    for p in stale:
        p.unlink(missing_ok=True)


def _intro(roots, frames: Frames, absent: list[str] | None) -> list[str]:
    names = " ".join(str(r) for r in roots)
    out = [f"Results read from: {', '.join(str(r) for r in roots)} ({len(frames.runs)} runs). Regenerate with "
           f"`mars-bench-report {names}`. Every column of a table is in its csv (and tex) under tables/."]
    if absent is not None:   # a sharded study (mars_bench/run/shards.py): say which shards' packs were not given
        out.append(f"Shards missing: {', '.join(absent)} (their numbers are absent, not estimated)." if absent
                   else "Shards: every shard of `make reproduce-full` is here.")
    return out


def _write_pages(out: Path, roots, frames: Frames, tables, drawn, absent: list[str] | None = None,
                 served: tuple | None = None) -> None:
    """``report.md`` and ``report.html``: the definitions once, then a section per question that has data
    (``layout.sections``), each with its tables (compact view) and figures; ``served``: the serving part's markdown
    and figures (``serving.write_rows``), a last section of report.md, named in report.html's intro."""
    from mars_bench.report.definitions import strip_definitions
    from mars_bench.report.html import definitions_used, page
    from mars_bench.report.layout import sections
    from mars_bench.store.io import atomic_write_text

    parts = sections(tables, drawn)
    intro = _intro(roots, frames, absent)
    if "study" in tables:
        intro.append("A study's runs appear once, for the phase that answers each question: speed from the study "
                     "table (its phases joined), quality, acceptance and fidelity from the quality phase (every "
                     "sample); tables/ holds every run of each table.")
    lines = ["# mars-bench report", ""] + [x for p in intro for x in (p, "")]
    if frames.problems:
        lines += ["## Problems (lines skipped)", ""] + [f"- {p}" for p in frames.problems] + [""]
        intro.append("Problems (lines skipped): " + "; ".join(frames.problems))
    defs = definitions_used(tables.values())
    if defs:
        lines += ["## Definitions", ""] + [f"- {d}" for d in defs] + [""]
    if not parts:
        lines += ["No table has rows and no figure could be drawn from these runs.", ""]
    for _, title, question, ts, figs in parts:
        lines += [f"## {title}", "", f"*{question}*", ""]
        for name, t in ts:
            lines += [t.to_markdown(caption=strip_definitions(t.caption)[0]).rstrip(),
                      "", f"Files: tables/{name}.md, tables/{name}.csv, tables/{name}.tex", ""]
        lines += [x for d in figs for x in (f"![{d.png.stem}](figures/{d.png.name})", "", f"*{d.caption}*", "")]
    if served is not None:
        md, figs = served
        intro.append("Serving (vllm serve, engine.serve=true): throughput, latency and quality against concurrency "
                     "in serving/serving.md and its figures.")
        lines += ["## Serving (vllm serve)", "", "*Throughput, latency and the served outputs' quality against "
                  "concurrency (mars_bench/report/serving.py; also serving/serving.md).*", "",
                  re.sub(r"^## ", "### ", md, flags=re.M).rstrip(), ""]
        lines += [x for f in figs for x in (f"![{f.stem}](serving/{f.name})", "")]
    atomic_write_text(out / "report.md", "\n".join(lines).rstrip() + "\n")
    atomic_write_text(out / "report.html", page("mars-bench report", intro, parts))


def run_figures(run_dir: str | Path, theta: float = DEFAULT_THETA) -> list[Path]:
    """PNG figures of one run, saved to ``<run_dir>/figures``: r distribution and z1 histogram of its
    positions, speedup and tau beside its siblings (same settings). Used by the W&B logger."""
    from mars_bench.store.spec import read_spec
    from mars_bench.report.figures import slug, speedup_tau
    from mars_bench.report.logits import r_distribution, z1_histogram

    run_dir, spec = Path(run_dir), read_spec(run_dir)
    frames = load_frames(run_dir.parent)
    runs = frames.runs
    mine = runs.loc[[s == spec and m == run_dir.parent.parent.name for s, m in zip(runs["spec"], runs["model_dir"])]]
    if spec is None or mine.empty:
        return []
    run = mine.iloc[0]
    figs = {"speedup_tau": speedup_tau(runs[runs["group"] == run["group"]], theta)}
    if run["method"] != "ar":
        figs.update(r_distribution=r_distribution(run, frames.samples, theta),
                    z1_histogram=z1_histogram(run, frames.samples))
    paths = []
    for name, fig in figs.items():
        if fig is not None:
            paths.append(run_dir / "figures" / f"{name}__{slug(run)}.png")
            paths[-1].parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(paths[-1], dpi=120)
    return paths
