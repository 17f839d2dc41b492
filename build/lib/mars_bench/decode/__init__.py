"""The decoding core: token ids in, ``DecodeResult`` out; it knows nothing of tasks, files or Hydra.

  types.py     Method (drafting scheme + rule), DecodeConfig, DecodeResult, Stopper
  rules/       verification rules: pure tensor functions + the RULES registry
  chain.py     ar and chain speculative decoding (the speculative step on one screen)
  tree/        draft trees: build, verify, mask, loop
  drafters/    the LM drafter (trees) and the EAGLE-3 head
  generate.py  one entry for every method
"""
from .generate import generate  # noqa: F401
from .types import DecodeConfig, DecodeResult, Method, Stopper  # noqa: F401
