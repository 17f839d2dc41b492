"""The serving benchmark's tables and figure (runs of ``engine=vllm engine.serve=true``, docs/vllm.md "Serving"): per
task, rule and concurrency (the run's batch_size: requests in flight), pooled over rounds (runs of the same spec but
its seed: ``scripts/bench_serve.py --rounds`` serves round r with seed r - 1), the output tokens per second of the
server and its ratio to exact's (sd, rule exact) with a 95% CI over rounds, TTFT / TPOT / ITL percentiles, the
acceptance per draft position (vLLM's per-request counts in the records, and its ``/metrics`` deltas in calls.jsonl),
and the quality of the served outputs (the task's per-sample scores) with its CI over prompts and the paired delta
against exact's at the same concurrency, with how many outputs are token-identical to exact's.

Definitions (those of ``vllm bench serve``): TTFT = send to the first streamed token; ITL = the gaps between
successive token-bearing chunks (with speculative decoding a chunk holds one verification step's tokens); TPOT =
(latency - TTFT) / (output tokens - 1) per request; output tokens/s = output tokens / wall time of the calls (a call:
the samples sent together, ``batch_size`` in flight). Uncertainty (``mars_bench.stats``): x exact is the geometric
mean over rounds of mars / exact output tokens/s (both rules of a round on the same prompts through one server) with
the t-interval of the per-round log ratios (``log_ratio_t_ci``: the requests of a call share its wall time, so the
round, not the request, is the unit); quality is each prompt's score averaged over rounds, its CI a bootstrap over
prompts (``mean_ci``), the delta a paired bootstrap over prompts (``mean_delta``); a corpus metric (BLEU, chrF) is
each round's own, with sacrebleu's bootstrap over prompts (the runner's summary.json). Reads results files only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from mars_bench import stats as S
from mars_bench.store.io import atomic_write_text, read_samples
from mars_bench.store.spec import RunSpec
from mars_bench.store.summary import Paired, from_registration

PERCENTILES = (50, 90, 99)
CAPTION = ("x exact: mars / exact output tokens/s, geometric mean over the rounds (both rules of a round on the same "
           "prompts through one server, which goes first alternating) with the 95% t-interval of the per-round log "
           "ratios (n = rounds); n/a with one round. Quality: each prompt's score averaged over rounds, 95% CI by "
           "bootstrap over prompts; Δ: paired bootstrap over prompts (mars - exact), its 95% CI and p; a corpus metric "
           "(BLEU, chrF) per round, each with sacrebleu's paired bootstrap over prompts. Acceptance, "
           "relaxations, identical outputs and the latency percentiles: pooled over rounds.")


@dataclass(frozen=True)
class ServedRun:
    """One served run directory: its spec (run.json), records, summary, calls (calls.jsonl), where it lies."""
    spec: RunSpec
    records: list
    summary: dict
    calls: list
    dir: Path
    task: str
    model: str

    @property
    def tokens(self) -> int:
        return int(sum(t["new_tokens"] for r in self.records for t in r["turns"]))

    @property
    def tokens_per_s(self) -> float | None:
        wall = sum(c["wall_s"] for c in self.calls)
        return self.tokens / wall if wall else None

    @property
    def group(self) -> tuple:
        """What rounds share: task, model and every setting but the seed."""
        return self.task, self.model, replace(self.spec, seed=0).dir_name


def _json_lines(path: Path) -> list:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def load(root) -> list[ServedRun]:
    """Every served run under ``root``."""
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
        out.append(ServedRun(RunSpec.from_dict(spec), recs, summary, _json_lines(d / "calls.jsonl"), d,
                             d.parent.name, d.parent.parent.name))
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


def metrics_of(runs: list[ServedRun]) -> dict[str, Paired]:
    """The task's tested metrics (summary.json's ``metric_specs``) of the first run that has them."""
    return next((from_registration(r.summary["metric_specs"]) for r in runs if r.summary.get("metric_specs")), {})


def prompt_scores(runs: list[ServedRun], metric: Paired) -> dict:
    """Sample id -> its per-sample score of ``metric`` averaged over the rounds (runs) that scored it."""
    by: dict = {}
    for run in runs:
        for r in run.records:
            v = metric.get(r.get("score"))
            if v is not None:
                by.setdefault(r["id"], []).append(float(v))
    return {i: float(np.mean(v)) for i, v in by.items()}


def _round_tests(runs: list[ServedRun], block: str, name: str) -> list[dict | None]:
    """Each round's (run's) ``stats[block][name]`` from its summary.json, in seed order (None where absent)."""
    return [((r.summary.get("stats") or {}).get(block) or {}).get(name)
            for r in sorted(runs, key=lambda r: r.spec.seed)]


def quality(runs: list[ServedRun], exact: list[ServedRun], settings: S.StatsSettings) -> tuple[dict, dict]:
    """(metric -> estimate over prompts, metric -> paired test against ``exact``'s runs). A corpus metric (BLEU,
    chrF) has no per-prompt score to pool: its estimate and its paired test are each round's own, from the round's
    summary.json (sacrebleu's bootstrap over prompts, made by the runner with the task's references), as a list
    (``per_round``: one entry per round, in seed order)."""
    own, vs = {}, {}
    for name, m in metrics_of(runs).items():
        if m.corpus:
            own[name] = {"per_round": _round_tests(runs, "quality", name)}
            tests = _round_tests(runs, "quality_vs_sd", name)
            if any(tests):
                vs[name] = {"per_round": tests}
            continue
        a = prompt_scores(runs, m)
        own[name] = S.mean_ci(list(a.values()), settings)
        b = prompt_scores(exact, m) if exact else {}
        ids = sorted(set(a) & set(b))
        if ids:
            vs[name] = S.mean_delta([a[i] for i in ids], [b[i] for i in ids], settings, m.higher)
    return own, vs


def _identical(pairs: list[tuple[ServedRun, ServedRun]] | None) -> str | None:
    """'same/compared' outputs over the paired rounds' shared sample ids."""
    if not pairs:
        return None
    same = total = 0
    for run, base in pairs:
        b = {r["id"]: [t["output_ids"] for t in r["turns"]] for r in base.records}
        for r in run.records:
            if r["id"] in b:
                total += 1
                same += [t["output_ids"] for t in r["turns"]] == b[r["id"]]
    return f"{same}/{total}"


