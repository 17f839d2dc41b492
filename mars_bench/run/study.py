"""Study mode (``study.batch_size`` > 0, ``config.StudyConfig``): quality from batched decoding of every sample
(the quality phase, run directories at batch size B), speed from interleaved batch-size-1 decoding of the first
samples until each speedup's CI is narrow enough (the timed phase). Greedy lossless methods are only timed: their
tokens are ar's, asserted on the timed samples. Records carry their phase. The jobs, the models and the
interleaved and batched paths are the runner's (mars_bench/run/runner.py: ``Job``, ``models_for``,
``run_interleaved``, ``run_batched``); every job is built once, the timed ones narrowed to the first n samples as
n grows (``Job.first``). ``cli.run_or_exit`` sends a study config here.
"""
from __future__ import annotations

import copy
import logging
import math

from mars_bench.base.errors import ConfigError
from mars_bench.config.overrides import Launch
from mars_bench.run.runner import Job, models_for, run_batched, run_interleaved
from mars_bench.store.spec import RunSpec
from mars_bench.config.validation import validate_study

log = logging.getLogger("mars_bench")


def _with(cfg, **values):
    """A copy of a (non-struct) config with top-level keys set."""
    out = copy.deepcopy(cfg)
    for key, value in values.items():
        out[key] = value
    return out


def tokens_are_ars(spec: RunSpec) -> bool:
    """Greedy decoding with a lossless rule: the outputs are ar's token for token (tested), so a study times
    such a method but never decodes it for quality."""
    return spec.temperature == 0.0 and spec.lossless


def _half_width(summary: dict) -> float | None:
    """Half-width of a run's speedup CI relative to the speedup (None: no CI yet)."""
    est = (summary.get("stats") or {}).get("speedup") or {}
    if est.get("value") and est.get("lo") is not None and est.get("hi") is not None:
        return (est["hi"] - est["lo"]) / 2.0 / est["value"]
    return None


class StudyError(RuntimeError):
    """A study's invariant broke (a greedy lossless method's tokens differ from ar's): a bug, not bad input."""


def run_study(cfg, launch: Launch) -> list[dict]:
    """Study mode (``config.StudyConfig``): the quality phase (every sample, batched at study.batch_size, every
    method but the greedy lossless ones), then the timed phase (batch size 1, interleaved, the first samples,
    growing until every speedup's CI half-width is within study.timed_ci of the speedup or study.timed_max is
    reached). Both phases resume: each writes its own run directories (batch size in the spec). ``launch``: the
    CLI's (its ``variants``: the compared methods). Returns the summaries, quality runs first."""
    validate_study(cfg)   # the variants are plain runs: their own validation no longer sees study.*
    st = cfg.study
    timed = [Job(v, interleaved=True, phase="timed") for v in launch.variants]   # all validated before loading
    quality = [Job(_with(t.cfg, batch_size=int(st.batch_size)), phase="quality") for t in timed
               if not tokens_are_ars(t.tag)]
    if not any(j.tag.scheme == "ar" for j in timed):
        raise ConfigError("study without ar in interleave; allowed: a list that includes [method=ar] (speedup and "
                            "every quality delta are against it)")
    cap = min(len(timed[0].samples), int(st.timed_max or len(timed[0].samples)))
    ctx = [None]

    def models():
        if ctx[0] is None:
            ctx[0] = models_for(timed)   # one set of models per engine the entries name
        return ctx[0]

    log.info("study: quality phase, %d methods x %d samples at batch size %d (%s only timed: tokens are ar's)",
             len(quality), len(timed[0].samples), st.batch_size,
             ", ".join(j.tag.head for j in timed if tokens_are_ars(j.tag)) or "none")
    summaries = run_batched(quality, models, launch.sweep, label="quality phase")
    n = min(int(st.timed_min), cap)
    while True:
        jobs = [j.first(n) for j in timed]   # the same jobs, their first n samples: nothing validated or loaded again
        summed = run_interleaved(jobs, models, launch.sweep)
        widths = [w for j, s in zip(jobs, summed) if j.method.speculative for w in [_half_width(s)]]
        worst = max((math.inf if w is None else w) for w in widths) if widths else 0.0
        log.info("study: timed phase, %d samples: widest speedup CI +-%.1f%% (target +-%.1f%%)", n, 100 * worst,
                 100 * st.timed_ci)
        if worst <= st.timed_ci or n >= cap:
            break
        grow = (worst / st.timed_ci) ** 2 if math.isfinite(worst) else 2.0   # CI width ~ 1 / sqrt(n)
        n = min(cap, max(n + 4, math.ceil(1.1 * n * grow)))
    _check_identity(jobs, summed)
    return summaries + summed


