"""`make bench`'s llama.cpp section (issue 52): our ar / sd / mars theta 0.9 against llama.cpp's ar and its own
speculative decoding of the same GGUF pair, on the same prompts, ratios with CIs from one run.

Per task (WMT19 zh-en, the authors' segments; GSM8K) one runner invocation, `mars-bench +compare=bench_llamacpp
task=<task> limit=<n> max_new_tokens=<budget> model.draft_quant=<draft>` (conf/compare/bench_llamacpp.yaml): the
native engine's ar, sd k 6 and mars k 8 theta 0.9 and engine=llamacpp's ar, sd k 6 and sd at llama.cpp's defaults
(k <= 16, p_min 0.75), decoded interleaved sample by sample (order rotated) into --runs (cleared first). Tokens/s
and tau are summary.json's; every ratio is paired on the samples both runs decoded (``bench.paired_ratio``:
tokens/s over tokens/s with its paired bootstrap CI, ``stats.speedup_ci``): each row over the native ar, over
llama.cpp's ar, and the headline rows (mars and sd over llama.cpp speculative). ``--model tiny``: the tiny pair
(llama.cpp reads it as F32 GGUF files; a smoke run of this script). Writes <out>/llamacpp.{md,json}.
Needs the binding: `bash .ci/llamacpp.sh` (docs/llamacpp.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from mars_bench.run import bench as B
from mars_bench.store.provenance import machine, machine_label

TASKS = {"wmt19_zh_en": ["subset=paper"], "gsm8k": []}
NATIVE_AR, LLAMA_AR = "ar", "ar (llama.cpp)"
LLAMA_SD, LLAMA_DEFAULTS = "sd k=6 (llama.cpp)", "sd k≤16 p_min=0.75 (llama.cpp)"
HEADLINES = (("mars k=8 θ=0.9", LLAMA_SD), ("mars k=8 θ=0.9", LLAMA_DEFAULTS), ("sd k=6", LLAMA_SD))


def row_name(spec) -> str:
    """A run's row: method, k, theta / p_min, and the engine when it is not ours."""
    name = spec.head + (f" k{'≤' if spec.p_min else '='}{spec.k}" if spec.k else "")
    name += f" θ={spec.settings['theta']:g}" if "theta" in spec.settings else ""
    name += f" p_min={spec.p_min:g}" if spec.p_min else ""
    return name + (f" ({'llama.cpp' if spec.engine == 'llamacpp' else spec.engine})" if spec.engine != "native" else "")


def table(runs_dir: Path) -> pd.DataFrame:
    """One row per run and task: tokens/s, tau, n, the samples with its engine's ar's tokens, the ratios to the
    native ar and to llama.cpp's ar with their CIs."""
    from mars_bench.report.frames import load_frames

    runs = load_frames([runs_dir]).runs
    rows = []
    for task, g in runs.groupby("task", sort=False):
        named = {row_name(r["spec"]): r for _, r in g.iterrows()}
        for name, r in named.items():
            row = {"task": task, "row": name, "engine": r["spec"].engine, "tokens_per_s": r["tokens_per_s"],
                   "tau": r["tau"], "n": int(r["n"])}
            for key, base in (("native_ar", NATIVE_AR), ("llama_ar", LLAMA_AR)):
                if base in named:
                    est = B.paired_ratio(r["dirs"], named[base]["dirs"])
                    row.update({f"vs_{key}": est["value"], f"vs_{key}_lo": est["lo"], f"vs_{key}_hi": est["hi"],
                                f"same_as_{key}": est["same_tokens"]})
            rows.append(row)
    return pd.DataFrame(rows)


def headlines(runs_dir: Path) -> pd.DataFrame:
    """The paired ratios the goal names (``HEADLINES``: a row over another, per task)."""
    from mars_bench.report.frames import load_frames

    runs = load_frames([runs_dir]).runs
    out = []
    for task, g in runs.groupby("task", sort=False):
        named = {row_name(r["spec"]): r for _, r in g.iterrows()}
        for a, b in HEADLINES:
            if a in named and b in named:
                est = B.paired_ratio(named[a]["dirs"], named[b]["dirs"])
                out.append({"task": task, "ratio": f"{a} / {b}", "value": est["value"], "lo": est["lo"],
                            "hi": est["hi"], "n": est["n"]})
    return pd.DataFrame(out)


