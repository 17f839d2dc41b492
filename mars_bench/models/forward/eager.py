"""The eager forward path: transformers' modules, called with the adapter's caches.

A single sequence (``Eager.forward``) appends its n tokens to the cache (a ``GrowingCache``), causal unless a
tree's 4-D mask and position ids come with them. A batch (``Eager.batch_forward``, layout in
``models.batched``): row b's n_b new tokens, padded with ``PAD_ID`` to the longest feed, are written at ITS
columns len_b .. len_b + n_b - 1, at positions len_b + i (a tree token: len_b + its depth), and the layers show
max(len_b) + n columns; the mask (``row_mask``) lets row b see its columns below len_b and its own new tokens
(causal, or a draft tree's ancestors), never another row's columns. One chain row needs no mask: the causal
default, as a single sequence. ``score_one`` and ``score_rows`` are shared with the fixed-shape path
(``models.forward.fixed``), which calls them with its own widths, rows and compiled model.
"""
from __future__ import annotations

import torch

from mars_bench.decode.tree.mask import additive, additive_mask, ancestors
from mars_bench.models.forward.path import ForwardPath

PAD_ID = 0               # batched forwards: the id fed in padding slots (masked out, its logits unused)


class Eager(ForwardPath):
    """transformers' modules over cache views exactly as wide as the tokens held."""

    def forward(self, a, ids, attention_mask, position_ids, logits: bool, hidden_states: bool):
        kwargs = {a.cache_kw: a.cache, "use_cache": True}
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:        # transformers' eager attention adds the mask: make it so
                attention_mask = additive_mask(attention_mask.reshape(attention_mask.shape[-2:]), a.model)
            kwargs["attention_mask"] = {"full_attention": attention_mask}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(a.device)
        return score_one(a, a.model, ids, kwargs, logits, hidden_states)

    def batch_forward(self, a, tokens: list, held: list[int], trees: list | None, hidden_states: bool):
        view = max(held, default=0) + max(len(t) for t in tokens)     # the columns the layers show
        return score_rows(a, tokens, tokens, held, trees, view, [], False, hidden_states)


def score_one(a, model, ids: torch.Tensor, kwargs: dict, logits: bool, hidden_states: bool):
    """One timed call of ``model`` on a single sequence's ``ids`` with the cache keywords ``kwargs``: raw fp32
    logits over ``a.out_vocab`` (None for ``logits=False``: the LM head scores the last token only), and the
    hidden states where asked."""
    if not logits:
        kwargs["logits_to_keep"] = 1
    if hidden_states:
        kwargs["output_hidden_states"] = True
    with a.timed():
        out = model(input_ids=ids, **kwargs)
        z = out.logits[0].float() if logits else None
    if z is not None:
        z = a.widen_logits(z)
    return (z, out.hidden_states) if hidden_states else z


def score_rows(a, tokens: list, fed: list, held: list[int], trees: list | None, view: int, layers: list,
               masked: bool, hidden_states: bool):
    """One timed call of ``a.step_model`` on the batched cache: ``fed[b]`` (``tokens`` plus any rows fed nothing)
    written at row b's columns ``held[b]`` .., the layers showing ``view`` columns during the forward. ``layers``:
    those told the fed row count (and, when every layer is there, given room for ``view`` columns before the
    forward); ``masked``: pass the mask even for one chain row. Returns per row of ``tokens`` its logits (and
    hidden states)."""
    rows, n, dev = len(fed), max(len(t) for t in fed), a.device
    tree_rows = any(t is not None for t in (trees or []))
    lens = torch.tensor(held, device=dev)
    ids = padded_ids(fed, n, dev)
    count = torch.tensor([len(t) for t in fed], device=dev)
    new_ok = torch.arange(n, device=dev)[None] < count[:, None]                        # [B, n]
    causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
    own = (causal[None] & new_ok[:, None, :]).clone()                                 # real new tokens
    offset = torch.arange(n, device=dev)[None].expand(rows, n).clone()
    for b, tree in enumerate(trees or []):
        if tree is not None and len(fed[b]):
            m = len(fed[b])
            own[b, :m, :m] = ancestors(tree.parents[:m], dev, max(tree.depths[:m]))
            offset[b, :m] = torch.tensor(tree.depths[:m], device=dev)
    own |= torch.eye(n, dtype=torch.bool, device=dev)[None]                          # padding sees itself: no empty row
    at = lens[:, None] + torch.arange(n, device=dev)[None]                             # [B, n]: each row's own columns
    room = bool(layers) and len(layers) == len(a.bcache.layers)
    for layer in layers:
        layer.rows = rows
        if room:                               # room made before the forward: nothing in it to trace but writes
            layer.reserve(rows, view)
    a.bcache.aim(at, view, room)
    kwargs = {a.cache_kw: a.bcache, "use_cache": True, "position_ids": lens[:, None] + offset}
    if rows > 1 or tree_rows or masked:
        allowed = row_mask(own, lens, view)                                            # [B, n, view]
        kwargs["attention_mask"] = {"full_attention": additive(allowed, a.model)[:, None]}
    if hidden_states:
        kwargs["output_hidden_states"] = True
    try:
        with a.timed():
            out = a.step_model(input_ids=ids, **kwargs)
            z = out.logits.float()
    finally:
        a.bcache.aim(None)
        for layer in layers:
            layer.rows = a.batch_rows
    a.show_batch()
    z = a.widen_logits(z)
    zs = [z[b, : len(t)] for b, t in enumerate(tokens)]
    if not hidden_states:
        return zs
    return zs, [tuple(h[b:b + 1, : len(t)] for h in out.hidden_states) for b, t in enumerate(tokens)]


def padded_ids(tokens: list, n: int, device) -> torch.Tensor:
    """[B, n] ids: row b's tokens (a list of ints or a LongTensor already on a device) then PAD_ID."""
    if not any(isinstance(t, torch.Tensor) for t in tokens):
        return torch.tensor([list(t) + [PAD_ID] * (n - len(t)) for t in tokens], dtype=torch.long, device=device)
    rows = [torch.as_tensor(t, dtype=torch.long).to(device) for t in tokens]
    return torch.stack([torch.nn.functional.pad(r, (0, n - len(r)), value=PAD_ID) for r in rows])


def row_mask(own: torch.Tensor, lens: torch.Tensor, width: int) -> torch.Tensor:
    """Bool [B, n, width]: query i of row b sees the row's columns below ``lens[b]`` and, among its new columns
    lens[b] + j (j < n), those ``own[b, i, j]`` allows."""
    rows, n = own.shape[:2]
    rel = torch.arange(width, device=own.device)[None] - lens[:, None]                   # [B, W]: column - len_b
    new = (rel >= 0) & (rel < n)
    mine = own.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(rows, n, width))       # own[b, i, rel]
    return (rel < 0)[:, None, :] | (mine & new[:, None, :])
