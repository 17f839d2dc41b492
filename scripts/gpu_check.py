"""GPU check of the decoding engine (mars_bench/decode): the ~5-minute check a lent GPU runs, no internet.

    python scripts/gpu_check.py                            # cuda, realistic shapes, bf16
    python scripts/gpu_check.py --device cpu --small       # the same checks at small shapes (a test runs it)

Models, random, built on the device from configs with fixed seeds (nothing is downloaded):
  target  Qwen3 decoder layers of the 32B's shape (hidden 5120, 64 / 8 heads, head_dim 128, MLP 25600),
          8 of its 64 layers, vocabulary 151936;  draft  Qwen3-0.6B's shape (hidden 1024, 16 / 8 heads,
          head_dim 128, MLP 3072, 28 layers);  an EAGLE-3 head over the target, saved and loaded in bf16.
  --small: hidden 64 / 32, 2 layers, vocabulary 512, fp32.
Checks (random models: the drafts are rarely accepted; the point is the engine, not a speedup):
  identity   greedy ar == transformers generate; sd k=4, mars theta=1, eagle3 vs ar: mismatch rate, first
             divergent position and the target's top-1 minus top-2 logit there. Must be 0 on a CPU; on
             CUDA reported (bf16 kernels change with the rows a forward scores: near-ties flip).
  batch      sd at B = 2 and 8 vs B = 1: mismatch rate (same rule), tokens/s.
  chi2       T = 1, sd exact: the first token's law vs p_target (top bins + rest), p > 1e-3.
  eagle3     the head's rotary inv_freq stays fp32 after the bf16 load.
  split      per-step milliseconds: draft / target / outside the forwards, per method (the engine's own
             per-step times, GenerateResult); no tokens/s is timed here.
  reads      host reads (device syncs) per step, greedy chain and tree, B = 1: <= 2 each.
  capture    sd k=4 and sd_tree with the decoding forwards at fixed shapes (eager), and on CUDA captured as
             model.capture=compile does (torch.compile reduce-overhead: CUDA graphs; compiling and recording
             timed apart, setup_s; no graph may be left uncaptured, cudagraph_skips = 0): tokens vs the
             eager run's (required equal on a CPU, reported on CUDA);
             their per-step times sit beside the eager ones in the split table: what decides the setting.
  memory     (cuda) peak allocated during the B = 8 run vs check_memory's estimate: peak <= estimate.
  runner     the runner's interleaved path on the device, in its own process: `mars-bench +compare=methods
             task=prompts model=tiny model.device=<device>` (ar, sd, mars interleaved sample by sample): every
             method's records written and summarized; sd's tokens are ar's (required on a CPU, reported on
             CUDA); its rows (tokens/s, tau, speedup and CI: summary.json's) printed, random models, no claim.
Writes $OUT/gpu_check.json (or --out); exit 0 when every check passed, 1 otherwise, 2 when CUDA is asked
for but absent.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # a device machine runs it from a bare checkout

from mars_bench.decode import DecodeConfig, Method, generate, generate_batch  # noqa: E402
from mars_bench.decode.engine import Request  # noqa: E402
from mars_bench.decode.hostreads import HostReads  # noqa: E402
from mars_bench.decode.tree import TreeSpec  # noqa: E402

SHAPES = {   # name -> (target, draft) Qwen3 config fields
    "real": (dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=8, num_attention_heads=64,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936),
             dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936)),
    "small": (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=512),
              dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16, vocab_size=512)),
}
TREE = TreeSpec(depth=3, top_k=3, total_tokens=12)
METHODS = {"sd k=4": Method("sd", k=4), "mars theta=1": Method("mars", k=4, rule_kwargs={"theta": 1.0}),
           "sd_tree": Method("sd_tree")}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--small", action="store_true", help="small shapes, fp32 (CPU tests)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per identity check")
    ap.add_argument("--max-new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--draws", type=int, default=600, help="T = 1 first-token draws of the chi-square check")
    ap.add_argument("--runner-prompts", type=int, default=4, help="prompts of the runner check (0: skip it)")
    ap.add_argument("--out", default=None, help="JSON path (default: $OUT/gpu_check.json or results/gpu_check.json)")
    return ap.parse_args(argv)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(device, small: bool):
    """(target adapter, draft adapter, raw target model): random Qwen3 models built on the device."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from mars_bench.models.adapter import CausalLMAdapter

    dtype = torch.float32 if small else torch.bfloat16
    models = []
    for seed, shape in enumerate(SHAPES["small" if small else "real"]):
        torch.manual_seed(seed)
        cfg = Qwen3Config(**shape, max_position_embeddings=4096, tie_word_embeddings=False,
                          initializer_range=0.15 if small else 0.02, attn_implementation="sdpa")
        with torch.device(device):
            models.append(Qwen3ForCausalLM(cfg).to(dtype).eval())
    tied(*models)
    target = CausalLMAdapter(models[0])
    return target, CausalLMAdapter(models[1], out_vocab=target.vocab), models[0]


