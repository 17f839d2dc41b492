"""The batch table of `make bench`: throughput of ar, sd and mars (theta 0.9) at batch sizes 1, 2, 4, 8.

Every row is the runner's: per task (GSM8K, HumanEval) and batch size B, one invocation of
`mars-bench +compare=bench_batch task=<task> batch_size=<B>` (mars_bench/conf/compare/bench_batch.yaml:
ar, sd and mars at k = 4, decoded interleaved, continuous refill), greedy, on the embedded default pair
(``--model tiny``: the tiny random pair, a smoke run of this script). Throughput = summary.json's tokens/s
(total new tokens / total wall s, prefills included: at B > 1 not a latency); `x ar` = its speedup over ar
at the same B with its CI (summary.json). `x itself (B=1)`: the method's tokens/s over its own at B = 1 on the
same samples, with its paired bootstrap CI (``stats.speedup_ci`` over the records; two invocations, not
interleaved with each other: drift between them lands in that ratio); `same as B=1`: samples whose tokens
equal the method's B = 1 tokens. mars over sd: the same paired ratio within one invocation.
Writes results/bench/batch.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from mars_bench.run import bench as B
from mars_bench.store.metrics import TAU_DEFINITION

ORDER = ("ar", "sd", "mars")


def batch_table(runs_dir) -> pd.DataFrame:
    """One row per (task, method, B) from the runs under ``runs_dir`` (``mars_bench.run.bench.runner_rows``), with
    each method's ratio to itself at the smallest B (``mars_bench.run.bench.paired_ratio``)."""
    rows = B.runner_rows(runs_dir)
    if rows.empty:
        return rows
    b1 = {(r.task, r.method): r for r in rows[rows["batch_size"] == rows["batch_size"].min()].itertuples()}
    self_b1 = [B.paired_ratio(r.dirs, b1[(r.task, r.method)].dirs) for r in rows.itertuples()]
    t = pd.DataFrame({"task": rows["task"], "method": rows["row"], "family": rows["method"],
                      "batch_size": rows["batch_size"].astype(int), "tokens_per_s": rows["tokens_per_s"],
                      "tau": rows["tau"], "vs_ar_same_b": rows["vs_ar"], "vs_ar_lo": rows["vs_ar_lo"],
                      "vs_ar_hi": rows["vs_ar_hi"], "n": rows["n"].astype(int), "fast_kernel": rows["fast_kernel"],
                      "vs_self_b1": [e["value"] for e in self_b1], "vs_self_b1_lo": [e["lo"] for e in self_b1],
                      "vs_self_b1_hi": [e["hi"] for e in self_b1], "same_as_b1": [e["same_tokens"] for e in self_b1],
                      "dirs": rows["dirs"]})
    t["_o"] = [(B.TASKS.index(x) if x in B.TASKS else len(B.TASKS), b, ORDER.index(m) if m in ORDER else len(ORDER))
               for x, b, m in zip(t["task"], t["batch_size"], t["family"])]
    return t.sort_values("_o", kind="stable").drop(columns=["_o"]).reset_index(drop=True)


def mars_over_sd(t: pd.DataFrame) -> dict:
    """'<task> B=<b>' -> mars's tokens/s over sd's in the same invocation, paired by sample (``paired_ratio``)."""
    by = {(r.task, r.family, r.batch_size): r.dirs for r in t.itertuples()}
    return {f"{task} B={b}": B.paired_ratio(by[(task, "mars", b)], dirs)
            for (task, m, b), dirs in by.items() if m == "sd" and (task, "mars", b) in by}


def write(out: Path, name: str, t: pd.DataFrame, meta: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    f = lambda x: "-" if pd.isna(x) else f"{x:.2f}"  # noqa: E731
    show = pd.DataFrame({
        "task": t["task"], "method": t["method"], "B": t["batch_size"], "tokens/s": t["tokens_per_s"].map(f),
        "x ar (same B)": t["vs_ar_same_b"].map(f),
        "95% CI": [f"{f(a)}-{f(b)}" if not pd.isna(a) else "-" for a, b in zip(t["vs_ar_lo"], t["vs_ar_hi"])],
        "x itself (B=1)": [f"{f(v)} [{f(a)}, {f(b)}]" for v, a, b in zip(t["vs_self_b1"], t["vs_self_b1_lo"],
                                                                           t["vs_self_b1_hi"])], "tau": t["tau"].map(f),
        "same as B=1": [f"{s}/{n}" for s, n in zip(t["same_as_b1"], t["n"])]})
    ratios = mars_over_sd(t) if len(t) else {}
    lines = [f"# Batched decoding throughput ({meta['pair']} pair)", "",
             f"Greedy, {meta['limit']} prompts per task, max_new_tokens={meta['max_new_tokens']}, k=4, mars theta=0.9, "
             f"{meta['threads']} threads; per task and B one runner invocation (`mars-bench +compare=bench_batch`), "
             "its methods interleaved. Throughput = total new tokens / total wall s (prefills included; at B > 1 "
             "not a latency); compare B > 1 rows only with ar at the same B (`x ar`, with its 95% CI from "
             "summary.json). `x itself (B=1)`: ratio of two invocations, not measured side by side, with its 95% "
             "paired bootstrap CI over the samples. "
             f"{TAU_DEFINITION}. `same as B=1`: samples whose tokens equal the method's B = 1 tokens.", "",
             show.to_markdown(index=False, disable_numparse=True), "",
             "mars over sd (tokens/s ratio, same invocation, paired by sample, 95% CI): "
             + ", ".join(f"{k}: {f(v['value'])} [{f(v['lo'])}, {f(v['hi'])}]" for k, v in ratios.items())]
    md = "\n".join(lines) + "\n"
    (out / f"{name}.md").write_text(md)
    rows = json.loads(t.drop(columns=["dirs"]).to_json(orient="records"))
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "mars_over_sd": ratios}, indent=2,
                                                 default=str) + "\n")
    return md


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=8, help="prompts per task (GSM8K, HumanEval); >= the largest B "
                    "fills every batch")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--tasks", default=",".join(B.TASKS))
    ap.add_argument("--model", default=None, help="a conf/model entry instead of the default pair (e.g. tiny)")
    ap.add_argument("--tiny", action="store_true", help="= --model tiny (a smoke run of this script)")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--runs", default="results/bench_runs/batch",
                    help="where the runner writes (cleared first)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args(argv)
    model = "tiny" if args.tiny else args.model
    runs = B.fresh_runs_dir(Path(args.runs))
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    for task in args.tasks.split(","):
        for b in sizes:
            B.run_compare("bench_batch", task, runs, [f"limit={args.limit}", f"max_new_tokens={args.max_new_tokens}",
                                                    f"batch_size={b}", "progress=false",
                                                    *([f"model={model}"] if model else [])], args.threads)
    t = batch_table(runs)
    meta = {"pair": model or "embedded default", "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "batch_sizes": sizes, "threads": args.threads,
            "runs": str(runs),
            "fast_kernel": sorted(set(t["fast_kernel"])) if len(t) else None}
    print(write(Path(args.out), "batch_tiny" if model == "tiny" else "batch", t, meta))


if __name__ == "__main__":
    main()
