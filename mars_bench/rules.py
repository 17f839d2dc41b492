"""Verification rules: small pure functions over tensors, looked up by name in ``RULES``.

A rule decides, for each of the k draft positions of a chain independently, whether the target
accepts the draft token there. The caller (``verify_chain``) keeps the longest accepted prefix and
draws the correction / bonus token. Randomness comes in as ``u`` (one uniform per position), so a
rule is a deterministic function of its inputs and unit-testable.

Inputs, for k draft positions over a vocabulary of size V:
  draft     LongTensor[k]      the draft tokens
  z         Tensor[k, V]       the target's RAW logits at those positions (before temperature)
  p_target  Tensor[k, V]|None  target distribution after temperature/top-p (None = greedy)
  q_draft   Tensor[k, V]|None  draft distribution the draft tokens were sampled from (None = greedy)
  u         Tensor[k]          uniforms in [0, 1) (ignored when greedy)
Output: ``Verdict(accept, relaxed)``, two BoolTensor[k]; ``relaxed`` marks acceptances owed to the
MARS margin clause (draft == target top-2), a subset of ``accept``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import sampling

NONPOSITIVE_TOP1 = ("strict", "ratio")   # see ``margin_ratio``
SAMPLED_TOP1 = ("always", "margin")      # see ``mars``


@dataclass
class Verdict:
    accept: torch.Tensor
    relaxed: torch.Tensor


def top2(z: torch.Tensor):
    """(z1, z2, top1, top2) of each row; top1 = argmax (the same tie-break as greedy decoding)."""
    top1 = z.argmax(-1)
    z1 = z.gather(-1, top1[..., None]).squeeze(-1)
    rest = z.scatter(-1, top1[..., None], float("-inf"))
    second = rest.argmax(-1)
    z2 = rest.gather(-1, second[..., None]).squeeze(-1)
    return z1, z2, top1, second


def margin_ratio(z1: torch.Tensor, z2: torch.Tensor, nonpositive_top1: str = "strict") -> torch.Tensor:
    """r = z2 / z1 on raw logits.

    ``strict``: where z1 <= 0 the ratio means nothing (z2 <= z1 <= 0 gives r >= 1), so r = -inf there
    and the margin clause never fires. ``ratio``: the authors' released code, z2 / (z1 + 1e-10), which
    relaxes every position with z1 < 0.
    """
    if nonpositive_top1 == "strict":
        return torch.where(z1 > 0, z2 / z1.clamp_min(1e-30), torch.full_like(z1, float("-inf")))
    if nonpositive_top1 == "ratio":
        return z2 / (z1 + 1e-10)
    raise ValueError(f"nonpositive_top1={nonpositive_top1!r}; allowed: {', '.join(NONPOSITIVE_TOP1)}")


def exact(draft, z, p_target=None, q_draft=None, u=None, **_) -> Verdict:
    """Standard (lossless) verification.

    greedy:   accept iff draft == argmax z.
    sampling: accept with probability min(1, p_target[d] / q_draft[d])  (Leviathan et al. 2023,
              Chen et al. 2023), i.e. iff u * q_draft[d] < p_target[d].
    """
    if p_target is None:
        accept = draft == z.argmax(-1)
    else:
        pd = p_target.gather(-1, draft[..., None]).squeeze(-1)
        qd = q_draft.gather(-1, draft[..., None]).squeeze(-1)
        accept = u * qd < pd
    return Verdict(accept, torch.zeros_like(accept))


def mars(draft, z, p_target=None, q_draft=None, u=None, theta: float = 0.9,
         nonpositive_top1: str = "strict", sampled_top1: str = "always", **_) -> Verdict:
    """MARS (Song et al., 2026): margin-aware acceptance.

    z1 >= z2 are the two largest raw target logits, r = z2 / z1 (see ``margin_ratio``).
      draft == top-1                 -> accept
      draft == top-2 and r > theta   -> accept ("relaxed")
      otherwise                      -> the standard rule of the mode (``exact``)
    ``sampled_top1``: in sampled decoding, ``always`` accepts a top-1 draft outright (the rule above);
    ``margin`` accepts it outright only when r > theta and otherwise leaves it to the rejection test
    (the authors' released code).
    """
    if sampled_top1 not in SAMPLED_TOP1:
        raise ValueError(f"sampled_top1={sampled_top1!r}; allowed: {', '.join(SAMPLED_TOP1)}")
    z1, z2, t1, t2 = top2(z)
    margin = margin_ratio(z1, z2, nonpositive_top1) > theta
    relaxed = (draft == t2) & margin
    top1_ok = draft == t1
    if p_target is not None and sampled_top1 == "margin":
        top1_ok = top1_ok & margin
    accept = top1_ok | relaxed | exact(draft, z, p_target, q_draft, u).accept
    return Verdict(accept, relaxed & accept)


RULES: dict[str, Callable[..., Verdict]] = {"exact": exact, "mars": mars}


def get_rule(name: str) -> Callable[..., Verdict]:
    if name not in RULES:
        raise ValueError(f"unknown verification rule {name!r}; allowed: {', '.join(RULES)}")
    return RULES[name]


@dataclass
class ChainVerdict:
    n_accepted: int          # length of the accepted draft prefix, 0..k
    next_token: int          # correction (on rejection) or bonus (all k accepted) token
    relaxed: list[bool]      # per accepted position: owed to the margin clause
    z1: list[float]          # per verified position (accepted ones + the first rejected one)
    z2: list[float]
    top1: list[int]
    top2: list[int]


def verify_chain(rule, draft: torch.Tensor, logits: torch.Tensor, q_draft: torch.Tensor | None,
                 temperature: float, top_p: float, generator: torch.Generator | None,
                 **rule_kwargs) -> ChainVerdict:
    """Verify a chain of k drafts against k + 1 rows of raw target logits.

    Row i of ``logits`` is the target's prediction for draft position i; row k predicts the token
    after the last draft. n = first position the rule rejects (k if none). On rejection at n the
    next token is argmax z_n (greedy) or a draw from norm(max(0, p_target_n - q_draft_n)); after k
    accepts it is the bonus token from p_target_k. With rule ``exact`` this is lossless.
    """
    k = draft.shape[0]
    greedy = temperature == 0.0
    p_target = None if greedy else sampling.warp(logits, temperature, top_p)
    u = None if greedy else torch.rand(k, generator=generator, device=logits.device)
    n, relaxed = 0, []
    if k:
        verdict = rule(draft, logits[:k], None if greedy else p_target[:k], q_draft, u, **rule_kwargs)
        rejected = (~verdict.accept).nonzero()
        n = int(rejected[0]) if rejected.numel() else k
        relaxed = verdict.relaxed[:n].tolist()
    if greedy:
        nxt = int(logits[n].argmax(-1))
    elif n < k:
        nxt = int(sampling.sample(sampling.residual(p_target[n], q_draft[n]), generator))
    else:
        nxt = int(sampling.sample(p_target[k], generator))
    m = min(n + 1, k)
    z1, z2, t1, t2 = top2(logits[:m])
    return ChainVerdict(n, nxt, relaxed, z1.tolist(), z2.tolist(),
                        t1.tolist(), t2.tolist())
