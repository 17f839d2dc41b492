"""Tables and figures from results trees (reads results files only).

    mars-bench-report [ROOT ...] [--out DIR] [--theta 0.9] [--no-figures] [--pack FILE.tar.xz] [--results-md FILE.md]

prints a compact comparison per settings group to stdout (``console.py``: shared settings once, then method,
n, tokens/s, tau, speedup, quality and its paired delta vs ar; 120 columns unless a terminal) and writes
every table (``.md``, ``.csv``, ``.tex``) and figure (``.png``, ``.pdf``) to ``<first ROOT>/report/`` (or ``--out``), with ``report.md`` linking them all.
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
import sys
from pathlib import Path

from .console import print_console, render
from .docs import write_results_md
from .figures import group_figures, make_figures
from .frames import DEFAULT_THETA, Frames, groups, load_frames
from .pack import SUFFIX, is_pack, pack, unpacked
from .tables import all_tables, write_tables
from .writer import Table

__all__ = ["Frames", "Table", "all_tables", "group_figures", "groups", "load_frames", "main", "make_figures",
           "print_console", "render", "write_report", "run_figures"]


def write_report(roots, out: str | Path | None = None, theta: float = DEFAULT_THETA,
                 figures: bool = True) -> dict:
    """Load ``roots``, write tables and figures under ``out``; returns {'frames', 'tables', 'paths', 'out'}."""
    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    out = Path(out) if out is not None else (Path(str(roots[0])[:-len(SUFFIX)]) if is_pack(roots[0])
                                             else Path(roots[0])) / "report"
    with contextlib.ExitStack() as stack:
        frames = load_frames([stack.enter_context(unpacked(r)) if is_pack(r) else r for r in roots])
    tables = all_tables(frames.runs, theta)
    paths = write_tables(tables, out / "tables")
    figs = make_figures(frames, out / "figures", theta) if figures else []
    from ..shards import missing

    absent = missing(roots)
    _write_index(out, roots, frames, tables, figs, absent)
    return {"frames": frames, "tables": tables, "paths": paths + figs, "out": out, "missing_shards": absent}


def _write_index(out: Path, roots, frames: Frames, tables, figs, absent: list[str] | None = None) -> None:
    from ..storage import atomic_write_text

    lines = ["# mars-bench report", "", f"Results read from: {', '.join(str(r) for r in roots)} "
             f"({len(frames.runs)} runs). Regenerate with `mars-bench-report {' '.join(str(r) for r in roots)}`.", ""]
    if absent is not None:   # a sharded study (mars_bench/shards.py): say which shards' packs were not given
        lines += [f"Shards missing: {', '.join(absent)} (their numbers are absent, not estimated)." if absent
                  else "Shards: every shard of `make reproduce-full` is here.", ""]
    if frames.problems:
        lines += ["## Problems (lines skipped)", ""] + [f"- {p}" for p in frames.problems] + [""]
    for name, t in tables.items():
        lines += [f"## {name}", "", f"Files: tables/{name}.md, tables/{name}.csv, tables/{name}.tex", "",
                  t.to_markdown(), ""]
    pngs = [p for p in figs if p.suffix == ".png"]
    if pngs:
        lines += ["## Figures", ""] + [f"![{p.stem}](figures/{p.name})" for p in pngs]
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")


def run_figures(run_dir: str | Path, theta: float = DEFAULT_THETA) -> list[Path]:
    """PNG figures of one run, saved to ``<run_dir>/figures``: r distribution and z1 histogram of its
    positions, speedup and tau beside its siblings (same settings). Used by the W&B logger."""
    from ..tags import read_spec
    from .figures import slug, speedup_tau
    from .logits import r_distribution, z1_histogram

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mars-bench-report", description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", default=["results"], metavar="ROOT",
                    help="results trees to read and merge (default: results)")
    ap.add_argument("--out", default=None, help="output folder (default: <first ROOT>/report)")
    ap.add_argument("--theta", type=float, default=DEFAULT_THETA,
                    help=f"mars theta shown in the main table and marked in figures (default {DEFAULT_THETA})")
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    ap.add_argument("--pack", default=None, metavar="FILE.tar.xz",
                    help="also pack the first ROOT's run files (run.json, samples, summary, config) into this file")
    ap.add_argument("--results-md", default=None, metavar="FILE.md",
                    help="also rewrite FILE.md's section generated from each ROOT, a .tar.xz pack, between its "
                         "marker comments, and with several packs the section over all of them (the paper's "
                         "layout and the claims; how docs/results.md's generated tables are regenerated)")
    args = ap.parse_args(argv)
    try:
        res = write_report(args.roots, args.out, args.theta, figures=not args.no_figures)
        if args.results_md:
            write_results_md(args.results_md, args.roots)
            every = " and the section over all of them" if len(args.roots) > 1 else ""
            print(f"mars-bench-report: rewrote the section generated from {', '.join(map(str, args.roots))}{every} "
                  f"in {args.results_md}", file=sys.stderr)
        if args.pack:
            print(f"mars-bench-report: packed {len(pack(args.roots[0], args.pack))} files to {args.pack}",
                  file=sys.stderr)
    except (FileNotFoundError, ValueError) as e:
        print(f"mars-bench-report: error: {e}", file=sys.stderr)
        return 2
    frames = res["frames"]
    for p in frames.problems:
        print(f"mars-bench-report: warning: {p} (skipped)", file=sys.stderr)
    if frames.runs.empty:
        print(f"mars-bench-report: no runs found under {', '.join(args.roots)}", file=sys.stderr)
        return 1
    if res["missing_shards"]:
        print(f"mars-bench-report: shards missing: {', '.join(res['missing_shards'])}", file=sys.stderr)
    print_console(frames.runs, args.theta)
    n_fig = sum(p.suffix == ".png" for p in res["paths"])
    print(f"mars-bench-report: {len(frames.runs)} runs; wrote {len(res['tables'])} tables (md, csv, tex) and "
          f"{n_fig} figures (png, pdf) to {res['out']} (index: {res['out'] / 'report.md'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
