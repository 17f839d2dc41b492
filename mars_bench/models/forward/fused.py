"""The fused forward path: each layer one C call (``a.fused``, a ``models.fused.FusedDecoder``; the kernels, the
models it covers and why are told there).

The decoder takes a flat list of M new tokens, each with its row, cache column, position and the cache columns it
attends to (``flat``: all of them with offsets). A chain token i of row b sits at column and position len_b + i and
attends to the row's columns 0 .. len_b + i (``chain_keys``); a tree token at column len_b + i, position
len_b + depth_i, attends to the row's len_b committed columns, its ancestors and itself (``tree_keys``). A single
sequence is a batch of one row over its own cache.
"""
from __future__ import annotations

import torch

from mars_bench.models.forward.path import ForwardPath


class Fused(ForwardPath):
    """``a.fused``'s one call per layer: a single sequence's chains and tree nodes, chains and trees of a batch,
    with their hidden states where asked (no prefill: ``models.forward.choose`` sends only those here)."""

    def forward(self, a, ids, attention_mask, position_ids, logits: bool, hidden_states: bool):
        """A chain (no mask: token i at column and position width + i, causal), or a tree's nodes: the same
        columns, at ``position_ids``, each attending to the columns its ``attention_mask`` row allows."""
        n, width = ids.shape[1], a.cache_len
        at = torch.arange(width, width + n, device=a.device)
        pos = at if position_ids is None else position_ids.reshape(n).to(at)
        keys = chain_keys(width, n) if attention_mask is None else mask_keys(attention_mask, width + n)
        with a.timed():
            out = a.fused.forward(a.cache, ids[0], pos, torch.zeros_like(at), at, *flat(keys), 1, width + n,
                                  hidden_states)
        if not hidden_states:
            return a.widen_logits(out)
        return a.widen_logits(out[0]), tuple(h[None] for h in out[1])

    def batch_forward(self, a, tokens: list, held: list[int], trees: list | None, hidden_states: bool):
        ids, rows, cols, pos, keys = [], [], [], [], []
        for b, t in enumerate(tokens):
            if not len(t):
                continue
            t = t.tolist() if isinstance(t, torch.Tensor) else list(t)     # the fused path runs on the CPU
            tree = trees[b] if trees else None
            ids += t
            rows += [b] * len(t)
            cols += range(held[b], held[b] + len(t))
            if tree is None:
                pos += range(held[b], held[b] + len(t))
                keys += chain_keys(held[b], len(t))
            else:
                pos += [held[b] + d for d in tree.depths[:len(t)]]
                keys += tree_keys(held[b], tree.parents[:len(t)])
        ids, pos, rows, cols = (torch.tensor(x, device=a.device) for x in (ids, pos, rows, cols))
        with a.timed():
            out = a.fused.forward(a.bcache, ids, pos, rows, cols, *flat(keys), a.batch_rows, max(a.blens),
                                  hidden_states)
        a.show_batch()
        z, hs = out if hidden_states else (out, None)
        z = a.widen_logits(z)
        parts, states, at = [], [], 0
        for t in tokens:
            parts.append(z[at:at + len(t)])
            if hs is not None:
                states.append(tuple(h[None, at:at + len(t)] for h in hs))
            at += len(t)
        return (parts, states) if hidden_states else parts


def chain_keys(length: int, n: int) -> list[torch.Tensor]:
    """Cache columns each of a row's n new chain tokens attends to: the row's ``length`` cached columns, then
    its new columns length .. length + i (token i and the ones before it)."""
    return [torch.arange(length + i + 1) for i in range(n)]


def tree_keys(length: int, parents: list[int]) -> list[torch.Tensor]:
    """Cache columns each of a row's new tree tokens attends to: the row's ``length`` cached columns, then the
    columns length + j of its ancestors j among the new tokens (``parents``: -1 = the committed sequence) and
    its own, ascending."""
    out = []
    for i in range(len(parents)):
        path, j = [], i
        while j >= 0:
            path.append(length + j)
            j = parents[j]
        out.append(torch.cat([torch.arange(length), torch.tensor(path[::-1])]))
    return out


def mask_keys(mask: torch.Tensor, span: int) -> list[torch.Tensor]:
    """Cache columns each of a single sequence's n new tokens attends to, read off a tree forward's mask over the
    ``span`` = cache + n columns ([1, 1, n, span] or [n, span]; boolean: True attends; additive: 0 attends), the
    token's own column included (a tree mask always allows it)."""
    allowed = mask.reshape(-1, mask.shape[-1]).cpu()
    allowed = allowed if allowed.dtype == torch.bool else allowed == 0
    if allowed.shape[1] != span:
        raise ValueError(f"attention_mask spans {allowed.shape[1]} columns; allowed: the cache's and the new "
                         f"tokens' {span}")
    return [row.nonzero().flatten() for row in allowed]


def flat(keys: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(all key columns, offsets [M + 1]) for ``FusedDecoder.forward``."""
    off = torch.zeros(len(keys) + 1, dtype=torch.long)
    off[1:] = torch.tensor([len(k) for k in keys]).cumsum(0)
    return torch.cat(keys), off
