"""`make bench`: speed of every decoding path on the embedded default pair, measured side by side.

Greedy, the same prompts (first GSM8K and HumanEval questions, chat template), the same
max_new_tokens and stop conditions for every row, methods interleaved prompt by prompt so machine
noise hits all rows alike. Only ratios measured in this one run are meaningful.
Rows, each labelled with its target precision: on the fp32 target, our ar on the plain and the panel
path, transformers `generate`, transformers assisted generation (the int8 draft as `assistant_model`;
`--fp32-draft` adds the fp32 draft as loaded), our lossless sd and mars (theta 0.9) at their best k, and
tree drafts; on the bf16 target (model.dtype=bf16: bf16 weight panels, fp32 between GEMMs) ar, sd,
mars(theta=1) and mars(theta 0.9); llama.cpp on the same Q4_K_M GGUF files, autoregressive and
speculative with the draft GGUF (optional extra `llamacpp`; skipped, with a line saying so, without it).
Also: target forward cost of n tokens (n = 1..16) per path, the share of wall time outside model
forwards, and the peak RSS of each configuration, measured in a fresh process that loads it as `make run`
does and decodes one prompt with ar, sd and mars. Writes results/bench/bench.{md,csv,json} and bench.png.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mars_bench.decode import DecodeConfig, Method, generate  # noqa: E402
from mars_bench.models import fastpath, llamacpp, panel  # noqa: E402
from mars_bench.models.pairs import eos_ids  # noqa: E402
from mars_bench.records import SPEEDUP_DEFINITION, TAU_DEFINITION  # noqa: E402

BASE = "ar (fp32 panel)"              # the row every ratio is taken to
RSS_GOAL_GB = 15.4 / 2                # issue 14: half of make run's 15.4 GB peak before the bf16 path
P_MIN = 0.75                          # adaptive draft rows: llama.cpp server's default p_min


def fast_available() -> bool:
    return panel.library() is not None or fastpath.available()


def model_cfg(dtype: str):
    from hydra import compose, initialize_config_dir

    from mars_bench import config as C

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model.fast_path={'on' if fast_available() else 'off'}",
                                                      f"model.dtype={dtype}"])
    return cfg.model


def load(dtype: str):
    from mars_bench.models.pairs import load_pair

    mcfg = model_cfg(dtype)
    return load_pair(mcfg), mcfg.draft_quant


def fp32_draft(pair):
    """The draft as loaded (no int8), on the fast path like every other model here."""
    from transformers import AutoModelForCausalLM

    from mars_bench.models.adapter import CausalLMAdapter

    model = AutoModelForCausalLM.from_pretrained(pair.draft_path, dtype=torch.float32)
    if fast_available():
        model = fastpath.enable_fast_path(model)
    return CausalLMAdapter(model, out_vocab=pair.target.vocab, name=pair.draft_path)


def gguf_paths():
    from mars_bench.models.embedded import DRAFT, TARGET, default_cache_dir

    return [default_cache_dir() / "gguf" / f"{n}.gguf" for n in (TARGET, DRAFT)]


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
        a.packing = fast   # packing=False makes expect() unpack: the plain path (fp32 panels only)
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


def llama(runner, cfg, speculative: bool, k: int | None = None):
    def run(ids):
        if k is not None:
            runner.draft.k = k
        return runner.run(ids, cfg.max_new_tokens, cfg.eos_ids, speculative=speculative)
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


def forward_costs(paths: dict, ns, ctx=200, reps=3, rounds=2):
    """ms of one target forward scoring n new tokens after a ctx-token prefix, n in ``ns``, per path
    (name -> (adapter, packing) or a llama.cpp runner); the paths alternate per n, so all see the same
    machine state; best of ``reps`` in each of ``rounds`` passes over n."""
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 150000, (ctx,), generator=g).tolist()
    out = {name: {} for name in paths}
    for name, p in paths.items():
        if isinstance(p, tuple):
            p[0].reset()
            p[0].forward(prefix, logits=False)
    for n in [n for _ in range(rounds) for n in ns]:
        for name, p in paths.items():
            if not isinstance(p, tuple):
                best = p.forward_ms(ctx=ctx, ns=(n,), reps=reps)[n] / 1000
            else:
                adapter, packing = p
                adapter.packing = packing
                adapter.expect(n)
                best = float("inf")
                for _ in range(reps):
                    adapter.crop(ctx)
                    t0 = time.perf_counter()
                    adapter.forward(torch.randint(0, 150000, (n,), generator=g).tolist())
                    best = min(best, time.perf_counter() - t0)
            out[name][n] = min(out[name].get(n, float("inf")), best * 1000)
    for p in paths.values():
        if isinstance(p, tuple):
            p[0].packing = True
    return out


def linear_bytes(model) -> int:
    """Bytes of weights the linear layers of ``model`` read in one forward (panels where packed)."""
    total = 0
    for m in model.modules():
        if isinstance(m, panel.PanelLinear):
            total += m.panels.numel() * m.panels.element_size()
        elif isinstance(m, torch.nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    return total


def stream_rates(paths: dict, costs: dict, reps=5) -> dict:
    """Why forward(1) costs what it costs: a 1-token forward is weight streaming, so GB/s = linear weight
    bytes / forward(1) per path, beside torch's own GEMV (oneDNN/MKL) of an LM-head-sized matrix
    (151,936 x 1536) in fp32 and bf16: the rate this machine streams each dtype at, outside our kernels."""
    out = {}
    for name, p in paths.items():
        if isinstance(p, tuple):
            gb = linear_bytes(p[0].model) / 1e9
            out[name] = {"weight_gb": gb, "gb_per_s": gb / (costs[name][1] / 1000)}
    for dt, label in ((torch.float32, "torch GEMV fp32"), (torch.bfloat16, "torch GEMV bf16")):
        w = torch.randn(151936, 1536).to(dt)
        x = torch.randn(1, 1536, dtype=dt)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            x @ w.T
            best = min(best, time.perf_counter() - t0)
        gb = w.numel() * w.element_size() / 1e9
        out[label] = {"weight_gb": gb, "gb_per_s": gb / best}
        del w
    return out


def rss_probe(dtype: str, max_new_tokens: int, data_dir: str) -> dict:
    """In this (fresh) process: load the pair of ``dtype`` as `make run` does (``llamacpp``: the two GGUF
    files), decode one prompt with ar, sd and mars; peak RSS (VmHWM) after loading and after each."""
    def peak():
        text = open("/proc/self/status").read()
        return int(text.split("VmHWM:")[1].split()[0]) / 1e6   # kB -> GB

    out = {}
    if dtype == "llamacpp":
        target, draft = gguf_paths()
        runner = llamacpp.LlamaCppRunner(str(target), str(draft), k=4, threads=torch.get_num_threads())
        out["load"] = peak()
        from transformers import AutoTokenizer

        from mars_bench.models.embedded import TARGET, ensure_model
        tok = AutoTokenizer.from_pretrained(ensure_model(TARGET, dtype="bf16"))   # the default's cached copy
        ids = prompts(tok, 1, data_dir)[0][1]
        for name, spec in (("ar", False), ("sd", True)):
            runner.run(ids, max_new_tokens, (tok.eos_token_id,), speculative=spec)
            out[name] = peak()
        return out
    pair, _ = load(dtype)
    out["load"] = peak()
    ids = prompts(pair.tokenizer, 1, data_dir)[0][1]
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, eos_ids=(pair.tokenizer.eos_token_id,))
    for name, m in (("ar", Method("ar")), ("sd", Method("sd", k=5)),
                    ("mars", Method("mars", k=6, rule="mars", rule_kwargs={"theta": 0.9}))):
        ours(pair, m, True, cfg)(ids)
        out[name] = peak()
    out["fast_kernel"] = fastpath.kind(pair.target.model)
    return out


def peak_rss(configs, max_new_tokens, data_dir) -> dict:
    """{config: {phase: peak GB}}, each config in its own process (a peak is per process)."""
    res = {}
    for c in configs:
        print(f"peak RSS of {c} (fresh process)...", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, "--rss-probe", c, "--max-new-tokens", str(max_new_tokens),
                               "--threads", str(torch.get_num_threads())], capture_output=True, text=True)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            res[c] = {"error": f"the {c} probe failed: {last}"}
            print(res[c]["error"], file=sys.stderr)
            continue
        res[c] = json.loads(proc.stdout.strip().splitlines()[-1])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=10, help="GSM8K + HumanEval prompts (half each)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k-sweep", default="4,5,6,7,8,10", help="k values tried for sd and mars")
    ap.add_argument("--sweep-prompts", type=int, default=2, help="prompts used to pick k")
    ap.add_argument("--trees", default="2,2,6;3,3,10;4,4,12;4,4,16",
                    help="tree shapes depth,top_k,total_tokens tried for sd_tree ('' = no tree rows)")
    ap.add_argument("--fp32-draft", action="store_true", help="also rows with the fp32 draft as loaded")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 target rows")
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp rows")
    ap.add_argument("--cost-n", default=",".join(map(str, range(1, 17))), help="n of the forward-cost table (1 first)")
    ap.add_argument("--cost-rounds", type=int, default=2, help="passes over n in the forward-cost table")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rss-probe", default=None, help=argparse.SUPPRESS)   # internal: one peak-RSS measurement
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = os.environ.get("MARS_BENCH_DATA_DIR")   # None: the tasks' own lookup (tasks/data.py)
    if args.rss_probe:
        print(json.dumps(rss_probe(args.rss_probe, min(args.max_new_tokens, 32), data_dir)))
        return
    bf16 = not args.no_bf16 and panel.bf16_available()
    if not args.no_bf16 and not bf16:
        print(f"bf16 rows skipped: no bf16 panel kernel ({panel.unavailable() or 'CPU lacks AVX512_BF16'})",
              file=sys.stderr)
    why_no_llama = ("--no-llama" if args.no_llama else llamacpp.unavailable()
                    or next((f"{p} missing" for p in gguf_paths() if not p.exists()), None))
    rss = peak_rss(["fp32"] + (["bf16"] if bf16 else []) + ([] if why_no_llama else ["llamacpp"]),
                   args.max_new_tokens, data_dir)
    if "error" in rss.get("llamacpp", {}):   # e.g. a build whose kernels crash on this CPU: keep the rest
        why_no_llama = rss["llamacpp"]["error"]
    if why_no_llama:
        print(f"llama.cpp rows skipped: {why_no_llama}", file=sys.stderr)

    pair, quant = load("fp32")
    pair16 = load("bf16")[0] if bf16 else None
    draft32 = fp32_draft(pair) if quant != "none" and args.fp32_draft else None
    tok = pair.tokenizer
    eos = eos_ids(pair.target.model, tok)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_ids=tuple(eos))
    items = prompts(tok, args.prompts, data_dir)
    fast = fast_available()
    mars = lambda k, theta=0.9: Method("mars", k=k, rule="mars", rule_kwargs={"theta": theta})  # noqa: E731
    ks = [int(k) for k in args.k_sweep.split(",")]
    runner = None
    if not why_no_llama:
        target_gguf, draft_gguf = gguf_paths()
        runner = llamacpp.LlamaCppRunner(str(target_gguf), str(draft_gguf), k=max(ks), threads=args.threads,
                                         eos_ids=eos)

    print("forward cost of n tokens (target)...", file=sys.stderr)
    paths = {"fp32 plain": (pair.target, False), "fp32 panel": (pair.target, True)}
    if pair16 is not None:
        paths["bf16"] = (pair16.target, True)
    if runner is not None:
        paths["llama.cpp Q4_K_M"] = runner
    costs = forward_costs(paths, [int(n) for n in args.cost_n.split(",")], rounds=args.cost_rounds)
    rates = stream_rates(paths, costs)

    new = pair16 or pair             # the pair whose k is swept: the new default where it runs
    tag = "bf16" if pair16 is not None else "fp32 panel"
    sweep_rows = {f"ar ({tag})": ours(new, Method("ar"), fast, cfg)}
    for k in ks:
        sweep_rows[f"sd k={k} ({tag})"] = ours(new, Method("sd", k=k), fast, cfg)
        sweep_rows[f"mars k={k} ({tag})"] = ours(new, mars(k), fast, cfg)
    shapes = [tuple(int(x) for x in t.split(",")) for t in args.trees.split(";") if t]
    tree = lambda d, w, t: {"depth": d, "top_k": w, "total_tokens": t, "static_paths": None,  # noqa: E731
                            "children": "topk"}
    for d, w, t in shapes:
        sweep_rows[f"sd_tree d{d} w{w} t{t} ({tag})"] = ours(new, Method("sd_tree", rule="exact", tree=tree(d, w, t)),
                                                             fast, cfg)
    if runner is not None:
        for k in ks:
            sweep_rows[f"llama.cpp speculative k={k}"] = llama(runner, cfg, True, k)
    print("k and tree-shape sweep...", file=sys.stderr)
    sweep = {n: agg(r) for n, r in measure(sweep_rows, items[: args.sweep_prompts], "sweep ").items()}
    best = {m: max(ks, key=lambda k: sweep[f"{m} k={k} ({tag})"]["tokens_per_s"]) for m in ("sd", "mars")}
    if shapes:
        best["tree"] = max(shapes, key=lambda s: sweep[f"sd_tree d%d w%d t%d ({tag})" % s]["tokens_per_s"])
    if runner is not None:
        best["llama.cpp"] = max(ks, key=lambda k: sweep[f"llama.cpp speculative k={k}"]["tokens_per_s"])

    dq = f", {quant} draft" if quant != "none" else ""
    rows = {"ar (fp32 plain)": ours(pair, Method("ar"), False, cfg),
            BASE: ours(pair, Method("ar"), fast, cfg),
            "transformers generate (fp32)": hf(pair, cfg),
            f"transformers assisted (fp32{dq})": hf(pair, cfg, pair.draft)}
    if draft32 is not None:
        rows["transformers assisted (fp32, fp32 draft)"] = hf(pair, cfg, draft32)
        rows[f"sd k={best['sd']} (fp32 panel, fp32 draft)"] = ours(pair, Method("sd", k=best["sd"]), fast, cfg, draft32)
    rows[f"sd k={best['sd']} (fp32 panel{dq})"] = ours(pair, Method("sd", k=best["sd"]), fast, cfg)
    rows[f"mars k={best['mars']} theta=0.9 (fp32 panel{dq})"] = ours(pair, mars(best["mars"]), fast, cfg)
    if pair16 is not None:
        rows["ar (bf16)"] = ours(pair16, Method("ar"), fast, cfg)
        rows[f"sd k={best['sd']} (bf16{dq})"] = ours(pair16, Method("sd", k=best["sd"]), fast, cfg)
        rows[f"mars k={best['mars']} theta=1 (bf16{dq})"] = ours(pair16, mars(best["mars"], 1.0), fast, cfg)
        rows[f"mars k={best['mars']} theta=0.9 (bf16{dq})"] = ours(pair16, mars(best["mars"]), fast, cfg)
    # adaptive draft length (method.p_min, llama.cpp's default 0.75): k is the longest chain a step may draft
    k_max = max(ks)
    rows[f"sd k<={k_max} p_min={P_MIN} ({tag}{dq})"] = ours(new, Method("sd", k=k_max, p_min=P_MIN), fast, cfg)
    rows[f"mars k<={k_max} p_min={P_MIN} theta=0.9 ({tag}{dq})"] = ours(
        new, Method("mars", k=k_max, rule="mars", rule_kwargs={"theta": 0.9}, p_min=P_MIN), fast, cfg)
    if shapes:
        d, w, t = best["tree"]
        rows[f"sd_tree d{d} w{w} t{t} ({tag}{dq})"] = ours(new, Method("sd_tree", rule="exact", tree=tree(d, w, t)),
                                                           fast, cfg)
        rows[f"mars_tree d{d} w{w} t{t} theta=0.9 ({tag}{dq})"] = ours(
            new, Method("mars_tree", rule="mars", rule_kwargs={"theta": 0.9}, tree=tree(d, w, t)), fast, cfg)
    if runner is not None:
        rows["llama.cpp ar (Q4_K_M)"] = llama(runner, cfg, False)
        rows[f"llama.cpp speculative k={best['llama.cpp']} (Q4_K_M, Q4_K_M draft)"] = llama(runner, cfg, True,
                                                                                     best["llama.cpp"])
    print("main comparison...", file=sys.stderr)
    raw = measure(rows, items)
    table = {n: agg(r) for n, r in raw.items()}
    base, hfg = table[BASE], table["transformers generate (fp32)"]
    refs = {"fp32": [r["tokens"] for r in raw["transformers generate (fp32)"]]}
    if pair16 is not None:
        refs["bf16"] = [r["tokens"] for r in raw["ar (bf16)"]]
    if runner is not None:
        refs["Q4_K_M"] = [r["tokens"] for r in raw["llama.cpp ar (Q4_K_M)"]]
    for n, row in table.items():
        prec = "Q4_K_M" if n.startswith("llama.cpp") else "bf16" if "(bf16" in n else "fp32"
        row["precision"] = {"Q4_K_M": "Q4_K_M blocks (llama.cpp)", "bf16": "bf16 weights, fp32 activations",
                            "fp32": "fp32"}[prec]
        row["vs_ar"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["vs_hf_generate"] = row["tokens_per_s"] / hfg["tokens_per_s"]
        row["identical_to_hf_generate"] = sum(a["tokens"] == b for a, b in zip(raw[n], refs["fp32"]))
        row["identical_to_ar_same_precision"] = sum(a["tokens"] == b for a, b in zip(raw[n], refs.get(prec, [])))
    goals = check_goals(table, costs, rss, len(items))
    kernels = {"fp32": fastpath.kind(pair.target.model)}
    if pair16 is not None:
        kernels["bf16"] = fastpath.kind(pair16.target.model)
    write(args, table, sweep, costs, best, len(items), goals, quant, kernels, rss, why_no_llama, rates)


def check_goals(table, costs, rss, n_prompts):
    """Issues 3 and 14's goals, each as (goal, measured value, met?), computed from this run's numbers."""
    out = []
    tps = lambda n: table[n]["tokens_per_s"]  # noqa: E731
    find = lambda prefix, path: next((n for n in table if n.startswith(prefix) and f"({path}" in n), None)  # noqa: E731
    if "bf16" in costs:
        b, f = costs["bf16"], costs["fp32 panel"]
        out += [("bf16: target forward(1) >= 1.8x faster than the fp32 panel path", f[1] / b[1], f[1] / b[1] >= 1.8),
                ("bf16: target forward(8) / forward(1) <= 1.2", b[8] / b[1], b[8] / b[1] <= 1.2)]
        for prefix in ("sd k=", "mars k="):
            n = next((n for n in table if n.startswith(prefix) and "(bf16" in n and "theta=0.9" not in n), None)
            if n:
                same = table[n]["identical_to_ar_same_precision"]
                out.append((f"{n}: prompts with greedy tokens identical to ar (bf16), of {n_prompts}", same,
                            same == n_prompts))
        out.append(("bf16 ar faster than fp32 panel ar", tps("ar (bf16)") / tps(BASE), tps("ar (bf16)") > tps(BASE)))
    if "load" in rss.get("bf16", {}):
        peak = max(v for k, v in rss["bf16"].items() if isinstance(v, float))
        out.append((f"peak RSS of the bf16 default (load + ar, sd, mars) <= {RSS_GOAL_GB:.1f} GB", peak,
                    peak <= RSS_GOAL_GB))
    for n in [n for n in table if n.startswith("sd k<=")]:   # adaptive draft length stays lossless
        same = table[n]["identical_to_ar_same_precision"]
        out.append((f"{n}: prompts with greedy tokens identical to ar, same precision, of {n_prompts}", same,
                    same == n_prompts))
    f = costs["fp32 panel"]
    out.append(("fp32 panel: target forward(8) / forward(1) <= 1.3", f[8] / f[1], f[8] / f[1] <= 1.3))
    sd, mars = find("sd k=", "fp32 panel"), find("mars k=", "fp32 panel")
    out.append((f"{sd} >= 1.3x our ar", table[sd]["vs_ar"], table[sd]["vs_ar"] >= 1.3))
    for n in table:
        if n.startswith("transformers assisted"):
            out.append((f"{sd} >= 1.6x {n}", tps(sd) / tps(n), tps(sd) / tps(n) >= 1.6))
    r = tps(mars) / tps(sd)
    out.append((f"{mars} >= 1.15x {sd}, with a higher tau", r, r >= 1.15 and table[mars]["tau"] > table[sd]["tau"]))
    hf_gen = tps("transformers generate (fp32)")
    out.append(("ar (fp32 plain) within 5% of transformers generate", tps("ar (fp32 plain)") / hf_gen,
                abs(tps("ar (fp32 plain)") / hf_gen - 1) <= 0.05))
    out.append((f"{BASE} faster than transformers generate", tps(BASE) / hf_gen, tps(BASE) > hf_gen))
    worst = max((r["outside_forward_share"] or 0) for r in table.values())
    out.append(("time outside model forwards <= 5% for every method (worst row)", worst, worst <= 0.05))
    return out


def write(args, table, sweep, costs, best, n_prompts, goals, quant, kernels, rss, why_no_llama, rates=None):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = [f"# Embedded default pair (Qwen2.5-Coder 0.5B -> 1.5B, {quant} draft, CPU {os.cpu_count()} cores), greedy",
             "", "Target kernels: " + ", ".join(f"{k} target: {v}" for k, v in kernels.items())
             + " (`mars_bench/models/fastpath.py`, `panel.py`). fp32 plain: `F.linear` as loaded. bf16: "
             "model.dtype=bf16, bf16 weight panels (inputs rounded to bf16, fp32 sums), norms, rotary, attention "
             "and residual stream in fp32.",
             "" if not why_no_llama else f"\nllama.cpp rows skipped: {why_no_llama}.",
             f"{n_prompts} prompts (GSM8K + HumanEval), max_new_tokens={args.max_new_tokens}, interleaved. "
             f"{TAU_DEFINITION}. Ratios are to {BASE} ({SPEEDUP_DEFINITION}).", "",
             "| method | target precision | tokens/s | tau | vs " + BASE + " | vs transformers generate | outside forwards "
             "| identical to generate (fp32) | identical to ar, same precision |", "|---|---|---|---|---|---|---|---|---|"]
    for n, r in table.items():
        share = r["outside_forward_share"]
        lines.append(f"| {n} | {r['precision']} | {f(r['tokens_per_s'])} | {f(r['tau'])} | {f(r['vs_ar'])}x | "
                     f"{f(r['vs_hf_generate'])}x | {'-' if share is None else f'{100 * share:.1f}%'} | "
                     f"{r['identical_to_hf_generate']}/{n_prompts} | {r['identical_to_ar_same_precision']}/{n_prompts} |")
    lines += ["", "Goals (issues 3 and 14), from this run:", "", "| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {g} | {v:.2f} | {'yes' if ok else 'no'} |" for g, v, ok in goals]
    lines += ["", "Peak resident memory (VmHWM, GB) of a fresh process per configuration: after loading the pair "
              "as `make run` does, and after decoding one prompt with each method in turn (a peak only grows):", "",
              "| configuration | kernel | after load | ar | sd | mars |", "|---|---|---|---|---|---|"]
    for c, r in rss.items():
        if "error" in r:
            lines.append(f"| {c} | {r['error']} | - | - | - | - |")
            continue
        lines.append(f"| {c} | {r.get('fast_kernel', 'llama.cpp')} | {f(r['load'])} | {f(r.get('ar'))} | "
                     f"{f(r.get('sd'))} | {f(r.get('mars'))} |")
    lines += ["", f"k and tree-shape sweep ({args.sweep_prompts} prompts; best: {best}):", "",
              "| row | tokens/s | tau |", "|---|---|---|"]
    lines += [f"| {n} | {f(r['tokens_per_s'])} | {f(r['tau'])} |" for n, r in sweep.items()]
    names = list(costs)
    lines += ["", "Target forward cost of n new tokens after 200 tokens of context, ms (ratio to n=1):", "",
              "| n | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for n in costs[names[0]]:
        lines.append(f"| {n} | " + " | ".join(f"{costs[p][n]:.0f} ({costs[p][n] / costs[p][1]:.2f})" for p in names) + " |")
    if rates:
        lines += ["", "Weight streaming (a 1-token forward reads every linear weight once): GB read / forward(1), and "
                  "torch's own GEMV of a 151,936 x 1536 matrix per dtype, best of 5:", "",
                  "| path | weights read, GB | GB/s |", "|---|---|---|"]
        lines += [f"| {n} | {r['weight_gb']:.2f} | {r['gb_per_s']:.1f} |" for n, r in rates.items()]
    md = "\n".join(lines) + "\n"
    (out / "bench.md").write_text(md)
    with open(out / "bench.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "precision", "tokens_per_s", "tau", "vs_ar", "vs_hf_generate", "outside_forward_share",
                    "identical_to_hf_generate", "identical_to_ar_same_precision"])
        for n, r in table.items():
            w.writerow([n, r["precision"], r["tokens_per_s"], r["tau"], r["vs_ar"], r["vs_hf_generate"],
                        r["outside_forward_share"], r["identical_to_hf_generate"], r["identical_to_ar_same_precision"]])
    (out / "bench.json").write_text(json.dumps({"table": table, "sweep": sweep, "forward_ms": costs, "goals": goals,
                                                "best_k": best, "fast_kernel": kernels, "peak_rss_gb": rss,
                                                "llama_cpp_skipped": why_no_llama, "weight_streaming": rates,
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
    axes[0].set_xlabel(f"speedup over {BASE} (x)")
    taus = [table[n]["tau"] or 0 for n in names]
    axes[1].barh(names, taus, color="tab:orange")
    axes[1].set_xlabel("tau (tokens per target forward)")
    axes[1].set_yticklabels([])
    fig.suptitle("Qwen2.5-Coder 0.5B -> 1.5B, CPU, greedy (GSM8K + HumanEval prompts); target precision per row")
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=120)


if __name__ == "__main__":
    main()
