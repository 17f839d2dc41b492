"""The batch table of `make bench`: throughput of ar, sd and mars (theta 0.9) at batch sizes 1, 2, 4, 8.

Every row is the runner's: per task (GSM8K, HumanEval) and batch size B, one invocation of
`mars-bench +compare=bench_batch task=<task> batch_size=<B>` (mars_bench/conf/compare/bench_batch.yaml:
ar, sd and mars at k = 4, decoded interleaved, continuous refill), greedy, on the embedded default pair
(``--model tiny``: the tiny random pair, a smoke run of this script). Throughput = summary.json's tokens/s
(total new tokens / total wall s, prefills included: at B > 1 not a latency); `x ar` = its speedup over ar
at the same B with its CI (summary.json). `x itself (B=1)` divides the tokens/s of two invocations (not
interleaved with each other: drift between them lands in that ratio); `same as B=1`: samples whose tokens
equal the method's B = 1 tokens (from the records). Writes results/bench/batch.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from bench import TASKS, fresh_runs_dir, run_compare  # noqa: E402
from mars_bench.records import TAU_DEFINITION, read_samples  # noqa: E402

GOAL = 1.8          # sd at its best B over sd at B = 1 (issue 12)


def outputs(dirs) -> dict:
    """Sample id -> output token ids of every turn, from a run's samples.jsonl."""
    out = {}
    for d in dirs:
        recs, _ = read_samples(Path(d) / "samples.jsonl")
        out.update({r["id"]: [t.get("output_ids") for t in r.get("turns", [])] for r in recs})
    return out


def batch_table(runs_dir) -> pd.DataFrame:
    """One row per (task, method, B) from the runs under ``runs_dir`` (``load_frames``)."""
    from mars_bench.report.frames import load_frames

    runs = load_frames([runs_dir]).runs
    rows = []
    for _, r in runs.iterrows():
        rows.append({"task": r["task"], "method": r["family"] if r["method"] == "ar" else r["label"],
                     "family": r["family"], "batch_size": int(r["batch_size"]), "tokens_per_s": r["tokens_per_s"],
                     "tau": r["tau"], "vs_ar_same_b": r["speedup"], "vs_ar_lo": r["speedup_lo"],
                     "vs_ar_hi": r["speedup_hi"], "n": int(r["n"]), "fast_kernel": ",".join(r["fast_kernel"] or []),
                     "outputs": outputs(r["dirs"])})
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    b1 = {(r.task, r.family): r for r in t[t["batch_size"] == t["batch_size"].min()].itertuples()}
    t["vs_self_b1"] = [r.tokens_per_s / b1[(r.task, r.family)].tokens_per_s for r in t.itertuples()]
    t["same_as_b1"] = [sum(o == b1[(r.task, r.family)].outputs.get(i) for i, o in r.outputs.items())
                       for r in t.itertuples()]
    order = {m: i for i, m in enumerate(("ar", "sd", "mars"))}
    t["_o"] = [(TASKS.index(x) if x in TASKS else len(TASKS), b, order.get(f.split()[0], 9))
               for x, b, f in zip(t["task"], t["batch_size"], t["family"])]
    return t.sort_values("_o").drop(columns=["_o", "outputs"]).reset_index(drop=True)


def goals(t: pd.DataFrame) -> list[dict]:
    """Per task: sd at its best B over sd at B = 1 (target GOAL)."""
    out = []
    for task, g in t[t["family"].str.startswith("sd")].groupby("task", sort=False):
        best = g.loc[g["tokens_per_s"].idxmax()]
        out.append({"task": task, "sd_best_b": int(best["batch_size"]), "sd_best_over_b1": best["vs_self_b1"],
                    "target": GOAL, "met": bool(best["vs_self_b1"] >= GOAL)})
    return out


