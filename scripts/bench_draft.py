"""`make bench`, the draft's part: what a draft token costs next to a target token, per draft setting, and
what that buys in speed.

1. Costs (in this process, paths alternating per n; best of reps): target forward of 1, 5 and 8 new tokens
   after 200 tokens of context; a 1-token forward of each draft setting (``--drafts``: int8 = fbgemm, q8 /
   q4 = group-32 codes, ``+v<N>`` = the LM head trimmed to N ids); per draft its weight bytes, the rate
   they stream at inside its linear layers, and the time outside them (norms, attention, Python).
2. k sweep (runner, ``+compare=bench_draft`` with ``interleave=`` set here): ar, sd and mars theta 0.9 at each
   k of ``--ks``, every draft setting, short outputs; the fastest k per draft and method is kept.
3. Speed at the task budgets (runner): ar, sd and mars at their swept k, for the int8 draft (before) and the
   fastest other setting, GSM8K and HumanEval; speedup vs ar with its paired bootstrap CI (summary.json).
4. llama.cpp's own speculative decoding of the same GGUF pair beside our mars with the fastest draft, decoded
   interleaved prompt by prompt here (``bench.measure``), on the GSM8K prompts.
5. Prompt lookup (no draft model) against ar and sd on CNN/DM, HumanEval and WMT19 (runner).

Goals (issue 23) are checked from these numbers; a missed one names the cost that limits it.
Writes results/bench/draft.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench as B  # noqa: E402

from mars_bench import stats as S  # noqa: E402
from mars_bench.decode import DecodeConfig, Method, generate  # noqa: E402
from mars_bench.models import fastpath, llamacpp, panel, quant  # noqa: E402
from mars_bench.models.pairs import eos_ids, load_draft  # noqa: E402
from mars_bench.records import SPEEDUP_DEFINITION, TAU_DEFINITION, machine, machine_label  # noqa: E402

BUDGET_TASKS = ("gsm8k", "humaneval")
LOOKUP_TASKS = ("cnn_dm", "humaneval", "wmt19_zh_en")
GOALS = {"draft_ratio": 0.10, "verify5": 1.15, "verify8": 1.25, "sd": 2.0, "mars": 2.5, "vs_llama": 1.5}
KIND_GOALS = {"panel-avx2-bf16": {"draft_ratio": 0.15, "verify5": 1.3}}   # issue 36: the AVX2 kind's cost rows


def goals(kernel: str) -> dict:
    """The goals a run on target kernel ``kernel`` is checked against (the AVX2 kind has its own cost rows)."""
    return {**GOALS, **KIND_GOALS.get(kernel, {})}


def overrides(draft: str) -> list[str]:
    """'q4+v32768' -> model.draft_quant=q4 model.draft_vocab=32768."""
    quant_name, _, vocab = draft.partition("+v")
    return [f"model.draft_quant={quant_name}", f"model.draft_vocab={int(vocab) if vocab else 0}"]


def model_cfg(draft: str):
    from hydra import compose, initialize_config_dir

    from mars_bench import config as C

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides(draft)).model


# ---- 1. costs ---------------------------------------------------------------------------------------------
LINEARS = (quant.QuantLinear, fastpath.Int8Linear, fastpath.PackedLinear, panel.PanelLinear, torch.nn.Linear)


def weight_bytes(model) -> int:
    out = 0
    for m in model.modules():
        if isinstance(m, quant.QuantLinear):
            out += m.panels.numel()
        elif isinstance(m, fastpath.Int8Linear):
            out += m.in_features * m.out_features
        elif isinstance(m, LINEARS):
            out += m.in_features * m.out_features * (2 if getattr(m, "bf16", False) else 4)
    return out


def linear_share(adapter, n: int = 1, ctx: int = 200, reps: int = 10) -> tuple[float, float]:
    """(ms per forward of n new tokens, ms of it inside linear layers), medians over ``reps``, hooks on every
    linear layer."""
    spent = [0.0]
    mods = [m for m in adapter.model.modules() if isinstance(m, LINEARS)]
    start = {}
    hooks = [m.register_forward_pre_hook(lambda mod, _: start.__setitem__(id(mod), time.perf_counter())) for m in mods]
    hooks += [m.register_forward_hook(lambda mod, _i, _o: spent.__setitem__(0, spent[0] + time.perf_counter()
                                                                            - start[id(mod)])) for m in mods]
    adapter.reset()
    adapter.expect(n)
    adapter.forward(list(range(1000, 1000 + ctx)), logits=False)
    walls, lins = [], []
    try:
        for i in range(reps):
            adapter.crop(ctx)
            spent[0] = 0.0
            t0 = time.perf_counter()
            adapter.forward(list(range(2000 + i, 2000 + i + n)))
            walls.append(time.perf_counter() - t0)
            lins.append(spent[0])
    finally:
        for h in hooks:
            h.remove()
    return sorted(walls)[reps // 2] * 1e3, sorted(lins)[reps // 2] * 1e3


def stream_rate(gib: float = 1.0, reps: int = 3) -> float:
    """GB/s this machine streams from DRAM into a sum over all threads (best of ``reps``): the weight-streaming
    bound a forward's rate is read against."""
    x = torch.ones(int(gib * 2**30) // 8, dtype=torch.int64)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 8 / best / 1e9


def costs(drafts: list[str], reps: int, rounds: int) -> tuple[dict, dict]:
    """({path: {n: ms}}, {draft: facts}): target n = 1, 5, 8 and each draft at n = 1, alternating. A draft with
    fused forwards (models/fused.py) is measured as it runs and, as "<draft> (modules)", through transformers'
    modules with linear-layer hooks (the split inside / outside the linear layers)."""
    pair, _ = B.load("bf16")
    adapters, facts = {}, {}
    for d in drafts:
        adapter, scheme = load_draft(model_cfg(d), pair)
        adapters[d] = adapter
        facts[d] = {"scheme": scheme, "weight_bytes": weight_bytes(adapter.model),
                    "path": "fused" if adapter.fused is not None else "modules"}
        if adapter.fused is not None:
            plain = adapter.fork()
            plain.fused = None
            adapters[f"{d} (modules)"] = plain
            facts[f"{d} (modules)"] = dict(facts[d], path="modules")
    target = B.forward_costs({"target": (pair.target, True)}, [1, 5, 8], reps=reps, rounds=rounds)
    drafted = B.forward_costs({d: (a, True) for d, a in adapters.items()}, [1], reps=reps, rounds=rounds)
    for d, a in adapters.items():
        f = facts[d]
        f.update(ms=drafted[d][1], ratio=drafted[d][1] / target["target"][1],
                 gb_per_s=f["weight_bytes"] / drafted[d][1] / 1e6, linear_ms=None, outside_ms=None)
        if f["path"] == "modules":
            wall, lin = linear_share(a)
            f.update(linear_ms=lin, outside_ms=wall - lin, linear_gb_per_s=f["weight_bytes"] / lin / 1e6)
    facts["target"] = {"weight_bytes": weight_bytes(pair.target.model), "kernel": fastpath.kind(pair.target.model),
                       "outside_ms": {}, "stream_gb_per_s": stream_rate()}
    if facts["target"]["kernel"] == "panel-amx-bf16":   # the AVX512_BF16-only kind's kernel, run on this machine
        panel.set_bf16_kernel(pair.target.model, amx=False)
        try:
            other = B.forward_costs({"target": (pair.target, True)}, [1, 5, 8], reps=reps, rounds=rounds)
        finally:
            panel.set_bf16_kernel(pair.target.model, amx=True)
        facts["target"]["avx512_bf16_here_ms"] = other["target"]
    for n in (1, 5, 8):   # what grows with n: the linears (kernel) or the rest (row-wise attention, Python)
        wall, lin = linear_share(pair.target, n, reps=max(3, reps))
        facts["target"]["outside_ms"][n] = wall - lin
    return target["target"], facts


# ---- 2-3, 5. runner rows ----------------------------------------------------------------------------------
def entries(sd_k: list[int], mars_k: list[int], extra=()) -> str:
    rows = [["method=ar"]] + [["method=sd", f"method.k={k}"] for k in sd_k]
    rows += [["method=mars", f"method.k={k}", "rule.theta=0.9"] for k in mars_k] + [list(e) for e in extra]
    return "interleave=[" + ",".join("[" + ",".join(f'"{o}"' for o in r) + "]" for r in rows) + "]"


def runner_rows(runs: Path, draft: str, tasks, interleave: str, extra=(), threads=None) -> pd.DataFrame:
    out = runs / draft.replace("+", "_")
    for task in tasks:
        B.run_compare("bench_draft", task, out, [*overrides(draft), interleave, "progress=false", *extra], threads)
    rows = B.our_rows(out)
    rows["draft"] = draft   # method and k: run.json's (``bench.our_rows``)
    return rows


def best_k(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per draft and method, the k with the most tokens/s summed over the sweep's tasks."""
    spec = sweep[sweep["method"].isin(["sd", "mars"])]
    tps = spec.groupby(["draft", "method", "k"])["tokens_per_s"].mean().reset_index()
    return tps.loc[tps.groupby(["draft", "method"])["tokens_per_s"].idxmax()].reset_index(drop=True)


# ---- 4. llama.cpp beside our mars ---------------------------------------------------------------------------
PROBE = """
import sys
from mars_bench.models import llamacpp
r = llamacpp.LlamaCppRunner(sys.argv[1], sys.argv[2], k=2, threads=1)
r.run(list(range(1000, 1010)), 2, (), speculative=True)
"""


def llama_probe() -> str | None:
    """None when llama.cpp decodes two tokens speculatively in a fresh process, else why not (a build whose
    kernels crash on this CPU kills only the probe)."""
    import subprocess

    why = llamacpp.unavailable() or next((f"{p} missing" for p in B.gguf_paths() if not p.exists()), None)
    if why:
        return why
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, B.gguf_paths())], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or [""])[-1][:120]
        return f"llama.cpp failed a 2-token probe in a fresh process (exit {proc.returncode}{': ' + last if last else ''})"
    return None