LOGIT_STD = 4.0    # random heads scaled so the target's logits are peaked like a trained model's, not flat
LAYER_GAIN = 0.1   # decoder layers' output projections scaled: the context moves the logits, the embedding leads


def tied(target, draft) -> None:
    """Make the random pair agree often enough to exercise accepted drafts. The target's embedding and LM head
    are projected onto a random hd-dimensional subspace (hd = the draft's width, orthonormal basis ``proj``)
    and the draft takes their coordinates there, so both models score the same logits from the embedding
    alone (RMSNorm is scale-free); their decoder layers' outputs (o_proj, down_proj) are scaled by LAYER_GAIN,
    so the context moves the logits without drowning the embedding. The target's head is scaled to logits of
    std ~LOGIT_STD (peaked like a trained model's, not flat)."""
    ht, hd = target.config.hidden_size, draft.config.hidden_size
    with torch.no_grad():
        proj = torch.linalg.qr(torch.randn(ht, hd, device=target.device))[0]       # [ht, hd], orthonormal columns
        w = target.lm_head.weight
        w.mul_(LOGIT_STD / (w.float().std() * ht ** 0.5))
        emb = target.model.embed_tokens.weight
        emb.mul_(1.0 / emb.float().std())                                           # token embeddings of rms ~1
        for src, dst in ((emb, draft.model.embed_tokens.weight), (w, draft.lm_head.weight)):
            low = src.float() @ proj
            src.copy_(low @ proj.T)
            dst.copy_(low)
        for model in (target, draft):
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(LAYER_GAIN)
                layer.mlp.down_proj.weight.mul_(LAYER_GAIN)


