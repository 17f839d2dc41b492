"""``generate``: one prompt, any method; dispatches to the chain or the tree loop (no import cycle)."""
from __future__ import annotations

import torch

from .chain import generate_chain
from .rules import get_rule
from .types import CHAIN, DecodeConfig, DecodeResult, Method


def generate(target, draft, tokenizer, prompt: list[int], method: Method, cfg: DecodeConfig,
             seed: int = 0, tree=None) -> DecodeResult:
    """Decode one prompt with ``method``; the same stop conditions apply to every method.

    Randomness: one generator per call, seeded with ``seed`` (the runner derives it per sample), so a
    sample's output never depends on what else is decoded."""
    if not prompt:
        raise ValueError("empty prompt: at least one token is needed")
    rule = get_rule(method.rule) if method.speculative else None
    settings = rule.settings(method.rule_kwargs) if rule else {}
    if rule:
        rule.check_mode("chain" if method.name in CHAIN else "tree", cfg.temperature)
    gen = torch.Generator(device=target.device).manual_seed(seed) if cfg.temperature > 0 else None
    if method.name in CHAIN:
        return generate_chain(target, draft, tokenizer, prompt, method, cfg, rule, settings, gen)
    from .tree.loop import generate_tree

    return generate_tree(target, draft, tokenizer, prompt, method, cfg, seed, tree)
