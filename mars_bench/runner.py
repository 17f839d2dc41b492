"""The runner: validate, load the task's samples, skip samples already in ``samples.jsonl``, decode the
rest (records written one by one), then write ``summary.json`` atomically.

Three ways to compare methods (docs/reproduce.md):
  * one method per job (``mars-bench -m method=ar,sd,mars``): jobs run one after another;
  * interleaved (``interleave``: a list of override lists, e.g. ``+compare=methods``): one job loads the
    models once and decodes each sample with every compared method in turn, rotating the order per
    sample, so drift in the machine's speed lands on all methods alike and shows up as a wider
    interval instead of a false speedup. Each method still writes its own run directory, resumable;
  * a study (``study.batch_size`` > 0, ``run_study``): quality from batched decoding of every sample (the
    quality phase, run directories at batch size B), speed from interleaved batch-size-1 decoding of the first
    samples until each speedup's CI is narrow enough (the timed phase). Greedy lossless methods are only
    timed: their tokens are ar's, asserted on the timed samples. Records carry their phase.
"""
from __future__ import annotations

import copy
import logging
import math
import os
from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf

from . import config as C
from . import engines
from .provenance import machine, machine_label
from .recordbuild import job_fields, sample_record, sample_seed, turn_record
from .sample_writer import SampleWriter
from .storage import atomic_write_text
from .summary import summarize_run
from .system_prompts import system_prompt_text
from .tags import RunSpec, write_spec
from .wandb_logger import make_logger

log = logging.getLogger("mars_bench")


def model_dir(cfg) -> str:
    m = cfg.model
    return f"{m.name}_{m.dtype}_{m.device}" + {"off": "_nofast", "mkl": "_mklfast"}.get(m.fast_path, "")


def prepare(cfg):
    """Everything that can fail on bad input, before any model is loaded or file written."""
    from .tasks import get_task

    from .tasks.data import DataError

    C.validate(cfg)
    engines.validate(cfg)     # what the engine can run; engine=vllm: its version into engine.version (the spec)
    text = system_prompt_text(cfg.protocol.system_prompt)   # none: the task's own (no system message)
    overrides = {} if text is None else {"system_prompt": text}
    data_dir = os.environ.get("MARS_BENCH_DATA_DIR") or cfg.data_dir
    try:   # the task registry and loaders check names, options, limit and subset: bad input
        task = get_task(cfg.task.name, **overrides)
        if "prompts" in task.options:   # whose user turns: the protocol's choice, for tasks with that option
            task = get_task(cfg.task.name, **overrides, prompts=cfg.protocol.task_prompts)
        samples = task.load(data_dir, limit=cfg.limit, subset=cfg.subset)
    except DataError:
        raise
    except ValueError as e:
        raise C.ConfigError(str(e)) from None
    max_new = C.max_new_tokens_of(cfg, task.max_new_tokens)
    task_dir = Path(cfg.results_dir) / model_dir(cfg) / f"{task.name}-v{task.version}"
    return task, samples, data_dir, max_new, task_dir


class Job:
    """One method's run directory within a run: its config, spec (``tag``), method, writer and samples to do,
    and the fields its records share (``fields``): every per-job setting, resolved once here. The directory is
    named by the spec (``RunSpec.dir_name``), so a rerun of the same command finds it; the spec is written there
    as run.json, and the resolved config as config.yaml, when this job claims its first sample, before decoding it."""

    def __init__(self, cfg, interleaved: bool = False, phase: str | None = None):
        self.cfg, self.interleaved, self.phase = cfg, interleaved, phase
        self.task, self.samples, self.data_dir, self.max_new, self.task_dir = prepare(cfg)
        self.tag = RunSpec.from_config(cfg, self.max_new, task_prompts=self.task.options.get("prompts", "ours"))
        self.run_dir = self.task_dir / self.tag.dir_name
        self._check_owner()
        self.method = C.method_of(cfg)
        self.fields = job_fields(self.tag, self.task, cfg.model.name, C.draft_quant_of(cfg), interleaved, phase)
        self.writer = SampleWriter(self.run_dir / "samples.jsonl", on_start=self.write_spec)
        self.todo = {s.id for s in self.samples if s.id not in self.writer.done}
        sweep = C.RULES[self.tag.rule].sweep if self.method.speculative else None
        self.label = f"{cfg.model.name} | {self.task.name} | {self.tag.head}" + (
            f" {sweep}={self.tag.settings[sweep]:g}" if sweep else "")

    def _check_owner(self) -> None:
        """A run directory whose run.json names other settings or other weights is never resumed (one line)."""
        from .tags import read_spec

        if not (self.run_dir / "run.json").is_file():
            return
        try:
            found = read_spec(self.run_dir)
        except ValueError as e:
            raise C.ConfigError(str(e)) from None
        if found != self.tag:
            from .models.identity import describe

            what = "weights" if replace(found, model=None, draft_model=None) == replace(
                self.tag, model=None, draft_model=None) else "settings"
            raise C.ConfigError(f"{self.run_dir} holds records of other {what} (its run.json: target "
                                f"{describe(found.model)}); allowed: a run directory of this run's own spec")

    def write_spec(self) -> None:
        """run.json in the run directory (once; one already there must hold this job's spec), then the resolved
        config beside it (config.yaml)."""
        try:
            write_spec(self.run_dir, self.tag)
        except ValueError as e:
            raise C.ConfigError(str(e)) from None
        atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True))

    def summarize(self) -> dict:
        ref = self.tag.lossless_reference()
        ar_dir = self.task_dir / self.tag.baseline().dir_name if self.tag.scheme != "ar" else None
        return summarize_run(self.run_dir, self.task, self.samples, self.cfg, self.data_dir, ar_dir=ar_dir,
                             sd_dir=self.task_dir / ref.dir_name if ref else None, spec=self.tag)


