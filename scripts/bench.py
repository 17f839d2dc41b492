"""`make bench`: speed of our decoding paths on the embedded default pair, in one table.

Every row is the runner's: per task (GSM8K, HumanEval) and target dtype, one invocation of
`mars-bench +compare=bench task=<task> model.dtype=<dtype>` (conf/compare/bench.yaml: ar, sd, mars theta 0.9
and 1, adaptive-length sd, sd_tree, prompt lookup), the methods decoded interleaved sample by sample (order
rotated per sample), into --runs (cleared first). Tokens/s, tau, speedup vs ar with its paired bootstrap CI,
samples identical to ar and the share of the loop's wall time outside forwards are summary.json's
(``mars_bench.run.bench.runner_rows``). Beside them: the peak RSS of each runner process (it loads the pair as
`make run` does and decodes every method), and the forward cost of n new tokens per target path (fp32 plain,
fp32 panel, bf16 where its kernel runs, llama.cpp's Q4_K_M where it runs) and of the draft, measured in this
process, the paths alternating. ``--model tiny``: the tiny random pair (a smoke run of this script).
Writes results/bench/bench.{md,csv,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd
import torch

from mars_bench.run import bench as B
from mars_bench.models import llamacpp, panel
from mars_bench.store.metrics import SPEEDUP_DEFINITION, TAU_DEFINITION
from mars_bench.store.provenance import machine, machine_label

COLUMNS = ["task", "block", "row", "precision", "tokens_per_s", "tau", "vs_ar", "vs_ar_lo", "vs_ar_hi",
           "identical_to_ar", "n", "outside_forward_share", "method", "k", "theta"]


def table_of(rows: pd.DataFrame) -> pd.DataFrame:
    """The runner's rows, per task in TASKS' order (the runner's row order kept within a task)."""
    order = lambda t: t.map(lambda x: B.TASKS.index(x) if x in B.TASKS else len(B.TASKS))  # noqa: E731
    return rows.sort_values("task", key=order, kind="stable", ignore_index=True)[COLUMNS]


def cost_paths(model: list[str], dtypes: list[str], threads: int, llama: bool) -> tuple[dict, dict]:
    """({path name: (adapter, packing) or a llama.cpp runner}, {path: kernel}) of the pair of ``model``: the fp32
    target plain and packed, the bf16 target where its kernel runs, llama.cpp's Q4_K_M target, and the draft of
    the first dtype's config."""
    from mars_bench.models import fastpath
    from mars_bench.models.pairs import eos_ids

    pair, quant = B.load([*model, "model.dtype=fp32"])
    paths = {"fp32 plain": (pair.target, False), "fp32 panel": (pair.target, True)}
    kernels = {"fp32 target": fastpath.kind(pair.target.model)}
    first = pair
    if "bf16" in dtypes:
        pair16, quant = B.load([*model, "model.dtype=bf16"])
        paths["bf16"] = (pair16.target, True)
        kernels["bf16 target"] = fastpath.kind(pair16.target.model)
        first = pair16 if dtypes[0] == "bf16" else pair
    if llama:
        target, draft = B.gguf_paths()
        paths["llama.cpp Q4_K_M"] = llamacpp.LlamaCppRunner(str(target), str(draft), k=4, threads=threads,
                                                            eos_ids=eos_ids(pair.target.model, pair.tokenizer))
    paths[f"draft ({quant}, {dtypes[0]})"] = (first.draft, True)
    return paths, kernels


def write(out: Path, table: pd.DataFrame, costs: dict, rss: dict, meta: dict) -> str:
    """bench.md (the table, memory, forward costs), bench.csv, bench.json."""
    f = lambda x, p=2: "-" if x is None or pd.isna(x) else f"{x:.{p}f}"  # noqa: E731
    md = lambda df, cols=None: pd.DataFrame(df, columns=cols).to_markdown(  # noqa: E731
        index=False, disable_numparse=True)
    shown = pd.DataFrame({
        "task": table["task"], "rows": table["block"], "method": table["row"], "target precision": table["precision"],
        "tokens/s": table["tokens_per_s"].map(f), "tau": table["tau"].map(f), "vs ar": table["vs_ar"].map(f),
        "95% CI": [f"{f(lo)}-{f(hi)}" if not pd.isna(lo) else "-" for lo, hi in zip(table["vs_ar_lo"],
                                                                                   table["vs_ar_hi"])],
        "identical to ar": [f"{a}/{n}" if not pd.isna(a) else "-" for a, n in zip(table["identical_to_ar"],
                                                                                  table["n"])],
        "outside forwards": [f(x * 100, 1) + "%" if not pd.isna(x) else "-" for x in table["outside_forward_share"]]})
    kernels = ", ".join(f"{k}: {v}" for k, v in (meta.get("kernels") or {}).items())
    lines = [f"# {meta.get('pair', 'Embedded default pair')} ({meta.get('draft_quant')} draft, CPU {os.cpu_count()} "
             "cores), greedy", "", f"Machine: {meta.get('machine', 'unrecorded')}.", "",
             f"{meta.get('prompts_per_task')} prompts per task, max_new_tokens={meta.get('max_new_tokens')}. Kernels: "
             f"{kernels}. Every row: `mars-bench +compare=bench` (conf/compare/bench.yaml), one invocation per task "
             f"and dtype, the methods interleaved sample by sample; each ratio is to the ar of its invocation, from "
             f"summary.json (runs: `{meta.get('runs')}`). {TAU_DEFINITION}. vs ar: {SPEEDUP_DEFINITION}; 95% CI: "
             "paired bootstrap over prompts. outside forwards: share of the decoding loop's wall time (prefill "
             "excluded) outside target and draft forwards.", "", md(shown), "",
             "Peak resident memory (ru_maxrss, GB) of each runner process (it loads the pair as `make run` does "
             "and decodes every method of the table):", "",
             md([[d, t, f(v)] for d, by in rss.items() for t, v in by.items()], ["dtype", "task", "peak RSS GB"])]
    if meta.get("llama_cpp_skipped"):
        lines += ["", f"llama.cpp forward costs skipped: {meta['llama_cpp_skipped']}."]
    if costs:
        ns = list(next(iter(costs.values())))
        lines += ["", f"Forward cost of n new tokens after 200 tokens of context, ms (ratio to n={ns[0]}):", "",
                  md([[n] + [f"{c[n]:.1f} ({c[n] / c[ns[0]]:.2f})" for c in costs.values()] for n in ns],
                     ["n", *costs])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text := "\n".join(lines) + "\n")
    table.to_csv(out / "bench.csv", index=False)
    (out / "bench.json").write_text(json.dumps({"meta": meta, "table": json.loads(table.to_json(orient="records")),
                                                "forward_ms": costs, "peak_rss_gb": rss}, indent=2, default=str))
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=5, help="prompts per task (GSM8K, HumanEval)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--model", default=None, help="a conf/model entry instead of the embedded default (e.g. tiny)")
    ap.add_argument("--dtypes", default=None, help="target dtypes, one runner invocation per task each (default: "
                    "bf16 where the bf16 kernel runs, else fp32; e.g. bf16,fp32)")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp's forward costs")
    ap.add_argument("--cost-n", default=",".join(map(str, range(1, 17))),
                    help="n of the forward-cost table (1 first; empty: no table)")
    ap.add_argument("--cost-rounds", type=int, default=2, help="passes over n in the forward-cost table")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--runs", default="results/bench_runs/decode", help="where the runner writes (cleared first)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = [f"model={args.model}"] if args.model else []
    bf16 = panel.bf16_available()
    if not bf16 and not args.dtypes:
        print(f"bf16 rows skipped: no bf16 panel kernel ({panel.unavailable() or 'CPU lacks AVX512_BF16'})",
              file=sys.stderr)
    dtypes = args.dtypes.split(",") if args.dtypes else ["bf16" if bf16 else "fp32"]
    why_no_llama = ("--no-llama" if args.no_llama else "--model " + args.model if args.model
                    else B.llama_unavailable())
    runs = B.fresh_runs_dir(Path(args.runs))
    rss = {d: {t: B.run_compare("bench", t, runs, [*model, f"limit={args.limit}",
                                                   f"max_new_tokens={args.max_new_tokens}", f"model.dtype={d}",
                                                   "progress=false"], args.threads) for t in B.TASKS}
           for d in dtypes}
    table = table_of(B.runner_rows(runs))
    ns = [int(n) for n in args.cost_n.split(",") if n]
    paths, kernels = cost_paths(model, dtypes, args.threads, not why_no_llama)
    print("forward cost of n tokens...", file=sys.stderr)
    costs = B.forward_costs(paths, ns, rounds=args.cost_rounds) if ns else {}
    meta = {"pair": f"{args.model} pair" if args.model else "Embedded default pair", "prompts_per_task": args.limit,
            "max_new_tokens": args.max_new_tokens, "dtypes": dtypes,
            "draft_quant": B.model_cfg(model).get("draft_quant", "none"), "kernels": kernels,
            "llama_cpp_skipped": why_no_llama,
            "threads": args.threads, "runs": str(runs), "torch": torch.__version__,
            "machine": machine_label(machine())}
    print(write(Path(args.out), table, costs, rss, meta))


if __name__ == "__main__":
    main()
