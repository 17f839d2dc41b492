"""GPU check of the decoding engine (mars_bench/decode) with the tiny random target/draft pair.

Run on the device machine (no internet, nothing to download; the tiny pair is built from configs):

    python scripts/gpu_check.py --device cuda          # default device; ~8 prompts, 32 new tokens
    python scripts/gpu_check.py --device cpu --prompts 3 --max-new 12    # the same checks on CPU

Checks, all greedy, chat-templated prompts, EOS = <|im_end|>:
  1. sd (k = 1, 4, 8) and mars with theta = 1 (strict) are token-identical to transformers
     ``model.generate(do_sample=False)``;
  2. sd_tree (TreeSpec(depth=3, top_k=3, total_tokens=12)) and prompt lookup (k = 4) too;
  3. ``generate_batch`` at batch size 4 gives the batch-size-1 tokens for sd, mars (theta 0.9), sd_tree;
  4. timings (synchronised clocks) per method: tokens/s and ratio to ar, of a RANDOM TINY model: they
     test the plumbing, they are not a speed claim.
Prints the device, torch version, each check's verdict and a PASS/FAIL line; writes a JSON summary to
$OUT/gpu_check.json when OUT is set, else results/gpu_check.json. Exit 0 only if every check passed;
exit 2 (one line) when CUDA is requested but unavailable. A mismatch reports its first differing
position and the target's top-1 minus top-2 logit there (a tiny gap points at float rounding, a large
one at a bug).
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

from mars_bench.decode import DecodeConfig, Method, generate, generate_batch  # noqa: E402
from mars_bench.decode.engine import Request  # noqa: E402
from mars_bench.decode.tree import TreeSpec  # noqa: E402

PROMPTS = ["Tell me a story.", "What is 2+2?", "Write a function that reverses a list.", "hello",
           "Translate: bonjour", "List three colors.", "Why is the sky blue?", "def fib(n):",
           "Explain recursion in one line.", "Name a prime number.", "x = [1, 2, 3]\nprint(",
           "The capital of France is"]
EOS, PAD = 258, 256          # the tiny tokenizer's <|im_end|> and <|endoftext|>
TREE = TreeSpec(depth=3, top_k=3, total_tokens=12)
METHODS = {                  # label -> (Method, tree)
    "ar": (Method("ar"), None),
    "sd k=1": (Method("sd", k=1), None),
    "sd k=4": (Method("sd", k=4), None),
    "sd k=8": (Method("sd", k=8), None),
    "mars theta=1": (Method("mars", k=4, rule_kwargs={"theta": 1.0, "nonpositive_top1": "strict"}), None),
    "mars theta=0.9": (Method("mars", k=4, rule_kwargs={"theta": 0.9}), None),
    "sd_tree": (Method("sd_tree"), TREE),
    "lookup k=4": (Method("lookup", k=4), None),
}
LOSSLESS = {"sd_chain": ["sd k=1", "sd k=4", "sd k=8", "mars theta=1"], "tree_and_lookup": ["sd_tree", "lookup k=4"]}
BATCHED = ["sd k=4", "mars theta=0.9", "sd_tree"]


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--prompts", type=int, default=8, help=f"prompts to decode (at most {len(PROMPTS)})")
    ap.add_argument("--max-new", type=int, default=32, help="max new tokens per prompt")
    ap.add_argument("--batch-size", type=int, default=4, help="batch size of the batch-invariance check")
    ap.add_argument("--out", default=None, help="JSON path (default: $OUT/gpu_check.json or results/gpu_check.json)")
    return ap.parse_args(argv)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_diff(got, ref, target, ids) -> str:
    """Where two token lists first differ, and the target's top-1 minus top-2 logit at that position."""
    i = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    with torch.inference_mode():
        z = target.model(torch.tensor([ids + ref[:i]], device=target.device)).logits[0, -1].float()
    top = torch.topk(z, 2).values.tolist()
    return f"token {i}: got {got[i:i + 3]} ref {ref[i:i + 3]} (len {len(got)} vs {len(ref)}), " \
           f"target top1-top2 gap {top[0] - top[1]:.3g}"


