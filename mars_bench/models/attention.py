"""Row-wise attention: every query row computed as a lone one-token decode step would compute it.

Why: greedy ``sd`` is token-identical to ``ar`` only if the target scores a token the same way whether
it arrives alone (``ar``, one query row) or among the k + 1 rows of a verification forward, or beside
other sequences in a batch. The linear layers are row-invariant (``panel.py``), but SDPA is not:
transformers packs grouped-query heads differently for one query row than for several, and the CPU
kernel blocks the rows, so a row's attention output changes in the last bits with the number of rows.
Measured on the embedded bf16 target (300-token context, 5 new tokens): layer-0 attention differs by
5e-5 between one 5-row forward and five 1-row forwards, the logits by 0.07, and greedy ``sd`` left
``ar``'s tokens on 5 of 48 WMT19 segments (bf16 rounds every GEMM input, so last-bit differences
grow).

Here each query row (per sequence) runs transformers' own ``sdpa_attention_forward`` with one query
row, no mask, and exactly the keys it may see (the mask's allowed positions, in cache order): the call
an ``ar`` decode step makes, so the row's result does not depend on the other rows. Registered through
transformers' ``AttentionInterface`` (the public extension point) and switched on, with the CPU fast
path, by ``use_rowwise``. Cost: one SDPA call per query row and layer (Python loop): a few ms per
verification forward, ~0.3 s more for a 300-token prefill.
"""
from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "mars_rowwise"


def rowwise_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs):
    """query [B, H, q, d], key/value [B, H_kv, kv, d], attention_mask None (causal, the new rows last)
    or [B, 1, q, kv] boolean (True = attend) or additive (0 = attend) -> ([B, q, H, d], None)."""
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise ValueError(f"{NAME} attention supports full attention only; got sliding_window="
                         f"{kwargs.get('sliding_window')}, softcap={kwargs.get('softcap')}")
    b, _, q, _ = query.shape
    kv = key.shape[2]
    if b == 1 and q == 1 and attention_mask is None:   # an ar decode step: the loop's one call, directly
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling,
                                      is_causal=False)
    if attention_mask is None:
        allowed = torch.ones(q, kv, dtype=torch.bool, device=query.device).tril(kv - q)[None].expand(b, q, kv)
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask[:, 0].expand(b, q, kv)
    else:
        allowed = (attention_mask[:, 0] == 0).expand(b, q, kv)
    counts = allowed.sum(-1)
    leading = allowed.int().cumprod(-1).sum(-1)          # a prefix of the cache: slice, no copy
    counts_l, prefix_l = counts.tolist(), (leading == counts).tolist()
    out = query.new_zeros(b, q, query.shape[1], value.shape[-1])
    for i in range(b):
        for j in range(q):
            n = counts_l[i][j]
            if n == 0:
                continue
            if prefix_l[i][j]:
                k_ij, v_ij = key[i:i + 1, :, :n], value[i:i + 1, :, :n]
            else:
                idx = allowed[i, j].nonzero().squeeze(1)
                k_ij, v_ij = key[i:i + 1].index_select(2, idx), value[i:i + 1].index_select(2, idx)
            o, _ = sdpa_attention_forward(module, query[i:i + 1, :, j:j + 1], k_ij, v_ij, None,
                                          dropout=dropout, scaling=scaling, is_causal=False)
            out[i, j] = o[0, 0]
    return out, None


def use_rowwise(model) -> None:
    """Register the row-wise attention and switch ``model`` to it (transformers' public interface)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, rowwise_attention)
    model.set_attn_implementation(NAME)
