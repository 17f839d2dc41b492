"""``summary.json`` for one run: totals, quality (the task's metrics), fidelity and speedup vs ``ar``, and
their uncertainty (``stats``: CIs, paired tests vs ``ar`` and ``sd`` with their non-inferiority verdicts,
MDEs; computed by ``mars_bench.stats``), the authors' tau and speedup beside ours (``tau_authors``,
``speedup_authors``, definitions in ``mars_bench.store.metrics``) and the share of samples per stop reason
(``stop_reasons``). Which metric gets which paired test is the task's registration (``task.metrics``),
stored as ``metric_specs`` so that the report reads it from the results."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mars_bench.store import metrics as M
from mars_bench.store import records as R
from mars_bench import stats as S
from mars_bench.store.provenance import manifest
from mars_bench.store.io import atomic_write_json
from mars_bench.store.spec import RunSpec
from mars_bench.tasks.base import METRIC_TESTS


@dataclass(frozen=True)
class Paired:
    """How one quality metric is tested: ``test`` (binary -> stats.binary_delta, McNemar; mean ->
    stats.mean_delta; corpus_bleu / corpus_chrf -> stats.corpus_delta / corpus_ci on the hypotheses at
    ``per_sample``; none -> untested), the direction and the per-sample value in a record's ``score``."""
    name: str
    higher: bool
    test: str
    per_sample: str | None
    get: Callable[[dict], Any]

    @property
    def corpus(self) -> bool:
        return self.test.startswith("corpus_")

    def as_dict(self) -> dict:
        return {"higher": self.higher, "test": self.test, "per_sample": self.per_sample}


def paired(name: str, higher: bool, test: str, per_sample: str | None) -> Paired:
    if test not in METRIC_TESTS:
        raise ValueError(f"metric {name}: test={test!r}; allowed: {', '.join(METRIC_TESTS)}")
    return Paired(name, bool(higher), test, per_sample, lambda score: (score or {}).get(per_sample))


def _judge_mean(score: dict):
    xs = [(score or {}).get(f"judge_score_turn{t}") for t in (1, 2)]
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


# tasks registered before ``task.metrics`` existed (a direction per metric in task.yaml): the tests they had
LEGACY_METRICS = {
    "accuracy_strict": paired("accuracy_strict", True, "binary", "correct_strict"),
    "accuracy_flexible": paired("accuracy_flexible", True, "binary", "correct_flexible"),
    "pass@1": paired("pass@1", True, "binary", "passed"),
    "judge_score": Paired("judge_score", True, "mean", None, _judge_mean),
    "bleu": paired("bleu", True, "corpus_bleu", "hypothesis"),
    "chrf": paired("chrf", True, "corpus_chrf", "hypothesis"),
}


def from_registration(metrics: dict | None) -> dict[str, Paired]:
    """Paired tests from a metric registration: ``task.metrics`` (name -> MetricSpec(name, higher, test,
    per_sample)), its dict form (summary.json's ``metric_specs``, task.yaml's ``metrics:``), or an older
    task.yaml's name -> 'higher' | 'lower' (then the LEGACY_METRICS test, if any)."""
    out = {}
    for name, spec in (metrics or {}).items():
        if isinstance(spec, str):
            if name in LEGACY_METRICS:
                out[name] = LEGACY_METRICS[name]
            continue
        get = spec.get if isinstance(spec, dict) else lambda k, s=spec: getattr(s, k)
        m = paired(name, get("higher"), get("test"), get("per_sample"))
        legacy = LEGACY_METRICS.get(name)
        out[name] = legacy if legacy is not None and legacy.as_dict() == m.as_dict() else m
    return {k: v for k, v in out.items() if v.test != "none"}


def task_metrics(task) -> dict[str, Paired]:
    """The task's paired tests: its registration ``task.metrics``; without one, its declared directions
    matched against LEGACY_METRICS."""
    reg = getattr(task, "metrics", None)
    return from_registration(reg if reg is not None else getattr(task, "metric_directions", None))


STOP_REASONS = ("max_new_tokens", "eos", "stop_string")   # decoding.Stopper's reasons


