"""Engines: what decodes a job's samples. ``native`` is this package's own loop (``decode/``); ``vllm`` hands them
to vLLM's offline ``LLM`` (``vllm.py``), with the rule registry inside vLLM's verification (``vllm_plugin.py``,
``verify.py``); everything that depends on vLLM's version is in ``vllm_compat.py``. docs/vllm.md."""
ENGINES = ("native", "vllm")
