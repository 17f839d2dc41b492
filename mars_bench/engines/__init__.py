"""Engines: what decodes a job's samples. ``native`` is this package's own loop (``decode/``); ``vllm`` hands them
to vLLM's offline ``LLM`` (``vllm.py``), with the rule registry inside vLLM's verification (``vllm_plugin.py``,
``verify.py``); everything that depends on vLLM's version is in ``vllm_compat.py``. docs/vllm.md."""
from __future__ import annotations

from typing import Any

ENGINES = ("native", "vllm")


def validate(cfg: Any) -> None:
    """What the chosen engine can run, after ``config.validate`` (one-line ``ConfigError``): native runs
    everything the schema allows; vllm refuses what vLLM cannot run (``vllm.check``) and records its version in
    ``engine.version``."""
    from ..config import ConfigError

    e = cfg.get("engine")
    if e is None or e.name == "native":
        return
    if e.name not in ENGINES:
        raise ConfigError(f"engine.name={e.name!r}; allowed: {', '.join(ENGINES)}")
    from .vllm import check

    try:
        e.version = check(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
