"""A run's summary as ``mars_bench.store.summary`` would state it for the samples found.

summary.json is read as written where it is current. Where it is missing or stale (written before some of
its fields existed, or over fewer samples than the merged samples.jsonl holds), each stale block is restated
in whole from the samples by the writer's own functions, never by the report: totals (``metrics.totals``),
speedup and fidelity vs ar (``metrics.speedup``, ``summary.fidelity_vs_ar``), stop reasons and every interval
and paired test (``summary.stop_reasons``, ``summary.run_stats``), and the run's notes say which. Quality (the
task's aggregate) needs the task's data and stays the summary's, over the samples it covers. BLEU / chrF
tests need the references, which results files do not hold: those stay untested, with a note. Which metric
gets which test is the registration stored in summary.json (``metric_specs``), else the task's task.yaml.
"""
from __future__ import annotations

from dataclasses import fields

from mars_bench.store import metrics as M
from mars_bench.store import records as R
from mars_bench import stats as S
from mars_bench.store import summary as W
from mars_bench.store.read import RunFiles


def current_summary(run: RunFiles, ar: RunFiles | None, ref: RunFiles | None) -> dict:
    """The run's summary with its stale blocks restated. ``ar``: its baseline run; ``ref``: the lossless run
    its quality is also compared with (None for ar and lossless runs)."""
    s = dict(run.summary or {})
    s["metric_directions"] = dict(run.directions)
    s["totals"] = _totals(run, s.get("totals"))
    if run.spec.scheme != "ar":
        s["speedup"], s["fidelity"] = _vs_ar(run, s, ar)
    s["stop_reasons"], s["stats"] = _stats(run, s, ar, ref)
    return s


def _totals(run: RunFiles, stored: dict | None) -> dict:
    recs, n = run.records, (stored or {}).get("n_samples")
    if stored is not None and (not run.has_samples or n == len(recs)):
        if not run.has_samples:
            run.notes.insert(0, "no samples.jsonl: numbers from summary.json only")
        return {**M.totals(recs), **stored} if recs else dict(stored)   # fields added since it was written
    run.notes.insert(0, "no summary.json: totals from samples.jsonl, no quality metrics" if stored is None else
                     f"summary.json covers {n} samples, samples.jsonl {len(recs)}: totals recomputed; quality is "
                     f"over the {n}")
    return M.totals(recs)


def _vs_ar(run: RunFiles, s: dict, ar: RunFiles | None) -> tuple[dict | None, dict | None]:
    """Speedup and fidelity against the ar run, restated when missing or not over the samples in common."""
    sp, fid = s.get("speedup"), s.get("fidelity")
    if ar is None or not ar.records or not run.records:
        if sp is None:
            run.notes.append(f"no speedup: no ar run {run.spec.baseline().label} with samples beside it")
        return sp, fid
    recs, base = R.as_records(run.records), R.as_records(ar.records)
    n_common, n_speed = len(M.paired_records(recs, base)), len(M.speed_pairs(recs, base))   # speed: same machine
    fid_n = ((fid or {}).get("aggregate") or {}).get("n")
    if sp is not None and sp.get("n_common") == n_speed and fid_n == n_common and "speedup_authors" in sp:
        return sp, fid
    run.notes.append(f"speedup and fidelity recomputed from samples ({n_common} in common with ar)")
    return M.speedup(run.records, ar.records), W.fidelity_vs_ar(run.records, ar.records)


def _stats(run: RunFiles, s: dict, ar: RunFiles | None, ref: RunFiles | None) -> tuple[dict | None, dict | None]:
    """(stop reasons, stats): summary.json's when current and complete, else restated by ``summary.run_stats``."""
    stored = s.get("stats")
    if not run.records:
        if stored is None:
            run.notes.append("no intervals: summary.json has none and there are no samples")
        return s.get("stop_reasons"), stored
    ar_recs = ar.records if ar is not None and ar.records else None
    ref_recs = ref.records if ref is not None and ref.records else None
    if stored is not None and _current(stored, run, ar_recs, ref_recs):
        return s.get("stop_reasons") or W.stop_reasons(run.records), stored
    run.notes.append("intervals and tests computed from samples.jsonl by the report"
                     + (" (summary.json has none)" if stored is None else " (summary.json's are stale)"))
    stats = W.run_stats(run.records, ar_recs, ref_recs, stats_settings(stored), metrics(run, s),
                        fidelity=s.get("fidelity"))
    return W.stop_reasons(run.records), stats


def _current(stored: dict, run: RunFiles, ar_recs: list | None, ref_recs: list | None) -> bool:
    """Stored stats over the samples found, with every block the writer writes for these runs."""
    if (stored.get("tau") or {}).get("n") != len(run.records) or "tau_authors" not in stored:
        return False
    if ar_recs is not None:
        n_ar = len(M.speed_pairs(R.as_records(run.records), R.as_records(ar_recs)))   # speed pairs one machine
        if (stored.get("speedup") or {}).get("n") != n_ar or stored.get("speedup_authors") is None:
            return False
    return ref_recs is None or stored.get("quality_vs_sd") is not None


def stats_settings(stored: dict | None) -> S.StatsSettings:
    """The statistics settings the summary was written with (defaults where it has none)."""
    known = {f.name for f in fields(S.StatsSettings)}
    given = ((stored or {}).get("settings") or {}).items()
    return S.StatsSettings(**{k: v for k, v in given if k in known})


def metrics(run: RunFiles, s: dict) -> dict:
    """The metrics to test (name -> summary.Paired): the summary's quality metrics, else the task's declared
    ones, else those the samples' scores hold; as registered (see the module doc)."""
    reg = registered_metrics(s, run.task)
    names = list(s.get("quality") or {}) or list(run.directions) or [
        m.name for m in reg.values() if not m.corpus and any(m.get(r.get("score") or {}) is not None
                                                             for r in run.records)]
    return {k: reg[k] for k in names if k in reg}


def registered_metrics(s: dict, task: str | None) -> dict:
    """The metric registration: summary.json's ``metric_specs``, else the task's task.yaml in this checkout,
    else none (results of a task unknown here)."""
    from mars_bench.tasks.base import load_spec

    if s.get("metric_specs") is not None:
        return W.from_registration(s["metric_specs"])
    if task is None:   # results that do not say their task
        return {}
    try:
        return W.from_registration(load_spec(task)["metrics"])
    except ValueError:
        return {}
