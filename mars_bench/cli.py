"""The Hydra entry point: ``mars-bench model=tiny method=sd rule=mars rule.theta=0.9 method.k=4 ...``.

Bad input (``ConfigError``, ``DataError``, a draft with another tokenizer) ends with one line and exit
code 2, before any model loads or file is written; every other exception is a bug and keeps its
traceback.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from . import config as C

CONF_DIR = str(Path(__file__).resolve().parent / "conf")   # shipped as package data
C.register()


def bad_input_errors() -> tuple:
    from .models.pairs import TokenizerMismatch
    from .tasks.data import DataError

    return C.ConfigError, DataError, TokenizerMismatch


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig):
    from .runner import run

    try:
        return run(cfg)
    except bad_input_errors() as e:   # bad input: one line, no traceback, exit 2
        print(f"mars-bench: error: {e}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