def latency(turns: list) -> dict:
    """TTFT / TPOT / ITL percentiles (ms) over ``turns`` (every round's, pooled)."""
    out = {}
    for name, values in (("ttft", [t["ttft_s"] for t in turns if t.get("ttft_s") is not None]),
                         ("tpot", [t["tpot_s"] for t in turns if t.get("tpot_s") is not None]),
                         ("itl", [x for t in turns for x in t.get("itl_s") or []])):
        out.update({f"{name}_p{p}_ms": _pct(values, p) for p in PERCENTILES})
    return out


def vs_exact(pairs: list[tuple[ServedRun, ServedRun]] | None, settings: S.StatsSettings) -> dict:
    """x exact over the paired rounds (``log_ratio_t_ci`` of their output tokens/s ratios) and the ratios; all None
    for exact itself (``pairs`` None)."""
    if pairs is None:
        return dict.fromkeys(("vs_exact", "vs_exact_lo", "vs_exact_hi", "vs_exact_n", "vs_exact_note",
                              "vs_exact_rounds"))
    ratios = [a.tokens_per_s / b.tokens_per_s for a, b in pairs if a.tokens_per_s and b.tokens_per_s]
    e = S.log_ratio_t_ci(ratios, settings)
    return {"vs_exact": e["value"], "vs_exact_lo": e["lo"], "vs_exact_hi": e["hi"], "vs_exact_n": e["n"],
            "vs_exact_note": e["note"], "vs_exact_rounds": ratios}