def main(argv=None) -> int:
    args = parse(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: CUDA requested (--device {args.device}) but torch.cuda.is_available() is False")
        return 2
    from mars_bench.models.adapter import CausalLMAdapter
    from mars_bench.models.tiny import tiny_pair

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)      # tiny tensors: more threads only add wake-up latency
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name} | torch {torch.__version__} | prompts {args.prompts} | max_new {args.max_new}")
    tm, dm, tok = tiny_pair()
    target = CausalLMAdapter(tm.to(device))
    draft = CausalLMAdapter(dm.to(device), out_vocab=target.vocab)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       return_dict=False) for p in PROMPTS[:args.prompts]]
    cfg = DecodeConfig(max_new_tokens=args.max_new, eos_ids=(EOS,))

    def hf(ids):
        g = tm.generate(torch.tensor([ids], device=device), max_new_tokens=args.max_new, do_sample=False,
                        eos_token_id=EOS, pad_token_id=PAD)
        return g[0, len(ids):].tolist()

    def run(label):
        method, tree = METHODS[label]
        return [generate(target, draft, tok, ids, method, cfg, tree=tree).tokens for ids in prompts]

    def timed(fn):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        return out, time.perf_counter() - t0

    for label in METHODS:             # warm-up: CUDA kernels, allocator, lazy imports
        method, tree = METHODS[label]
        generate(target, draft, tok, prompts[0], method, DecodeConfig(max_new_tokens=4, eos_ids=(EOS,)), tree=tree)
    hf(prompts[0])
    ref, hf_s = timed(lambda: [hf(ids) for ids in prompts])
    outs, secs = {}, {}
    for label in METHODS:
        outs[label], secs[label] = timed(lambda: run(label))

    checks = {}

    def check(key, pairs):            # pairs: (label, prompt index, got, want)
        bad = [f"{lab} prompt {i}: {first_diff(g, w, target, prompts[i])}" for lab, i, g, w in pairs if g != w]
        checks[key] = {"passed": not bad, "compared": len(pairs), "mismatches": bad}

    check("ar_matches_hf_generate", [("ar", i, g, ref[i]) for i, g in enumerate(outs["ar"])])
    for key, labels in LOSSLESS.items():
        check(f"{key}_matches_hf_generate", [(lab, i, g, ref[i]) for lab in labels for i, g in enumerate(outs[lab])])
    pairs, batch_secs, batch_toks = [], {}, {}
    for label in BATCHED:
        method, tree = METHODS[label]
        got = {}
        reqs = [Request(list(ids), key=i) for i, ids in enumerate(prompts)]
        _, batch_secs[label] = timed(lambda: generate_batch(target, draft, tok, reqs, method, cfg, args.batch_size,
                                                            lambda r, res: got.__setitem__(r.key, res), tree=tree))
        batch_toks[label] = sum(len(r.tokens) for r in got.values())
        if sorted(got) != list(range(len(prompts))):
            got = {i: got.get(i) for i in range(len(prompts))}
        pairs += [(label, i, got[i].tokens if got[i] else [], outs[label][i]) for i in range(len(prompts))]
    check(f"batch{args.batch_size}_equals_batch1", pairs)

    print("\ntimings of a RANDOM TINY model (plumbing and overheads, NOT a speed claim):")
    ar_tps = sum(map(len, outs["ar"])) / secs["ar"]
    timings = {}
    rows = [("hf generate", sum(map(len, ref)), hf_s)] + [(lab, sum(map(len, outs[lab])), secs[lab]) for lab in METHODS]
    rows += [(f"{lab} batch={args.batch_size}", batch_toks[lab], batch_secs[lab]) for lab in BATCHED]
    for label, n, s in rows:
        tps = n / s if s else 0.0
        timings[label] = {"tokens": n, "seconds": round(s, 4), "tokens_per_s": round(tps, 1),
                          "ratio_to_ar": round(tps / ar_tps, 3)}
        print(f"  {label:<22} {n:5d} tok {s:7.3f} s {tps:9.1f} tok/s  x{tps / ar_tps:5.2f} vs ar")

    print("\nchecks:")
    for key, c in checks.items():
        print(f"  {'PASS' if c['passed'] else 'FAIL'}  {key} ({c['compared']} compared)")
        for m in c["mismatches"][:5]:
            print(f"        {m}")
    passed = all(c["passed"] for c in checks.values())
    summary = {"passed": passed, "device": name, "device_type": device.type, "torch": torch.__version__,
               "prompts": len(prompts), "max_new_tokens": args.max_new, "batch_size": args.batch_size,
               "checks": checks, "timings": timings,
               "timings_note": "random tiny model: plumbing and overheads, not a speed claim"}
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "results") \
        / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(f"\n{'PASS' if passed else 'FAIL'}: {sum(c['passed'] for c in checks.values())}/{len(checks)} checks "
          f"passed on {name}; summary written to {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
