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
4. Prompt lookup (no draft model) against ar and sd on CNN/DM, HumanEval and WMT19 (runner).

Every decoded row is the runner's (``mars_bench.run.bench``): the methods interleaved sample by sample, order
rotated, speedups and CIs from summary.json. ``--model tiny``: the tiny random pair (a smoke run of this
script). Writes results/bench/draft.{md,json}.
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

from mars_bench.run import bench as B
from mars_bench.models import fastpath, fused, panel, quant
from mars_bench.models.pairs import load_draft
from mars_bench.store.metrics import SPEEDUP_DEFINITION, TAU_DEFINITION
from mars_bench.store.provenance import machine, machine_label

BUDGET_TASKS = ("gsm8k", "humaneval")
LOOKUP_TASKS = ("cnn_dm", "humaneval", "wmt19_zh_en")


# ---- 1. costs ---------------------------------------------------------------------------------------------
LINEARS = (quant.QuantLinear, fastpath.Int8Linear, fastpath.PackedLinear, panel.PanelLinear, torch.nn.Linear)


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
    ids = lambda start, count: [(start + j) % adapter.vocab for j in range(count)]  # noqa: E731
    adapter.forward(ids(1000, ctx), logits=False)
    walls, lins = [], []
    try:
        for i in range(reps):
            adapter.crop(ctx)
            spent[0] = 0.0
            t0 = time.perf_counter()
            adapter.forward(ids(2000 + i, n))
            walls.append(time.perf_counter() - t0)
            lins.append(spent[0])
    finally:
        for h in hooks:
            h.remove()
    return sorted(walls)[reps // 2] * 1e3, sorted(lins)[reps // 2] * 1e3


def bf16_kernel(target, amx: bool) -> None:
    """The target's bf16 panels run on AMX tiles or the AVX512_BF16 kernel (``panel.set_bf16_kernel``); fused
    layers call the kernels by address, so they are rebuilt."""
    panel.set_bf16_kernel(target.model, amx=amx)
    if target.fused is not None:
        target.fused = fused.FusedDecoder(target.model)


def costs(model: list[str], drafts: list[str], reps: int, rounds: int) -> tuple[dict, dict]:
    """({path: {n: ms}}, {draft: facts}): target n = 1, 5, 8 and each draft at n = 1, alternating. A draft with
    fused forwards (models/fused.py) is measured as it runs and, as "<draft> (modules)", through transformers'
    modules with linear-layer hooks (the split inside / outside the linear layers)."""
    pair, _ = B.load(model)
    adapters, facts = {}, {}
    for d in drafts:
        adapter, scheme = load_draft(B.model_cfg([*model, *B.draft_overrides(d)]), pair)
        adapters[d] = adapter
        facts[d] = {"scheme": scheme, "weight_bytes": B.weight_bytes(adapter.model),
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
    facts["target"] = {"weight_bytes": B.weight_bytes(pair.target.model), "kernel": fastpath.kind(pair.target.model),
                       "outside_ms": {}, "stream_gb_per_s": B.stream_rate()}
    facts["target"]["path"] = "fused" if pair.target.fused is not None else "modules"
    if facts["target"]["kernel"] == "panel-amx-bf16":   # the AVX512_BF16-only kind's kernel, run on this machine
        bf16_kernel(pair.target, amx=False)
        try:
            other = B.forward_costs({"target": (pair.target, True)}, [1, 5, 8], reps=reps, rounds=rounds)
        finally:
            bf16_kernel(pair.target, amx=True)
        facts["target"]["avx512_bf16_here_ms"] = other["target"]
    modules = pair.target.fork()            # the split needs the linears called from Python: the modules path
    modules.fused = None
    for n in (1, 5, 8):   # what grows with n: the linears (kernel) or the rest (row-wise attention, Python)
        wall, lin = linear_share(modules, n, reps=max(3, reps))
        facts["target"]["outside_ms"][n] = wall - lin
    return target["target"], facts


# ---- 2-3, 5. runner rows ----------------------------------------------------------------------------------
def entries(sd_k: list[int], mars_k: list[int], extra=()) -> str:
    rows = [["method=ar"]] + [["method=sd", f"method.k={k}"] for k in sd_k]
    rows += [["method=mars", f"method.k={k}", "rule.theta=0.9"] for k in mars_k] + [list(e) for e in extra]
    return "interleave=[" + ",".join("[" + ",".join(f'"{o}"' for o in r) + "]" for r in rows) + "]"


def runner_rows(runs: Path, draft: str, tasks, interleave: str, extra=(), threads=None) -> pd.DataFrame:
    """One runner invocation per task (``+compare=bench_draft`` with this draft setting and ``interleave``) into
    runs/<draft>, read back as rows (``mars_bench.run.bench.runner_rows``: method and k are run.json's)."""
    out = runs / draft.replace("+", "_")
    for task in tasks:
        B.run_compare("bench_draft", task, out, [*B.draft_overrides(draft), interleave, "progress=false", *extra],
                      threads)
    rows = B.runner_rows(out)
    rows["draft"] = draft
    return rows


def best_k(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per draft and method, the k with the most tokens/s summed over the sweep's tasks."""
    spec = sweep[sweep["method"].isin(["sd", "mars"])]
    tps = spec.groupby(["draft", "method", "k"])["tokens_per_s"].mean().reset_index()
    return tps.loc[tps.groupby(["draft", "method"])["tokens_per_s"].idxmax()].reset_index(drop=True)


# ---- output ---------------------------------------------------------------------------------------------------
def rows_md(df: pd.DataFrame) -> str:
    f = lambda x, p=2: "-" if x is None or pd.isna(x) else f"{x:.{p}f}"  # noqa: E731
    shown = pd.DataFrame({
        "task": df["task"], "draft": df["draft"], "method": df["row"], "n": df["n"],
        "tokens/s": df["tokens_per_s"].map(f), "tau": df["tau"].map(f),
        "vs ar [95% CI]": [f"{f(v)} [{f(lo)}, {f(hi)}]" for v, lo, hi in zip(df["vs_ar"], df["vs_ar_lo"], df["vs_ar_hi"])],
        "identical to ar": [f"{a}/{n}" for a, n in zip(df["identical_to_ar"], df["n"])]})
    return shown.to_markdown(index=False, disable_numparse=True)


def write(out: Path, meta: dict, target: dict, facts: dict, sweep, chosen, budget, lookup) -> str:
    f = lambda x, p=2: "-" if x is None or pd.isna(x) else f"{x:.{p}f}"  # noqa: E731
    here = {int(n): v for n, v in (facts["target"].get("avx512_bf16_here_ms") or {}).items()}
    md = lambda rows, cols: pd.DataFrame(rows, columns=cols).to_markdown(index=False, disable_numparse=True)  # noqa: E731
    lines = [f"# Draft cost and speed, {meta.get('pair', 'embedded pair (bf16 target)')}, greedy", "",
             f"Machine: {meta['machine']}. Target kernel: {facts['target']['kernel']} ({facts['target'].get('path', 'modules')} "
             f"forwards). {TAU_DEFINITION}. "
             f"vs ar: {SPEEDUP_DEFINITION}; 95% CI: paired bootstrap over prompts.", "",
             "Target forward of n new tokens after 200 tokens of context, ms (ratio to n = 1):", "",
             md([[n, f"{target[n]:.1f}", f"{target[n] / target[1]:.2f}",
                  f(facts["target"].get("outside_ms", {}).get(n), 1), f(here.get(n), 1),
                  f(here[n] / here[1] if here.get(n) and here.get(1) else None)] for n in (1, 5, 8)],
                ["n", "ms", "ratio", "outside linears ms (modules path)", "AVX512_BF16 kernel here, ms", "its ratio"]),
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
    if lookup is not None:
        lines += ["", f"Prompt lookup (no draft model) ({meta['lookup']}):", "", rows_md(lookup)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft.md").write_text(text := "\n".join(lines) + "\n")
    js = lambda df: None if df is None else json.loads(df.to_json(orient="records"))  # noqa: E731
    (out / "draft.json").write_text(json.dumps({"meta": meta, "target_ms": target, "drafts": facts, "sweep": js(sweep),
                                                "chosen_k": js(chosen), "budget": js(budget),
                                                "lookup": js(lookup)}, indent=2, default=str))
    return text


def render(path: Path, out: Path) -> str:
    """draft.md again from a saved draft.json (no decoding): the tables of that run."""
    data = json.loads(Path(path).read_text())
    df = lambda rows: None if rows is None else pd.DataFrame(rows)  # noqa: E731
    target = {int(n): v for n, v in data["target_ms"].items()}
    facts = data["drafts"]
    facts["target"]["outside_ms"] = {int(n): v for n, v in facts["target"].get("outside_ms", {}).items()}
    budget, chosen, sweep, lookup = (df(data[k]) for k in ("budget", "chosen_k", "sweep", "lookup"))
    for frame in (budget, sweep, lookup, chosen):
        if frame is not None and "k" in frame:
            frame["k"] = frame["k"].astype("Int64")
    return write(out, data["meta"], target, facts, sweep, chosen, budget, lookup)


def main(argv=None):
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
    ap.add_argument("--model", default=None, help="a conf/model entry instead of the embedded default (e.g. tiny)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--runs", default="results/bench_runs/draft", help="where the runner writes (cleared first)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--render", default=None, help="only rewrite draft.md (into --out) from this saved draft.json")
    args = ap.parse_args(argv)
    if args.render:
        print(render(Path(args.render), Path(args.out)))
        return
    torch.set_num_threads(args.threads)
    drafts = args.drafts.split(",")
    model = [f"model={args.model}"] if args.model else []
    meta = {"machine": machine_label(machine()), "drafts": drafts, "threads": args.threads, "torch": torch.__version__,
            **({"pair": f"{args.model} pair"} if args.model else {})}
    print("draft and target forward costs...", file=sys.stderr, flush=True)
    target, facts = costs(model, drafts, args.reps, args.rounds)
    runs = B.fresh_runs_dir(Path(args.runs))
    sweep = chosen = None
    ks = [int(k) for k in args.ks.split(",")]
    if args.sweep_limit:
        meta["sweep"] = (f"{args.sweep_limit} prompt{'s' if args.sweep_limit > 1 else ''} per task of "
                         f"{', '.join(BUDGET_TASKS)}, {args.sweep_tokens} new tokens")
        sweep = pd.concat([runner_rows(runs / "sweep", d, BUDGET_TASKS, entries(ks, ks), [
            *model, f"limit={args.sweep_limit}", f"max_new_tokens={args.sweep_tokens}"], args.threads) for d in drafts],
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
        extra = [*model, f"limit={args.limit}"] + ([f"max_new_tokens={args.max_new_tokens}"] if args.max_new_tokens else [])
        parts = []
        for d in dict.fromkeys(["int8", fastest]) if "int8" in drafts else [fastest]:
            theta1 = [["method=mars", f"method.k={k_of(d, 'mars')}", "rule.theta=1.0"]] if d == fastest else []
            tasks = BUDGET_TASKS if d == fastest else args.before_tasks.split(",")
            parts.append(runner_rows(runs / "budget", d, tasks, entries([k_of(d, "sd")], [k_of(d, "mars")], theta1),
                                     extra, args.threads))
        budget = pd.concat(parts, ignore_index=True)
    lookup = None
    if args.lookup_limit:
        meta["lookup"] = (f"{args.lookup_limit} prompt{'s' if args.lookup_limit > 1 else ''} per task, "
                          f"{args.lookup_tokens} new tokens, sd with the {fastest} draft")
        lookup = runner_rows(runs / "lookup", fastest, LOOKUP_TASKS,
                             entries([k_of(fastest, "sd")], [], [["method=lookup"]]),
                             [*model, f"limit={args.lookup_limit}", f"max_new_tokens={args.lookup_tokens}"], args.threads)
    print(write(Path(args.out), meta, target, facts, sweep, chosen, budget, lookup))


if __name__ == "__main__":
    main()
