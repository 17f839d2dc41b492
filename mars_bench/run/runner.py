"""The runner: validate, load the task's samples, skip samples already in ``samples.jsonl``, decode the
rest (records written one by one), then write ``summary.json`` atomically.

Three ways to compare methods (docs/reproduce.md):
  * one method per job (``mars-bench -m method=ar,sd,mars``): jobs run one after another;
  * interleaved (``interleave``: a list of override lists, e.g. ``+compare=methods``): one job loads the
    models once and decodes each sample with every compared method in turn, rotating the order per
    sample, so drift in the machine's speed lands on all methods alike and shows up as a wider
    interval instead of a false speedup. Each method still writes its own run directory, resumable;
  * a study (``study.batch_size`` > 0): mars_bench/run/study.py, which drives the jobs and the interleaved
    path defined here.

A job's settings are resolved once, in ``Job`` (its ``Method``, spec, draft quantization, stats settings, the
resolved config as a plain dict), and handed down as typed values; what the command line chose beyond the config
(the interleaved variants, the sweep's name) comes from the CLI as a ``Launch``. Study mode uses ``Job``,
``models_for``, ``run_interleaved`` and ``run_batched``.
"""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from omegaconf import OmegaConf

from mars_bench.config.spec import run_spec
from mars_bench.base.errors import ConfigError
from mars_bench.decode.rules import RULES
from mars_bench.decode.types import Method
from mars_bench import engines
from mars_bench.config.overrides import Launch
from mars_bench.config.settings import decode_config, draft_quant_of, max_new_tokens_of
from mars_bench.stats import StatsSettings
from mars_bench.store import contention
from mars_bench.store.provenance import machine, machine_label, process_commit
from mars_bench.store.recordbuild import job_fields, sample_record, sample_seed, turn_record
from mars_bench.store.writer import SampleWriter
from mars_bench.store.io import atomic_write_text
from mars_bench.store.summary import summarize_run
from mars_bench.tasks.system_prompts import system_prompt_text
from mars_bench.store.spec import write_spec
from mars_bench.config.validation import validate
from mars_bench.run.wandb_logger import make_logger

log = logging.getLogger("mars_bench")


def model_dir(cfg) -> str:
    m = cfg.model
    return f"{m.name}_{m.dtype}_{m.device}" + {"off": "_nofast", "mkl": "_mklfast"}.get(m.fast_path, "")


class Prepared(NamedTuple):
    """What ``prepare`` resolves from a config: the task, its samples, the data folder, the budget, the task's
    results folder and the ``Method`` validation resolved."""
    task: object
    samples: list
    data_dir: str | None
    max_new: int
    task_dir: Path
    method: Method


def prepare(cfg) -> Prepared:
    """Everything that can fail on bad input, before any model is loaded or file written."""
    from mars_bench.tasks import get_task

    from mars_bench.tasks.data import DataError

    method = validate(cfg)    # resolves the job's Method, once
    engines.validate(cfg, method)   # what the engine can run; engine=vllm: its version into engine.version (the spec)
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
        raise ConfigError(str(e)) from None
    max_new = max_new_tokens_of(cfg, task.max_new_tokens)
    task_dir = Path(cfg.results_dir) / model_dir(cfg) / f"{task.name}-v{task.version}"
    return Prepared(task, samples, data_dir, max_new, task_dir, method)