def _check_identity(jobs: list, summaries: list, row_invariant: bool | None = None) -> list[dict]:
    """Every timed sample of a greedy lossless method has ar's tokens. On a row-invariant backend (the CPU
    path: a row's logits do not depend on how many rows a forward scores) a difference is a StudyError (the
    records stay). Elsewhere (CUDA: GEMM and SDPA kernels change with the rows scored, so near-ties flip) it
    is measured, not fatal: each such job gets ``identity.json`` in its run directory and ``identity`` in its
    summary (``identity_report``). Returns those reports."""
    if row_invariant is None:
        row_invariant = jobs[0].row_invariant if jobs else True
    reports = []
    for job, s in zip(jobs, summaries):
        if job.tag.scheme != "ar" and tokens_are_ars(job.tag):
            per_sample = ((s.get("fidelity") or {}).get("per_sample")) or {}
            problem = identity_problem(per_sample, len(job.samples))
            if problem and row_invariant:
                raise StudyError(f"{job.label}: {problem}; greedy {job.tag.head} must reproduce ar's tokens "
                                 f"(records kept in {job.run_dir})")
            if not row_invariant:
                from mars_bench.store.io import atomic_write_json, read_samples

                recs, _ = read_samples(job.run_dir / "samples.jsonl")
                report = identity_report(per_sample, {r["id"]: r for r in recs}, len(job.samples))
                atomic_write_json(job.run_dir / "identity.json", report)
                s["identity"] = report
                reports.append(report)
                if problem:
                    log.warning("%s: %s (not row-invariant: mismatch rate %.3f recorded in identity.json)", job.label,
                                problem, report["mismatch_rate"])
    return reports



def identity_report(per_sample: dict, records: dict, n: int) -> dict:
    """Greedy identity measured where it is not guaranteed: the mismatch rate over compared samples and, per
    divergent sample, the first divergent token and the method's top-1 minus top-2 raw logit there (a tiny
    gap: a near-tie flipped by kernel rounding; a large one: a bug). ``records``: sample id -> record."""
    bad = sorted(i for i, d in per_sample.items() if not d["identical"])
    out = []
    for i in bad:
        pos = per_sample[i].get("first_divergence")
        gap = logit_gap(records[i], pos) if i in records and pos is not None else None
        out.append({"sample": i, "first_divergence": pos, "logit_gap": gap})
    return {"compared": len(per_sample), "expected": n, "mismatched": len(bad),
            "mismatch_rate": len(bad) / len(per_sample) if per_sample else None, "divergent": out}


def logit_gap(record: dict, position: int) -> float | None:
    """z1 - z2 of the target's raw logits where the record committed output token ``position`` (over its turns'
    output ids in order); None where none was recorded (a bonus token after a fully accepted draft, or ar)."""
    for turn in record["turns"]:
        n = len(turn["output_ids"])
        if position >= n:
            position -= n
            continue
        start = zi = oi = 0
        outcome = turn.get("outcome") or ""
        for a in turn.get("accepted") or []:
            oi += a
            rejected = oi < len(outcome) and outcome[oi] == "X"
            oi += rejected
            if position < start + a + 1:
                j = position - start
                if j < a or rejected:
                    return round(turn["z1"][zi + j] - turn["z2"][zi + j], 4)
                return None
            start, zi = start + a + 1, zi + a + rejected
        return None
    return None


def identity_problem(per_sample: dict, n: int) -> str | None:
    """What breaks 'every one of the n samples is token-identical to ar' in a summary's per-sample fidelity."""
    bad = sorted(i for i, d in per_sample.items() if not d["identical"])
    if bad:
        return f"{len(bad)} of {len(per_sample)} samples differ from ar's tokens (first: {bad[0]})"
    if len(per_sample) < n:
        return f"only {len(per_sample)} of {n} samples could be compared with ar's"
    return None