def eagle3_drafter(target, device, small: bool):
    """A random EAGLE-3 head over ``target``, written to disk in bf16 and loaded back in the target's dtype (bf16
    at the real shapes)."""
    from safetensors.torch import save_file

    from mars_bench.decode.drafters.eagle3 import Eagle3Head
    from mars_bench.models.eagle3_heads import load_eagle3_drafter

    c = target.model.config
    draft_vocab = min(c.vocab_size, 32000)
    config = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size // 2, "num_hidden_layers": 1,
              "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
              "head_dim": c.head_dim, "vocab_size": c.vocab_size, "draft_vocab_size": draft_vocab,
              "max_position_embeddings": 4096, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
              # decoder-layer ids (hidden_states index = id + 1 <= L - 1: the last is final-normed)
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, (c.num_hidden_layers - 1) // 2,
                                                                    c.num_hidden_layers - 2]}}
    torch.manual_seed(2)
    head = Eagle3Head(config).to(torch.bfloat16)
    sd = {k: v for k, v in head.state_dict().items()}
    for k, v in sd.items():
        if v.is_floating_point():
            sd[k] = (torch.randn(v.shape) * 0.02).to(torch.bfloat16) if v.dim() > 1 else torch.ones_like(v)
    sd["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
    sd["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool)
    sd["t2d"][:draft_vocab] = True
    with tempfile.TemporaryDirectory(prefix="gpu_check_eagle3_") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        save_file({k: v.contiguous() for k, v in sd.items()}, str(Path(folder) / "model.safetensors"))
        return load_eagle3_drafter(folder, target)


def first_divergence(got, ref, target, prompt) -> dict | None:
    """None when identical, else the first differing position and the target's top-1 minus top-2 logit there."""
    if got == ref:
        return None
    i = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    with torch.inference_mode():
        z = target.model(torch.tensor([prompt + ref[:i]], device=target.device)).logits[0, -1].float()
    top = torch.topk(z, 2).values.tolist()
    return {"position": i, "logit_gap": round(top[0] - top[1], 5)}


def compare(label, outs, refs, target, prompts, exact: bool) -> dict:
    diffs = [first_divergence(g, r, target, p) for g, r, p in zip(outs, refs, prompts)]
    bad = [dict(d, prompt=i) for i, d in enumerate(diffs) if d is not None]
    rate = len(bad) / len(outs)
    return {"check": label, "mismatch_rate": rate, "divergent": bad, "required_zero": exact,
            "passed": rate == 0 or not exact}


def split(results) -> dict:
    steps = sum(r.steps for r in results) or 1
    ms = lambda key: round(1000 * sum(getattr(r, key) for r in results) / steps, 3)  # noqa: E731
    outside = sum(r.wall_s - r.prefill_s - r.target_s - r.draft_s for r in results)
    return {"steps": steps, "tau": round(sum(len(r.tokens) for r in results) / steps, 3), "draft_ms": ms("draft_s"),
            "target_ms": ms("target_s"), "outside_ms": round(1000 * outside / steps, 3)}


def chi_square(target, draft, prompt, draws: int, device) -> dict:
    """T = 1, sd exact, the first committed token over ``draws`` seeds vs p_target(. | prompt)."""
    from scipy.stats import chisquare

    with torch.inference_mode():
        z = target.model(torch.tensor([prompt], device=device)).logits[0, -1].float()
    p = torch.softmax(z, -1).cpu()
    cfg = DecodeConfig(max_new_tokens=1, temperature=1.0, budget="after_step")
    first = {}
    reqs = (Request(list(prompt), seed=s, key=s) for s in range(draws))
    generate_batch(target, draft, None, reqs, Method("sd", k=4), cfg, 8,
                   lambda r, res: first.__setitem__(r.key, res.tokens[0]))
    top = [t for t in torch.argsort(p, descending=True).tolist() if p[t] * draws >= 5][:30]
    counts = [sum(1 for t in first.values() if t == b) for b in top]
    exp = [float(p[b]) * draws for b in top]
    counts.append(draws - sum(counts))
    exp.append(draws - sum(exp))
    stat, pval = chisquare(counts, exp) if len(top) and exp[-1] > 0 else chisquare(counts[:-1], exp[:-1])
    return {"check": "chi2_first_token", "draws": draws, "bins": len(counts), "p_value": float(pval),
            "passed": bool(pval > 1e-3)}


def host_reads(target, draft, prompts, cfg, method, tree=None) -> float:
    with HostReads() as reads:
        res = [generate(target, draft, None, p, method, cfg, tree=tree) for p in prompts]
    return round(reads.total / sum(r.steps for r in res), 3)


def capture_checks(target, draft, prompts, device, exact: bool, refs: dict, run) -> list:
    """sd k=4 and sd_tree with fixed-shape decoding forwards ("fixed": eager), and on CUDA through
    ``models.pairs.capture`` ("compile"), each against the eager run's tokens ``refs[label]``; ``run`` puts their
    per-step times in the split table. The adapters are put back to eager afterwards."""
    from mars_bench.models.pairs import capture

    checks = []
    for mode in ["fixed"] + (["compile"] if device.type == "cuda" else []):
        t0 = time.perf_counter()
        for a in (target, draft):
            a.set_fixed_shape(True)
            if mode == "compile":
                capture(a, "compile", device)
        try:
            for label in ("sd k=4", "sd_tree"):
                tree = TREE if label == "sd_tree" else None
                if mode == "compile":  # compiling and recording the shapes this run takes: not in its timing
                    for p in prompts:
                        generate(target, draft, None, p, METHODS[label], DecodeConfig(max_new_tokens=8), tree=tree)
                setup_s = round(time.perf_counter() - t0, 1)
                got = run(f"{label} {mode}", METHODS[label], tree=tree)
                check = {**compare(f"{label}_{mode}_vs_eager", got, refs[label], target, prompts, exact),
                         "setup_s": setup_s}
                if mode == "compile":  # graphs inductor would not capture (mutated inputs, CPU tensors, ...)
                    from torch._dynamo.utils import counters

                    check["cudagraph_skips"] = int(counters["inductor"]["cudagraph_skips"])
                    check["passed"] = check["passed"] and check["cudagraph_skips"] == 0
                checks.append(check)
                t0 = time.perf_counter()
        finally:
            for a in (target, draft):
                a.set_fixed_shape(False)
                a.step_model = a.model
    return checks


def runner_check(device, n: int, max_new: int, exact: bool):
    """(check, rows): the runner's interleaved path on ``device`` with the tiny pair (ar, sd, mars of
    conf/compare/methods.yaml on the built-in prompts), in its own process, read back as rows
    (``mars_bench.run.bench.runner_rows``: summary.json's numbers)."""
    from mars_bench.run import bench as B

    with tempfile.TemporaryDirectory(prefix="gpu_check_runner_") as folder:
        runs = B.fresh_runs_dir(Path(folder) / "runs")
        peak = B.run_compare("methods", "prompts", runs, ["model=tiny", f"model.device={device.type}", f"limit={n}",
                                                          f"max_new_tokens={max_new}", "progress=false"], quiet=True)
        rows = B.runner_rows(runs)
    sd = rows[(rows["method"] == "sd") & ~rows["relaxed"].astype(bool)]
    same = int(sd["identical_to_ar"].min()) if len(sd) else 0
    return {"check": "runner_interleaved", "methods": list(rows["row"]), "n": [int(x) for x in rows["n"]],
            "sd_identical_to_ar": same, "required_zero": exact, "peak_rss_gb": round(peak, 2),
            "passed": len(rows) == 3 and all(int(x) == n for x in rows["n"]) and (same == n or not exact)}, rows


def main(argv=None) -> int:
    args = parse(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: CUDA requested (--device {args.device}) but torch.cuda.is_available() is False")
        return 2
    from mars_bench.decode.backend import memory_need

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    t_start = time.perf_counter()
    target, draft, tm = build(device, args.small)
    vocab = tm.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (24 + 8 * i,), generator=gen).tolist() for i in range(args.prompts)]
    cfg = DecodeConfig(max_new_tokens=args.max_new)
    exact = device.type == "cpu"
    print(f"device: {name} | torch {torch.__version__} | shapes {'small' if args.small else 'real'} | "
          f"prompts {len(prompts)} x {args.max_new} tokens")
    for m in [Method("ar"), *METHODS.values()]:           # warm-up: kernels, allocator
        generate(target, draft, None, prompts[0], m, DecodeConfig(max_new_tokens=4), tree=TREE)
    checks, timing = [], {}

    def run(label, method, drafter=draft, tree=None):
        res = [generate(target, drafter, None, p, method, cfg, tree=tree) for p in prompts]
        timing[label] = split(res)
        return [r.tokens for r in res]

    ar = run("ar", Method("ar"))
    hf = [tm.generate(torch.tensor([p], device=device), max_new_tokens=args.max_new, do_sample=False,
                      pad_token_id=0, eos_token_id=None)[0, len(p):].tolist() for p in prompts]
    checks.append(compare("ar_vs_generate", ar, hf, target, prompts, True))
    outs = {}
    for label, method in METHODS.items():
        outs[label] = run(label, method, tree=TREE if method.name == "sd_tree" else None)
        checks.append(compare(f"{label}_vs_ar", outs[label], ar, target, prompts, exact))
    drafter = eagle3_drafter(target, device, args.small)
    inv = drafter.head.rotary.inv_freq
    checks.append({"check": "eagle3_inv_freq_fp32", "dtype": str(inv.dtype), "passed": inv.dtype == torch.float32})
    checks.append(compare("eagle3_vs_ar", run("eagle3", Method("eagle3"), drafter, TREE), ar, target, prompts, exact))
    for b in (2, 8):
        got = {}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        generate_batch(target, draft, None, [Request(list(p), key=i) for i, p in enumerate(prompts)],
                       Method("sd", k=4), cfg, b, lambda r, res: got.__setitem__(r.key, res.tokens))
        sync(device)
        checks.append(compare(f"sd_B{b}_vs_B1", [got[i] for i in range(len(prompts))], outs["sd k=4"], target, prompts,
                              exact))
        if device.type == "cuda" and b == 8:
            peak = torch.cuda.max_memory_allocated(device) - base
            need = memory_need([target, draft], max(map(len, prompts)) + args.max_new + 5, 5)
            estimate = sum(per_row * b + once for per_row, once in need.values())
            checks.append({"check": "peak_memory_within_estimate", "peak_bytes": peak, "estimate_bytes": estimate,
                           "passed": peak <= estimate})
    checks.append(chi_square(target, draft, prompts[0], args.draws, device))
    short = DecodeConfig(max_new_tokens=min(32, args.max_new))
    reads = {"sd k=4": host_reads(target, draft, prompts[:2], short, METHODS["sd k=4"]),
             "sd_tree": host_reads(target, draft, prompts[:2], short, METHODS["sd_tree"], TREE)}
    checks.append({"check": "host_reads_per_step", **reads,
                   "passed": reads["sd k=4"] <= 2 and reads["sd_tree"] <= 2})
    checks += capture_checks(target, draft, prompts, device, exact, outs, run)
    rows = None
    if args.runner_prompts:
        check, rows = runner_check(device, args.runner_prompts, min(32, args.max_new), exact)
        checks.append(check)

    print("\nper step, per method (random models: plumbing and overheads, NOT a speed claim):")
    for label, t in timing.items():
        print(f"  {label:<14} " + " ".join(f"{k} {v}" for k, v in t.items()))
    if rows is not None:
        print("\nrunner, tiny pair (summary.json's numbers; NOT a speed claim):")
        f = lambda x: "-" if x is None or x != x else f"{x:.2f}"  # noqa: E731
        for r in rows.itertuples():
            print(f"  {r.row:<16} tokens/s {r.tokens_per_s:.1f} tau {r.tau:.2f} vs ar {f(r.vs_ar)} "
                  f"[{f(r.vs_ar_lo)}, {f(r.vs_ar_hi)}] identical to ar {r.identical_to_ar}/{r.n}")
    print("\nchecks:")
    for c in checks:
        extra = {k: v for k, v in c.items() if k not in ("check", "passed", "divergent")}
        print(f"  {'PASS' if c['passed'] else 'FAIL'}  {c['check']} {extra}")
        for d in c.get("divergent", [])[:3]:
            print(f"        prompt {d['prompt']}: first divergence at token {d['position']}, logit gap {d['logit_gap']}")
    passed = all(c["passed"] for c in checks)
    summary = {"passed": passed, "device": name, "torch": torch.__version__, "small": args.small,
               "prompts": len(prompts), "max_new_tokens": args.max_new, "checks": checks, "timing": timing,
               "seconds": round(time.perf_counter() - t_start, 1)}
    out = Path(args.out) if args.out else Path(os.environ.get("OUT") or "results") / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(f"\n{'PASS' if passed else 'FAIL'}: {sum(c['passed'] for c in checks)}/{len(checks)} checks passed on "
          f"{name} in {summary['seconds']} s; summary written to {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
