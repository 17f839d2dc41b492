"""``fly``: training-free loosely speculative decoding (FLy, arXiv 2511.22972; AMD-AGI/FLy
fly/models/FLy.py ``SPDGenerate``, chain path).

A draft matches when the standard test accepts it (greedy: it is the argmax). A MISMATCHED draft at
chain position i is accepted when the next window - 1 drafts all match (judged on the matches before
loosening, so windows do not cascade) and the target is not confident there (top-3 entropy
-sum_top3 p log p of softmax(z) >= entropy; FLy's gate, off when entropy <= 0.01); the last
``window`` positions stay strict, and a chain shorter than ``window`` is verified strictly.
A block-level rule: it reads the whole chain's match mask, so it is defined for chains only.
Defaults: FLy's Llama-3-70B config (win_len 6, entropy_thre 0.3). Strict (= exact): entropy = inf.
(FLy's sampled path counts a match when either of two target samples equals the draft; here the
standard rejection test decides a match.)
"""
from __future__ import annotations

import torch

from mars_bench.decode.rules.base import Knob, Rule, register


def _fly(draft, z, p_target, q_draft, u, standard, window, entropy):
    k = draft.shape[0]
    loose = torch.zeros_like(standard)
    if k >= window:
        for i in range(k - window):          # the last `window` positions stay strict
            loose[i] = (not bool(standard[i])) and bool(standard[i + 1:i + window].all())
        if entropy > 0.01:
            logp = torch.log_softmax(z.float(), -1)
            top = logp.topk(3, -1).values
            loose &= -(top.exp() * top).sum(-1) >= entropy
    return standard | loose, loose.long()


fly = register(Rule(
    "fly", _fly, lossless=False,
    doc="FLy: accept a mismatch when the next window-1 drafts match and the target's top-3 entropy >= entropy",
    knobs=(Knob("window", 6, "FLy win_len: the mismatch and the window - 1 matching drafts after it", low=1,
                integer=True, tag="win"),
           Knob("entropy", 0.3, "FLy entropy_thre on the target's top-3 entropy (inf = strict)", low=0.0, tag="ent")),
    modes=frozenset({"greedy", "sampled", "chain"}), clauses=("window",), strict="entropy=inf", sweep="window"))