def vs_llama(draft: str, k: int, llama_k: int, limit: int, max_new: int, data_dir, threads: int) -> dict:
    pair, _ = B.load("bf16")
    adapter, _ = load_draft(model_cfg(draft), pair)
    eos = eos_ids(pair.target.model, pair.tokenizer)
    cfg = DecodeConfig(max_new_tokens=max_new, eos_ids=tuple(eos))
    target_gguf, draft_gguf = B.gguf_paths()
    runner = llamacpp.LlamaCppRunner(str(target_gguf), str(draft_gguf), k=llama_k, threads=threads, eos_ids=eos)
    method = Method("mars", k=k, rule="mars", rule_kwargs={"theta": 0.9})

    def ours(ids):
        pair.target.expect(k + 1)
        adapter.expect(1)
        r = generate(pair.target, adapter, pair.tokenizer, ids, method, cfg)
        return {"tokens": r.tokens, "wall_s": r.wall_s, "steps": r.steps}

    rows = {f"mars k={k} θ=0.9 ({draft} draft)": ours,
            f"llama.cpp speculative k={llama_k}": B.llama(runner, cfg, True, llama_k)}
    items = [p for p in B.prompts(pair.prompt_ids, limit, data_dir) if p[0] == "gsm8k"]
    raw = B.measure(rows, items)
    (a, ra), (b, rb) = raw.items()
    up = S.speedup_ci([len(r["tokens"]) for r in ra], [r["wall_s"] for r in ra],
                      [len(r["tokens"]) for r in rb], [r["wall_s"] for r in rb], S.StatsSettings())
    tps = lambda rs: sum(len(r["tokens"]) for r in rs) / sum(r["wall_s"] for r in rs)  # noqa: E731
    return {"ours": a, "llama": b, "ours_tps": tps(ra), "llama_tps": tps(rb), "ratio": up["value"],
            "lo": up["lo"], "hi": up["hi"], "n": len(ra), "max_new_tokens": max_new}