def stop_reasons(recs: list) -> dict:
    """Share of samples per stop reason of their last turn (max_new_tokens = cut by the token budget)."""
    last = [(r.turns[-1].stop_reason if r.turns else None) or "unrecorded" for r in R.as_records(recs)]
    out = {k: (last.count(k) / len(last) if last else None) for k in STOP_REASONS}
    out.update({k: last.count(k) / len(last) for k in sorted(set(last) - set(STOP_REASONS))})
    out["n"] = len(last)
    return out


def _corpus_groups(metrics: dict[str, Paired]) -> dict[str, list[Paired]]:
    """Corpus metrics by the score key of their hypotheses (bleu and chrf share one sacrebleu call)."""
    out: dict[str, list[Paired]] = {}
    for m in metrics.values():
        if m.corpus:
            out.setdefault(m.per_sample, []).append(m)
    return out


def _sacrebleu_key(m: Paired) -> str:
    return m.test.removeprefix("corpus_")   # stats.corpus_delta / corpus_ci return 'bleu' and 'chrf'


def quality_tests(recs: list, base_recs: list, metrics: dict[str, Paired],
                  settings: S.StatsSettings, references: dict | None = None) -> dict:
    """Paired test of each metric in ``metrics`` (name -> Paired) on the ids both runs have, with its
    non-inferiority verdict. ``references``: id -> reference text, needed for BLEU / chrF (absent in
    results files). Records: SampleRecords or their dicts."""
    pairs = [(r.score or {}, b.score or {}, r.id)
             for r, b in M.paired_records(R.as_records(recs), R.as_records(base_recs))]
    out = {}
    for m in metrics.values():
        if m.test in ("binary", "mean"):
            vals = [(m.get(a), m.get(b)) for a, b, _ in pairs if m.get(a) is not None and m.get(b) is not None]
            fn = S.binary_delta if m.test == "binary" else S.mean_delta
            out[m.name] = fn([a for a, _ in vals], [b for _, b in vals], settings, m.higher)
    for key, group in _corpus_groups(metrics).items():
        use = [(a[key], b[key], i) for a, b, i in pairs if key in a and key in b]
        if references is None or any(i not in references for _, _, i in use):
            note = "needs the references: re-summarize the run (rerun its mars-bench command; finished samples " \
                   "are not decoded again)"
            out.update({m.name: S.no_test(len(use), note, settings) for m in group})
            continue
        res = S.corpus_delta([a for a, _, _ in use], [b for _, b, _ in use], [references[i] for *_, i in use],
                             settings, all(m.higher for m in group))
        out.update({m.name: res[_sacrebleu_key(m)] for m in group})
    return out


def quality_cis(recs: list, metrics: dict[str, Paired], settings: S.StatsSettings,
                references: dict | None = None) -> dict:
    """The run's own CI of each metric in ``metrics``: Wilson for binary scores, bootstrap for means,
    sacrebleu's bootstrap for BLEU / chrF (needs ``references``)."""
    recs, out = R.as_records(recs), {}
    for m in metrics.values():
        vals = [v for v in (m.get(r.score or {}) for r in recs) if v is not None]
        if m.test == "binary":
            out[m.name] = S.proportion_ci(int(sum(vals)), len(vals), settings)
        elif m.test == "mean":
            out[m.name] = S.mean_ci(vals, settings)
    for key, group in _corpus_groups(metrics).items():
        use = [(r.score[key], r.id) for r in recs if key in (r.score or {})]
        if references is None or any(i not in references for _, i in use):
            out.update({m.name: {**S.no_test(len(use), "needs the references: re-summarize the run", settings),
                                 "value": None} for m in group})
            continue
        res = S.corpus_ci([h for h, _ in use], [references[i] for _, i in use], settings)
        out.update({m.name: res[_sacrebleu_key(m)] for m in group})
    return out


def authors_speedup_ci(recs: list, ar_recs: list, settings: S.StatsSettings) -> dict:
    """The authors' speedup with its paired-bootstrap CI; the note says when ar's tokens were not re-tokenized."""
    tok, wall, ar_tok, ar_wall, note = M.authors_speedup_columns(recs, ar_recs)
    est = S.speedup_authors_ci(tok, wall, ar_tok, ar_wall, settings)
    return {**est, "note": "; ".join(x for x in (est["note"], note) if x) or None}


