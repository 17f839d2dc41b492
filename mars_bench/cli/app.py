"""The Hydra entry point: ``mars-bench model=tiny method=sd rule=mars rule.theta=0.9 method.k=4 ...``.

Bad input (``ConfigError``, ``DataError``, a draft with another tokenizer) ends with one line and exit
code 2, before any model loads or file is written; a results file that cannot be written
(``StorageError``) with one line and exit 1; SIGINT / SIGTERM with one line and 130 / 143 (finished
samples kept); every other exception is a bug and keeps its traceback.

Hydra's global state (``HydraConfig``, ``compose``) is read here and nowhere below: ``launch_of`` turns it into a
``Launch`` (the interleaved variants' configs, the sweep's name) that the runner and study mode take.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mars_bench.config import schema as C
from mars_bench.base.errors import ConfigError
from mars_bench.config.overrides import Launch, check_overrides

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")   # shipped as package data
C.register()


def bad_input_errors() -> tuple:
    from mars_bench.models.pairs import TokenizerMismatch
    from mars_bench.tasks.data import DataError

    return ConfigError, DataError, TokenizerMismatch


def variant_configs(cfg, overrides) -> tuple:
    """The config of every entry of ``interleave`` (a list of override lists), composed like a job of a sweep
    from this job's own ``overrides`` (Hydra's task overrides) plus the entry's; entries may change only method.*
    and rule.*, and the engine (e.g. engine=llamacpp beside the native engine's methods: ``runner.models_for``). Each
    variant is a plain run (no interleave, study.batch_size 0: the study drives them)."""
    from hydra import compose
    from omegaconf import OmegaConf

    base = [o for o in overrides if not o.lstrip("+~").split("=")[0] in ("interleave", "compare")]
    out = []
    for entry in cfg.get("interleave") or []:
        entry = [entry] if isinstance(entry, str) else list(entry)
        bad = [o for o in entry if o.split("=")[0].lstrip("+~").split(".")[0] not in ("method", "rule", "engine")]
        if bad:
            raise ConfigError(f"interleave entry {bad[0]!r}; allowed: overrides of method.*, rule.* and engine only "
                              "(the compared methods share model, task and decoding settings)")
        v = compose(config_name="config", overrides=base + entry)
        OmegaConf.set_struct(v, False)
        v.interleave = []
        v.study.batch_size = 0
        out.append(v)
    return tuple(out)


def launch_of(cfg) -> Launch:
    """What this command chose beyond ``cfg``, read from Hydra's global state once: the interleaved variants'
    configs and the sweep's name (``Launch``). Outside a Hydra app (a test calling ``run_or_exit``): no
    variants, sweep ``run``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return Launch()
    hc = HydraConfig.get()
    choices = hc.runtime.choices
    sweep = choices.get("sweep") or choices.get("experiment") or ("multirun" if hc.mode == RunMode.MULTIRUN
                                                                  else "run")
    return Launch(variants=variant_configs(cfg, list(hc.overrides.task)), sweep=sweep)


def run_or_exit(cfg, launch: Launch | None = None):
    """``runner.run``, or ``study_mode.run_study`` for a study (``study.batch_size`` > 0), with ``launch``
    (``launch_of(cfg)`` when None); bad input and storage errors end the process with one line, bugs propagate."""
    from mars_bench.base.locking import StorageError
    from mars_bench.run.runner import run
    from mars_bench.run.study import run_study

    try:
        launch = launch if launch is not None else launch_of(cfg)
        return (run_study if cfg.study.batch_size else run)(cfg, launch)
    except StorageError as e:         # full disk / read-only results: one line naming the path, exit 1
        print(f"mars-bench: error: {e}", file=sys.stderr)
        sys.exit(1)
    except bad_input_errors() as e:   # bad input: one line, no traceback, exit 2
        print(f"mars-bench: error: {e}", file=sys.stderr)
        sys.exit(2)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig):
    return run_or_exit(cfg)


def main() -> None:
    from mars_bench.base import interrupts

    interrupts.run_main(_checked_main)   # SIGINT/SIGTERM: one line, exit 130/143, finished samples kept


def _checked_main() -> None:
    """Overrides Hydra would refuse in several lines (bad syntax, type, group option): one line, exit 2."""
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as e:
        print(f"mars-bench: error: {e}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
