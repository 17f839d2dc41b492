"""The Hydra entry point: ``mars-bench model=tiny method=sd rule=mars rule.theta=0.9 method.k=4 ...``.

Bad input (``ConfigError``, ``DataError``, a draft with another tokenizer) ends with one line and exit
code 2, before any model loads or file is written; a results file that cannot be written
(``StorageError``) with one line and exit 1; SIGINT / SIGTERM with one line and 130 / 143 (finished
samples kept); every other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mars_bench.config import schema as C
from mars_bench.base.errors import ConfigError
from mars_bench.config.overrides import check_overrides

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")   # shipped as package data
C.register()


def bad_input_errors() -> tuple:
    from mars_bench.models.pairs import TokenizerMismatch
    from mars_bench.tasks.data import DataError

    return ConfigError, DataError, TokenizerMismatch


def run_or_exit(cfg):
    """``runner.run``, or ``study_mode.run_study`` for a study (``study.batch_size`` > 0); bad input and storage
    errors end the process with one line, bugs propagate."""
    from mars_bench.base.locking import StorageError
    from mars_bench.run.runner import run
    from mars_bench.run.study import run_study

    try:
        return (run_study if cfg.study.batch_size else run)(cfg)
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
