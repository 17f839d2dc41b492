"""The vLLM engine: ``engine.py`` hands a job's samples to vLLM's offline ``LLM``; ``serve.py`` (``engine.serve``) sends
them to ``vllm serve`` through the harness's client (``client.py``); ``plugin.py`` and ``verify.py`` put the rule
registry inside vLLM's verification and audit it; everything that depends on vLLM's version is in ``compat.py``.
docs/vllm.md."""
from . import engine
from .engine import check

__all__ = ["Models", "check"]


def Models(cfg, methods):  # noqa: N802 (the engine's Models, engines.models)
    """The loaded models of a run: the offline ``LLM`` (``engine.Models``), or with ``engine.serve`` the servers
    (``serve.ServedModels``)."""
    if cfg.engine.serve:
        from .serve import ServedModels

        return ServedModels(cfg, methods)
    return engine.Models(cfg, methods)
