"""``mars`` (Song et al., Findings of ACL 2026) and its probability-ratio ablation ``mars_prob``.

mars: z1 >= z2 are the target's two largest RAW logits, r = z2 / z1 (``margin_ratio``):
  draft == top-1                 -> accept (sampled: outright, or only when r > theta: ``sampled_top1``)
  draft == top-2 and r > theta   -> accept (the margin clause)
  otherwise                      -> the standard test
mars_prob: the same with r = p2 / p1 on the target's probabilities (the paper's ablation): greedy
softmax(z), sampled p_target (temperature, top-p).
Strict setting (= exact): theta = 1 in greedy decoding (r > 1 never holds); in sampled decoding
theta = 1 with sampled_top1 = margin (with ``always`` a top-1 draft is accepted outright, which is
lossy: issue 16). ``outside_nucleus``: with top_p < 1, ``refuse`` (default) never accepts leniently a
draft outside the target's nucleus (p_target[d] = 0 after top-p); ``allow`` takes r and the top-2 from the
unfiltered logits with no nucleus check (this harness before the setting existed). The authors' code
(5SSjw/MARS ``mars/model/utils.py``, ``evaluate_posterior``, sampled branch) takes them from the logits after
its ``logits_processor`` (temperature, then top-p, -inf outside the nucleus): with two or more tokens in the
nucleus its top-2 and r are the unfiltered ones, inside the nucleus (both settings agree with it); with a
one-token nucleus z2 = -inf, so it never relaxes when z1 > 0 (as ``refuse``), and when z1 < 0 (r = +inf) it
may accept a zero-probability token (``torch.topk``'s pick among the -inf ties), which neither setting does. ``outside_top2`` (sampled): where
r > theta, a draft that is neither top-1 nor top-2 gets the standard test (``test``, default) or, as
in the authors' tree code, is rejected untested and leaves p_target as it was for the next sibling
(``skip``; in a chain the correction token is then drawn from p_target, not the residual).
"""
from __future__ import annotations

import torch

from mars_bench.decode.rules.base import Knob, Rule, in_support, register, top2

NONPOSITIVE_TOP1 = ("strict", "ratio")
SAMPLED_TOP1 = ("always", "margin")

THETA = Knob("theta", 0.9, "threshold on r = z2/z1; the paper's default 0.9", low=0.0, high=1.0,
             open_low=True, tag="th")
SAMPLED = Knob("sampled_top1", "always", "sampling: always accept a top-1 draft | margin: only when r > theta "
               "(the authors' code), else the standard test", choices=SAMPLED_TOP1, sampled_only=True)
NUCLEUS = Knob("outside_nucleus", "refuse", "top_p < 1: refuse lenient acceptance of a draft outside the nucleus "
               "| allow (r and top-2 from the unfiltered logits, no nucleus check)", choices=("refuse", "allow"), tag="nucleus", nucleus_only=True,
               show_default=True)   # shown at the default too: runs before it existed accepted outside the nucleus


def margin_ratio(z1: torch.Tensor, z2: torch.Tensor, nonpositive_top1: str = "strict") -> torch.Tensor:
    """r = z2 / z1 on raw logits. ``strict``: where z1 <= 0 the ratio means nothing (z2 <= z1 <= 0
    gives r >= 1), so r = -inf there and the margin clause never fires. ``ratio``: the authors' code,
    z2 / (z1 + 1e-10), which relaxes every position with z1 < 0."""
    if nonpositive_top1 == "strict":
        return torch.where(z1 > 0, z2 / z1.clamp_min(1e-30), torch.full_like(z1, float("-inf")))
    if nonpositive_top1 == "ratio":
        return z2 / (z1 + 1e-10)
    raise ValueError(f"nonpositive_top1={nonpositive_top1!r}; allowed: {', '.join(NONPOSITIVE_TOP1)}")


OUTSIDE_TOP2 = Knob("outside_top2", "test", "sampling, r > theta: a draft outside the top-2 gets the standard "
                    "test | skip: rejected untested, p_target unchanged (the authors' tree code)",
                    choices=("test", "skip"), tag="top2", sampled_only=True)


def _clauses(draft, z, p_target, standard, margin, sampled_top1, outside_nucleus, outside_top2="test", tops=None):
    """Shared by both variants: (accept, clause, skipped) with clause 1 = top2_margin, 2 = top1. ``tops``: top2(z)
    when the caller has it (computed once a verification)."""
    _, _, t1, t2 = top2(z) if tops is None else tops
    top2_ok = (draft == t2) & margin
    top1_ok = draft == t1
    if p_target is not None and sampled_top1 == "margin":
        top1_ok = top1_ok & margin
    if outside_nucleus == "refuse":
        inside = in_support(draft, p_target)
        top2_ok, top1_ok = top2_ok & inside, top1_ok & inside
    skipped = torch.zeros_like(top1_ok)
    if p_target is not None and outside_top2 == "skip":
        skipped = margin & (draft != t1) & (draft != t2)
    accept = (standard & ~skipped) | top1_ok | top2_ok
    clause = torch.where(top2_ok, 1, torch.where(top1_ok, 2, 0))
    return accept, clause, skipped


def _mars(draft, z, p_target, q_draft, u, standard, theta, nonpositive_top1, sampled_top1, outside_nucleus,
          outside_top2):
    tops = top2(z)
    return _clauses(draft, z, p_target, standard, margin_ratio(tops[0], tops[1], nonpositive_top1) > theta,
                    sampled_top1, outside_nucleus, outside_top2, tops)


def _mars_prob(draft, z, p_target, q_draft, u, standard, theta, sampled_top1, outside_nucleus):
    p = torch.softmax(z.float(), -1) if p_target is None else p_target
    p1, p2, _, _ = top2(p)
    r = p2 / p1.clamp_min(1e-30)
    return _clauses(draft, z, p_target, standard, r > theta, sampled_top1, outside_nucleus)


mars = register(Rule(
    "mars", _mars, lossless=False, doc="MARS: accept the target's top-2 when r = z2/z1 > theta (raw logits)",
    knobs=(THETA, Knob("nonpositive_top1", "strict", "strict: never relax when z1 <= 0 | ratio: the authors' "
                       "z2/(z1+1e-10)", choices=NONPOSITIVE_TOP1), SAMPLED, NUCLEUS, OUTSIDE_TOP2),
    clauses=("top2_margin", "top1"), strict="theta=1 (greedy); theta=1 and sampled_top1=margin (sampled)",
    sweep="theta"))

mars_prob = register(Rule(
    "mars_prob", _mars_prob, lossless=False,
    doc="MARS ablation: r = p2/p1 on the target's probabilities instead of raw logits",
    knobs=(THETA, SAMPLED, NUCLEUS), clauses=("top2_margin", "top1"),
    strict="theta=1 (greedy); theta=1 and sampled_top1=margin (sampled)", sweep="theta"))