def run(cfg) -> dict | list[dict]:
    """One job; with ``interleave`` set, every compared method of it, interleaved (returns their summaries)."""
    if cfg.study.batch_size:
        return run_study(cfg)
    if cfg.get("interleave"):
        return run_interleaved(cfg, variant_configs(cfg))
    job = Job(cfg)
    log.info("%s: %d samples (%d already done) -> %s", job.label, len(job.samples),
             len(job.samples) - len(job.todo), job.run_dir)
    logger = make_logger(cfg.logger, job.run_dir, cfg, spec=job.tag)
    try:
        if job.todo:   # a finished run (e.g. a reused ar baseline) loads no model: it only re-summarizes
            bar = _progress(job.label, cfg.progress, len(job.todo))
            todo = [(i, s) for i, s in enumerate(job.samples) if s.id in job.todo]
            _decode(Models(cfg, [job.method]), job, todo, logger, bar,
                    source=job.writer.claimed(todo))   # no sample twice
            bar.close()
        summary = job.summarize()
        logger.log_summary(summary)
    finally:
        job.writer.close()
        logger.close()
    log.info("%s: %s", job.label, {k: summary["totals"][k] for k in ("tokens_per_s", "tau", "n_relaxed")})
    return summary


def variant_configs(cfg) -> list:
    """The config of every entry of ``interleave`` (a list of override lists), composed like a job of a sweep
    from this job's own overrides plus the entry's; entries may change only method.* and rule.*."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    base = [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").split("=")[0] in ("interleave", "compare")]
    out = []
    for entry in cfg.interleave:
        entry = [entry] if isinstance(entry, str) else list(entry)
        bad = [o for o in entry if o.split("=")[0].lstrip("+~").split(".")[0] not in ("method", "rule")]
        if bad:
            raise C.ConfigError(f"interleave entry {bad[0]!r}; allowed: overrides of method.* and rule.* only "
                                "(the compared methods share model, task and decoding settings)")
        v = compose(config_name="config", overrides=base + entry)
        OmegaConf.set_struct(v, False)
        v.interleave = []
        v.study.batch_size = 0   # each variant is a plain run; the study drives them (run_study)
        out.append(v)
    return out


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


def run_study(cfg) -> list[dict]:
    """Study mode (``config.StudyConfig``): the quality phase (every sample, batched at study.batch_size, every
    method but the greedy lossless ones), then the timed phase (batch size 1, interleaved, the first samples,
    growing until every speedup's CI half-width is within study.timed_ci of the speedup or study.timed_max is
    reached). Both phases resume: each writes its own run directories (batch size in the spec). Returns the
    summaries, quality runs first."""
    C.validate_study(cfg)   # the variants are plain runs: their own validation no longer sees study.*
    st = cfg.study
    variants = variant_configs(cfg)
    probe = [Job(v, interleaved=True, phase="timed") for v in variants]   # every variant validated before loading
    quality = [Job(_with(p.cfg, batch_size=int(st.batch_size)), phase="quality") for p in probe
               if not tokens_are_ars(p.tag)]
    if not any(j.tag.scheme == "ar" for j in probe):
        raise C.ConfigError("study without ar in interleave; allowed: a list that includes [method=ar] (speedup and "
                            "every quality delta are against it)")
    cap = min(len(probe[0].samples), int(st.timed_max or len(probe[0].samples)))
    ctx = [None]

    def models():
        if ctx[0] is None:
            ctx[0] = Models(cfg, [j.method for j in probe])
        return ctx[0]

    log.info("study: quality phase, %d methods x %d samples at batch size %d (%s only timed: tokens are ar's)",
             len(quality), len(probe[0].samples), st.batch_size,
             ", ".join(j.tag.head for j in probe if tokens_are_ars(j.tag)) or "none")
    summaries = _run_batched(cfg, quality, models)
    n = min(int(st.timed_min), cap)
    while True:
        jobs = [Job(_with(v, limit=n), interleaved=True, phase="timed") for v in variants]
        timed = run_interleaved(cfg, [j.cfg for j in jobs], ctx=models if any(j.todo for j in jobs) else None,
                                jobs=jobs)
        widths = [w for j, s in zip(jobs, timed) if j.method.speculative for w in [_half_width(s)]]
        worst = max((math.inf if w is None else w) for w in widths) if widths else 0.0
        log.info("study: timed phase, %d samples: widest speedup CI +-%.1f%% (target +-%.1f%%)", n, 100 * worst,
                 100 * st.timed_ci)
        if worst <= st.timed_ci or n >= cap:
            break
        grow = (worst / st.timed_ci) ** 2 if math.isfinite(worst) else 2.0   # CI width ~ 1 / sqrt(n)
        n = min(cap, max(n + 4, math.ceil(1.1 * n * grow)))
    _check_identity(jobs, timed)
    return summaries + timed


def _check_identity(jobs: list, summaries: list, row_invariant: bool | None = None) -> list[dict]:
    """Every timed sample of a greedy lossless method has ar's tokens. On a row-invariant backend (the CPU
    path: a row's logits do not depend on how many rows a forward scores) a difference is a StudyError (the
    records stay). Elsewhere (CUDA: GEMM and SDPA kernels change with the rows scored, so near-ties flip) it
    is measured, not fatal: each such job gets ``identity.json`` in its run directory and ``identity`` in its
    summary (``identity_report``). Returns those reports."""
    if row_invariant is None:
        row_invariant = backend_row_invariant(jobs[0].cfg) if jobs else True
    reports = []
    for job, s in zip(jobs, summaries):
        if job.tag.scheme != "ar" and tokens_are_ars(job.tag):
            per_sample = ((s.get("fidelity") or {}).get("per_sample")) or {}
            problem = identity_problem(per_sample, len(job.samples))
            if problem and row_invariant:
                raise StudyError(f"{job.label}: {problem}; greedy {job.tag.head} must reproduce ar's tokens "
                                 f"(records kept in {job.run_dir})")
            if not row_invariant:
                from .storage import atomic_write_json, read_samples

                recs, _ = read_samples(job.run_dir / "samples.jsonl")
                report = identity_report(per_sample, {r["id"]: r for r in recs}, len(job.samples))
                atomic_write_json(job.run_dir / "identity.json", report)
                s["identity"] = report
                reports.append(report)
                if problem:
                    log.warning("%s: %s (not row-invariant: mismatch rate %.3f recorded in identity.json)", job.label,
                                problem, report["mismatch_rate"])
    return reports


WARMUP_TOKENS = 16    # new tokens of each method's warm-up decode


def warm_up(ctx, jobs: list, sample) -> None:
    """Before the first timed decode on a GPU: ``sample`` decoded once by every job's method with a short budget,
    the records discarded (CUDA context, kernels, the allocator's pools and autotuning are paid here, not by
    whichever method happens to come first; the authors' scripts warm up too)."""
    for job in jobs:
        keep = job.max_new
        job.max_new = min(keep, WARMUP_TOKENS)
        try:
            ctx.decode(job, sample, 0)
        finally:
            job.max_new = keep


def backend_row_invariant(cfg) -> bool:
    """Whether the study's target gives a row the same logits whatever the rows a forward scores: the CPU
    path (tested token-identical to ar); a CUDA device or a device_map is not."""
    from .models.pairs import resolve_device

    return not cfg.model.get("device_map") and resolve_device(cfg.model.device).type == "cpu"


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


def _run_batched(cfg, jobs: list, models) -> list[dict]:
    """Each job's missing samples at its batch size, one job after another (no timing is read from them), then
    the summaries, ar first (the others compare to it)."""
    loggers = [make_logger(j.cfg.logger, j.run_dir, j.cfg, spec=j.tag) for j in jobs]
    try:
        todo = sum(len(j.todo) for j in jobs)
        bar = _progress(f"{cfg.model.name} | {jobs[0].task.name} | quality phase", cfg.progress and todo, todo)
        for j, job in enumerate(jobs):
            rest = [(i, s) for i, s in enumerate(job.samples) if s.id in job.todo]
            if rest:
                _decode(models(), job, rest, loggers[j], bar, source=job.writer.claimed(rest))
        bar.close()
        summaries = _summarize(jobs, loggers)
    finally:
        _close(jobs, loggers)
    return summaries


def _summarize(jobs: list, loggers: list) -> list[dict]:
    """Each job's summary.json, ar first (the others compare to it), logged; in the jobs' order."""
    summaries = [None] * len(jobs)
    for j in sorted(range(len(jobs)), key=lambda j: jobs[j].method.speculative):
        summaries[j] = jobs[j].summarize()
        loggers[j].log_summary(summaries[j])
    return summaries


def _close(jobs: list, loggers: list) -> None:
    for job, lg in zip(jobs, loggers):
        job.writer.close()
        lg.close()


def run_interleaved(cfg, variants: list, ctx=None, jobs: list | None = None) -> list[dict]:
    """Every variant interleaved at its batch size B (the same for all: entries change only method.* and rule.*):
    chunks of samples, each decoded by every compared method in turn, the order rotated per chunk. At B = 1 a
    chunk is one sample (each sample decoded by every method back to back: the timed comparison); at B > 1 it
    is CHUNK_BATCHES * B samples, so that each method's batch refills. ``ctx``: a callable returning loaded
    Models (loaded here when None); ``jobs``: the variants' Jobs when the caller made them."""
    jobs = jobs or [Job(v, interleaved=True) for v in variants]   # every variant validated before any model loads
    tags = [j.tag.dir_name for j in jobs]
    dup = {t for t in tags if tags.count(t) > 1}
    if dup:
        raise C.ConfigError(f"interleave lists the same run twice: {sorted(dup)[0]}")
    samples = jobs[0].samples
    todo = sum(len(j.todo) for j in jobs)
    log.info("interleaved: %d methods x %d samples (%d decodes to do) on %s", len(jobs), len(samples), todo,
             jobs[0].task.name)
    loggers = [make_logger(j.cfg.logger, j.run_dir, j.cfg, spec=j.tag) for j in jobs]
    try:
        if todo:
            ctx = ctx() if ctx is not None else Models(cfg, [j.method for j in jobs])
            if not backend_row_invariant(cfg):      # warm-up (issue 32): see warm_up
                warm_up(ctx, jobs, samples[0])
            bar = _progress(f"{cfg.model.name} | {jobs[0].task.name} | {len(jobs)} methods interleaved",
                            cfg.progress, todo)
            batch_size = jobs[0].tag.batch_size
            chunk = 1 if batch_size == 1 else CHUNK_BATCHES * batch_size
            indexed = list(enumerate(samples))
            for c, start in enumerate(range(0, len(indexed), chunk)):
                for n in range(len(jobs)):           # rotate the order per chunk
                    j = (c + n) % len(jobs)
                    mine = [(i, s) for i, s in indexed[start:start + chunk]   # another process may hold one
                            if s.id in jobs[j].todo and jobs[j].writer.claim(s.id)]
                    if mine:
                        _decode(ctx, jobs[j], mine, loggers[j], bar, order=n)
            for j, job in enumerate(jobs):           # samples another process held: wait, take over if it died
                rest = [(i, smp) for i, smp in indexed if smp.id in job.todo]
                if rest:
                    _decode(ctx, job, rest, loggers[j], bar, source=job.writer.claimed(rest))
            bar.close()
        summaries = _summarize(jobs, loggers)
    finally:
        _close(jobs, loggers)
    for j, s in zip(jobs, summaries):
        log.info("%s: %s", j.label, {k: s["totals"][k] for k in ("tokens_per_s", "tau", "n_relaxed")})
    return summaries


CHUNK_BATCHES = 4   # interleaved and batched: each method decodes 4 x batch_size samples in turn


def _decode(ctx, job: Job, todo: list, logger, bar, order: int = 0, source=None) -> None:
    """The job's samples ``todo`` ([(index, sample)]) decoded (``Models.decode_batched``), each record written
    as it finishes."""
    ctx.decode_batched(job, todo, lambda sample, rec: (_write(job, sample, rec, logger), bar.update(1)), order=order,
                       source=source)


def _write(job: Job, sample, record: dict, logger) -> None:
    job.writer.write(record)
    job.todo.discard(sample.id)
    logger.log_sample(record)


class Models:
    """The model pair (and the drafting heads the methods' schemes declare), loaded once for every method of a run."""

    def __new__(cls, cfg, methods):   # another engine (e.g. vllm) decodes the samples: engines.models, same records
        if (cfg.get("engine") or {}).get("name", engines.NATIVE) != engines.NATIVE:
            return engines.models(cfg, methods)
        return super().__new__(cls)

    def __init__(self, cfg, methods):
        from .models import fastpath
        from .models.pairs import eos_ids, load_pair

        self.pair = load_pair(cfg.model, need_draft=any(m.scheme.draft_lm for m in methods))
        heads = {m.scheme.head.key: m.scheme.head for m in methods if m.scheme.head is not None}
        # model.<key> -> the loaded head (decode.drafting.Head), each loaded once
        self.heads = {key: head.load(cfg.model[key], self.pair.target) for key, head in heads.items()}
        self.kernel = fastpath.kind(self.pair.target.model)   # recorded: which linear kernel the target ran on
        self.machine = machine(str(cfg.model.device))         # recorded: CPU, instruction sets, threads (GPU)
        log.info("machine: %s | kernel %s", machine_label(self.machine), self.kernel)
        self.eos = eos_ids(self.pair.target.model, self.pair.tokenizer)

    def decode(self, job: Job, sample, index: int, order: int = 0) -> dict:
        """One sample (all its turns) with the job's method: ``decode_batched`` of one; returns its record."""
        out = []
        self.decode_batched(job, [(index, sample)], lambda s, rec: out.append(rec), order)
        return out[0]

    def decode_batched(self, job: Job, todo: list, write, order: int = 0, source=None) -> None:
        """Samples ``todo`` ([(index, sample)]) with the job's method at its batch size B (decode.engine; B = 1:
        a batch of one): a sample's turns run in sequence in its slot, each seeded by ``sample_seed``;
        ``write(sample, record)`` is called as each sample finishes, in finish order. ``source``: an iterable
        over (a part of) ``todo`` read lazily, one pair as a slot frees (default: ``todo``); the memory check
        uses all of ``todo``."""
        from .decode.backend import check_memory
        from .decode.generate import Request, generate_batch
        from .tasks import build_messages

        task, tok, bsz, seed = job.task, self.pair.tokenizer, job.tag.batch_size, job.tag.seed
        scheme = job.method.scheme          # what it drafts with (decode.drafting)
        dcfg = C.decode_config(job.cfg, job.max_new, self.eos, task.stop_strings)
        state = {}      # sample id -> (outputs, turn records)

        def request(sample, index, t):
            state.setdefault(sample.id, ([], []))
            ids = self.pair.prompt_ids(build_messages(task, sample, state[sample.id][0], t))
            return Request(ids, seed=sample_seed(seed, index, t), key=(sample, index, t))

        def on_done(req, res):
            sample, index, t = req.key
            outputs, turns = state[sample.id]
            outputs.append(tok.decode(res.tokens, skip_special_tokens=True))
            turns.append(turn_record(res, req.prompt, outputs[-1], tok, batched=bsz > 1))
            if t + 1 < len(sample.turns):
                return request(sample, index, t + 1)
            write(sample, sample_record(job, sample, index, turns, task.score(sample, outputs), self.kernel, order,
                                        self.machine))
            del state[sample.id]
            return None

        longest = max(len(request(s, i, 0).prompt) for i, s in todo)
        state.clear()
        turns = max(len(s.turns) for _, s in todo)
        try:   # a conservative bound: later turns hold earlier prompts and outputs
            step = _tokens_per_step(job.method)
            check_memory([self.pair.target, self.pair.draft if scheme.draft_lm else None], bsz,
                         turns * (longest + job.max_new + step), step)
        except ValueError as e:
            raise C.ConfigError(str(e)) from None
        queue = (request(s, i, 0) for i, s in (todo if source is None else source))
        draft = self.heads[scheme.head.key] if scheme.head is not None else self.pair.draft
        generate_batch(self.pair.target, draft, tok, queue, job.method, dcfg, bsz, on_done)


def _tokens_per_step(method) -> int:
    """Most tokens one target forward scores per row: k + 1 (chains), the tree's size (trees)."""
    if method.scheme.tree:
        t = method.tree
        return len(t["static_paths"]) + 1 if t.get("static_paths") else int(t["total_tokens"])
    return method.k + 1


class _NoBar:
    def update(self, n): pass
    def close(self): pass


def _progress(label: str, enabled: bool, total: int):
    """A progress bar over ``total`` samples (a no-op one when disabled)."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(desc=label, unit="sample", dynamic_ncols=True, total=total)