def group_row(runs: list[ServedRun], exact: list[ServedRun] | None, settings: S.StatsSettings) -> dict:
    """One row: a rule at a concurrency, pooled over its rounds ``runs``; ``exact``: exact's rounds at that
    concurrency (None for exact itself), paired with ``runs`` by seed."""
    runs = sorted(runs, key=lambda r: r.spec.seed)
    s, recs = runs[0].spec, [r for run in runs for r in run.records]
    k, calls = int(s.k or 0), [c for r in runs for c in r.calls]
    base = {r.spec.seed: r for r in exact or []}
    pairs = [(run, base[run.spec.seed]) for run in runs if run.spec.seed in base] if exact is not None else None
    q, q_vs = quality(runs, exact or [], settings)
    return {"task": runs[0].task, "model": runs[0].model, "head": s.head, "rule": s.rule, "run": runs[0].group[2],
            "settings": f"T {s.temperature:g}, top-p {s.top_p:g}, k {s.k}, max new tokens {s.max_new_tokens}",
            "theta": s.settings.get("theta"), "concurrency": s.batch_size, "rounds": len(runs),
            "seeds": [r.spec.seed for r in runs], "n": len({r["id"] for r in recs}),
            "tokens_per_s_rounds": [r.tokens_per_s for r in runs],
            "tokens_per_s": float(np.mean([r.tokens_per_s for r in runs if r.tokens_per_s] or [np.nan])),
            **vs_exact(pairs, settings),
            "quality": q, "quality_vs_exact": q_vs,
            "identical_to_exact": _identical(pairs),
            "relaxed": int(sum(r["n_relaxed"] for r in recs)), "dirs": [str(r.dir) for r in runs],
            **latency([t for r in recs for t in r["turns"]]),
            "positions": positions(recs, k) if k else [],
            "positions_metrics": _metric_positions(calls, k) if k and calls else []}


def rows(runs: list[ServedRun], settings: S.StatsSettings | None = None) -> pd.DataFrame:
    """One row per task, model, settings, concurrency and rule, its rounds pooled (module doc)."""
    groups: dict = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    out = []
    for (task, model, _), members in groups.items():
        ref = members[0].spec.lossless_reference()
        exact = None if ref is None else groups.get((task, model, replace(ref, seed=0).dir_name), [])
        out.append(group_row(members, exact, settings or S.StatsSettings()))
    df = pd.DataFrame(out)
    if df.empty:
        return df
    return df.sort_values(["task", "model", "settings", "concurrency", "rule"]).reset_index(drop=True)


def _given(x) -> bool:
    return x is not None and not (isinstance(x, float) and np.isnan(x))


