"""The batch table of `make bench`: throughput of ar, sd and mars (theta 0.9) at batch sizes 1, 2, 4, 8.

Greedy, the same prompts (first GSM8K and HumanEval questions, chat template), the same max_new_tokens
and stop conditions everywhere, on the embedded default pair (``--tiny``: the tiny random pair, a smoke
run of this script). Every (method, B) cell decodes all prompts with continuous refill
(``decode.batch``); cells are measured side by side in one run, their order rotated per round, so
machine noise hits every cell alike. Throughput = total new tokens / total wall seconds of the cell
(prefills included): at B > 1 that is not a latency. Each cell's ratio is given to ar at the same B and
to the same method at B = 1; also mars over sd at each B, and whether each sample's tokens equal its
B = 1 tokens. Writes results/bench/batch.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mars_bench.decode import DecodeConfig, Method  # noqa: E402
from mars_bench.decode.generate import Request, generate_batch  # noqa: E402
from mars_bench.models.pairs import eos_ids  # noqa: E402
from mars_bench.records import TAU_DEFINITION  # noqa: E402

GOAL = 1.8          # sd at its best B over sd at B = 1 (issue 12)


def load(tiny: bool, model: str | None = None):
    """(target, draft, tokenizer, fast kernel) of the embedded default pair on its fast path, or the tiny pair."""
    from mars_bench.models import fastpath

    if tiny:
        from mars_bench.models.adapter import CausalLMAdapter
        from mars_bench.models.tiny import tiny_pair

        t, d, tok = tiny_pair()
        target = CausalLMAdapter(t)
        return target, CausalLMAdapter(d, out_vocab=target.vocab), tok, "off"
    from hydra import compose, initialize_config_dir

    from mars_bench import config as C
    from mars_bench.models.pairs import load_pair

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "mars_bench" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}"] if model else [])
    pair = load_pair(cfg.model, need_draft=True)
    return pair.target, pair.draft, pair.tokenizer, fastpath.kind(pair.target.model)


def prompts(tok, n: int, data_dir: str, tiny: bool) -> list[list[int]]:
    from mars_bench.tasks import build_messages, get_task

    if tiny:
        from tests.conftest import PROMPTS

        return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                        return_dict=False) for p in PROMPTS[:n]]
    out = []
    for name, m in (("gsm8k", (n + 1) // 2), ("humaneval", n // 2)):
        task = get_task(name)
        out += [tok.apply_chat_template(build_messages(task, s, [], 0), add_generation_prompt=True, return_dict=False)
                for s in task.load(data_dir, limit=m)]
    return out


def cell(target, draft, tok, items, method, cfg, batch_size):
    """Decode every prompt at ``batch_size``; (wall s, tokens per prompt, target forwards)."""
    out = {}
    steps = {}

    def done(req, res):
        out[req.key], steps[req.key] = res.tokens, res.steps
        return None

    t0 = time.perf_counter()
    generate_batch(target, draft, tok, [Request(ids, key=i) for i, ids in enumerate(items)], method, cfg,
                   batch_size, done)
    return time.perf_counter() - t0, [out[i] for i in range(len(items))], sum(steps.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="GSM8K + HumanEval prompts (half each)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--k", type=int, default=4, help="drafts per step for sd and mars")
    ap.add_argument("--theta", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=1, help="measurements of every cell (order rotated)")
    ap.add_argument("--tiny", action="store_true", help="the tiny random pair (a smoke run of this script)")
    ap.add_argument("--model", default=None, help="a conf/model entry instead of the default pair (e.g. tiny: "
                    "the embedded code path on GSM8K/HumanEval prompts, in seconds)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = os.environ.get("MARS_BENCH_DATA_DIR")   # None: the tasks' own lookup (tasks/data.py)
    target, draft, tok, kernel = load(args.tiny, args.model)
    eos = eos_ids(target.model, tok)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_ids=tuple(eos))
    items = prompts(tok, args.prompts, data_dir, args.tiny)
    methods = {"ar": Method("ar"), "sd": Method("sd", k=args.k),
               "mars": Method("mars", k=args.k, rule_kwargs={"theta": args.theta})}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    cells = [(m, b) for b in sizes for m in methods]
    cell(target, draft, tok, items[:2], methods["sd"], DecodeConfig(max_new_tokens=4), 2)     # warm-up
    raw = {c: {"wall_s": 0.0, "tokens": 0, "steps": 0, "outputs": None} for c in cells}
    for r in range(args.rounds):
        for n in range(len(cells)):
            m, b = cells[(n + r * 5) % len(cells)]
            print(f"round {r + 1}/{args.rounds}: {m} B={b}", file=sys.stderr, flush=True)
            wall, outs, steps = cell(target, draft, tok, items, methods[m], cfg, b)
            c = raw[(m, b)]
            c["wall_s"] += wall
            c["tokens"] += sum(map(len, outs))
            c["steps"] += steps
            c["outputs"] = c["outputs"] or outs
    table = []
    for m, b in cells:
        c = raw[(m, b)]
        tps = c["tokens"] / c["wall_s"]
        same_b1 = sum(o == o1 for o, o1 in zip(c["outputs"], raw[(m, sizes[0])]["outputs"]))
        table.append({"method": m, "batch_size": b, "tokens_per_s": tps, "tau": c["tokens"] / c["steps"],
                      "new_tokens": c["tokens"], "wall_s": c["wall_s"], "same_as_b1": same_b1})
    by = {(row["method"], row["batch_size"]): row for row in table}
    for row in table:
        row["vs_ar_same_b"] = row["tokens_per_s"] / by[("ar", row["batch_size"])]["tokens_per_s"]
        row["vs_self_b1"] = row["tokens_per_s"] / by[(row["method"], sizes[0])]["tokens_per_s"]
    mars_over_sd = {b: by[("mars", b)]["tokens_per_s"] / by[("sd", b)]["tokens_per_s"] for b in sizes}
    best = max(sizes, key=lambda b: by[("sd", b)]["tokens_per_s"])
    goal = {"sd_best_b": best, "sd_best_over_b1": by[("sd", best)]["vs_self_b1"], "target": GOAL,
            "met": by[("sd", best)]["vs_self_b1"] >= GOAL}
    write(Path(args.out), args, table, mars_over_sd, goal, kernel, len(items))


def write(out: Path, args, table, mars_over_sd, goal, kernel, n_prompts):
    out.mkdir(parents=True, exist_ok=True)
    name = "batch_tiny" if args.tiny else "batch"
    meta = {"pair": "tiny" if args.tiny else args.model or "embedded default", "prompts": n_prompts,
            "max_new_tokens": args.max_new_tokens, "k": args.k, "theta": args.theta, "rounds": args.rounds,
            "threads": args.threads, "fast_kernel": kernel, "torch": torch.__version__}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": table, "mars_over_sd": mars_over_sd,
                                                  "goal": goal}, indent=2) + "\n")
    lines = [f"# Batched decoding throughput ({meta['pair']} pair)", "",
             f"Greedy, {n_prompts} prompts ({'the fast tier' if args.tiny else 'GSM8K + HumanEval'}), max_new_tokens={args.max_new_tokens}, k={args.k}, "
             f"mars theta={args.theta:g}, {args.threads} threads, fast kernel {kernel}, {args.rounds} round(s), "
             "cells interleaved in one run. Throughput = total new tokens / total wall s of the cell (prefills "
             "included; at B > 1 not a latency); compare B > 1 rows only with ar at the same B. "
             f"{TAU_DEFINITION}. `same as B=1`: samples whose tokens equal the method's B = 1 tokens.", "",
             "| method | B | tokens/s | x ar (same B) | x itself (B=1) | tau | same as B=1 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['method']} | {r['batch_size']} | {r['tokens_per_s']:.2f} | {r['vs_ar_same_b']:.2f} | "
                     f"{r['vs_self_b1']:.2f} | {r['tau']:.2f} | {r['same_as_b1']}/{n_prompts} |")
    lines += ["", "mars over sd (tokens/s ratio) by B: "
              + ", ".join(f"B={b}: {v:.2f}" for b, v in mars_over_sd.items()), "",
              f"Goal: sd at its best B (B={goal['sd_best_b']}) = {goal['sd_best_over_b1']:.2f}x sd at B=1 "
              f"(target >= {goal['target']}x): {'met' if goal['met'] else 'NOT met'}.", ""]
    (out / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
