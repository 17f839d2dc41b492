"""The serving benchmark's tables and figure (runs of ``engine=vllm engine.serve=true``, docs/vllm.md "Serving"): per
task, rule and concurrency (the run's batch_size: requests in flight) the output tokens per second of the server,
TTFT / TPOT / ITL percentiles, the acceptance per draft position (vLLM's per-request counts in the records, and its
``/metrics`` deltas in calls.jsonl), and the quality of the served outputs (the task's metrics, summary.json) beside
exact's (sd, rule exact) at the same concurrency, with how many outputs are token-identical to exact's.

Definitions (those of ``vllm bench serve``): TTFT = send to the first streamed token; ITL = the gaps between
successive token-bearing chunks (with speculative decoding a chunk holds one verification step's tokens); TPOT =
(latency - TTFT) / (output tokens - 1) per request; output tokens/s = output tokens / wall time of the calls (a call:
the samples sent together, ``batch_size`` in flight). Reads results files only.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from mars_bench.store.io import read_samples
from mars_bench.store.spec import RunSpec

PERCENTILES = (50, 90, 99)
KEYS = ("task", "model", "head", "theta", "concurrency")


def load(root) -> list[dict]:
    """Every served run under ``root``: its spec (run.json), records, summary and calls."""
    out = []
    for spec_path in sorted(Path(root).rglob("run.json")):
        try:
            spec = json.loads(spec_path.read_text())
        except (OSError, ValueError):    # load_frames names unreadable runs; here they are skipped
            continue
        d = spec_path.parent
        if not spec.get("serve") or not (d / "samples.jsonl").is_file():
            continue
        recs, _ = read_samples(d / "samples.jsonl")
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
        calls = [json.loads(x) for x in (d / "calls.jsonl").read_text().splitlines()] \
            if (d / "calls.jsonl").is_file() else []
        out.append({"spec": spec, "records": recs, "summary": summary, "calls": calls, "dir": d,
                    "task": d.parent.name, "model": d.parent.parent.name})
    return out


def _pct(values, p) -> float | None:
    return float(np.percentile(values, p)) * 1000 if len(values) else None   # ms


def positions(records, k: int) -> list[float | None]:
    """Per draft position i = 1..k: steps that accepted >= i drafts / steps that proposed >= i (all turns; also
    scripts/bench_vllm.py's)."""
    acc, prop = np.zeros(k), np.zeros(k)
    for r in records:
        for t in r["turns"]:
            for p, a in zip(t["proposed"], t["accepted"]):
                prop[:min(p, k)] += 1
                acc[:min(a, k)] += 1
    return [float(a / p) if p else None for a, p in zip(acc, prop)]


def _metric_positions(calls, k: int) -> list[float | None]:
    """vLLM's /metrics: accepted at position i / drafts (its own per-position rate)."""
    drafts = sum(c["metrics"]["num_drafts"] for c in calls)
    acc = [sum(c["metrics"]["accepted_per_pos"][i] for c in calls if i < len(c["metrics"]["accepted_per_pos"]))
           for i in range(k)]
    return [a / drafts if drafts else None for a in acc]


def _quality(summary: dict) -> dict:
    """The task's tested metrics (``metric_specs``) as summary.json holds them."""
    q = summary.get("quality") or {}
    return {k: q[k] for k in summary.get("metric_specs") or {} if isinstance(q.get(k), (int, float))}


def _vs_exact(summary: dict) -> dict:
    """Per tested metric, the paired delta against exact at the same concurrency (summary.json's
    ``stats.quality_vs_sd``, mars_bench/stats.py): delta, its 95% CI and p-value."""
    found = ((summary.get("stats") or {}).get("quality_vs_sd") or {})
    return {k: {x: v.get(x) for x in ("delta", "lo", "hi", "p_value", "n")} for k, v in found.items()
            if k in (summary.get("metric_specs") or {}) and isinstance(v, dict)}


def rows(runs: list[dict]) -> pd.DataFrame:
    """One row per served run (module doc)."""
    out = []
    for run in runs:
        s, recs = RunSpec.from_dict(run["spec"]), run["records"]
        turns = [t for r in recs for t in r["turns"]]
        k = int(s.k or 0)
        ref = s.lossless_reference()
        row = {"task": run["task"], "model": run["model"], "head": s.head, "rule": s.rule, "run": s.dir_name,
               "exact_run": ref.dir_name if ref else None,
               "settings": f"T {s.temperature:g}, top-p {s.top_p:g}, k {s.k}, max new tokens {s.max_new_tokens}",
               "theta": s.settings.get("theta"), "concurrency": s.batch_size, "n": len(recs),
               "tokens": int(sum(t["new_tokens"] for t in turns)),
               "wall_s": float(sum(c["wall_s"] for c in run["calls"])),
               "quality": _quality(run["summary"]), "quality_vs_exact": _vs_exact(run["summary"]),
               "dir": str(run["dir"]),
               "outputs": {r["id"]: [t["output_ids"] for t in r["turns"]] for r in recs}}
        row["tokens_per_s"] = row["tokens"] / row["wall_s"] if row["wall_s"] else None
        for name, values in (("ttft", [t["ttft_s"] for t in turns if t.get("ttft_s") is not None]),
                             ("tpot", [t["tpot_s"] for t in turns if t.get("tpot_s") is not None]),
                             ("itl", [x for t in turns for x in t.get("itl_s") or []])):
            for p in PERCENTILES:
                row[f"{name}_p{p}_ms"] = _pct(values, p)
        row["positions"] = positions(recs, k) if k else []
        row["positions_metrics"] = _metric_positions(run["calls"], k) if k and run["calls"] else []
        row["relaxed"] = int(sum(r["n_relaxed"] for r in recs))
        out.append(row)
    df = pd.DataFrame(out)
    if df.empty:
        return df
    df = df.sort_values(["task", "model", "settings", "concurrency", "rule"]).reset_index(drop=True)
    return _against_exact(df)


def _against_exact(df: pd.DataFrame) -> pd.DataFrame:
    """Per row: its exact run's (``RunSpec.lossless_reference``: the same settings and concurrency, rule exact) quality
    and tokens/s, and how many outputs are token-identical to it."""
    same, base_q, speed = [], [], []
    for _, row in df.iterrows():
        base = df[(df["task"] == row["task"]) & (df["model"] == row["model"]) & (df["run"] == row["exact_run"])]
        if base.empty:
            same.append(None), base_q.append(None), speed.append(None)
            continue
        b = base.iloc[0]
        ids = set(row["outputs"]) & set(b["outputs"])
        same.append(f"{sum(row['outputs'][i] == b['outputs'][i] for i in ids)}/{len(ids)}")
        base_q.append(b["quality"])
        speed.append(row["tokens_per_s"] / b["tokens_per_s"] if row["tokens_per_s"] and b["tokens_per_s"] else None)
    return df.assign(identical_to_exact=same, exact_quality=base_q, vs_exact=speed)


def _num(x, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{digits}f}"


def _quality_text(q: dict | None, base=None, delta: dict | None = None) -> str:
    """``metric value (exact value; delta [lo, hi] p)`` per tested metric."""
    if not q:
        return "-"
    out = []
    for k, v in q.items():
        d = (delta or {}).get(k)
        vs = ""
        if isinstance(base, dict) and k in base:
            vs = f"exact {_num(base[k], 3)}"
            if d and d.get("delta") is not None:
                vs += f"; Δ {d['delta']:+.3f} [{_num(d['lo'], 3)}, {_num(d['hi'], 3)}] p {_num(d['p_value'], 2)}"
        out.append(f"{k} {_num(v, 3)}" + (f" ({vs})" if vs else ""))
    return "; ".join(out)


def render(df: pd.DataFrame) -> str:
    """The markdown tables: throughput, acceptance and quality; then latency percentiles."""
    if df.empty:
        return "No served runs (engine=vllm engine.serve=true) found.\n"
    lines = []
    for (task, model, settings), g in df.groupby(["task", "model", "settings"], sort=False):
        k = max((len(p) for p in g["positions"]), default=0)
        rule = lambda r: r["head"] if pd.isna(r["theta"]) else f"{r['head']} {r['theta']:g}"  # noqa: E731
        main = pd.DataFrame({
            "concurrency": g["concurrency"], "rule": [rule(r) for _, r in g.iterrows()], "n": g["n"],
            "output tokens/s": g["tokens_per_s"].map(_num), "x exact": g["vs_exact"].map(_num),
            f"accepted at position 1-{k} (records)": [" / ".join(_num(x) for x in p) for p in g["positions"]],
            "(/metrics)": [" / ".join(_num(x) for x in p) for p in g["positions_metrics"]],
            "relaxed": g["relaxed"],
            "identical to exact": g["identical_to_exact"].map(lambda x: "-" if pd.isna(x) else x),
            "quality (exact at the same concurrency; paired Δ [95% CI], p)": [
                _quality_text(q, b, d) for q, b, d in zip(g["quality"], g["exact_quality"], g["quality_vs_exact"])]})
        lat = pd.DataFrame({"concurrency": g["concurrency"], "rule": [rule(r) for _, r in g.iterrows()],
                            **{f"{m.upper()} p{p} (ms)": g[f"{m}_p{p}_ms"].map(_num) for m in ("ttft", "tpot", "itl")
                               for p in PERCENTILES}})
        lines += [f"## {task}, {model} ({settings})", "", main.to_markdown(index=False, disable_numparse=True), "",
                  "Latency (per request; ITL over every gap between streamed chunks):", "",
                  lat.to_markdown(index=False, disable_numparse=True), ""]
    return "\n".join(lines)


def figure(df: pd.DataFrame, path: Path) -> list[Path]:
    """Output tokens/s and the task's first quality metric against concurrency, one line per rule, one figure per
    task, model and settings (``<path stem>__<task>[-<n>].png``); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for n, ((task, model, settings), g) in enumerate(df.groupby(["task", "model", "settings"], sort=False)):
        metric = next((m for q in g["quality"] for m in q), None)
        fig, axes = plt.subplots(1, 2 if metric else 1, figsize=(9 if metric else 4.5, 3.4), squeeze=False)
        for (head, theta), r in g.groupby(["head", g["theta"].fillna(-1)], sort=False):
            label = head if theta < 0 else f"{head} θ {theta:g}"
            axes[0, 0].plot(r["concurrency"], r["tokens_per_s"], marker="o", label=label)
            if metric:
                axes[0, 1].plot(r["concurrency"], [q.get(metric) for q in r["quality"]], marker="o", label=label)
        axes[0, 0].set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="output tokens/s",
                       title=f"{task}: throughput")
        if metric:
            axes[0, 1].set(xscale="log", xlabel="concurrency (requests in flight)", ylabel=metric,
                           title=f"{task}: quality of the served outputs")
        for ax in axes[0]:
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_xticks(sorted(g["concurrency"].unique()), labels=[str(c) for c in sorted(g["concurrency"].unique())])
            ax.legend()
        fig.suptitle(f"{model}, {settings}", fontsize=9)
        fig.tight_layout()
        out = path.with_name(f"{path.stem}__{task}{f'-{n}' if n else ''}.png")
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
        plt.close(fig)
        written.append(out)
    return written


def write(root, out_md: Path) -> tuple[str, list[Path]]:
    """Tables (``out_md``, and its JSON beside it) and figures of the served runs under ``root``."""
    return write_rows(rows(load(root)), out_md)


def write_rows(df: pd.DataFrame, out_md: Path, figures: bool = True) -> tuple[str, list[Path]]:
    """``rows``' tables to ``out_md`` (and its JSON beside it) and, with ``figures``, the figures beside it."""
    md = render(df)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(md)
    figs = figure(df, out_md.with_suffix(".png")) if figures and not df.empty else []
    table = df.drop(columns=["outputs"]) if not df.empty else df
    out_md.with_suffix(".json").write_text(table.to_json(orient="records", indent=1))
    return md, figs
