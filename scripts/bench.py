"""`make bench`: speed of every decoding path on the embedded default pair, in one table.

Our rows (ar, sd, mars theta 0.9 and 1, adaptive-length sd, sd_tree, prompt lookup) are the runner's:
`mars-bench +compare=bench task=gsm8k|humaneval` (conf/compare/bench.yaml), interleaved sample by sample,
records and summary.json (speedup vs ar, its CI) under --runs (cleared first), read with `load_frames`.
Decoded here, interleaved prompt by prompt with our ar (fp32 plain and panel paths) on the same prompts so
each ratio is to an ar measured beside it: transformers `generate` and assisted generation (the default's
quantized draft as `assistant_model`) on the fp32 target, llama.cpp on the same Q4_K_M GGUF files, ar and speculative
(optional extra `llamacpp`). Also: forward cost of n tokens (target per path, and the draft), the share
of the decoding loop's wall time (prefill excluded) outside forwards, and the peak RSS of each configuration
in a fresh process that loads it as `make run` does and decodes one prompt with ar, sd and mars. Writes
results/bench/bench.{md,csv,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mars_bench import stats as S  # noqa: E402
from mars_bench.decode import DecodeConfig, Method, generate  # noqa: E402
from mars_bench.models import fastpath, llamacpp, panel  # noqa: E402
from mars_bench.models.pairs import eos_ids  # noqa: E402
from mars_bench.records import (SPEEDUP_DEFINITION, TAU_DEFINITION, machine, machine_label,  # noqa: E402
                                outside_forward_share)

TASKS = ("gsm8k", "humaneval")
REF_AR = "ar (fp32 panel)"            # the reference block's ratios are to this row
OURS, REFS = "ours (runner)", "references"
RSS_GOAL_GB = 15.4 / 2                # issue 14: half of make run's 15.4 GB peak before the bf16 path
SD_K, MARS_K = 6, 8                   # conf/compare/bench.yaml's k (the memory probe decodes with them)
RUNS_MARK = ".bench-runs"             # a runs folder this script made (and may clear)
PRECISION = {"fp32": "fp32", "bf16": "bf16 weights, fp32 activations", "Q4_K_M": "Q4_K_M blocks (llama.cpp)"}
COLUMNS = ["task", "block", "row", "precision", "tokens_per_s", "tau", "vs_ar", "vs_ar_lo", "vs_ar_hi",
           "identical_to_ar", "n", "outside_forward_share"]


# ---- our rows: the runner -------------------------------------------------------------------------------
def fresh_runs_dir(path: Path) -> Path:
    """``path`` empty and marked as ours (a folder this script made is cleared; another is refused)."""
    path = Path(path)
    if path.exists():
        if not (path / RUNS_MARK).exists() and any(path.iterdir()):
            raise SystemExit(f"{path} holds files this script did not write; choose another --runs folder")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / RUNS_MARK).touch()
    return path


def run_compare(compare: str, task: str, runs_dir: Path, overrides=(), threads: int | None = None,
                quiet: bool = False) -> None:
    """One runner invocation: `mars-bench +compare=<compare> task=<task> <overrides>` into ``runs_dir``."""
    cmd = [sys.executable, "-m", "mars_bench.run", f"+compare={compare}", f"task={task}",
           f"results_dir={runs_dir}", *overrides]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    print("+ mars-bench " + " ".join(cmd[3:]), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=quiet, text=True)
    if proc.returncode:
        tail = (proc.stderr or "").strip().splitlines()[-5:] if quiet else []
        raise SystemExit(f"mars-bench +compare={compare} task={task} failed (exit {proc.returncode})"
                         + ("".join(f"\n  {x}" for x in tail)))


def our_rows(runs_dir) -> pd.DataFrame:
    """The runner's runs under ``runs_dir`` as table rows: summary.json's tokens/s, tau, speedup vs ar and its
    CI, outputs identical to ar's, share of the loop's wall time outside forwards (``load_frames``, nothing
    recomputed)."""
    from mars_bench.report.frames import load_frames

    runs = load_frames([runs_dir]).runs
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    dtype = [(spec.model or {}).get("dtype") or "dtype unknown" for spec in runs["spec"]]   # run.json's
    same = (runs["pct_identical"].astype(float) * runs["n_compared"].astype(float) / 100).round()
    out = pd.DataFrame({
        "task": runs["task"], "block": [f"{OURS}, {d}" for d in dtype], "row": runs["label"],
        "precision": [PRECISION.get(d, d) for d in dtype], "tokens_per_s": runs["tokens_per_s"], "tau": runs["tau"],
        "vs_ar": runs["speedup"], "vs_ar_lo": runs["speedup_lo"], "vs_ar_hi": runs["speedup_hi"],
        "identical_to_ar": same.where(runs["method"] != "ar", runs["n"]), "n": runs["n"],
        "outside_forward_share": runs["outside_forward_share"], "theta": runs["theta"], "relaxed": runs["relaxed"],
        "method": runs["method"], "k": runs["k"]})   # run.json's: what ran, never parsed from a label
    return out.astype({"identical_to_ar": "Int64", "n": "Int64"})


# ---- reference rows: decoded here, interleaved with our ar --------------------------------------------
def fast_available() -> bool:
    return panel.library() is not None or fastpath.available()


def load(dtype: str):
    """The embedded default pair at ``dtype`` on the fast path, and its draft quantization."""
    from hydra import compose, initialize_config_dir

    from mars_bench import config as C
    from mars_bench.models.pairs import load_pair

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model.fast_path={'on' if fast_available() else 'off'}",
                                                      f"model.dtype={dtype}"])
    return load_pair(cfg.model), cfg.model.draft_quant


def gguf_paths():
    from mars_bench.models.embedded import DRAFT, TARGET, default_cache_dir

    return [default_cache_dir() / "gguf" / f"{n}.gguf" for n in (TARGET, DRAFT)]


def prompts(encode, limit: int, data_dir) -> list[tuple[str, str, list[int]]]:
    """(task, sample id, prompt ids) of the samples the runner decodes (the first ``limit`` of each task);
    ``encode``: chat messages -> ids (``Pair.prompt_ids``)."""
    from mars_bench.tasks import build_messages, get_task

    tasks = [get_task(name) for name in TASKS]
    return [(t.name, s.id, encode(build_messages(t, s, [], 0))) for t in tasks for s in t.load(data_dir, limit=limit)]


def set_path(pair, fast: bool, draft=None):
    for a in (pair.target, draft or pair.draft):
        a.packing = fast   # packing=False makes expect() unpack: the plain path (fp32 panels only)
        a.expect(1)


def ours_ar(pair, fast, cfg):
    def run(ids):
        set_path(pair, fast)
        r = generate(pair.target, pair.draft, pair.tokenizer, ids, Method("ar"), cfg)
        return {"tokens": r.tokens, "wall_s": r.wall_s, "steps": r.steps, "forward_s": r.target_s + r.draft_s,
                "prefill_s": r.prefill_s}
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


def measure(rows: dict, items) -> dict:
    """Interleaved: for each prompt, every row once, the row order rotated by one per prompt (no row always
    runs first or always follows the same row). -> {row: [per-prompt dicts with task and id]}"""
    out = {name: [] for name in rows}
    names = list(rows)
    for i, (task, pid, ids) in enumerate(items):
        for name in names[i % len(names):] + names[: i % len(names)]:
            out[name].append(rows[name](ids) | {"task": task, "id": pid})
        print(f"  references: prompt {i + 1}/{len(items)} done", file=sys.stderr, flush=True)
    return out


def reference_rows(raw: dict, settings: S.StatsSettings | None = None) -> pd.DataFrame:
    """Per task, each reference row's tokens/s and ratio to REF_AR on the same prompts, with their paired
    bootstrap CIs (mars_bench.stats, as summary.json computes them), and its prompts with the tokens of the
    ar of its precision (llama.cpp ar for llama.cpp rows, else REF_AR)."""
    settings = settings or S.StatsSettings()
    out = []
    for task in dict.fromkeys(r["task"] for rs in raw.values() for r in rs):
        by = {name: [r for r in rs if r["task"] == task] for name, rs in raw.items()}
        base = by[REF_AR]
        for name, rs in by.items():
            prec = "Q4_K_M" if name.startswith("llama.cpp") else "fp32"
            ref = by.get("llama.cpp ar (Q4_K_M)", []) if prec == "Q4_K_M" else base
            col = lambda key, rows=rs: [r[key] for r in rows]  # noqa: E731
            tokens = [len(t) for t in col("tokens")]
            steps, fwd = col("steps"), col("forward_s")
            up = S.speedup_ci(tokens, col("wall_s"), [len(r["tokens"]) for r in base], [r["wall_s"] for r in base],
                              settings)
            out.append({"task": task, "block": REFS, "row": name, "precision": PRECISION[prec],
                        "tokens_per_s": S.ratio_ci(tokens, col("wall_s"), settings)["value"],
                        "tau": S.ratio_ci(tokens, steps, settings)["value"] if None not in steps else None,
                        "vs_ar": up["value"], "vs_ar_lo": up["lo"], "vs_ar_hi": up["hi"],
                        "identical_to_ar": sum(a["tokens"] == b["tokens"] for a, b in zip(rs, ref)), "n": len(rs),
                        "outside_forward_share": None if None in fwd else
                        outside_forward_share(sum(col("wall_s")), sum(col("prefill_s")), sum(fwd))})
    return pd.DataFrame(out, columns=COLUMNS)


def table_of(ours: pd.DataFrame, refs: pd.DataFrame) -> pd.DataFrame:
    """The combined table: per task, our rows (runner) then the references."""
    table = pd.concat([df for df in (ours, refs) if not df.empty] or [ours], ignore_index=True)
    return table.sort_values("task", key=lambda t: t.map(TASKS.index), kind="stable", ignore_index=True)


# ---- forward costs, memory -----------------------------------------------------------------------------
def forward_costs(paths: dict, ns, ctx=200, reps=3, rounds=2):
    """ms of one forward scoring n new tokens after a ctx-token prefix, n in ``ns``, per path (name ->
    (adapter, packing) or a llama.cpp runner); the paths alternate per n, so all see the same machine
    state; best of ``reps`` in each of ``rounds`` passes over n."""
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
        ids = prompts(lambda m: tok.apply_chat_template(m, add_generation_prompt=True, return_dict=False), 1,
                      data_dir)[0][2]
        for name, spec in (("ar", False), ("sd", True)):
            runner.run(ids, max_new_tokens, (tok.eos_token_id,), speculative=spec)
            out[name] = peak()
        return out
    pair, _ = load(dtype)
    out["load"] = peak()
    ids = prompts(pair.prompt_ids, 1, data_dir)[0][2]
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, eos_ids=(pair.tokenizer.eos_token_id,))
    for name, m in (("ar", Method("ar")), ("sd", Method("sd", k=SD_K)),
                    ("mars", Method("mars", k=MARS_K, rule="mars", rule_kwargs={"theta": 0.9}))):
        set_path(pair, True)
        generate(pair.target, pair.draft, pair.tokenizer, ids, m, cfg)
        out[name] = peak()
    out["fast_kernel"] = fastpath.kind(pair.target.model)
    return out


def peak_rss(configs, max_new_tokens, threads) -> dict:
    """{config: {phase: peak GB}}, each config in its own process (a peak is per process)."""
    res = {}
    for c in configs:
        print(f"peak RSS of {c} (fresh process)...", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, "--rss-probe", c, "--max-new-tokens", str(max_new_tokens),
                               "--threads", str(threads)], capture_output=True, text=True)
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        res[c] = {"error": f"the {c} probe failed: {last}"} if proc.returncode else \
            json.loads(proc.stdout.strip().splitlines()[-1])
        print(res[c].get("error", f"  {res[c]}"), file=sys.stderr)
    return res


# ---- goals and output -----------------------------------------------------------------------------------
def check_goals(table: pd.DataFrame, costs: dict, rss: dict) -> list[tuple[str, float, bool]]:
    """Issues 3 and 14's goals, each as (goal, measured value, met?), from this run's numbers; a goal whose
    rows or forward sizes were not measured is left out. Ratios only within a block (measured side by side)."""
    out = []
    b, f = costs.get("bf16", {}), costs.get("fp32 panel", {})
    if {1, 8} <= set(b) and {1, 8} <= set(f):
        out += [("bf16: target forward(1) >= 1.8x faster than the fp32 panel path", f[1] / b[1], f[1] / b[1] >= 1.8),
                ("bf16: target forward(8) / forward(1) <= 1.2", b[8] / b[1], b[8] / b[1] <= 1.2)]
    if {1, 8} <= set(f):
        out.append(("fp32 panel: target forward(8) / forward(1) <= 1.3", f[8] / f[1], f[8] / f[1] <= 1.3))
    if "load" in rss.get("bf16", {}):
        peak = max(v for v in rss["bf16"].values() if isinstance(v, float))
        out.append((f"peak RSS of the bf16 default (load + ar, sd, mars) <= {RSS_GOAL_GB:.1f} GB", peak,
                    peak <= RSS_GOAL_GB))
    for (task, block), g in table.groupby(["task", "block"], sort=False):
        rows = {r["row"]: r for _, r in g.iterrows()}
        tps = lambda n: rows[n]["tokens_per_s"]  # noqa: E731
        if block.startswith(OURS):
            for n, r in rows.items():   # greedy, lossless (mars at theta 1 too): the tokens of ar
                if n != "ar" and (not r["relaxed"] or r["theta"] == 1.0):
                    out.append((f"{task}, {block}: {n}, samples identical to ar, of {r['n']}", r["identical_to_ar"],
                                r["identical_to_ar"] == r["n"]))
            sd, mars = (next((n for n in rows if n.startswith(p)), None) for p in ("sd k=", "mars θ=0.9"))
            if sd:
                out.append((f"{task}, {block}: {sd} >= 1.3x ar", rows[sd]["vs_ar"], rows[sd]["vs_ar"] >= 1.3))
            if sd and mars:
                out.append((f"{task}, {block}: {mars} >= 1.15x {sd}, with a higher tau", tps(mars) / tps(sd),
                            tps(mars) / tps(sd) >= 1.15 and rows[mars]["tau"] > rows[sd]["tau"]))
        elif "transformers generate (fp32)" in rows:
            hf_gen = tps("transformers generate (fp32)")
            if "ar (fp32 plain)" in rows:
                r = tps("ar (fp32 plain)") / hf_gen
                out.append((f"{task}: ar (fp32 plain) within 5% of transformers generate", r, abs(r - 1) <= 0.05))
            r = tps(REF_AR) / hf_gen
            out.append((f"{task}: {REF_AR} faster than transformers generate", r, r > 1))
    if table["outside_forward_share"].notna().any():
        worst = float(table["outside_forward_share"].max())
        out.append(("time outside model forwards <= 5% for every row of ours (worst row)", worst, worst <= 0.05))
    return out


def write(out: Path, table: pd.DataFrame, goals, costs: dict, rss: dict, meta: dict) -> str:
    """bench.md (the table, goals, memory, forward costs), bench.csv, bench.json."""
    f = lambda x, p=2: "-" if x is None or pd.isna(x) else f"{x:.{p}f}"  # noqa: E731
    md = lambda df, cols=None: pd.DataFrame(df, columns=cols).to_markdown(  # noqa: E731
        index=False, disable_numparse=True)
    pair_cells = lambda fmt, a, b: [  # noqa: E731
        fmt(x, y) if not pd.isna(x) else "-" for x, y in zip(table[a], table[b])]
    shown = pd.DataFrame({
        "task": table["task"], "rows": table["block"], "method": table["row"], "target precision": table["precision"],
        "tokens/s": table["tokens_per_s"].map(f), "tau": table["tau"].map(f), "vs ar": table["vs_ar"].map(f),
        "95% CI": pair_cells(lambda lo, hi: f"{f(lo)}-{f(hi)}", "vs_ar_lo", "vs_ar_hi"),
        "identical to ar": pair_cells(lambda a, n: f"{a}/{n}", "identical_to_ar", "n"),
        "outside forwards": [f(x * 100, 1) + "%" if not pd.isna(x) else "-" for x in table["outside_forward_share"]]})
    kernels = ", ".join(f"{k}: {v}" for k, v in (meta.get("kernels") or {}).items())
    lines = [f"# Embedded default pair ({meta.get('draft_quant')} draft, CPU {os.cpu_count()} cores), greedy", "",
             f"Machine: {meta.get('machine', 'unrecorded')}.", "",
             f"{meta.get('prompts_per_task')} prompts per task, max_new_tokens={meta.get('max_new_tokens')}. Kernels: "
             f"{kernels}. `{OURS}` rows: `mars-bench +compare=bench` (conf/compare/bench.yaml), the methods "
             f"interleaved, ratios to their ar from summary.json (runs: `{meta.get('runs')}`). `{REFS}` rows: "
             f"decoded interleaved here on the same prompts, ratios to `{REF_AR}`. Compare ratios only within a "
             f"block. {TAU_DEFINITION}. vs ar: {SPEEDUP_DEFINITION}; 95% CI: paired bootstrap over prompts. "
             "outside forwards: share of the decoding loop's wall time (prefill excluded) outside target and "
             "draft forwards.",
             *([f"\nllama.cpp rows skipped: {meta['llama_cpp_skipped']}."] if meta.get("llama_cpp_skipped") else []),
             "", md(shown), "", "Goals (issues 3 and 14), from this run:", "",
             md([(g, f(v), "yes" if ok else "no") for g, v, ok in goals], ["goal", "measured", "met"]), "",
             "Peak resident memory (VmHWM, GB) of a fresh process per configuration, after loading the pair as "
             "`make run` does and after decoding one prompt with each method in turn:", "",
             md([[c, r["error"]] + ["-"] * 4 if "error" in r else [c, r.get("fast_kernel", "llama.cpp")]
                 + [f(r.get(k)) for k in ("load", "ar", "sd", "mars")] for c, r in rss.items()],
                ["configuration", "kernel", "after load", "ar", "sd", "mars"])]
    if costs:
        ns = list(next(iter(costs.values())))
        lines += ["", f"Forward cost of n new tokens after 200 tokens of context, ms (ratio to n={ns[0]}):", "",
                  md([[n] + [f"{c[n]:.0f} ({c[n] / c[ns[0]]:.2f})" for c in costs.values()] for n in ns],
                     ["n", *costs])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text := "\n".join(lines) + "\n")
    table.to_csv(out / "bench.csv", index=False)
    (out / "bench.json").write_text(json.dumps({"meta": meta, "table": json.loads(table.to_json(orient="records")),
                                                "forward_ms": costs, "goals": goals, "peak_rss_gb": rss},
                                               indent=2, default=str))
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=5, help="prompts per task (GSM8K, HumanEval)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtypes", default=None, help="target dtypes of our rows, one runner invocation per task each "
                    "(default: bf16 where the bf16 kernel runs, else fp32; e.g. bf16,fp32)")
    ap.add_argument("--llama-k", type=int, default=6, help="draft tokens per step of llama.cpp speculative")
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp rows")
    ap.add_argument("--cost-n", default=",".join(map(str, range(1, 17))), help="n of the forward-cost table (1 first)")
    ap.add_argument("--cost-rounds", type=int, default=2, help="passes over n in the forward-cost table")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"))
    ap.add_argument("--runs", default=str(ROOT / "results" / "bench_runs" / "decode"),
                    help="where the runner writes our rows (cleared first)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rss-probe", default=None, help=argparse.SUPPRESS)   # internal: one peak-RSS measurement
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = os.environ.get("MARS_BENCH_DATA_DIR")   # None: the tasks' own lookup (tasks/data.py)
    if args.rss_probe:
        print(json.dumps(rss_probe(args.rss_probe, min(args.max_new_tokens, 32), data_dir)))
        return
    bf16 = panel.bf16_available()
    if not bf16:
        print(f"bf16 rows skipped: no bf16 panel kernel ({panel.unavailable() or 'CPU lacks AVX512_BF16'})",
              file=sys.stderr)
    dtypes = args.dtypes.split(",") if args.dtypes else ["bf16" if bf16 else "fp32"]
    why_no_llama = ("--no-llama" if args.no_llama else llamacpp.unavailable()
                    or next((f"{p} missing" for p in gguf_paths() if not p.exists()), None))
    rss = peak_rss(["fp32"] + (["bf16"] if bf16 else []) + ([] if why_no_llama else ["llamacpp"]),
                   args.max_new_tokens, args.threads)
    if "error" in rss.get("llamacpp", {}):   # e.g. a build whose kernels crash on this CPU: keep the rest
        why_no_llama = rss["llamacpp"]["error"]
    if why_no_llama:
        print(f"llama.cpp rows skipped: {why_no_llama}", file=sys.stderr)

    runs = fresh_runs_dir(Path(args.runs))   # our rows first, in their own processes (one pair in memory)
    for dtype in dtypes:
        for task in TASKS:
            run_compare("bench", task, runs, [f"limit={args.limit}", f"max_new_tokens={args.max_new_tokens}",
                                              f"model.dtype={dtype}", "progress=false"], args.threads)

    pair, quant = load("fp32")
    pair16 = load("bf16")[0] if bf16 else None
    eos = eos_ids(pair.target.model, pair.tokenizer)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_ids=tuple(eos))
    runner = None
    if not why_no_llama:
        target_gguf, draft_gguf = gguf_paths()
        runner = llamacpp.LlamaCppRunner(str(target_gguf), str(draft_gguf), k=args.llama_k, threads=args.threads,
                                         eos_ids=eos)
    print("forward cost of n tokens...", file=sys.stderr)
    paths = {"fp32 plain": (pair.target, False), "fp32 panel": (pair.target, True)}
    if pair16 is not None:
        paths["bf16"] = (pair16.target, True)
    if runner is not None:
        paths["llama.cpp Q4_K_M"] = runner
    paths[f"draft ({quant}, {'bf16' if pair16 else 'fp32'})"] = ((pair16 or pair).draft, True)   # the default's
    costs = forward_costs(paths, [int(n) for n in args.cost_n.split(",")], rounds=args.cost_rounds)

    dq = f", {quant} draft" if quant != "none" else ""
    rows = {"ar (fp32 plain)": ours_ar(pair, False, cfg), REF_AR: ours_ar(pair, fast_available(), cfg),
            "transformers generate (fp32)": hf(pair, cfg),
            f"transformers assisted (fp32{dq})": hf(pair, cfg, pair.draft)}
    if runner is not None:
        rows["llama.cpp ar (Q4_K_M)"] = llama(runner, cfg, False)
        rows[f"llama.cpp speculative k={args.llama_k} (Q4_K_M, Q4_K_M draft)"] = llama(runner, cfg, True, args.llama_k)
    print("references, interleaved with our ar...", file=sys.stderr)
    refs = reference_rows(measure(rows, prompts(pair.prompt_ids, args.limit, data_dir)))
    table = table_of(our_rows(runs), refs)
    kernels = {"fp32 target": fastpath.kind(pair.target.model)}
    if pair16 is not None:
        kernels["bf16 target"] = fastpath.kind(pair16.target.model)
    meta = {"prompts_per_task": args.limit, "max_new_tokens": args.max_new_tokens, "dtypes": dtypes,
            "draft_quant": quant, "kernels": kernels, "llama_cpp_skipped": why_no_llama, "threads": args.threads,
            "runs": str(runs.relative_to(ROOT) if runs.is_relative_to(ROOT) else runs), "torch": torch.__version__,
            "machine": machine_label(machine())}
    print(write(Path(args.out), table, check_goals(table, costs, rss), costs, rss, meta))


if __name__ == "__main__":
    main()