class Job:
    """One method's run directory within a run: its config, spec (``tag``), method, writer and samples to do,
    and the fields its records share (``fields``): every per-job setting, resolved once here (the ``Method`` by
    validation, the spec, the draft quantization, the stats settings, ``config``: the resolved config as a plain
    dict). The directory is named by the spec (``RunSpec.dir_name``), so a rerun of the same command finds it; the
    spec is written there as run.json, and the resolved config as config.yaml, when this job claims its first
    sample, before decoding it."""

    def __init__(self, cfg, interleaved: bool = False, phase: str | None = None):
        self.cfg, self.interleaved, self.phase = cfg, interleaved, phase
        self.task, samples, self.data_dir, self.max_new, self.task_dir, self.method = prepare(cfg)
        self.draft_quant = draft_quant_of(cfg, self.method)
        self.tag = run_spec(cfg, self.max_new, self.method, self.draft_quant,
                            task_prompts=self.task.options.get("prompts", "ours"))
        self.model, self.stats, self.progress = cfg.model.name, StatsSettings.from_cfg(cfg), bool(cfg.progress)
        self.config = OmegaConf.to_container(cfg, resolve=True)   # after prepare: engine.version is filled
        self.run_dir = self.task_dir / self.tag.dir_name
        self._check_owner()
        self.fields = {**job_fields(self.tag, self.task, self.model, self.draft_quant, interleaved, phase),
                       "commit": process_commit()}
        self._loaded = samples
        self._start(samples)
        sweep = RULES[self.tag.rule].sweep if self.method.speculative else None
        self.label = f"{self.model} | {self.task.name} | {self.tag.head}" + (
            f" {sweep}={self.tag.settings[sweep]:g}" if sweep else "")

    def _start(self, samples: list) -> None:
        """``samples`` to run, a writer on the run directory, and the samples still to do."""
        self.samples = samples
        self.writer = SampleWriter(self.run_dir / "samples.jsonl", on_start=self.write_spec)
        self.todo = {s.id for s in self.samples if s.id not in self.writer.done}

    def first(self, n: int) -> "Job":
        """This job narrowed to the first ``n`` of the samples it loaded, as if built with ``limit=n`` (study
        mode's timed sample as it grows; the config it records says so), with a writer of its own: no
        validation, task load or spec again."""
        self.config = {**self.config, "limit": n}
        self._start(self._loaded[:n])
        return self

    @cached_property
    def row_invariant(self) -> bool:
        """Whether this job's target gives a row the same logits whatever the rows a forward scores
        (``backend_row_invariant``)."""
        return backend_row_invariant(self.cfg)

    def _check_owner(self) -> None:
        """A run directory whose run.json names other settings or other weights is never resumed (one line)."""
        from mars_bench.store.spec import read_spec

        if not (self.run_dir / "run.json").is_file():
            return
        try:
            found = read_spec(self.run_dir)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if found != self.tag:
            from mars_bench.models.identity import describe

            what = "weights" if replace(found, model=None, draft_model=None) == replace(
                self.tag, model=None, draft_model=None) else "settings"
            raise ConfigError(f"{self.run_dir} holds records of other {what} (its run.json: target "
                                f"{describe(found.model)}); allowed: a run directory of this run's own spec")

    def write_spec(self) -> None:
        """run.json in the run directory (once; one already there must hold this job's spec), then the resolved
        config beside it (config.yaml)."""
        try:
            write_spec(self.run_dir, self.tag)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(self.config))

    def logger(self, sweep: str):
        """This job's experiment-tracker logger (``make_logger``); ``sweep``: the ``Launch``'s."""
        return make_logger(self.cfg.logger, self.run_dir, self.config, spec=self.tag, sweep=sweep)

    def summarize(self) -> dict:
        ref = self.tag.lossless_reference()
        ar_dir = self.task_dir / self.tag.baseline().dir_name if self.tag.scheme != "ar" else None
        return summarize_run(self.run_dir, self.task, self.samples, self.tag, model=self.model,
                             data_dir=self.data_dir, settings=self.stats, config=self.config,
                             draft_quant=self.draft_quant, ar_dir=ar_dir,
                             sd_dir=self.task_dir / ref.dir_name if ref else None)