# ---- goals and output ---------------------------------------------------------------------------------------
def bound(tau: float, k: int, target: dict, draft_ms: float) -> float | None:
    """The speedup a chain of k drafts at this tau reaches when only forwards cost time: tau target tokens of
    ar against one verification of k + 1 tokens (interpolated from n = 5 and 8) and k draft tokens."""
    if not tau or not k:
        return None
    verify = target[5] + (target[8] - target[5]) * (min(max(k + 1, 5), 8) - 5) / 3 if k + 1 <= 8 else target[8]
    return tau * target[1] / (verify + k * draft_ms)


def check_goals(target: dict, facts: dict, budget: pd.DataFrame, llama: dict | None, kernel: str) -> list:
    out, want = [], goals(kernel)
    stream = facts.get("target", {}).get("stream_gb_per_s")
    for d, f in facts.items():
        if d == "target" or d.endswith(" (modules)"):
            continue
        floor = f"; {f['weight_bytes'] / 1e6:.0f} MB at the machine's {stream:.1f} GB/s alone take " \
                f"{f['weight_bytes'] / stream / 1e6:.1f} ms" if stream else ""
        if f.get("path") == "fused":
            why = (f"one C call per layer: {f['ms']:.1f} ms streams the weights at {f['gb_per_s']:.1f} GB/s over the "
                   f"whole forward{floor}")
        else:
            why = (f"{f['ms']:.1f} ms = {f['linear_ms']:.1f} in linears ({f['weight_bytes'] / 1e6:.0f} MB at "
                   f"{f.get('linear_gb_per_s', f['gb_per_s']):.1f} GB/s) + {f['outside_ms']:.1f} outside them "
                   f"(norms, attention, Python){floor}")
        out.append((f"draft {d} forward(1) / target forward(1) <= {want['draft_ratio']}", f["ratio"],
                    f["ratio"] <= want["draft_ratio"], why))
    kind = "AVX512_BF16-only kind" if kernel == "panel-avx512-bf16" else f"{kernel}; the AVX512_BF16-only kind was not measured here"
    outside = facts.get("target", {}).get("outside_ms", {})
    here = {int(n): v for n, v in (facts.get("target", {}).get("avx512_bf16_here_ms") or {}).items()}
    for n, key in ((5, "verify5"), (8, "verify8")):
        r = target[n] / target[1]
        grew = (f"; outside linears {outside[1]:.1f} -> {outside[n]:.1f} ms (row-wise attention over more rows, "
                f"norms, Python)" if 1 in outside and n in outside else "")
        other = (f"; its kernel (panel-avx512-bf16) on this machine: {here[n] / here[1]:.2f}"
                 if here.get(1) and here.get(n) else "")
        out.append((f"target forward({n}) / forward(1) <= {want[key]}", r, r <= want[key], kind + grew + other))
    gsm = budget[(budget["task"] == "gsm8k")]
    for d, g in gsm.groupby("draft", sort=False):
        for method in ("sd", "mars"):
            row = g[(g["method"] == method) & (g["theta"].fillna(0.9) != 1.0)]
            if row.empty:
                continue
            r = row.iloc[0]
            b = bound(r["tau"], r["k"], target, facts[d]["ms"])
            why = (f"tau {r['tau']:.2f} at k={int(r['k'])}: the cost table predicts {b:.2f}x (tau x target(1) / "
                   f"(verify(k + 1) + k drafts)); outside forwards {r['outside_forward_share'] * 100:.0f}% of wall"
                   if b else "")
            out.append((f"GSM8K {method} ({d} draft) >= {want[method]}x ar [CI {r['vs_ar_lo']:.2f}, {r['vs_ar_hi']:.2f}],"
                        f" n={r['n']}", r["vs_ar"], r["vs_ar"] >= want[method], why))
    for _, r in budget[(budget["method"] != "ar") & ((budget["method"] == "sd") | (budget["theta"] == 1.0))].iterrows():
        out.append((f"{r['task']} {r['row']} ({r['draft']} draft): tokens identical to ar, of {r['n']}",
                    r["identical_to_ar"], r["identical_to_ar"] == r["n"], ""))
    if llama:
        out.append((f"{llama['ours']} >= {want['vs_llama']}x {llama['llama']} [CI {llama['lo']:.2f}, {llama['hi']:.2f}],"
                    f" n={llama['n']}", llama["ratio"], llama["ratio"] >= want["vs_llama"],
                    f"{llama['ours_tps']:.2f} vs {llama['llama_tps']:.2f} tokens/s"))
    return out