def _num(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if _given(x) else "-"


def _interval(value, lo, hi, digits: int = 2) -> str:
    """``value [lo, hi]``, or ``value (no CI)`` where the estimate has none (one round, all prompts alike)."""
    if not _given(value):
        return "-"
    return f"{value:.{digits}f} " + (f"[{lo:.{digits}f}, {hi:.{digits}f}]" if _given(lo) and _given(hi) else "(no CI)")


def ratio_text(row) -> str:
    """x exact with its CI over rounds; 'n/a (1 round)' where one round gives no interval."""
    n = row["vs_exact_n"]
    if not _given(n) or not n:
        return "-"
    if _given(row["vs_exact_lo"]):
        return _interval(row["vs_exact"], row["vs_exact_lo"], row["vs_exact_hi"])
    return f"{_num(row['vs_exact'])} (CI n/a: {'1 round' if n == 1 else row['vs_exact_note']})"


def tokens_text(row) -> str:
    """Mean output tokens/s over the rounds, each round's after it."""
    per = row["tokens_per_s_rounds"]
    return _num(row["tokens_per_s"]) + (f" ({' / '.join(_num(x) for x in per)})" if len(per) > 1 else "")


def _value_text(e: dict | None) -> str:
    return _interval(e.get("value"), e.get("lo"), e.get("hi"), 3) if e else "-"


def _delta_text(d: dict | None) -> str:
    """``delta [lo, hi] p`` (``n`` after it) of a paired test against exact; '-' where there is none."""
    if not d or d.get("delta") is None:
        return "-"
    ci = f"[{d['lo']:+.3f}, {d['hi']:+.3f}], p {_num(d.get('p_value'))}" if _given(d.get("lo")) else "no CI"
    return f"{d['delta']:+.3f} {ci}, n {d['n']}"


def _rounds_text(texts: list[str]) -> str:
    """One text where the rounds agree (greedy rounds decode the same outputs), else 'r1: ... / r2: ...'."""
    if len(set(texts)) <= 1:
        return texts[0] if texts else "-"
    return " / ".join(f"r{i}: {t}" for i, t in enumerate(texts, 1))


def quality_cells(q: dict, vs: dict) -> dict[str, tuple[str, str]]:
    """Metric -> (its estimate, its Δ against exact) as table cells: pooled over rounds; a corpus metric (``quality``:
    ``per_round``) written once where its rounds agree, else per round."""
    out = {}
    for name, e in (q or {}).items():
        d = (vs or {}).get(name)
        if "per_round" not in e:
            out[name] = (_value_text(e), _delta_text(d))
            continue
        tests = (d or {}).get("per_round") or [None] * len(e["per_round"])
        out[name] = (_rounds_text([_value_text(x) for x in e["per_round"]]),
                     _rounds_text([_delta_text(t) for t in tests]))
    return out


def _label(r) -> str:
    return r["head"] if not _given(r["theta"]) else f"{r['head']} {r['theta']:g}"


def render(df: pd.DataFrame) -> str:
    """The markdown tables: throughput, acceptance and quality; then latency percentiles (module doc)."""
    if df.empty:
        return "No served runs (engine=vllm engine.serve=true) found.\n"
    lines = []
    for (task, model, settings), g in df.groupby(["task", "model", "settings"], sort=False):
        k = max((len(p) for p in g["positions"]), default=0)
        rs = list(g.to_dict("records"))
        main = pd.DataFrame({
            "concurrency": g["concurrency"], "rule": [_label(r) for r in rs], "rounds": g["rounds"], "prompts": g["n"],
            "output tokens/s (mean; per round)": [tokens_text(r) for r in rs],
            "x exact [95% CI]": [ratio_text(r) for r in rs],
            f"accepted at position 1-{k} (records)": [" / ".join(_num(x) for x in p) for p in g["positions"]],
            "(/metrics)": [" / ".join(_num(x) for x in p) for p in g["positions_metrics"]],
            "relaxed": g["relaxed"],
            "identical to exact": [r["identical_to_exact"] if _given(r["identical_to_exact"]) else "-" for r in rs]})
        cells = [quality_cells(r["quality"], r["quality_vs_exact"]) for r in rs]
        names = list(dict.fromkeys(m for c in cells for m in c))
        quality = pd.DataFrame({"concurrency": g["concurrency"], "rule": [_label(r) for r in rs],
                                **{col: [c.get(m, ("-", "-"))[j] for c in cells] for m in names
                                   for j, col in enumerate((f"{m} [95% CI]", f"Δ {m} vs exact [95% CI], p, n"))}})
        lat = pd.DataFrame({"concurrency": g["concurrency"], "rule": [_label(r) for r in rs],
                            **{f"{m.upper()} p{p} (ms)": g[f"{m}_p{p}_ms"].map(_num) for m in ("ttft", "tpot", "itl")
                               for p in PERCENTILES}})
        lines += [f"## {task}, {model} ({settings})", "", CAPTION, "",
                  main.to_markdown(index=False, disable_numparse=True), "",
                  "Quality of the served outputs (the task's metrics; a corpus metric such as BLEU per round, written "
                  "once where the rounds agree):", "",
                  quality.to_markdown(index=False, disable_numparse=True), "",
                  "Latency (per request, pooled over rounds; ITL over every gap between streamed chunks):", "",
                  lat.to_markdown(index=False, disable_numparse=True), ""]
    return "\n".join(lines)


def point(e: dict | None) -> float | None:
    """An estimate's value; a per-round one (corpus metric): the mean of its rounds' values."""
    if e and "per_round" in e:
        vals = [r["value"] for r in e["per_round"] if r and _given(r.get("value"))]
        return float(np.mean(vals)) if vals else None
    return (e or {}).get("value")


def figure(df: pd.DataFrame, path: Path) -> list[Path]:
    """Output tokens/s (mean over rounds) and the task's first quality metric against concurrency, one line per rule,
    one figure per task, model and settings (``<path stem>__<task>[-<n>].png``); returns the files written."""
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
                axes[0, 1].plot(r["concurrency"], [point(q.get(metric)) for q in r["quality"]], marker="o", label=label)
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
    atomic_write_text(out_md, md)
    figs = figure(df, out_md.with_suffix(".png")) if figures and not df.empty else []
    atomic_write_text(out_md.with_suffix(".json"), df.to_json(orient="records", indent=1))
    return md, figs