def hit_budget(rec) -> bool:
    """Whether any turn of a sample stopped at max_new_tokens (a runaway: it ran to the token budget)."""
    return any(t.stop_reason == "max_new_tokens" for t in R.as_records([rec])[0].turns)


def hit_budget_last(rec) -> bool:
    """Whether a sample's last turn stopped at max_new_tokens (what ``stop_reasons`` counts as truncated)."""
    turns = R.as_records([rec])[0].turns
    return bool(turns) and turns[-1].stop_reason == "max_new_tokens"


def budget_free_speedup(recs: list, ar_recs: list, settings: S.StatsSettings | None = None) -> dict:
    """The speedup over ar (ours, paired bootstrap CI) on the speed pairs where neither the method's sample nor
    ar's hit the token budget in any turn: the headline without runaway samples, which move it either way
    (their repeated text drafts easily, and a long runaway weighs its own rate heavily in the pooled sums).
    ``n_dropped``: the pairs left out."""
    settings = settings or S.StatsSettings()
    pairs = M.speed_pairs(R.as_records(recs), R.as_records(ar_recs))
    keep = [(r, b) for r, b in pairs if not hit_budget(r) and not hit_budget(b)]
    col = lambda i, k: [getattr(p[i], k) for p in keep]  # noqa: E731
    est = S.speedup_ci(col(0, "new_tokens"), col(0, "wall_s"), col(1, "new_tokens"), col(1, "wall_s"), settings)
    return {**est, "n_dropped": len(pairs) - len(keep)}


def run_stats(recs: list, ar_recs: list | None = None, sd_recs: list | None = None,
              settings: S.StatsSettings | None = None, metrics: dict[str, Paired] | None = None,
              references: dict | None = None, fidelity: dict | None = None) -> dict:
    """The ``stats`` block of summary.json: CIs of tau, tokens/s, speedup vs ar (paired), fidelity to ar,
    each quality metric; the authors' tau and speedup (records' module doc) with theirs; paired quality
    tests vs ar and vs sd (None when that run is absent). ``metrics``: name -> Paired (``task_metrics``).
    Records: SampleRecords or their dicts."""
    settings = settings or S.StatsSettings()
    metrics = metrics or {}
    recs = R.as_records(recs)
    ar_recs = None if ar_recs is None else R.as_records(ar_recs)
    sd_recs = None if sd_recs is None else R.as_records(sd_recs)
    col = lambda rs, k: [getattr(r, k) for r in rs]  # noqa: E731
    out = {"settings": settings.as_dict(),
           "tau": S.ratio_ci(col(recs, "new_tokens"), col(recs, "steps"), settings),
           "tau_authors": S.ratio_ci(col(recs, "new_tokens"), [M.authors_idx(r) for r in recs], settings),
           "tokens_per_s": S.ratio_ci(col(recs, "new_tokens"), col(recs, "wall_s"), settings),
           "speedup": None, "speedup_authors": None, "fidelity": None, "quality": None, "quality_vs_ar": None,
           "quality_vs_sd": None}
    out["quality"] = quality_cis(recs, metrics, settings, references)
    if ar_recs is not None:
        pairs, apart = M.speed_pairs(recs, ar_recs), M.left_out_note(recs, ar_recs)
        both, base = [r for r, _ in pairs], [b for _, b in pairs]
        out["speedup"] = S.speedup_ci(col(both, "new_tokens"), col(both, "wall_s"), col(base, "new_tokens"),
                                      col(base, "wall_s"), settings)
        if apart:
            out["speedup"]["note"] = "; ".join(x for x in (out["speedup"].get("note"), apart) if x)
        out["speedup_authors"] = authors_speedup_ci(recs, ar_recs, settings)
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


def fidelity_vs_ar(recs: list, ar_recs: list) -> dict | None:
    """Per-sample comparison with the ar output of the same target and settings, and its aggregate."""
    from mars_bench.tasks.fidelity import aggregate_fidelity, fidelity

    per = {}
    for r, b in M.paired_records(R.as_records(recs), R.as_records(ar_recs)):
        mine, base = r.turns, b.turns
        per[r.id] = fidelity([t for x in mine for t in x.output_ids], [t for x in base for t in x.output_ids],
                             "\n".join(x.output_text for x in mine), "\n".join(x.output_text for x in base))
    if not per:
        return None
    return {"aggregate": aggregate_fidelity(list(per.values())), "per_sample": per}


