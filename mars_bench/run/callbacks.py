"""Hydra callbacks. ``ValidateSweep`` checks every job of a multirun before the first one starts.

Hydra's basic sweeper only checks that each job's config *composes*; a value out of range
(``method.theta=1.5``) would fail only when its job runs, possibly hours into a sweep. This callback
expands the sweep exactly as the sweeper will (``hydra.sweeper.params`` + command-line overrides),
composes each job's config and runs ``validation.validate``, ``engines.validate`` and the task checks of
``runner.prepare`` on it.
The first bad value stops the multirun with a one-line error naming the job and the value (exit 2).

Registered by ``conf/sweep/*.yaml``, ``conf/experiment/*.yaml`` and ``conf/hydra/callbacks/validate.yaml``.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("mars_bench")


class ValidateSweep(Callback):
    """``on_multirun_start``: validate every override combination; exit 2 on the first bad one.

    Hydra turns exceptions raised in callbacks into warnings, so a bad value ends the process here
    (``SystemExit`` is not an ``Exception``) before the sweeper launches anything."""

    def __init__(self, check_task: bool = True) -> None:
        self.check_task = check_task

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            n = validate_sweep(config, check_task=self.check_task)
        except SweepError as e:
            print(f"mars-bench: error: {e}", file=sys.stderr)
            sys.exit(2)
        log.info("validated %d sweep job(s) before starting any", n)


class SweepError(ValueError):
    """One job of a sweep has a bad value; the message is one line."""


def sweep_jobs(config: DictConfig, loader=None) -> list[list[str]]:
    """The override list of every job, in the order the basic sweeper launches them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = loader or _loader()
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    args = [f"{k}={v}" for k, v in params.items()]
    args += list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    overrides = OverridesParser.create(config_loader=loader).parse_overrides(args)
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def validate_sweep(config: DictConfig, check_task: bool = True) -> int:
    """Compose and validate every job of the multirun described by ``config``; return the job count."""
    from mars_bench.config.validation import validate
    from mars_bench.engines import validate as validate_engine

    loader = _loader()
    jobs = sweep_jobs(config, loader)
    seen_tasks: set = set()
    for num, job in enumerate(jobs):
        label = f"sweep job #{num} ({' '.join(job)})"
        try:
            cfg = loader.load_sweep_config(config, list(job))
        except Exception as e:  # composition: unknown key, unknown group option, type error
            raise SweepError(f"{label}: {_one_line(e)}") from None
        try:
            key = (cfg.task.name, cfg.protocol.system_prompt, cfg.protocol.task_prompts, cfg.subset, cfg.limit,
                   cfg.data_dir)
            if check_task and key not in seen_tasks:
                from mars_bench.run.runner import prepare

                prepare(cfg)   # validation, the engine's checks; unknown task or subset, missing data, bad task option
                seen_tasks.add(key)
            else:
                validate_engine(cfg, validate(cfg))   # validate resolves the job's Method; the engine checks that one
        except Exception as e:  # ConfigError, unknown task/subset, missing data (DataError)
            raise SweepError(f"{label}: {_one_line(e)}") from None
    return len(jobs)


def _loader():
    from hydra.core.global_hydra import GlobalHydra

    gh = GlobalHydra.instance()
    if not gh.is_initialized() or gh.hydra is None:
        raise RuntimeError("ValidateSweep needs an initialized Hydra (use it as a Hydra callback)")
    return gh.hydra.config_loader


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
