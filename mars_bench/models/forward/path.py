"""The one interface of an adapter's forward paths (``ForwardPath``), what ``models.forward.choose`` picks from.

A path runs the model; the adapter (``models.adapter.CausalLMAdapter``) owns the rest: the caches and their
lengths, the timing (``a.timed()``: one counted forward, the device synchronized at both ends) and the mapping of
the model's logits onto the target's vocabulary (``a.widen_logits``). The two methods are the scoring halves of
``decode.backend``'s interfaces, on the adapter's state: ``forward`` does ``SequenceModel.forward``'s scoring and
``batch_forward`` does ``Backend.batch_forward``'s.
"""
from __future__ import annotations

from typing import Protocol

import torch


class ForwardPath(Protocol):
    """How a ``CausalLMAdapter`` ``a`` scores new tokens (implementations subclass it; stateless, one instance
    serves every adapter).

    ``forward``: the single-sequence cache ``a.cache`` takes ``ids`` [1, n] (on ``a.device``) after its
    ``a.cache_len`` cached tokens; ``attention_mask`` (4-D, over cache + n) and ``position_ids`` [1, n] for a
    tree, else None; returns raw fp32 logits [n, out_vocab] (None for ``logits=False``), with the per-layer hidden
    states where ``hidden_states``.
    ``batch_forward``: row b of the batched cache ``a.bcache`` takes ``tokens[b]`` after its ``held[b]`` committed
    tokens (``a.blens`` already counts the fed ones); ``trees[b]``: a draft tree over them or None; returns the
    logits per row (and the hidden states per row where ``hidden_states``), the cache layers showing the rows'
    width (``a.show_batch``)."""

    def forward(self, a, ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                logits: bool, hidden_states: bool): ...

    def batch_forward(self, a, tokens: list, held: list[int], trees: list | None, hidden_states: bool): ...
