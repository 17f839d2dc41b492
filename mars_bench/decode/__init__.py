"""The decoding core: token ids in, ``DecodeResult`` out; it knows nothing of tasks, files or Hydra.

  types.py     Method (drafting scheme + rule), DecodeConfig, DecodeResult, Stopper
  drafting.py  the drafting schemes, one declaration each: what each drafts with, its proposer
  engine.py    the one decoding loop (every method, every batch size): propose, verify, commit
  proposers/   how drafts are made: LM chain, LM / EAGLE-3 tree, prompt lookup
  rules/       verification rules: pure tensor functions + the RULES registry
  backend.py   what the loop asks of a model and its KV cache (batched; RowByRow for single-sequence models)
  tree/        draft trees: build, verify, mask
  drafters/    the LM drafter and the EAGLE-3 head (tree proposers)
  generate.py  entry points: generate (one prompt), generate_batch
"""
from mars_bench.decode.generate import generate, generate_batch  # noqa: F401
from mars_bench.decode.types import DecodeConfig, DecodeResult, Method, Stopper  # noqa: F401