def render(rows: pd.DataFrame, heads: pd.DataFrame, meta: dict) -> str:
    f = lambda x: "-" if x is None or pd.isna(x) else f"{x:.2f}"  # noqa: E731
    ci = lambda r, k: "-" if pd.isna(r.get(k, float("nan"))) else f"{f(r[k])} [{f(r[k + '_lo'])}, {f(r[k + '_hi'])}]"  # noqa: E731
    shown = pd.DataFrame([{
        "task": r["task"], "method": r["row"], "tokens/s": f(r["tokens_per_s"]), "tau": f(r["tau"]), "n": r["n"],
        "vs native ar [95% CI]": ci(r, "vs_native_ar"), "vs llama.cpp ar [95% CI]": ci(r, "vs_llama_ar"),
        "same tokens as its engine's ar": f"{int(r['same_as_llama_ar' if r['engine'] == 'llamacpp' else 'same_as_native_ar'])}"
                                          f"/{r['n']}" if not pd.isna(r.get("same_as_native_ar", float("nan"))) else "-",
    } for _, r in rows.iterrows()])
    lines = [f"# Beside llama.cpp ({meta['pair']}), greedy", "",
             f"Machine: {meta['machine']}; llama-cpp-python {meta['llamacpp']}; commit {meta['commit']}.", "",
             f"Samples: {meta['samples']}; max_new_tokens={meta['max_new_tokens']}; native draft "
             f"{meta['draft_quant']}, llama.cpp's the draft GGUF as stored. Every method decoded interleaved sample by "
             "sample in one run per task; ratios are tokens/s over tokens/s paired on the same samples, with 95% "
             "paired bootstrap CIs.", "", shown.to_markdown(index=False, disable_numparse=True), ""]
    if len(heads):
        lines += ["| task | ratio | value [95% CI] | n |", "|---|---|---|---:|"]
        lines += [f"| {h['task']} | {h['ratio']} | {f(h['value'])} [{f(h['lo'])}, {f(h['hi'])}] | {h['n']} |"
                  for _, h in heads.iterrows()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wmt19", type=int, default=12, help="WMT19 segments (the authors' subset, first N)")
    p.add_argument("--gsm8k", type=int, default=8, help="GSM8K questions (first N)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--draft-quant", default="q4", help="the native draft (model.draft_quant): q4 as the study")
    p.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the runner (both engines)")
    p.add_argument("--runs", type=Path, default=Path("results/bench_llamacpp_runs"))
    p.add_argument("--out", type=Path, default=Path("results/bench"))
    a = p.parse_args(argv)
    from mars_bench.models import llamacpp

    why = llamacpp.unavailable()
    if why:
        raise SystemExit(f"bench_llamacpp: {why} (bash .ci/llamacpp.sh)")
    runs = B.fresh_runs_dir(a.runs)
    model = ["model=tiny"] if a.model == "tiny" else []
    limits = {"wmt19_zh_en": a.wmt19, "gsm8k": a.gsm8k}
    for task, extra in TASKS.items():
        if limits[task]:
            B.run_compare("bench_llamacpp", task, runs, [*model, *extra, f"limit={limits[task]}",
                                                           f"max_new_tokens={a.max_new_tokens}",
                                                           f"model.draft_quant={a.draft_quant}", "progress=false"],
                          threads=a.threads)
    rows, heads = table(runs), headlines(runs)
    from mars_bench.store.provenance import process_commit

    meta = {"pair": "tiny pair" if a.model == "tiny" else "embedded pair, Qwen2.5-Coder 0.5B -> 1.5B",
            "machine": machine_label(machine()), "llamacpp": llamacpp.version(), "commit": process_commit(),
            "samples": ", ".join(f"{t} {n}" for t, n in limits.items() if n), "max_new_tokens": a.max_new_tokens,
            "draft_quant": a.draft_quant}
    a.out.mkdir(parents=True, exist_ok=True)
    md = render(rows, heads, meta)
    (a.out / "llamacpp.md").write_text(md)
    (a.out / "llamacpp.json").write_text(json.dumps({"meta": meta, "rows": rows.to_dict("records"),
                                                     "headlines": heads.to_dict("records")}, indent=1, default=str))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
