"""A KV cache that appends in place: transformers' ``DynamicCache`` whose full-attention layers keep their
keys and values as prefix views of a buffer with spare columns.

Why: ``DynamicLayer.update`` concatenates the whole cache with the new columns on every forward
(``torch.cat``), so each decode step copies every layer's keys and values once more: 97 ``aten::cat``
calls per one-token forward of the embedded draft, a copy that grows with the context (the profiler charged
them 3.5 ms of a q4 draft step after 200 tokens; the step's wall time there moved by less than its noise,
28.1 vs 28.4 ms). Here a forward writes only its new columns; the values, their order
and the tensors attention sees are the same, so logits are bit-identical to ``DynamicCache``'s (tested
through forward / crop / keep / batched sequences).

A layer owns its buffer while ``keys`` / ``values`` are prefix views of it (``crop`` and the batched
trims slice such a view). Code that replaces them with new tensors (``keep``'s index selection, the
batched widen / select / compact) is seen at the next ``update``, which copies them into a new buffer.
Nothing outside the adapter holds cache tensors across forwards: a write past a cropped length reuses
columns a dropped view once covered.
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
    """``DynamicLayer`` appending into spare columns instead of concatenating."""

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None

    def _owned(self, key_states: torch.Tensor) -> bool:
        k, v, kb, vb = self.keys, self.values, self._kbuf, self._vbuf
        return (kb is not None and k.dim() == 4 and k.data_ptr() == kb.data_ptr() and k.stride() == kb.stride()
                and v.data_ptr() == vb.data_ptr() and v.stride() == vb.stride()
                and k.shape[:2] == key_states.shape[:2] and kb.dtype == key_states.dtype)

    def reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, n: int) -> int:
        """Make the buffers hold the cached columns plus ``n`` more (shaped like ``key_states`` /
        ``value_states`` [B, H, *, d]); return the first free column. ``advance(n)`` then makes the written
        columns part of the cache."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        if not self._owned(key_states) or old + n > self._kbuf.shape[-2]:
            cap = capacity(old + n)
            (b, h, _, d), (bv, hv, _, dv) = key_states.shape, value_states.shape
            kb, vb = key_states.new_empty(b, h, cap, d), value_states.new_empty(bv, hv, cap, dv)
            if old:
                kb[:, :, :old].copy_(self.keys)
                vb[:, :, :old].copy_(self.values)
            self._kbuf, self._vbuf = kb, vb
        return old

    def advance(self, n: int) -> None:
        end = (self.keys.shape[-2] if self.keys.dim() == 4 else 0) + n
        self.keys, self.values = self._kbuf[:, :, :end], self._vbuf[:, :, :end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        old = self.reserve(key_states, value_states, n)
        self._kbuf[:, :, old:old + n].copy_(key_states)
        self._vbuf[:, :, old:old + n].copy_(value_states)
        self.advance(n)
        return self.keys, self.values

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        super().reset()


class GrowingCache(DynamicCache):
    """``DynamicCache`` with ``GrowingLayer`` in place of every plain ``DynamicLayer`` (sliding-window and
    other layer kinds stay as transformers makes them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in self.layers]
        if getattr(self, "layer_class_to_replicate", None) is DynamicLayer:
            self.layer_class_to_replicate = GrowingLayer