def rows_md(df: pd.DataFrame) -> str:
    f = lambda x, p=2: "-" if x is None or pd.isna(x) else f"{x:.{p}f}"  # noqa: E731
    shown = pd.DataFrame({
        "task": df["task"], "draft": df["draft"], "method": df["row"], "n": df["n"],
        "tokens/s": df["tokens_per_s"].map(f), "tau": df["tau"].map(f),
        "vs ar [95% CI]": [f"{f(v)} [{f(lo)}, {f(hi)}]" for v, lo, hi in zip(df["vs_ar"], df["vs_ar_lo"], df["vs_ar_hi"])],
        "identical to ar": [f"{a}/{n}" for a, n in zip(df["identical_to_ar"], df["n"])]})
    return shown.to_markdown(index=False, disable_numparse=True)


def write(out: Path, meta: dict, target: dict, facts: dict, sweep, chosen, budget, llama, lookup, goals) -> str:
    f = lambda x, p=2: "-" if x is None or pd.isna(x) else f"{x:.{p}f}"  # noqa: E731
    here = {int(n): v for n, v in (facts["target"].get("avx512_bf16_here_ms") or {}).items()}
    md = lambda rows, cols: pd.DataFrame(rows, columns=cols).to_markdown(index=False, disable_numparse=True)  # noqa: E731
    lines = [f"# Draft cost and speed, embedded pair (bf16 target), greedy", "",
             f"Machine: {meta['machine']}. Target kernel: {facts['target']['kernel']}. {TAU_DEFINITION}. "
             f"vs ar: {SPEEDUP_DEFINITION}; 95% CI: paired bootstrap over prompts.", "",
             "Target forward of n new tokens after 200 tokens of context, ms (ratio to n = 1):", "",
             md([[n, f"{target[n]:.1f}", f"{target[n] / target[1]:.2f}",
                  f(facts["target"].get("outside_ms", {}).get(n), 1), f(here.get(n), 1),
                  f(here[n] / here[1] if here.get(n) and here.get(1) else None)] for n in (1, 5, 8)],
                ["n", "ms", "ratio", "outside linears ms", "AVX512_BF16 kernel here, ms", "its ratio"]),
             "", "The last two columns: the same target with its panels run by the AVX512_BF16 kernel (the kernel "
             "of CPUs without AMX) on this machine, where it is AMX; not a measurement of the other CPU kind.",
             "", "Draft forward of 1 token after 200 tokens of context (same run, alternating with the target):", "",
             md([[d, x["scheme"], x.get("path", "modules"), f"{x['ms']:.1f}", f"{x['ratio']:.3f}",
                  f"{x['weight_bytes'] / 1e6:.0f}", f(x.get("gb_per_s"), 1), f(x.get("linear_ms"), 1),
                  f(x.get("linear_gb_per_s", x.get("gb_per_s") if x.get("linear_ms") else None), 1),
                  f(x.get("outside_ms"), 1)]
                 for d, x in facts.items() if d != "target"],
                ["draft", "scheme", "path", "ms", "/ target(1)", "weights MB", "GB/s (whole forward)", "in linears ms",
                 "GB/s (linears)", "outside linears ms"]),
             "", "Path: fused = one C call per decoder layer (models/fused.py); modules = transformers' modules with "
             "the quantized linear layers, timed inside / outside them with hooks."
             + (f" The machine streams {facts['target']['stream_gb_per_s']:.1f} GB/s (a 1 GiB sum, all threads)."
                if facts["target"].get("stream_gb_per_s") else "")]
    if sweep is not None:
        lines += ["", f"k sweep ({meta['sweep']}); the k with the most tokens/s per draft and method (mean over "
                  "the tasks) is kept:", "",
                  md([[r["task"], r["draft"], r["row"], f"{r['tokens_per_s']:.2f}", f(r["tau"]), f(r["vs_ar"])]
                      for _, r in sweep.iterrows()], ["task", "draft", "method", "tokens/s", "tau", "vs ar"]),
                  "", md([[r["draft"], r["method"], int(r["k"]), f"{r['tokens_per_s']:.2f}"] for _, r in chosen.iterrows()],
                         ["draft", "method", "chosen k", "mean tokens/s"])]
    if budget is not None:
        lines += ["", f"At the task budgets ({meta['budget']}):", "", rows_md(budget)]
    if llama:
        lines += ["", f"Beside llama.cpp's speculative decoding of the same GGUF pair (Q4_K_M), GSM8K, interleaved "
                  f"prompt by prompt, max_new_tokens={llama['max_new_tokens']}: {llama['ours']} "
                  f"{llama['ours_tps']:.2f} tokens/s, {llama['llama']} {llama['llama_tps']:.2f} tokens/s, ratio "
                  f"{llama['ratio']:.2f} [{llama['lo']:.2f}, {llama['hi']:.2f}], n = {llama['n']}."]
    elif meta.get("llama_skipped"):
        lines += ["", f"llama.cpp row skipped: {meta['llama_skipped']}."]
    if lookup is not None:
        lines += ["", f"Prompt lookup (no draft model) ({meta['lookup']}):", "", rows_md(lookup)]
    lines += ["", "Goals (issue 23), from this run:", "",
              md([(g, f(v), "yes" if ok else "no", why) for g, v, ok, why in goals], ["goal", "measured", "met", "limited by"])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft.md").write_text(text := "\n".join(lines) + "\n")
    js = lambda df: None if df is None else json.loads(df.to_json(orient="records"))  # noqa: E731
    (out / "draft.json").write_text(json.dumps({"meta": meta, "target_ms": target, "drafts": facts, "sweep": js(sweep),
                                                "chosen_k": js(chosen), "budget": js(budget), "vs_llama": llama,
                                                "lookup": js(lookup), "goals": goals}, indent=2, default=str))
    return text


def render(path: Path, out: Path) -> str:
    """draft.md again from a saved draft.json (no decoding): the tables and goals of that run."""
    data = json.loads(Path(path).read_text())
    df = lambda rows: None if rows is None else pd.DataFrame(rows)  # noqa: E731
    target = {int(n): v for n, v in data["target_ms"].items()}
    facts = data["drafts"]
    facts["target"]["outside_ms"] = {int(n): v for n, v in facts["target"].get("outside_ms", {}).items()}
    budget, chosen, sweep, lookup = (df(data[k]) for k in ("budget", "chosen_k", "sweep", "lookup"))
    for frame in (budget, sweep, lookup, chosen):
        if frame is not None and "k" in frame:
            frame["k"] = frame["k"].astype("Int64")
    goals = check_goals(target, facts, budget if budget is not None else pd.DataFrame(columns=["task", "draft"]),
                        data["vs_llama"], facts["target"]["kernel"])
    return write(out, data["meta"], target, facts, sweep, chosen, budget, data["vs_llama"], lookup, goals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafts", default="int8,q8,q4,q4+v32768", help="draft settings: int8 | q8 | q4 | none, +v<N>")
    ap.add_argument("--ks", default="4,6,8,10", help="k of the sweep")
    ap.add_argument("--sweep-limit", type=int, default=2, help="prompts per task in the sweep (0: no sweep, k=--k)")
    ap.add_argument("--sweep-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8, help="k of sd and mars without a sweep")
    ap.add_argument("--limit", type=int, default=4, help="prompts per task at the task budgets (0: skip)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="instead of the task budgets")
    ap.add_argument("--before-tasks", default="gsm8k", help="tasks of the int8 draft's rows at the budgets")
    ap.add_argument("--lookup-limit", type=int, default=3, help="prompts per task of the lookup rows (0: skip)")
    ap.add_argument("--lookup-tokens", type=int, default=128)
    ap.add_argument("--llama-limit", type=int, default=4, help="GSM8K prompts beside llama.cpp (0: skip)")
    ap.add_argument("--llama-k", type=int, default=6)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"))
    ap.add_argument("--runs", default=str(ROOT / "results" / "bench_runs" / "draft"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--render", default=None, help="only rewrite draft.md (into --out) from this saved draft.json")
    args = ap.parse_args()
    if args.render:
        print(render(Path(args.render), Path(args.out)))
        return
    torch.set_num_threads(args.threads)
    data_dir = os.environ.get("MARS_BENCH_DATA_DIR")
    drafts = args.drafts.split(",")
    meta = {"machine": machine_label(machine()), "drafts": drafts, "threads": args.threads, "torch": torch.__version__}
    print("draft and target forward costs...", file=sys.stderr, flush=True)
    target, facts = costs(drafts, args.reps, args.rounds)
    kernel = facts["target"]["kernel"]
    runs = B.fresh_runs_dir(Path(args.runs))
    sweep = chosen = None
    ks = [int(k) for k in args.ks.split(",")]
    if args.sweep_limit:
        meta["sweep"] = (f"{args.sweep_limit} prompt{'s' if args.sweep_limit > 1 else ''} per task of "
                         f"{', '.join(BUDGET_TASKS)}, {args.sweep_tokens} new tokens")
        sweep = pd.concat([runner_rows(runs / "sweep", d, BUDGET_TASKS, entries(ks, ks), [
            f"limit={args.sweep_limit}", f"max_new_tokens={args.sweep_tokens}"], args.threads) for d in drafts],
            ignore_index=True)
        chosen = best_k(sweep)
    k_of = lambda d, m: args.k if chosen is None else int(chosen[(chosen["draft"] == d) & (chosen["method"] == m)]["k"].iloc[0])  # noqa: E731
    fastest = min((d for d in drafts if d != "int8"), key=lambda d: facts[d]["ms"], default=drafts[0])
    if chosen is not None:   # the fastest draft is the one whose best method decodes fastest in the sweep
        fastest = chosen.loc[chosen["tokens_per_s"].idxmax(), "draft"]
    meta["fastest_draft"] = fastest
    budget = None
    if args.limit:
        meta["budget"] = (f"{args.limit} prompts per task (int8: {args.before_tasks}), "
                          + (f"max_new_tokens={args.max_new_tokens}" if args.max_new_tokens else "each task's max_new_tokens"))
        extra = [f"limit={args.limit}"] + ([f"max_new_tokens={args.max_new_tokens}"] if args.max_new_tokens else [])
        parts = []
        for d in dict.fromkeys(["int8", fastest]) if "int8" in drafts else [fastest]:
            theta1 = [["method=mars", f"method.k={k_of(d, 'mars')}", "rule.theta=1.0"]] if d == fastest else []
            tasks = BUDGET_TASKS if d == fastest else args.before_tasks.split(",")
            parts.append(runner_rows(runs / "budget", d, tasks, entries([k_of(d, "sd")], [k_of(d, "mars")], theta1),
                                     extra, args.threads))
        budget = pd.concat(parts, ignore_index=True)
    llama = None
    why = "--llama-limit 0" if not args.llama_limit else llama_probe()
    if why:
        meta["llama_skipped"] = why
    else:
        print("our mars beside llama.cpp speculative...", file=sys.stderr, flush=True)
        llama = vs_llama(fastest, k_of(fastest, "mars"), args.llama_k, args.llama_limit,
                         args.max_new_tokens or 512, data_dir, args.threads)
    lookup = None
    if args.lookup_limit:
        meta["lookup"] = (f"{args.lookup_limit} prompt{'s' if args.lookup_limit > 1 else ''} per task, "
                          f"{args.lookup_tokens} new tokens, sd with the {fastest} draft")
        lookup = runner_rows(runs / "lookup", fastest, LOOKUP_TASKS,
                             entries([k_of(fastest, "sd")], [], [["method=lookup"]]),
                             [f"limit={args.lookup_limit}", f"max_new_tokens={args.lookup_tokens}"], args.threads)
    goals = check_goals(target, facts, budget if budget is not None else pd.DataFrame(columns=["task", "draft"]),
                        llama, kernel)
    print(write(Path(args.out), meta, target, facts, sweep, chosen, budget, llama, lookup, goals))


if __name__ == "__main__":
    main()
