"""The CPU kernel family's costs on the embedded pair (bf16 target), in this process: target forward of 1, 5
and 8 new tokens (``--rows``; 16 for a 16-node tree's verification) after 200 tokens of context (fused where the target qualifies, and through transformers'
modules beside it), a 100-token prefill, a 1-token forward of each draft setting, the
machine's streaming rate and the peak RSS. Run it once per kernel family to compare them on one machine:

    MARS_BENCH_CPU_ISA=generic python scripts/bench_cpu_kernels.py   # before: MKL packed fp32, int8 draft
    MARS_BENCH_CPU_ISA=avx2 python scripts/bench_cpu_kernels.py      # the avx2 kernels

Prints one JSON object (and appends it to ``--out`` when given). ``--layers N``: instead of the pair, N decoder
layers of the target's linear shapes plus its LM head (bf16 weights, never cached between calls), each kernel
kind in turn per row count in this one process: the panel kernel of this family, MKL packed fp32 (the fallback:
the bf16 weights widened) and torch's own bf16 ``F.linear``."""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

from mars_bench.run import bench as B
from mars_bench.models import fastpath, panel, quant
from mars_bench.models.pairs import load_draft


def prefill_ms(adapter, n: int = 100, reps: int = 2) -> float:
    ids = torch.randint(0, 150000, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    best = float("inf")
    for _ in range(reps):
        adapter.reset()
        t0 = time.perf_counter()
        adapter.forward(ids, logits=False)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


SHAPES = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]


def layer_costs(layers: int, reps: int, rounds: int) -> dict:
    """ms of one pass over ``layers`` x the target's 7 linear shapes + its LM head at M = 1, 5, 8, per kernel."""
    from torch import nn

    g = torch.Generator().manual_seed(0)
    lins = [nn.Linear(i, o, bias=False, dtype=torch.bfloat16) for o, i in SHAPES * layers + [(151936, 1536)]]
    for lin in lins:
        lin.weight.data.copy_(torch.randn(lin.weight.shape, generator=g) * 0.02)
    kinds = {"torch-bf16": lins}
    wide = []
    for lin in lins:
        f = nn.Linear(lin.in_features, lin.out_features, bias=False)
        f.weight.data.copy_(lin.weight.float())
        wide.append(fastpath.PackedLinear(f))
    kinds["mkl-packed"] = wide
    if panel.bf16_available():
        kinds[panel.PanelLinear(lins[0]).kernel] = [panel.PanelLinear(lin) for lin in lins]
    out = {k: {} for k in kinds}
    with torch.inference_mode():
        for _ in range(rounds):
            for m in (1, 5, 8):
                xs = {d: torch.randn(m, d, generator=g) for d in (1536, 8960)}
                for name, mods in kinds.items():
                    for mod in mods:
                        if isinstance(mod, fastpath.PackedLinear):
                            mod.pack(m)
                    best = float("inf")
                    for _ in range(reps):
                        t0 = time.perf_counter()
                        for mod in mods:
                            mod(xs[mod.in_features].to(torch.bfloat16) if name == "torch-bf16" else xs[mod.in_features])
                        best = min(best, time.perf_counter() - t0)
                    out[name][m] = min(out[name].get(m, float("inf")), best * 1e3)
    weights = sum(lin.weight.numel() * 2 for lin in lins)
    stream = B.stream_rate()
    return {"isa": panel.isa(), "layers": layers, "bf16_weight_bytes": weights, "stream_gb_per_s": stream,
            "ms": out, "ratio_to_m1": {k: {m: v[m] / v[1] for m in v} for k, v in out.items()},
            "m1_over_streaming_limit": {k: v[1] / (weights / stream / 1e6) for k, v in out.items()},
            "threads": torch.get_num_threads()}


def parse_rows(text: str) -> list[int]:
    """``--rows``' row counts, 1 added (every ratio is to it), sorted; a bad list raises one line naming it."""
    try:
        rows = sorted({1, *(int(r) for r in text.split(","))})
    except ValueError:
        rows = [0]
    if rows[0] < 1:
        raise ValueError(f"--rows {text!r}: allowed is a comma-separated list of positive integers, e.g. 1,5,8,16")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafts", default="q8,q4,int8", help="draft settings (int8 | q8 | q4, +v<N>), comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch (and kernel) threads; default torch's own")
    ap.add_argument("--layers", type=int, default=0, help="time N layers of the target's shapes instead of the pair")
    ap.add_argument("--rows", default="1,5,8", help="target forwards of these many new tokens, comma-separated "
                    "(1 is always timed: every ratio is to it; 16 = a 16-node tree's verification)")
    args = ap.parse_args(argv)
    try:
        rows = parse_rows(args.rows)
    except ValueError as e:
        ap.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.layers:
        return emit(layer_costs(args.layers, args.reps, args.rounds), args.out)
    pair, _ = B.load(["model.dtype=bf16"])
    drafts = {}
    for d in args.drafts.split(","):
        adapter, scheme = load_draft(B.model_cfg(["model.dtype=bf16", *B.draft_overrides(d)]), pair)
        drafts[f"{d} ({scheme}, {'fused' if adapter.fused is not None else 'modules'})"] = adapter
    paths = {"target": (pair.target, True)}
    if pair.target.fused is not None:            # the same target through transformers' modules, side by side
        modules = pair.target.fork()
        modules.fused = None
        paths["modules"] = (modules, True)
    costs = B.forward_costs(paths, rows, reps=args.reps, rounds=args.rounds)
    target = costs["target"]
    drafted = B.forward_costs({d: (a, True) for d, a in drafts.items()}, [1], reps=args.reps, rounds=args.rounds)
    weights = B.weight_bytes(pair.target.model)
    stream = B.stream_rate()
    out = {"isa": panel.isa(), "kernel": fastpath.kind(pair.target.model), "quant_kernel": quant.kind(),
           "target_path": "fused" if pair.target.fused is not None else "modules", "target_ms": target,
           "target_modules_ms": costs.get("modules"), "verify_ratio": {n: target[n] / target[1] for n in rows},
           # the n-token forward's rate, one multiply-add (2 flops) per weight and row (attention left out): where
           # it stops growing with n, the forward is compute-bound and each extra row costs its share
           "target_gflop_per_s": {n: 2 * weights / 2 * n / (target[n] / 1e3) / 1e9 for n in rows},
           "target_weight_bytes": weights, "stream_gb_per_s": stream,
           "forward1_over_streaming_limit": target[1] / (weights / stream / 1e6),
           "prefill100_ms": prefill_ms(pair.target),
           "draft_ms": {d: v[1] for d, v in drafted.items()},
           "draft_over_target": {d: v[1] / target[1] for d, v in drafted.items()},
           "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
           "threads": torch.get_num_threads()}
    return emit(out, args.out)


def emit(out: dict, path: Path | None) -> int:
    print(json.dumps(out, indent=1))
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
