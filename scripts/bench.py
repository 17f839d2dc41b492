"""`make bench`: speed of every decoding path on the embedded default pair, measured side by side.

Greedy, the same prompts (first GSM8K and HumanEval questions, chat template), the same
max_new_tokens and stop conditions for every row, methods interleaved prompt by prompt so machine
noise hits all rows alike. Only ratios measured in this one run are meaningful.
Rows: our ar on the plain and the fast path, transformers `generate`, transformers assisted generation
(the draft as `assistant_model`: the int8 draft we use, and the fp32 draft as loaded), our lossless sd
(int8 and fp32 draft) and mars (theta 0.9) at their best measured k, and tree drafts. The target is
fp32 in every row. Also: target forward cost of n tokens over 1 token (n = 1..16) on both paths, and the
share of wall time outside model forwards. Writes results/bench/bench.{md,csv,json} and bench.png.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mars_bench.decode import DecodeConfig, Method, generate  # noqa: E402
from mars_bench.models import fastpath, panel  # noqa: E402
from mars_bench.records import SPEEDUP_DEFINITION, TAU_DEFINITION  # noqa: E402


def fast_available() -> bool:
    return panel.library() is not None or fastpath.available()


def load(args):
    from hydra import compose, initialize_config_dir

    from mars_bench import config as C
    from mars_bench.models.pairs import load_pair

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model.fast_path={'on' if fast_available() else 'off'}"])
    pair = load_pair(cfg.model)
    return pair, cfg.model.draft_quant


def fp32_draft(pair):
    """The draft as loaded (no int8), on the fast path like every other model here."""
    from transformers import AutoModelForCausalLM

    from mars_bench.models.adapter import CausalLMAdapter

    model = AutoModelForCausalLM.from_pretrained(pair.draft_path, dtype=torch.float32)
    if fast_available():
        model = fastpath.enable_fast_path(model)
    return CausalLMAdapter(model, out_vocab=pair.target.vocab, name=pair.draft_path)


def prompts(tok, n, data_dir):
    from mars_bench.tasks import build_messages, get_task

    out = []
    for name in ("gsm8k", "humaneval"):
        task = get_task(name)
        for s in task.load(data_dir, limit=(n + 1) // 2 if name == "gsm8k" else n // 2):
            out.append((s.id, tok.apply_chat_template(build_messages(task, s, [], 0),
                                                      add_generation_prompt=True, return_dict=False)))
    return out


def set_path(pair, fast: bool, draft=None):
    for a in (pair.target, draft or pair.draft):
        a.packing = fast   # packing=False makes expect() unpack: the plain path
        a.expect(1)


def ours(pair, method, fast, cfg, draft=None):
    def run(ids):
        set_path(pair, fast, draft)
        r = generate(pair.target, draft or pair.draft, pair.tokenizer, ids, method, cfg)
        return {"tokens": r.tokens, "wall_s": r.wall_s, "steps": r.steps,
                "forward_s": r.target_s + r.draft_s}
    return run


def hf(pair, cfg, assistant=None):
    def run(ids):
        set_path(pair, False, assistant)
        kw = {"assistant_model": assistant.model} if assistant is not None else {}
        x = torch.tensor([ids], device=pair.target.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = pair.target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                             max_new_tokens=cfg.max_new_tokens, eos_token_id=list(cfg.eos_ids),
                                             pad_token_id=cfg.eos_ids[0], **kw)
        wall = time.perf_counter() - t0
        return {"tokens": out[0, len(ids):].tolist(), "wall_s": wall, "steps": None, "forward_s": None}
    return run


def measure(rows: dict, items, reps_label=""):
    """Interleaved: for each prompt, every row once, the row order rotated by one per prompt (no row always
    runs first or always follows the same row). -> {row: [per-prompt dicts]}"""
    out = {name: [] for name in rows}
    names = list(rows)
    for i, (pid, ids) in enumerate(items):
        for name in names[i % len(names):] + names[: i % len(names)]:
            out[name].append(rows[name](ids) | {"id": pid})
        print(f"  {reps_label}prompt {i + 1}/{len(items)} done", file=sys.stderr, flush=True)
    return out


def agg(res):
    tok = sum(len(r["tokens"]) for r in res)
    wall = sum(r["wall_s"] for r in res)
    steps = [r["steps"] for r in res if r["steps"] is not None]
    fwd = [r["forward_s"] for r in res if r["forward_s"] is not None]
    return {"tokens": tok, "wall_s": wall, "tokens_per_s": tok / wall,
            "tau": tok / sum(steps) if steps else None,
            "outside_forward_share": 1 - sum(fwd) / wall if fwd else None}


def forward_costs(adapter, ctx=200, reps=3, rounds=2, max_n=16):
    """ms of one target forward scoring n new tokens after a ctx-token prefix, n = 1..max_n, on the plain
    and the fast path (alternated per n, so both see the same machine state); best of ``reps`` in each of
    ``rounds`` passes over n, so a noisy moment cannot decide one n's number alone."""
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 150000, (ctx,), generator=g).tolist()
    out = {"plain": {}, "fast": {}}
    adapter.reset()
    adapter.forward(prefix, logits=False)
    for n in [n for _ in range(rounds) for n in range(1, max_n + 1)]:
        for path in ("plain", "fast"):
            adapter.packing = path == "fast"
            adapter.expect(n)
            best = float("inf")
            for _ in range(reps):
                adapter.crop(ctx)
                t0 = time.perf_counter()
                adapter.forward(torch.randint(0, 150000, (n,), generator=g).tolist())
                best = min(best, time.perf_counter() - t0)
            out[path][n] = min(out[path].get(n, float("inf")), best * 1000)
    adapter.packing = True
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=10, help="GSM8K + HumanEval prompts (half each)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k-sweep", default="4,5,6,7,8,10", help="k values tried for sd and mars")
    ap.add_argument("--sweep-prompts", type=int, default=2, help="prompts used to pick k")
    ap.add_argument("--trees", default="2,2,6;3,3,10;4,4,12;4,4,16",
                    help="tree shapes depth,top_k,total_tokens tried for sd_tree ('' = no tree rows)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = os.environ.get("MARS_BENCH_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    pair, quant = load(args)
    draft32 = fp32_draft(pair) if quant != "none" else None
    tok = pair.tokenizer
    gen_eos = pair.target.model.generation_config.eos_token_id
    eos = sorted({tok.eos_token_id} | set(gen_eos if isinstance(gen_eos, list) else [gen_eos]) - {None})
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_ids=tuple(eos))
    items = prompts(tok, args.prompts, data_dir)
    fast = fast_available()
    mars = lambda k: Method("mars", k=k, rule="mars", rule_kwargs={"theta": 0.9})  # noqa: E731

    print("forward cost of n tokens (target)...", file=sys.stderr)
    costs = forward_costs(pair.target)

    ks = [int(k) for k in args.k_sweep.split(",")]
    sweep_rows = {"ar": ours(pair, Method("ar"), fast, cfg)}
    for k in ks:
        sweep_rows[f"sd k={k}"] = ours(pair, Method("sd", k=k), fast, cfg)
        sweep_rows[f"mars k={k}"] = ours(pair, mars(k), fast, cfg)
    shapes = [tuple(int(x) for x in t.split(",")) for t in args.trees.split(";") if t]
    tree = lambda d, w, t: {"depth": d, "top_k": w, "total_tokens": t, "static_paths": None,  # noqa: E731
                            "children": "topk"}
    for d, w, t in shapes:
        sweep_rows[f"sd_tree d{d} w{w} t{t}"] = ours(pair, Method("sd_tree", rule="exact", tree=tree(d, w, t)), fast, cfg)
    print("k and tree-shape sweep...", file=sys.stderr)
    sweep = {n: agg(r) for n, r in measure(sweep_rows, items[: args.sweep_prompts], "sweep ").items()}
    best = {m: max(ks, key=lambda k: sweep[f"{m} k={k}"]["tokens_per_s"]) for m in ("sd", "mars")}
    if shapes:
        best["tree"] = max(shapes, key=lambda s: sweep["sd_tree d%d w%d t%d" % s]["tokens_per_s"])

    dq = f" ({quant} draft)" if quant != "none" else ""
    rows = {"ar (plain path)": ours(pair, Method("ar"), False, cfg),
            "ar (fast path)": ours(pair, Method("ar"), fast, cfg),
            "transformers generate": hf(pair, cfg),
            f"transformers assisted{dq}": hf(pair, cfg, pair.draft)}
    if draft32 is not None:
        rows["transformers assisted (fp32 draft)"] = hf(pair, cfg, draft32)
        rows[f"sd k={best['sd']} (fp32 draft)"] = ours(pair, Method("sd", k=best["sd"]), fast, cfg, draft32)
    rows[f"sd k={best['sd']}{dq}"] = ours(pair, Method("sd", k=best["sd"]), fast, cfg)
    rows[f"mars k={best['mars']} theta=0.9{dq}"] = ours(pair, mars(best["mars"]), fast, cfg)
    if shapes:
        d, w, t = best["tree"]
        rows[f"sd_tree d{d} w{w} t{t}{dq}"] = ours(pair, Method("sd_tree", rule="exact", tree=tree(d, w, t)), fast, cfg)
        rows[f"mars_tree d{d} w{w} t{t} theta=0.9{dq}"] = ours(
            pair, Method("mars_tree", rule="mars", rule_kwargs={"theta": 0.9}, tree=tree(d, w, t)), fast, cfg)
    print("main comparison...", file=sys.stderr)
    raw = measure(rows, items)
    table = {n: agg(r) for n, r in raw.items()}
    base, hfg = table["ar (fast path)"], table["transformers generate"]
    ref = [r["tokens"] for r in raw["transformers generate"]]
    for n, row in table.items():
        row["vs_ar"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["vs_hf_generate"] = row["tokens_per_s"] / hfg["tokens_per_s"]
        row["identical_to_hf_generate"] = sum(a["tokens"] == b for a, b in zip(raw[n], ref))
    goals = check_goals(table, costs, dq)
    write(args, table, sweep, costs, best, len(items), raw, goals, quant, fastpath.kind(pair.target.model))


def check_goals(table, costs, dq):
    """Issue 3's goals, each as (goal, measured value, met?), computed from this run's numbers."""
    fast = costs["fast"]
    sd = next(n for n in table if n.startswith("sd k=") and n.endswith(dq) and "fp32 draft" not in n)
    mars = next(n for n in table if n.startswith("mars k=") and n.endswith(dq))
    tps = lambda n: table[n]["tokens_per_s"]  # noqa: E731
    out = [("target forward(8) / forward(1) on the fast path <= 1.3", fast[8] / fast[1], fast[8] / fast[1] <= 1.3),
           (f"{sd} >= 1.3x our ar", table[sd]["vs_ar"], table[sd]["vs_ar"] >= 1.3)]
    for n in table:
        if n.startswith("transformers assisted"):
            out.append((f"{sd} >= 1.6x {n}", tps(sd) / tps(n), tps(sd) / tps(n) >= 1.6))
    r = tps(mars) / tps(sd)
    out.append((f"{mars} >= 1.15x {sd}, with a higher tau", r,
                r >= 1.15 and table[mars]["tau"] > table[sd]["tau"]))
    hf_gen = tps("transformers generate")
    out.append(("ar (plain path) within 5% of transformers generate", tps("ar (plain path)") / hf_gen,
                abs(tps("ar (plain path)") / hf_gen - 1) <= 0.05))
    out.append(("ar (fast path) faster than transformers generate", tps("ar (fast path)") / hf_gen,
                tps("ar (fast path)") > hf_gen))
    worst = max((r["outside_forward_share"] or 0) for r in table.values())
    out.append(("time outside model forwards <= 5% for every method (worst row)", worst, worst <= 0.05))
    return out


def write(args, table, sweep, costs, best, n_prompts, raw, goals, quant, kernel):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = [f"# Embedded default pair (Qwen2.5-Coder 0.5B -> 1.5B, fp32 target, {quant} draft, CPU "
             f"{os.cpu_count()} cores), greedy", "",
             f"Fast path kernel: {kernel} (`mars_bench/models/fastpath.py`). Plain path: `F.linear` as loaded.",
             "", f"{n_prompts} prompts (GSM8K + HumanEval), max_new_tokens={args.max_new_tokens}, interleaved. "
             f"{TAU_DEFINITION}. Ratios are to our ar on the fast path ({SPEEDUP_DEFINITION}).", "",
             "| method | tokens/s | tau | vs our ar | vs transformers generate | outside forwards | identical to generate |",
             "|---|---|---|---|---|---|---|"]
    for n, r in table.items():
        share = r["outside_forward_share"]
        lines.append(f"| {n} | {f(r['tokens_per_s'])} | {f(r['tau'])} | {f(r['vs_ar'])}x | "
                     f"{f(r['vs_hf_generate'])}x | {'-' if share is None else f'{100 * share:.1f}%'} | "
                     f"{r['identical_to_hf_generate']}/{n_prompts} |")
    lines += ["", "Goals (issue 3), from this run:", "", "| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {g} | {v:.2f} | {'yes' if ok else 'no'} |" for g, v, ok in goals]
    lines += ["", f"k and tree-shape sweep ({args.sweep_prompts} prompts; best: {best}):", "",
              "| row | tokens/s | tau |", "|---|---|---|"]
    lines += [f"| {n} | {f(r['tokens_per_s'])} | {f(r['tau'])} |" for n, r in sweep.items()]
    lines += ["", "Target forward cost of n new tokens after 200 tokens of context, ms (ratio to n=1):", "",
              "| n | plain | fast |", "|---|---|---|"]
    for n in costs["plain"]:
        p, q = costs["plain"][n], costs["fast"][n]
        lines.append(f"| {n} | {p:.0f} ({p / costs['plain'][1]:.2f}) | {q:.0f} ({q / costs['fast'][1]:.2f}) |")
    md = "\n".join(lines) + "\n"
    (out / "bench.md").write_text(md)
    with open(out / "bench.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "tokens_per_s", "tau", "vs_ar", "vs_hf_generate", "outside_forward_share", "identical"])
        for n, r in table.items():
            w.writerow([n, r["tokens_per_s"], r["tau"], r["vs_ar"], r["vs_hf_generate"],
                        r["outside_forward_share"], r["identical_to_hf_generate"]])
    (out / "bench.json").write_text(json.dumps({"table": table, "sweep": sweep, "forward_ms": costs, "goals": goals,
                                                "best_k": best, "fast_kernel": kernel,
                                                "args": {**vars(args), "out": os.path.relpath(out, ROOT)}},
                                               indent=2))
    plot(out, table)
    print(md)


def plot(out, table):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    axes[0].barh(names, [table[n]["vs_ar"] for n in names], color="tab:blue")
    axes[0].axvline(1.0, color="k", lw=0.8, ls="--")
    axes[0].set_xlabel("speedup over our ar, fast path (x)")
    taus = [table[n]["tau"] or 0 for n in names]
    axes[1].barh(names, taus, color="tab:orange")
    axes[1].set_xlabel("tau (tokens per target forward)")
    axes[1].set_yticklabels([])
    fig.suptitle("Qwen2.5-Coder 0.5B -> 1.5B (fp32 target), CPU, greedy (GSM8K + HumanEval prompts)")
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=120)


if __name__ == "__main__":
    main()
