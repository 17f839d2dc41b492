"""``summary.json`` for one run: totals, quality (the task's metrics), fidelity and speedup vs ``ar``, and
their uncertainty (``stats``: CIs, paired tests vs ``ar`` and ``sd``, MDEs; computed by ``mars_bench.stats``)
and the share of samples per stop reason (``stop_reasons``)."""
from __future__ import annotations

import time
from pathlib import Path

from omegaconf import OmegaConf

from . import records as R
from . import stats as S
from .config import draft_quant_of, method_of
from .decode.rules import RULES
from .tags import RunTag


def _judge_mean(score: dict):
    xs = [score.get(f"judge_score_turn{t}") for t in (1, 2)]
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


# quality metric (a key of summary["quality"]) -> (kind, its per-sample value in a record's "score"):
# binary -> stats.binary_delta (McNemar), mean -> stats.mean_delta (paired bootstrap),
# corpus -> stats.corpus_delta (sacrebleu's paired bootstrap on the hypotheses and the references)
PAIRED_METRICS = {
    "accuracy_strict": ("binary", lambda s: s.get("correct_strict")),
    "accuracy_flexible": ("binary", lambda s: s.get("correct_flexible")),
    "pass@1": ("binary", lambda s: s.get("passed")),
    "judge_score": ("mean", _judge_mean),
    "bleu": ("corpus", lambda s: s.get("hypothesis")),
    "chrf": ("corpus", lambda s: s.get("hypothesis")),
}
STOP_REASONS = ("max_new_tokens", "eos", "stop_string")   # decoding.Stopper's reasons


def stop_reasons(recs: list[dict]) -> dict:
    """Share of samples per stop reason of their last turn (max_new_tokens = cut by the token budget)."""
    last = [(r.get("turns") or [{}])[-1].get("stop_reason") or "unrecorded" for r in recs]
    out = {k: (last.count(k) / len(last) if last else None) for k in STOP_REASONS}
    out.update({k: last.count(k) / len(last) for k in sorted(set(last) - set(STOP_REASONS))})
    out["n"] = len(last)
    return out


def quality_tests(recs: list[dict], base_recs: list[dict], metrics, settings: S.StatsSettings,
                  references: dict | None = None) -> dict:
    """Paired test of each metric in ``metrics`` (those PAIRED_METRICS knows) on the ids both runs have.
    ``references``: id -> reference text, needed for BLEU / chrF (absent in results files)."""
    base = {r["id"]: r for r in base_recs}
    pairs = [(r["score"] or {}, base[r["id"]]["score"] or {}, r["id"]) for r in recs if r["id"] in base]
    out, corpus = {}, [m for m in metrics if PAIRED_METRICS.get(m, ("",))[0] == "corpus"]
    for m in metrics:
        kind, get = PAIRED_METRICS.get(m, (None, None))
        if kind in ("binary", "mean"):
            vals = [(get(a), get(b)) for a, b, _ in pairs if get(a) is not None and get(b) is not None]
            fn = S.binary_delta if kind == "binary" else S.mean_delta
            out[m] = fn([a for a, _ in vals], [b for _, b in vals], settings)
    if corpus:
        use = [(a["hypothesis"], b["hypothesis"], i) for a, b, i in pairs if "hypothesis" in a and "hypothesis" in b]
        if references is None or any(i not in references for _, _, i in use):
            res = {m: S.no_test(len(use), "needs the references: re-summarize the run (rerun its mars-bench "
                                "command; finished samples are not decoded again)", settings) for m in corpus}
        else:
            res = S.corpus_delta([a for a, _, _ in use], [b for _, b, _ in use], [references[i] for *_, i in use],
                                 settings)
        out.update({m: res[m] for m in corpus})
    return out


def quality_cis(recs: list[dict], metrics, settings: S.StatsSettings, references: dict | None = None) -> dict:
    """The run's own CI of each metric PAIRED_METRICS knows: Wilson for binary scores, bootstrap for
    means, sacrebleu's bootstrap for BLEU / chrF (needs ``references``)."""
    out, corpus = {}, [m for m in metrics if PAIRED_METRICS.get(m, ("",))[0] == "corpus"]
    for m in metrics:
        kind, get = PAIRED_METRICS.get(m, (None, None))
        vals = [get(r["score"] or {}) for r in recs]
        vals = [v for v in vals if v is not None]
        if kind == "binary":
            out[m] = S.proportion_ci(int(sum(vals)), len(vals), settings)
        elif kind == "mean":
            out[m] = S.mean_ci(vals, settings)
    if corpus:
        use = [(r["score"]["hypothesis"], r["id"]) for r in recs if "hypothesis" in (r["score"] or {})]
        if references is None or any(i not in references for _, i in use):
            res = {m: {**S.no_test(len(use), "needs the references: re-summarize the run", settings),
                       "value": None} for m in corpus}
        else:
            res = S.corpus_ci([h for h, _ in use], [references[i] for _, i in use], settings)
        out.update({m: res[m] for m in corpus})
    return out


