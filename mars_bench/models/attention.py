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

Here each query row (per sequence and head) attends to exactly the keys it may see (the mask's allowed
positions, in cache order) with one fixed arithmetic, so its result does not depend on the other rows.
Where the panel library is built (AVX-512F or AVX2 + FMA and a C compiler, ``panel.py``), one C call per layer
does every row (``rows_attention`` in ``panel_gemm.c``, ``attend.h``: 16-lane, on AVX2 8-lane partial sums, fixed
order);
an ``ar`` step and a verification row take the same call. Measured on the embedded bf16 target after
200 tokens of context: attention per forward of 1 / 5 / 8 tokens 3.5 / 11.6 / 16.2 ms as one SDPA call
per row and layer (Python loop), the growth most of what verification added outside the linear layers.
Without the library, each row runs transformers' own ``sdpa_attention_forward`` with one query row, no
mask and its keys (the call an ``ar`` decode step makes), as before. Registered through transformers'
``AttentionInterface`` (the public extension point) and switched on, with the CPU fast path, by
``use_rowwise``.
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
    lib = _kernel(query, key, value, dropout)
    if lib is not None:
        return _rows_c(lib, module, query, key, value, attention_mask, scaling), None
    if b == 1 and q == 1 and attention_mask is None:   # an ar decode step: the loop's one call, directly
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling,
                                      is_causal=False)
    allowed = _allowed(attention_mask, b, q, kv, query.device)
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


def _allowed(attention_mask, b: int, q: int, kv: int, device) -> torch.Tensor:
    """Bool [b, q, kv]: which keys each query row may see (no mask: causal, the new rows last)."""
    if attention_mask is None:
        return torch.ones(q, kv, dtype=torch.bool, device=device).tril(kv - q)[None].expand(b, q, kv)
    if attention_mask.dtype == torch.bool:
        return attention_mask[:, 0].expand(b, q, kv)
    return (attention_mask[:, 0] == 0).expand(b, q, kv)


def _kernel(query, key, value, dropout: float):
    """The panel library where its row-wise attention applies to these tensors, else None."""
    if dropout or query.device.type != "cpu" or query.shape[-1] % 16:
        return None
    if not (query.dtype == key.dtype == value.dtype == torch.float32) or key.shape[-1] != value.shape[-1]:
        return None
    from mars_bench.models import panel

    return panel.library()


_LISTS: list = [None]   # the last (mask, shape, keys, off): every layer of a forward passes the same mask


def _key_lists(attention_mask, b: int, q: int, kv: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, off) int32: row i of the b * q query rows attends to keys[off[i]:off[i + 1]], in cache order."""
    last = _LISTS[0]
    if last is not None and last[0] is attention_mask and last[1] == (b, q, kv):
        return last[2], last[3]
    if b == 1 and q == 1 and attention_mask is None:   # an ar decode step: every key, in order
        keys, off = torch.arange(kv, dtype=torch.int32), torch.tensor([0, kv], dtype=torch.int32)
    else:
        allowed = _allowed(attention_mask, b, q, kv, device)
        keys = allowed.nonzero()[:, 2].to(torch.int32).contiguous()   # row-major: each row's keys, in cache order
        off = torch.zeros(b * q + 1, dtype=torch.int32)
        off[1:] = allowed.reshape(b * q, kv).sum(-1).cumsum(0)
    _LISTS[0] = (attention_mask, (b, q, kv), keys, off)
    return keys, off


def _rows_c(lib, module, query, key, value, attention_mask, scaling):
    """Every row in one C call (``rows_attention``) -> [B, q, H, d]."""
    b, h, q, d = query.shape
    kv, h_kv = key.shape[2], key.shape[1]
    keys, off = _key_lists(attention_mask, b, q, kv, query.device)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1 or key.stride(-2) != d:
        key = key.contiguous()
    if value.stride(-1) != 1 or value.stride(-2) != d:
        value = value.contiguous()
    out = query.new_empty(b, q, h, d)
    scale = scaling if scaling is not None else d ** -0.5
    rc = lib.rows_attention(query.data_ptr(), query.stride(0), query.stride(1), query.stride(2), key.data_ptr(),
                            key.stride(0), key.stride(1), value.data_ptr(), value.stride(0), value.stride(1), b, h,
                            h_kv, q, d, keys.data_ptr(), off.data_ptr(), float(scale), out.data_ptr(),
                            torch.get_num_threads())
    if rc != 0:
        raise MemoryError(f"row-wise attention kernel failed (code {rc}) for {b} x {q} rows over {kv} keys")
    return out


def use_rowwise(model) -> None:
    """Register the row-wise attention and switch ``model`` to it (transformers' public interface)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, rowwise_attention)
    model.set_attn_implementation(NAME)