def run(cfg, launch: Launch = Launch()) -> dict | list[dict]:
    """One job; with ``interleave`` set, every compared method of it (``launch.variants``, composed by the CLI),
    interleaved (returns their summaries). A study (``study.batch_size`` > 0) is ``study.run_study``'s, never
    this."""
    if cfg.study.batch_size:
        raise ValueError("runner.run is the plain run; a config with study.batch_size > 0 goes to study.run_study")
    if cfg.get("interleave"):
        if not launch.variants:
            raise ValueError("interleave is set but launch.variants is empty; allowed: the variants the CLI "
                             "composes (cli.app.launch_of)")
        jobs = [Job(v, interleaved=True) for v in launch.variants]   # every variant validated before any model loads
        return run_interleaved(jobs, lambda: models_for(jobs), launch.sweep)
    job = Job(cfg)
    log.info("%s: %d samples (%d already done) -> %s", job.label, len(job.samples),
             len(job.samples) - len(job.todo), job.run_dir)
    logger = job.logger(launch.sweep)
    try:
        if job.todo:   # a finished run (e.g. a reused ar baseline) loads no model: it only re-summarizes
            mark = contention.Probe().begin()
            models = models_for([job])
            say_if_busy(mark, job.tag.batch_size)
            bar = progress_bar(job.label, job.progress, len(job.todo))
            todo = [(i, s) for i, s in enumerate(job.samples) if s.id in job.todo]
            decode_samples(models, job, todo, logger, bar, source=job.writer.claimed(todo))   # no sample twice
            bar.close()
        summary = job.summarize()
        logger.log_summary(summary)
    finally:
        job.writer.close()
        logger.close()
    log.info("%s: %s", job.label, {k: summary["totals"][k] for k in ("tokens_per_s", "tau", "n_relaxed")})
    return summary


def say_if_busy(mark, batch_size: int) -> None:
    """Before a timed phase (batch size 1): one line when the machine has been busy since ``mark``
    (``contention.busy_since``): its samples would be flagged by the rule of docs/timing.md."""
    why = contention.busy_since(mark) if batch_size == 1 and contention.measuring() else None
    if why:
        log.warning("machine busy before timing (%s; docs/timing.md): samples timed under contention are flagged, "
                    "left out of every speedup, and re-timed when this command is run again", why)


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
    from mars_bench.models.pairs import resolve_device

    return not cfg.model.get("device_map") and resolve_device(cfg.model.device).type == "cpu"


def summarize_jobs(jobs: list, loggers: list) -> list[dict]:
    """Each job's summary.json, ar first (the others compare to it), logged; in the jobs' order."""
    summaries = [None] * len(jobs)
    for j in sorted(range(len(jobs)), key=lambda j: jobs[j].method.speculative):
        summaries[j] = jobs[j].summarize()
        loggers[j].log_summary(summaries[j])
    return summaries


def close_jobs(jobs: list, loggers: list) -> None:
    for job, lg in zip(jobs, loggers):
        job.writer.close()
        lg.close()


def run_interleaved(jobs: list, models, sweep: str = "run") -> list[dict]:
    """Every job interleaved at its batch size B (the same for all: entries change only method.* and rule.*):
    chunks of samples, each decoded by every compared method in turn, the order rotated per chunk. At B = 1 a
    chunk is one sample (each sample decoded by every method back to back: the timed comparison); at B > 1 it
    is CHUNK_BATCHES * B samples, so that each method's batch refills. ``models``: a callable returning the
    loaded Models (called only when there is something to decode); ``sweep``: the ``Launch``'s (the loggers')."""
    tags = [j.tag.dir_name for j in jobs]
    dup = {t for t in tags if tags.count(t) > 1}
    if dup:
        raise ConfigError(f"interleave lists the same run twice: {sorted(dup)[0]}")
    samples = jobs[0].samples
    todo = sum(len(j.todo) for j in jobs)
    log.info("interleaved: %d methods x %d samples (%d decodes to do) on %s", len(jobs), len(samples), todo,
             jobs[0].task.name)
    loggers = [j.logger(sweep) for j in jobs]
    try:
        if todo:
            mark = contention.Probe().begin()
            ctx = models()
            if not jobs[0].row_invariant:           # warm-up (issue 32): see warm_up
                warm_up(ctx, jobs, samples[0])
            say_if_busy(mark, jobs[0].tag.batch_size)
            bar = progress_bar(f"{jobs[0].model} | {jobs[0].task.name} | {len(jobs)} methods interleaved",
                               jobs[0].progress, todo)
            batch_size = jobs[0].tag.batch_size
            chunk = 1 if batch_size == 1 else CHUNK_BATCHES * batch_size
            indexed = list(enumerate(samples))
            for c, start in enumerate(range(0, len(indexed), chunk)):
                for n in range(len(jobs)):           # rotate the order per chunk
                    j = (c + n) % len(jobs)
                    mine = [(i, s) for i, s in indexed[start:start + chunk]   # another process may hold one
                            if s.id in jobs[j].todo and jobs[j].writer.claim(s.id)]
                    if mine:
                        decode_samples(ctx, jobs[j], mine, loggers[j], bar, order=n)
            for j, job in enumerate(jobs):           # samples another process held: wait, take over if it died
                rest = [(i, smp) for i, smp in indexed if smp.id in job.todo]
                if rest:
                    decode_samples(ctx, job, rest, loggers[j], bar, source=job.writer.claimed(rest))
            bar.close()
        summaries = summarize_jobs(jobs, loggers)
    finally:
        close_jobs(jobs, loggers)
    for j, s in zip(jobs, summaries):
        log.info("%s: %s", j.label, {k: s["totals"][k] for k in ("tokens_per_s", "tau", "n_relaxed")})
    return summaries


