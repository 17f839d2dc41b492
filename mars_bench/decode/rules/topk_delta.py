"""``topk_delta``: TensorRT-LLM's relaxed acceptance for MTP (``relaxed_topk``, ``relaxed_delta``;
tensorrt_llm/_torch/speculative/mtp.py and kernels/speculativeDecoding/mtpKernels.cu
``mtpRelaxedAcceptanceKernel``), also shipped by Modular MAX.

    accept d  iff  d in top_k(p) and p(d) >= p(top1) - delta,   p = softmax(z) (raw logits, T = 1)

in linear probability space, as the kernel does (``p(d) >= p(top1) - delta``, so a token tied with
the top-1 passes even at delta = 0); the top-1 (argmax, greedy decoding's tie-break) is always accepted.
TensorRT-LLM runs it with greedy targets only (inside DeepSeek-R1's <think> span), so it is registered
for greedy decoding. Defaults are TensorRT-LLM's recommended setting (top_k 10, delta 0.6; its config
defaults 1 / 0 are the strict setting). Strict (= exact): top_k = 1 (only the argmax; the top-k's own
tie-break is not consulted); delta = 0 too, except where another token's probability equals the
top-1's exactly.
"""
from __future__ import annotations

import torch

from mars_bench.decode.rules.base import Knob, Rule, register


def _topk_delta(draft, z, p_target, q_draft, u, standard, top_k, delta):
    p = torch.softmax(z.float(), -1)
    top_p, top_i = p.topk(min(top_k, p.shape[-1]), -1)
    pd = p.gather(-1, draft[..., None]).squeeze(-1)
    ok = (top_i == draft[..., None]).any(-1) & (pd >= top_p[..., 0] - delta)
    if top_k == 1:           # the argmax only: topk may break a tie differently from argmax (on GPUs)
        ok = torch.zeros_like(ok)
    return standard | ok, ok.long()


topk_delta = register(Rule(
    "topk_delta", _topk_delta, lossless=False,
    doc="TensorRT-LLM relaxed acceptance: d in the target's top_k and p(d) >= p(top1) - delta",
    knobs=(Knob("top_k", 10, "the draft must be among the target's top_k tokens", low=1, integer=True, tag="top"),
           Knob("delta", 0.6, "the draft's probability at most delta below the top-1's", low=0.0, high=1.0,
                tag="dl")),
    modes=frozenset({"greedy", "chain", "tree"}), clauses=("topk_delta",),
    strict="top_k=1 (delta=0 too, except exact ties with the top-1)",
    sweep="delta"))