def write(out: Path, name: str, t: pd.DataFrame, gs: list[dict], meta: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    f = lambda x: "-" if pd.isna(x) else f"{x:.2f}"  # noqa: E731
    show = pd.DataFrame({
        "task": t["task"], "method": t["method"], "B": t["batch_size"], "tokens/s": t["tokens_per_s"].map(f),
        "x ar (same B)": t["vs_ar_same_b"].map(f),
        "95% CI": [f"{f(a)}-{f(b)}" if not pd.isna(a) else "-" for a, b in zip(t["vs_ar_lo"], t["vs_ar_hi"])],
        "x itself (B=1)": t["vs_self_b1"].map(f), "tau": t["tau"].map(f),
        "same as B=1": [f"{s}/{n}" for s, n in zip(t["same_as_b1"], t["n"])]})
    by = {(r.task, r.family.split()[0], r.batch_size): r.tokens_per_s for r in t.itertuples()}
    mars_over_sd = {f"{task} B={b}": by[(task, "mars", b)] / by[(task, "sd", b)]
                    for task, m, b in by if m == "sd" and (task, "mars", b) in by}
    lines = [f"# Batched decoding throughput ({meta['pair']} pair)", "",
             f"Greedy, {meta['limit']} prompts per task, max_new_tokens={meta['max_new_tokens']}, k=4, mars theta=0.9, "
             f"{meta['threads']} threads; per task and B one runner invocation (`mars-bench +compare=bench_batch`), "
             "its methods interleaved. Throughput = total new tokens / total wall s (prefills included; at B > 1 "
             "not a latency); compare B > 1 rows only with ar at the same B (`x ar`, with its 95% CI from "
             "summary.json). `x itself (B=1)`: ratio of two invocations, not measured side by side. "
             f"{TAU_DEFINITION}. `same as B=1`: samples whose tokens equal the method's B = 1 tokens.", "",
             show.to_markdown(index=False, disable_numparse=True), "",
             "mars over sd (tokens/s ratio, same invocation): "
             + ", ".join(f"{k}: {v:.2f}" for k, v in mars_over_sd.items()),
             ""]
    lines += [f"Goal ({g['task']}): sd at its best B (B={g['sd_best_b']}) = {g['sd_best_over_b1']:.2f}x sd at B=1 "
              f"(target >= {g['target']}x): {'met' if g['met'] else 'NOT met'}." for g in gs]
    md = "\n".join(lines) + "\n"
    (out / f"{name}.md").write_text(md)
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": json.loads(t.to_json(orient="records")),
                                                  "mars_over_sd": mars_over_sd, "goal": gs}, indent=2) + "\n")
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=8, help="prompts per task (GSM8K, HumanEval); >= the largest B "
                    "fills every batch")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--model", default=None, help="a conf/model entry instead of the default pair (e.g. tiny)")
    ap.add_argument("--tiny", action="store_true", help="= --model tiny (a smoke run of this script)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"))
    ap.add_argument("--runs", default=str(ROOT / "results" / "bench_runs" / "batch"),
                    help="where the runner writes (cleared first)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    model = "tiny" if args.tiny else args.model
    runs = fresh_runs_dir(Path(args.runs))
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    for task in args.tasks.split(","):
        for b in sizes:
            run_compare("bench_batch", task, runs, [f"limit={args.limit}", f"max_new_tokens={args.max_new_tokens}",
                                                    f"batch_size={b}", "progress=false",
                                                    *([f"model={model}"] if model else [])], args.threads)
    t = batch_table(runs)
    meta = {"pair": model or "embedded default", "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "batch_sizes": sizes, "threads": args.threads,
            "runs": str(runs.relative_to(ROOT) if runs.is_relative_to(ROOT) else runs),
            "fast_kernel": sorted(set(t["fast_kernel"])) if len(t) else None}
    print(write(Path(args.out), "batch_tiny" if model == "tiny" else "batch", t, goals(t), meta))


if __name__ == "__main__":
    main()