def _directions(task) -> dict[str, str]:
    """'higher' / 'lower' per metric the task reports (its registration when it has one)."""
    reg = getattr(task, "metrics", None)
    if reg is None:
        return dict(task.metric_directions)
    return {name: "higher" if (spec["higher"] if isinstance(spec, dict) else spec.higher) else "lower"
            for name, spec in reg.items()}


def summarize_run(run_dir: Path, task, samples, spec: RunSpec, *, model: str, data_dir, settings: S.StatsSettings,
                  config: dict, draft_quant: str | None, ar_dir: Path | None = None,
                  sd_dir: Path | None = None) -> dict:
    """Write and return summary.json, from the job's settings as resolved once: ``spec``, the run's ``RunSpec``
    (method, scheme, rule and its settings, k, temperature, top-p, seed, batch size); ``model``: the model's name;
    ``settings``: the stats settings; ``config``: the resolved config as a plain dict (kept as ``config``);
    ``draft_quant``: the draft quantization that ran (``draft_quant_of``). ``ar_dir`` / ``sd_dir``: the ar / sd
    runs of the same settings (compared when their samples exist)."""
    run_dir = Path(run_dir)
    recs, problems = R.read_records(run_dir / "samples.jsonl")
    by_id = {r.id: r for r in recs}
    ordered = [(s, by_id[s.id]) for s in samples if s.id in by_id]
    tag = spec
    registered = task_metrics(task)
    quality = task.aggregate([s for s, _ in ordered], [r.score for _, r in ordered],
                             [[t.output_text for t in r.turns] for _, r in ordered]) if ordered else {}
    summary = {
        "run_dir": str(run_dir), "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model, "task": task.name, "task_version": task.version,
        "method": tag.head, "k": tag.k,
        "draft_quant": draft_quant,
        "fast_kernel": sorted({r.fast_kernel or "unrecorded" for _, r in ordered}),   # one, unless resumed elsewhere
        "machines": M.machines([r for _, r in ordered]),   # CPU (or GPU), instruction sets, threads; likewise
        "scheme": tag.scheme, "rule": tag.rule if tag.speculative else None,
        "rule_settings": tag.settings, "lossless": not tag.speculative or tag.lossless,   # theta: rule_settings'
        "temperature": tag.temperature, "top_p": tag.top_p, "seed": tag.seed,
        "batch_size": tag.batch_size,   # > 1: tokens/s is the run's throughput, not a latency
        "config": config,
        "manifest": manifest(), "data_sha256": task.data_sha256(data_dir),
        "totals": M.totals([r for _, r in ordered]), "quality": quality,
        "metric_directions": _directions(task), "problems": problems,
        "metric_specs": {name: m.as_dict() for name, m in registered.items()},
        "definitions": {"tau": M.TAU_DEFINITION, "speedup": M.SPEEDUP_DEFINITION,
                        "tau_authors": M.TAU_AUTHORS_DEFINITION, "speedup_authors": M.SPEEDUP_AUTHORS_DEFINITION},
        "speedup": None, "fidelity": None, "stop_reasons": stop_reasons([r for _, r in ordered]),
    }
    mine, ar_recs, sd_recs = [r for _, r in ordered], None, None
    if ar_dir is not None and (Path(ar_dir) / "samples.jsonl").exists():
        ar_recs, _ = R.read_records(Path(ar_dir) / "samples.jsonl")
        summary["speedup"] = M.speedup(mine, ar_recs)
        summary["fidelity"] = fidelity_vs_ar(mine, ar_recs)
        summary["ar_run_dir"] = str(ar_dir)
    if sd_dir is not None and (Path(sd_dir) / "samples.jsonl").exists():
        sd_recs, _ = R.read_records(Path(sd_dir) / "samples.jsonl")
        summary["sd_run_dir"] = str(sd_dir)
    summary["stats"] = run_stats(mine, ar_recs, sd_recs, settings,
                                 metrics={k: m for k, m in registered.items() if k in quality},
                                 references={s.id: s.reference for s, _ in ordered if isinstance(s.reference, str)},
                                 fidelity=summary["fidelity"])
    atomic_write_json(run_dir / "summary.json", summary)
    return summary
