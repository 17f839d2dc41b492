"""The vLLM engine: ``engine.py`` hands a job's samples to vLLM's offline ``LLM``; ``plugin.py`` and ``verify.py``
put the rule registry inside vLLM's verification and audit it; everything that depends on vLLM's version is in
``compat.py``. docs/vllm.md."""
from .engine import Models, check

__all__ = ["Models", "check"]
