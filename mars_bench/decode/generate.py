"""Entry points of the decoding loop (``engine.decode``): one prompt (``generate``) or many, batched
(``generate_batch``)."""
from __future__ import annotations

from mars_bench.decode.engine import BatchResult, Request, decode
from mars_bench.decode.types import DecodeConfig, DecodeResult, Method


def generate(target, draft, tokenizer, prompt: list[int], method: Method, cfg: DecodeConfig,
             seed: int = 0, tree=None, rule=None) -> DecodeResult:
    """Decode one prompt with ``method`` (a batch of one); the same stop conditions apply to every method.

    Randomness: one generator per request, seeded with ``seed`` (the runner derives it per sample), so a
    sample's output never depends on what else is decoded."""
    if not prompt:
        raise ValueError("empty prompt: at least one token is needed")
    out = []
    decode(target, draft, tokenizer, [Request(list(prompt), seed)], method, cfg, 1,
           lambda req, res: out.append(res), tree=tree, rule=rule)
    return out[0]


def generate_batch(target, draft, tokenizer, requests, method: Method, cfg: DecodeConfig, batch_size: int,
                   on_done, tree=None, rule=None) -> None:
    """Decode ``requests`` with at most ``batch_size`` in flight; ``on_done(request, result)`` as each
    finishes (it may return a follow-up request). See ``engine``."""
    decode(target, draft, tokenizer, requests, method, cfg, batch_size, on_done, tree=tree, rule=rule)


__all__ = ["BatchResult", "Request", "generate", "generate_batch"]
