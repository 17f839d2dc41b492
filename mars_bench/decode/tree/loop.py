"""The tree decoding loop: draft a tree, score it in ONE target forward, keep the accepted path.

Same conventions as ``decode.chain`` (and the same ``Stopper``): between steps the target cache
holds every committed token except the newest, which is the tree's root and is fed first in the next
target forward, so tau = new tokens / target forwards. One step:
  1. the drafter builds a ``DraftTree`` below the root (build.build_tree), at most as deep as the token
     budget allows (path + 1 token <= max_new_tokens - emitted) under the exact budget rule; under
     after_step (the authors'), always the full tree, and the budget is checked after the step;
  2. the target scores [root, node_1 .. node_N] in one forward: 4-D tree mask over [cache + N + 1]
     (each node sees the committed prefix, its ancestors and itself), position ids
     cache_len + depth;
  3. verify picks the accepted path and the next token (greedy or sampled algorithm);
  4. both caches keep only the accepted path (``adapter.keep`` by index: committed + root + path for
     the target; the drafter drops the other branches likewise), so they equal a plain causal forward
     over the committed sequence.
Audit, as for chains: ``proposed`` = tree nodes per step (root excluded), ``accepted`` = path length,
``z1``/``z2``/``outcome`` per verified node of the chosen path (A exact, R relaxed) plus X when the
path's end had children that were all rejected, ``relaxed`` entries {pos, depth, draft, top1, top2,
z1, z2}; ``depth_proposed`` = deepest draft per step (for the per-depth acceptance rate).
"""
from __future__ import annotations

import time
import torch

from ..chain import expect, finish, record_verdict
from ..drafters import as_drafter
from ..rules import get_rule
from ..types import DecodeConfig, DecodeResult, Method, Stopper
from .build import DraftTree, TreeSpec, build_tree
from .mask import additive_mask
from .verify import TreeVerdict, verify_greedy, verify_sampled

TreeDecodeResult = DecodeResult   # depth_proposed lives on DecodeResult


def per_depth_acceptance(res: DecodeResult) -> list[float]:
    """Acceptance rate at depth i (i = 1..): steps whose path reached depth i / steps proposing depth i."""
    out = []
    for d in range(1, max(res.depth_proposed, default=0) + 1):
        n = sum(1 for x in res.depth_proposed if x >= d)
        out.append(sum(1 for a, x in zip(res.accepted, res.depth_proposed) if x >= d and a >= d) / n)
    return out


def tree_step(target, drafter, seq: list[int], spec: TreeSpec, rule, cfg: DecodeConfig,
              gen: torch.Generator | None, budget: int, **rule_kwargs):
    """One draft-tree-then-verify step over ``seq``; returns (committed tokens, tree, verdict)."""
    greedy = cfg.temperature == 0.0
    tree = build_tree(drafter, seq, spec, budget, "greedy" if greedy else spec.children, cfg, gen)
    base = target.cache_len
    kw = {}
    if tree.size:
        anc = tree.ancestors().to(target.device)
        allowed = torch.cat([torch.ones(len(tree.tokens), base, dtype=torch.bool, device=target.device), anc], 1)
        kw = {"attention_mask": additive_mask(allowed, getattr(target, "model", None)),
              "position_ids": (base + torch.tensor(tree.depths, device=target.device))[None]}
    out = target.forward(tree.tokens, hidden_states=drafter.needs_hidden, **kw)
    z, hidden = out if drafter.needs_hidden else (out, None)
    if greedy:
        v = verify_greedy(rule, tree, z, **rule_kwargs)
    else:
        v = verify_sampled(rule, tree, z, cfg.temperature, cfg.top_p, gen, **rule_kwargs)
    if tree.size:
        target.keep(torch.tensor(list(range(base + 1)) + [base + j for j in v.path], dtype=torch.long))
    committed = [tree.tokens[j] for j in v.path] + [v.next_token]
    drafter.commit(tree, v.path, committed, hidden)
    return committed, tree, v


def generate_tree(target, draft, tokenizer, prompt: list[int], method: Method, cfg: DecodeConfig,
                  seed: int = 0, tree: TreeSpec | None = None) -> TreeDecodeResult:
    """Decode one prompt with a tree method; ``draft`` is a CausalLMAdapter or an EAGLE-3 drafter."""
    if not prompt:
        raise ValueError("empty prompt: at least one token is needed")
    if draft is None:
        raise ValueError(f"method {method.name!r} needs a draft model or an EAGLE-3 head")
    spec = tree if tree is not None else TreeSpec.from_method(method)
    rule = get_rule(method.rule)
    settings = rule.settings(method.rule_kwargs)
    drafter = as_drafter(draft)
    expect(target, spec.total_tokens if spec.static_paths is None else len(spec.static_paths) + 1)
    expect(getattr(drafter, "lm", None), spec.top_k if spec.static_paths is None else _widest(spec))
    gen = torch.Generator(device=target.device).manual_seed(seed) if cfg.temperature > 0 else None
    stopper, res = Stopper(tokenizer, cfg), TreeDecodeResult()
    t_before = (target.forward_s, drafter.forward_s)
    t0 = time.perf_counter()
    target.reset()
    hidden = None
    if len(prompt) > 1:
        out = target.forward(prompt[:-1], logits=False, hidden_states=drafter.needs_hidden)
        hidden = out[1] if drafter.needs_hidden else None
    drafter.prefill(prompt, hidden)
    res.prefill_s = time.perf_counter() - t0
    seq, new, stop = list(prompt), res.tokens, None
    while stop is None:
        start = len(new)
        budget = cfg.draft_len(spec.max_depth, len(new))   # exact: no path past the budget; after_step: full tree
        committed, t, v = tree_step(target, drafter, seq, spec, rule, cfg, gen, budget, **settings)
        _audit(res, t, v, start, committed)
        res.steps += 1
        new.extend(committed)
        seq.extend(committed)
        stop = stopper.cut(new, start)
    return finish(res, stop, t0, target, drafter, t_before)


def _widest(spec: TreeSpec) -> int:
    """Static tree: the most nodes one drafter expansion feeds (nodes of one depth with children)."""
    parents = {p[:-1] for p in spec.static_paths if len(p) > 1}
    return max([sum(1 for p in parents if len(p) == d) for d in range(1, spec.max_depth)], default=1)


def _audit(res: TreeDecodeResult, tree: DraftTree, v: TreeVerdict, start: int, committed) -> None:
    res.proposed.append(tree.size)
    res.accepted.append(len(v.path))
    res.depth_proposed.append(tree.max_depth)
    record_verdict(res, v, start, committed, v.rejected_end)


__all__ = ["TreeDecodeResult", "generate_tree", "per_depth_acceptance", "tree_step"]
