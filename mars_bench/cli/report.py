"""``mars-bench-report``: tables (md, csv, tex) and figures from results trees and packs (``mars_bench.report``),
the sections of docs/results.md generated from packs, and a results tree packed for committing. The shard plan
(``run.shards``) is read here, so the report itself knows only what it is given."""
from __future__ import annotations

import argparse
import sys

from mars_bench.base.errors import InputError
from mars_bench.report import DEFAULT_THETA, print_console, write_report
from mars_bench.report.docs import write_results_md
from mars_bench.run.shards import missing
from mars_bench.store.pack import pack


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
        absent = missing(args.roots)
        res = write_report(args.roots, args.out, args.theta, figures=not args.no_figures, missing_shards=absent)
        if args.results_md:
            write_results_md(args.results_md, args.roots, missing_shards=absent)
            every = " and the section over all of them" if len(args.roots) > 1 else ""
            print(f"mars-bench-report: rewrote the section generated from {', '.join(map(str, args.roots))}{every} "
                  f"in {args.results_md}", file=sys.stderr)
        if args.pack:
            print(f"mars-bench-report: packed {len(pack(args.roots[0], args.pack))} files to {args.pack}",
                  file=sys.stderr)
    except (FileNotFoundError, InputError) as e:   # bad input: one line; a bug keeps its traceback
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
