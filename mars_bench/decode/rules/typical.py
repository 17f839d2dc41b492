"""``typical``: Medusa's typical acceptance (Cai et al. 2024; FasterDecoding/Medusa
medusa/model/utils.py ``evaluate_posterior``, sampling='typical', defaults of ``medusa_generate``).

    sampled: accept d  iff  p_T(d) > min(epsilon, alpha * exp(-H(p_T))),   p_T = p_target, H its entropy
    greedy:  accept d  iff  d == argmax z   (Medusa's temperature-0 path: exact)

It replaces the rejection test (a draft the standard test would accept can be rejected); after a
rejection the next token is drawn from p_target (``correction=target``; Medusa's fast path takes the
argmax there). Strict (= exact): greedy decoding; in sampled decoding no setting is exact.
A lower epsilon or alpha never accepts fewer drafts.
"""
from __future__ import annotations

import torch

from mars_bench.decode.rules.base import Knob, Rule, register


def _typical(draft, z, p_target, q_draft, u, standard, epsilon, alpha):
    if p_target is None:
        return standard, torch.zeros_like(draft)
    entropy = -(p_target * torch.log(p_target + 1e-5)).sum(-1)     # Medusa's +1e-5
    threshold = torch.clamp(alpha * torch.exp(-entropy), max=epsilon)
    ok = p_target.gather(-1, draft[..., None]).squeeze(-1) > threshold
    return ok, ok.long()


typical = register(Rule(
    "typical", _typical, lossless=False,
    doc="Medusa typical acceptance: p_target(d) > min(epsilon, alpha * exp(-H(p_target)))",
    knobs=(Knob("epsilon", 0.09, "Medusa posterior_threshold", low=0.0, high=1.0, tag="eps"),
           Knob("alpha", 0.3, "Medusa posterior_alpha (recommended sqrt(epsilon))", low=0.0, high=1.0, tag="al")),
    clauses=("typical",), strict="greedy decoding (Medusa falls back to exact matching)", sweep="epsilon",
    correction="target"))
