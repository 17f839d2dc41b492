"""The fixed-shape forward path, what ``model.capture`` needs (``CausalLMAdapter.fixed_shape``).

A batched forward's cache views and mask span ``fixed_columns(max(len_b) + n)`` columns (a power of two, at least
``FIXED_MIN``) instead of exactly max(len_b) + n, every row masked by its length as on the eager path, and rows
that left the batch are still fed (nothing): the row count stays the one ``batch_reset`` set. A single sequence's
forwards of a few tokens (a tree draft's expansions, a chain's catch-up) likewise write at the cache's width and
attend over ``fixed_columns`` columns (its cache a one-row ``RowCache``). The forwards of a decode then take a few
shapes (rows x fed tokens x a width that changes O(log length) times), not one per token, so each can be captured
once (CUDA graphs: ``a.step_model``, a compiled model) and replayed; prefills stay eager. The masked columns add
attention work, never weight reads.
"""
from __future__ import annotations

import torch

from mars_bench.decode.tree.mask import additive
from mars_bench.models.forward.eager import score_one, score_rows
from mars_bench.models.forward.path import ForwardPath

FIXED_MIN = 256          # the narrowest cache view a fixed-shape forward attends over


def fixed_columns(columns: int) -> int:
    """Columns a fixed-shape forward's cache views span to hold ``columns``: the next power of two, at least
    ``FIXED_MIN``."""
    return max(FIXED_MIN, 1 << (columns - 1).bit_length())


class Fixed(ForwardPath):
    """Cache views of a few fixed widths, the batch's row count fixed."""

    def forward(self, a, ids, attention_mask, position_ids, logits: bool, hidden_states: bool):
        """A few tokens at fixed shapes: the new tokens written at the cache's columns width .. width + n - 1
        (``RowCache``, one row), the views and the mask spanning ``fixed_columns(width + n)`` columns, the columns
        above the new ones masked; then the views show the width + n columns held."""
        n, width = ids.shape[1], a.cache_len
        view = fixed_columns(width + n)
        if attention_mask is None:                          # causal: token i sees columns 0 .. width + i
            cols = torch.arange(width + n, device=a.device)
            attention_mask = additive(cols[None] <= width + torch.arange(n, device=a.device)[:, None],
                                      a.model)[None, None]
        pad = view - attention_mask.shape[-1]
        masked = False if attention_mask.dtype == torch.bool else torch.finfo(attention_mask.dtype).min
        mask = torch.nn.functional.pad(attention_mask, (0, pad), value=masked)
        if position_ids is None:
            position_ids = torch.arange(width, width + n, device=a.device)[None]
        layers = [layer for layer in a.cache.layers if layer.is_initialized]
        for layer in layers:
            layer.reserve(1, view)
        a.cache.aim(torch.arange(width, width + n, device=a.device)[None], view, held=True)
        kwargs = {a.cache_kw: a.cache, "use_cache": True, "attention_mask": {"full_attention": mask},
                  "position_ids": position_ids.to(a.device)}
        try:
            return score_one(a, a.step_model, ids, kwargs, logits, hidden_states)
        finally:
            a.cache.aim(None)
            for layer in layers:
                layer.show(width + n)

    def batch_forward(self, a, tokens: list, held: list[int], trees: list | None, hidden_states: bool):
        view = fixed_columns(max(held, default=0) + max(len(t) for t in tokens))
        fed, extra = tokens, a.fixed_rows - len(tokens)
        if extra > 0:                     # rows that left feed nothing: the row count stays fixed
            fed, held = list(tokens) + [[]] * extra, held + [0] * extra
            trees = None if trees is None else list(trees) + [None] * extra
        return score_rows(a, tokens, fed, held, trees, view, a.batch_layers(), True, hidden_states)
