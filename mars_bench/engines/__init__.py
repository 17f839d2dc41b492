"""Engines: what decodes a job's samples. ``native`` is this package's own loop (``decode/``, run by
``runner.NativeModels``); every other engine is one package here, named as its ``conf/engine/<name>.yaml``:
``vllm/`` (vLLM's offline ``LLM`` or ``vllm serve``, the rule registry inside vLLM's verification, everything that
depends on vLLM's version in ``vllm/compat.py``; docs/vllm.md) and ``llamacpp/`` (llama.cpp's binding: ar and its own
speculative decoding; docs/llamacpp.md).

A new engine = ``engines/<name>/`` + ``conf/engine/<name>.yaml`` + tests: the engines are the YAML files of
``conf/engine/``, and the package of one provides

    check(cfg, method) -> str    what it cannot run of the job's config and its resolved ``Method``, refused in
                                 one line (ValueError), before any model loads; returns the engine's version
                                 (recorded in ``engine.version``)
    Models(cfg, methods)         the loaded models (``runner.models_for`` builds them): ``decode`` /
                                 ``decode_batched`` (same records)
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from mars_bench.store.spec import NATIVE   # the default engine, named once (RunSpec.engine's default)

CONF = Path(__file__).resolve().parent.parent / "conf" / "engine"


def names() -> tuple[str, ...]:
    """The engines, ``native`` first: one per ``conf/engine/*.yaml``."""
    return (NATIVE, *sorted(p.stem for p in CONF.glob("*.yaml") if p.stem != NATIVE))


def module(name: str):
    """The module of a non-native engine (imported on use: its library is optional)."""
    return importlib.import_module(f"{__name__}.{name}")


def validate(cfg: Any, method) -> None:
    """What the chosen engine can run, after ``validation.validate`` (one-line ``ConfigError``); ``method``: the
    job's ``Method`` that ``validation.validate`` returned. Native runs everything the schema allows; another
    engine refuses what it cannot run (its ``check``), which also returns its version, recorded in
    ``engine.version``."""
    from mars_bench.base.errors import ConfigError

    e = cfg.engine
    if e.name == NATIVE:
        return
    if e.name not in names():
        raise ConfigError(f"engine.name={e.name!r}; allowed: {', '.join(names())}")
    try:
        e.version = module(e.name).check(cfg, method)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def models(cfg: Any, methods):
    """The ``Models`` of a non-native engine (``runner.engine_models`` dispatches here)."""
    return module(cfg.engine.name).Models(cfg, methods)
