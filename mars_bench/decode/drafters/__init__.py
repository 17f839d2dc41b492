"""Drafters of tree decoding: ``lm.LMDrafter`` (a small causal LM) and ``eagle3.Eagle3Drafter`` (an
EAGLE-3 head fed with the target's hidden states); ``as_drafter`` wraps a plain adapter."""
from mars_bench.decode.drafters.lm import LMDrafter, as_drafter  # noqa: F401