def run_batched(jobs: list, models, sweep: str = "run", label: str = "batched") -> list[dict]:
    """Each job's missing samples at its batch size, one job after another (no timing is read from them), then
    the summaries, ar first (the others compare to it). ``models``: as ``run_interleaved``'s; ``label``: the
    progress bar's last part."""
    if not jobs:
        return []
    loggers = [j.logger(sweep) for j in jobs]
    try:
        todo = sum(len(j.todo) for j in jobs)
        bar = progress_bar(f"{jobs[0].model} | {jobs[0].task.name} | {label}", jobs[0].progress and todo, todo)
        for j, job in enumerate(jobs):
            rest = [(i, s) for i, s in enumerate(job.samples) if s.id in job.todo]
            if rest:
                decode_samples(models(), job, rest, loggers[j], bar, source=job.writer.claimed(rest))
        bar.close()
        summaries = summarize_jobs(jobs, loggers)
    finally:
        close_jobs(jobs, loggers)
    return summaries


CHUNK_BATCHES = 4   # interleaved and batched: each method decodes 4 x batch_size samples in turn


def models_for(jobs: list):
    """The loaded models of interleaved jobs: one ``Models`` per engine they name, each loaded once with its jobs'
    methods; several engines (an entry saying engine=...): ``PerEngine`` sends each job to its own."""
    by_engine: dict = {}
    for j in jobs:
        by_engine.setdefault(j.cfg.engine.name, []).append(j)
    loaded = {name: engine_models(js[0].cfg, [j.method for j in js]) for name, js in by_engine.items()}
    return next(iter(loaded.values())) if len(loaded) == 1 else PerEngine(loaded)


def engine_models(cfg, methods: list):
    """The loaded models that decode ``methods`` (every method of one engine, loaded once): ``NativeModels`` for the
    native engine, else the engine's own (``engines.models``; same records)."""
    if cfg.engine.name != engines.NATIVE:
        return engines.models(cfg, methods)
    return NativeModels(cfg.model, methods)


class PerEngine:
    """Interleaved jobs of several engines: each job's ``decode`` / ``decode_batched`` go to its engine's Models."""

    def __init__(self, loaded: dict):
        self.loaded = loaded

    def of(self, job):
        return self.loaded[job.cfg.engine.name]

    def decode(self, job, sample, index: int, order: int = 0) -> dict:
        return self.of(job).decode(job, sample, index, order)

    def decode_batched(self, job, todo: list, write, order: int = 0, source=None) -> None:
        self.of(job).decode_batched(job, todo, write, order=order, source=source)


