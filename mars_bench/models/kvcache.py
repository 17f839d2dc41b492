"""KV caches that write in place: transformers' ``DynamicCache`` whose full-attention layers keep their keys
and values as views of a preallocated buffer with spare columns.

Why: ``DynamicLayer.update`` concatenates the whole cache with the new columns on every forward
(``torch.cat``), so each decode step copies every layer's keys and values once more: 97 ``aten::cat``
calls per one-token forward of the embedded draft, a copy that grows with the context (the profiler charged
them 3.5 ms of a q4 draft step after 200 tokens; the step's wall time there moved by less than its noise,
28.1 vs 28.4 ms). Here a forward writes only its new columns; the values, their order
and the tensors attention sees are the same, so logits are bit-identical to ``DynamicCache``'s (tested
through forward / crop / keep / batched sequences).

A layer's buffer is [rows, heads, capacity, dim]; ``keys`` / ``values`` are the views [:rows, :, :width]. A
buffer is allocated zeroed (a masked column is never garbage, never NaN) and replaced only when a write
needs more columns than it has (``capacity``: half as many again, so O(log n) times per sequence). Nothing
is ever gathered to compact it:
- ``GrowingCache`` (one sequence): a forward appends at the width; ``crop`` slices the view; the adapter's
  ``keep`` keeps a tree's accepted path by moving its few columns down in place (``move``; the prefix is not
  touched).
- ``RowCache`` (the batch, ``models.batched.BatchCacheMixin``): row b's new tokens go to ITS columns
  len_b .. len_b + n - 1 (``write_at``, set before a forward), so a row's committed tokens are always its
  columns 0 .. len_b - 1: a crop lowers len_b (later writes overwrite the rest), a tree's path moves within
  the row's tail, and the columns a row does not hold are masked out by the adapter.
A layer owns its buffer while ``keys`` / ``values`` are such views. Code that replaces them with other
tensors (a sharded test moving one to another device) is seen at the next write, which copies them into a
new buffer. Nothing outside the adapter holds cache tensors across forwards: a write past a cropped length
reuses columns a dropped view once covered.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SPARE = 256     # spare columns a new buffer gets (at least; half the length once longer)


def capacity(columns: int) -> int:
    """Columns of the buffer a layer allocates to hold ``columns`` (the most it holds for them)."""
    return columns + max(SPARE, columns // 2)


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` writing into its own buffer's spare columns instead of concatenating."""

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None
    rows = 1                  # rows of the buffer the views show

    def owns(self) -> bool:
        """``keys`` / ``values`` are views of this layer's buffers."""
        k, v, kb, vb = self.keys, self.values, self._kbuf, self._vbuf
        return (kb is not None and k is not None and k.dim() == 4 and k.device == kb.device
                and k.data_ptr() == kb.data_ptr() and k.stride() == kb.stride() and k.dtype == kb.dtype
                and v.data_ptr() == vb.data_ptr() and v.stride() == vb.stride())

    @property
    def width(self) -> int:
        """Columns the views show (every row's cached columns lie below it)."""
        return self.keys.shape[-2] if self.is_initialized and self.keys is not None and self.keys.dim() == 4 else 0

    def hold(self, key_states: torch.Tensor, value_states: torch.Tensor, width: int) -> None:
        """Make the buffers hold ``width`` columns for the rows of ``key_states`` / ``value_states`` ([B, H, *, d],
        shapes and dtype only), keeping the columns the views show; a new buffer copies them (the only copy)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        kb, (b, h, _, d) = self._kbuf, key_states.shape
        if (self.owns() and kb.shape[0] >= b and kb.shape[1] == h and kb.shape[3] == d and width <= kb.shape[2]
                and kb.dtype == key_states.dtype):
            return
        old, cap = self.width, capacity(width)
        kb = key_states.new_zeros(b, h, cap, d)
        vb = value_states.new_zeros(b, value_states.shape[1], cap, value_states.shape[3])
        if old:
            kb[:self.keys.shape[0], :, :old].copy_(self.keys)
            vb[:self.values.shape[0], :, :old].copy_(self.values)
        self._kbuf, self._vbuf, self.rows = kb, vb, b
        self.show(old)

    def show(self, width: int) -> None:
        """Point ``keys`` / ``values`` at the buffers' first ``rows`` rows and ``width`` columns (no copy)."""
        self.keys, self.values = self._kbuf[:self.rows, :, :width], self._vbuf[:self.rows, :, :width]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        old, n = self.width, key_states.shape[-2]
        self.hold(key_states, value_states, old + n)
        self._kbuf[:self.rows, :, old:old + n].copy_(key_states)
        self._vbuf[:self.rows, :, old:old + n].copy_(value_states)
        self.show(old + n)
        return self.keys, self.values

    def reserve(self, rows: int, width: int) -> None:
        """``hold`` ahead of a forward (outside a compiled region: ``owns`` compares data pointers, which dynamo
        cannot trace), for ``rows`` rows of the buffers' own heads, dim and dtype. The buffers are marked as
        static addresses: a captured forward writes into them in place (CUDA graphs skip a graph that mutates
        any other input) and replays until a new buffer replaces them."""
        kb, vb = self._kbuf, self._vbuf
        self.hold(kb.new_empty(rows, kb.shape[1], 0, kb.shape[3]), vb.new_empty(rows, vb.shape[1], 0, vb.shape[3]),
                  width)
        torch._dynamo.mark_static_address(self._kbuf)
        torch._dynamo.mark_static_address(self._vbuf)

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor, at: torch.Tensor, width: int,
              held: bool = False):
        """Row b's n new columns go to columns ``at[b]`` ([B, n], on this layer's device); the views then show
        ``width`` columns. ``held``: ``reserve`` made room already."""
        if not held:
            self.hold(key_states, value_states, width)
        (b, h, n, d), (_, hv, _, dv) = key_states.shape, value_states.shape
        self._kbuf[:b].scatter_(2, at[:, None, :, None].expand(b, h, n, d), key_states)
        self._vbuf[:b].scatter_(2, at[:, None, :, None].expand(b, hv, n, dv), value_states)
        self.show(width)
        return self.keys, self.values

    def move(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Column ``src[i]`` of row ``rows[i]`` to column ``dst[i]`` of that row, for every i at once (the
        sources are read before any is written); nothing else moves."""
        for buf in (self._kbuf, self._vbuf):
            buf[rows, :, dst] = buf[rows, :, src]

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        """Row ``src[i]``'s first ``width`` columns to row ``dst[i]``, for every i at once (rows leaving a batch:
        the ones behind a gap move into it)."""
        for buf in (self._kbuf, self._vbuf):
            buf[dst, :, :width] = buf[src, :, :width]

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        self.rows = 1
        super().reset()


class GrowingCache(DynamicCache):
    """``DynamicCache`` with ``GrowingLayer`` in place of every plain ``DynamicLayer`` (sliding-window and
    other layer kinds stay as transformers makes them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in self.layers]
        if getattr(self, "layer_class_to_replicate", None) is DynamicLayer:
            self.layer_class_to_replicate = GrowingLayer


class RowCache(DynamicCache):
    """The batched cache: a ``GrowingLayer`` for every layer (the adapter's batched masks are full-attention
    masks). While ``write_at`` ([B, n] columns) is set, a forward writes row b's new tokens at ``write_at[b]``
    and the layers then show ``width`` columns; else it appends like ``GrowingCache``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.layers = [GrowingLayer() for _ in self.layers]
        if getattr(self, "layer_class_to_replicate", None) is not None:
            self.layer_class_to_replicate = GrowingLayer
        self.write_at, self.width, self._at, self.held = None, 0, {}, False

    def aim(self, at: torch.Tensor | None, width: int = 0, held: bool = False) -> None:
        """The next forward's write columns ([B, n], or None: append) and the width the layers show after it;
        ``held``: every layer's ``reserve`` made room for them already."""
        self.write_at, self.width, self._at, self.held = at, width, {} if at is None else {at.device: at}, held

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self.write_at is None:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        dev = key_states.device
        if dev not in self._at:             # a sharded model: the columns once per device
            self._at[dev] = self.write_at.to(dev)
        return self.layers[layer_idx].write(key_states, value_states, self._at[dev], self.width, self.held)