def run_stats(recs: list[dict], ar_recs: list[dict] | None = None, sd_recs: list[dict] | None = None,
              settings: S.StatsSettings | None = None, metrics=(), references: dict | None = None,
              fidelity: dict | None = None) -> dict:
    """The ``stats`` block of summary.json: CIs of tau, tokens/s, speedup vs ar (paired), fidelity to ar,
    each quality metric; paired quality tests vs ar and vs sd (None when that run is absent)."""
    settings = settings or S.StatsSettings()
    col = lambda rs, k: [r[k] for r in rs]  # noqa: E731
    out = {"settings": settings.as_dict(),
           "tau": S.ratio_ci(col(recs, "new_tokens"), col(recs, "steps"), settings),
           "tokens_per_s": S.ratio_ci(col(recs, "new_tokens"), col(recs, "wall_s"), settings),
           "speedup": None, "fidelity": None, "quality": None, "quality_vs_ar": None, "quality_vs_sd": None}
    metrics = [m for m in metrics if m in PAIRED_METRICS]
    out["quality"] = quality_cis(recs, metrics, settings, references)
    if ar_recs is not None:
        ar = {r["id"]: r for r in ar_recs}
        both = [r for r in recs if r["id"] in ar]
        base = [ar[r["id"]] for r in both]
        out["speedup"] = S.speedup_ci(col(both, "new_tokens"), col(both, "wall_s"), col(base, "new_tokens"),
                                      col(base, "wall_s"), settings)
        out["quality_vs_ar"] = quality_tests(recs, ar_recs, metrics, settings, references)
    if sd_recs is not None:
        out["quality_vs_sd"] = quality_tests(recs, sd_recs, metrics, settings, references)
    per = list(((fidelity or {}).get("per_sample") or {}).values())
    if per:
        share = S.proportion_ci(sum(bool(d["identical"]) for d in per), len(per), settings)
        share.update({k: (None if share[k] is None else 100.0 * share[k]) for k in ("value", "lo", "hi")})
        out["fidelity"] = {"pct_identical": share,
                           "mean_chrf_to_ar": S.mean_ci([float(d["chrf_to_ar"]) for d in per], settings)}
    return out


def fidelity_vs_ar(recs: list[dict], ar_recs: list[dict]) -> dict | None:
    """Per-sample comparison with the ar output of the same target and settings, and its aggregate."""
    from .tasks.fidelity import aggregate_fidelity, fidelity

    ar = {r["id"]: r for r in ar_recs}
    per = {}
    for r in recs:
        if r["id"] not in ar:
            continue
        mine, base = r["turns"], ar[r["id"]]["turns"]
        per[r["id"]] = fidelity([t for x in mine for t in x["output_ids"]],
                                [t for x in base for t in x["output_ids"]],
                                "\n".join(x["output_text"] for x in mine),
                                "\n".join(x["output_text"] for x in base))
    if not per:
        return None
    return {"aggregate": aggregate_fidelity(list(per.values())), "per_sample": per}


def summarize_run(run_dir: Path, task, samples, cfg, data_dir, ar_dir: Path | None = None,
                  sd_dir: Path | None = None, settings: S.StatsSettings | None = None) -> dict:
    """Write and return summary.json. ``ar_dir`` / ``sd_dir``: the ar / sd runs of the same settings
    (compared when their samples exist); ``settings``: None reads ``cfg.stats`` (else the defaults)."""
    run_dir = Path(run_dir)
    settings = settings or S.StatsSettings.from_cfg(cfg)
    recs, problems = R.read_samples(run_dir / "samples.jsonl")
    by_id = {r["id"]: r for r in recs}
    ordered = [(s, by_id[s.id]) for s in samples if s.id in by_id]
    method, tag = method_of(cfg), RunTag.parse(run_dir.name)
    quality = task.aggregate([s for s, _ in ordered], [r["score"] for _, r in ordered],
                             [[t["output_text"] for t in r["turns"]] for _, r in ordered]) if ordered else {}
    summary = {
        "run_dir": str(run_dir), "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": cfg.model.name, "task": task.name, "task_version": task.version,
        "method": tag.head if tag else method.name, "k": cfg.method.k,
        "draft_quant": draft_quant_of(cfg),
        "fast_kernel": sorted({r.get("fast_kernel", "unrecorded") for _, r in ordered}),   # one, unless resumed elsewhere
        "scheme": method.name, "rule": method.rule if method.speculative else None,
        "rule_settings": method.rule_kwargs, "lossless": (not method.speculative) or RULES[method.rule].lossless,
        "theta": method.rule_kwargs.get("theta"),
        "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed,
        "batch_size": int(cfg.get("batch_size", 1)),   # > 1: tokens/s is the run's throughput, not a latency
        "config": OmegaConf.to_container(cfg, resolve=True),
        "manifest": R.manifest(), "data_sha256": task.data_sha256(data_dir),
        "totals": R.totals([r for _, r in ordered]), "quality": quality,
        "metric_directions": task.metric_directions, "problems": problems,
        "definitions": {"tau": R.TAU_DEFINITION, "speedup": R.SPEEDUP_DEFINITION},
        "speedup": None, "fidelity": None, "stop_reasons": stop_reasons([r for _, r in ordered]),
    }
    mine, ar_recs, sd_recs = [r for _, r in ordered], None, None
    if ar_dir is not None and (Path(ar_dir) / "samples.jsonl").exists():
        ar_recs, _ = R.read_samples(Path(ar_dir) / "samples.jsonl")
        summary["speedup"] = R.speedup(mine, ar_recs)
        summary["fidelity"] = fidelity_vs_ar(mine, ar_recs)
        summary["ar_run_dir"] = str(ar_dir)
    if sd_dir is not None and (Path(sd_dir) / "samples.jsonl").exists():
        sd_recs, _ = R.read_samples(Path(sd_dir) / "samples.jsonl")
        summary["sd_run_dir"] = str(sd_dir)
    summary["stats"] = run_stats(mine, ar_recs, sd_recs, settings, metrics=list(quality),
                                 references={s.id: s.reference for s, _ in ordered if isinstance(s.reference, str)},
                                 fidelity=summary["fidelity"])
    R.atomic_write_json(run_dir / "summary.json", summary)
    return summary