def decode_samples(ctx, job: Job, todo: list, logger, bar, order: int = 0, source=None) -> None:
    """The job's samples ``todo`` ([(index, sample)]) decoded (the loaded models' ``decode_batched``), each record
    written as it finishes."""
    ctx.decode_batched(job, todo, lambda sample, rec: (_write(job, sample, rec, logger), bar.update(1)), order=order,
                       source=source)


def _write(job: Job, sample, record: dict, logger) -> None:
    job.writer.write(record)
    job.todo.discard(sample.id)
    logger.log_sample(record)


class NativeModels:
    """The model pair of the model config ``mcfg`` (and the drafting heads the methods' schemes declare), loaded
    once for every method of a run."""

    def __init__(self, mcfg, methods):
        from mars_bench.models import fastpath
        from mars_bench.models.pairs import eos_ids, load_pair

        self.pair = load_pair(mcfg, need_draft=any(m.scheme.draft_lm for m in methods))
        heads = {m.scheme.head.key: m.scheme.head for m in methods if m.scheme.head is not None}
        # model.<key> -> the loaded head (decode.drafting.Head), each loaded once
        self.heads = {key: head.load(mcfg[key], self.pair.target) for key, head in heads.items()}
        self.kernel = fastpath.kind(self.pair.target.model)   # recorded: which linear kernel the target ran on
        self.machine = machine(str(mcfg.device))              # recorded: CPU, instruction sets, threads (GPU)
        # recorded per timed sample: the machine meanwhile (docs/timing.md)
        self.probe = contention.Probe(self.machine["threads"]) if contention.measuring() else None
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
        uses all of ``todo``. At B = 1 each record holds what the machine did while it was timed (``contention``:
        from its first turn's request to its last turn's end, scoring left out)."""
        from mars_bench.decode.backend import check_memory
        from mars_bench.decode.generate import Request, generate_batch
        from mars_bench.tasks import build_messages

        task, tok, bsz, seed = job.task, self.pair.tokenizer, job.tag.batch_size, job.tag.seed
        scheme = job.method.scheme          # what it drafts with (decode.drafting)
        dcfg = decode_config(job.tag, job.max_new, self.eos, task.stop_strings)
        state = {}      # sample id -> (outputs, turn records)
        spans = {}      # sample id -> contention.Probe mark (B = 1)

        def request(sample, index, t):
            state.setdefault(sample.id, ([], []))
            if bsz == 1 and t == 0 and self.probe is not None:
                spans[sample.id] = self.probe.begin()
            ids = self.pair.prompt_ids(build_messages(task, sample, state[sample.id][0], t))
            return Request(ids, seed=sample_seed(seed, index, t), key=(sample, index, t))

        def on_done(req, res):
            sample, index, t = req.key
            outputs, turns = state[sample.id]
            outputs.append(tok.decode(res.tokens, skip_special_tokens=True))
            turns.append(turn_record(res, req.prompt, outputs[-1], tok, batched=bsz > 1))
            if t + 1 < len(sample.turns):
                return request(sample, index, t + 1)
            mark = spans.pop(sample.id, None)
            busy = self.probe.end(mark) if mark is not None else None
            write(sample, sample_record(job, sample, index, turns, task.score(sample, outputs), self.kernel, order,
                                        self.machine, busy))
            del state[sample.id]
            return None

        longest = max(len(request(s, i, 0).prompt) for i, s in todo)
        state.clear()
        spans.clear()
        turns = max(len(s.turns) for _, s in todo)
        try:   # a conservative bound: later turns hold earlier prompts and outputs
            step = _tokens_per_step(job.method)
            check_memory([self.pair.target, self.pair.draft if scheme.draft_lm else None], bsz,
                         turns * (longest + job.max_new + step), step)
        except ValueError as e:
            raise ConfigError(str(e)) from None
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


def progress_bar(label: str, enabled: bool, total: int):
    """A progress bar over ``total`` samples (a no-op one when disabled)."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(desc=label, unit="sample", dynamic_ncols=True, total=total)
