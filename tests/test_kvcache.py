"""The in-place KV cache (models/kvcache.py): every logit bit-identical to transformers' DynamicCache
through the adapter's single-sequence cache vocabulary (forward, crop, keep), the batched cache (forward /
crop / keep / select) bit-identical to a reference layer doing every write and move on fresh copies, and
appends really write into the layer's own buffer."""
import copy

import torch
from transformers import DynamicCache

from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.kvcache import GrowingCache, GrowingLayer


def twins(tiny):
    """The tiny target twice over the same weights: ours, and one on transformers' DynamicCache."""
    ours = tiny[0].fork()
    ref = tiny[0].fork()
    ref._cache_cls = DynamicCache
    ref.reset()
    return ours, ref


def test_adapter_uses_growing_layers(tiny):
    ours, _ = twins(tiny)
    assert isinstance(ours.cache, GrowingCache)
    assert all(type(layer) is GrowingLayer for layer in ours.cache.layers)


def test_single_sequence_bit_identical(tiny):
    ours, ref = twins(tiny)
    g = torch.Generator().manual_seed(0)
    steps = [("f", 40), ("f", 1), ("f", 5), ("c", 43), ("f", 1), ("k", None), ("f", 3), ("c", 10), ("f", 300),
             ("f", 1)]
    for op, arg in steps:
        if op == "f":
            ids = torch.randint(0, 256, (arg,), generator=g).tolist()
            a, b = ours.forward(ids), ref.forward(ids)
            assert torch.equal(a, b), (op, arg)
        elif op == "c":
            ours.crop(arg)
            ref.crop(arg)
        else:           # everything from column 4 on is the "tail": most of it moves
            n = ours.cache_len
            offsets = [i for i in range(n - 4) if i % 3]
            ours.keep(4, offsets)
            ref.keep(4, offsets)
        assert ours.cache_len == ref.cache_len


def test_appends_write_in_place(tiny):
    ours, _ = twins(tiny)
    ours.forward(list(range(30)))
    layer = ours.cache.layers[0]
    buf = layer._kbuf
    assert buf.shape[-2] > 30
    ours.forward([5])
    ours.crop(20)
    ours.forward([6, 7])
    assert layer._kbuf is buf and layer.keys.data_ptr() == buf.data_ptr() and layer.keys.shape[-2] == 22
    ours.keep(2, range(0, 20, 2))                   # moved within the buffer: the next append writes there too
    ours.forward([8])
    assert layer._kbuf is buf and layer.keys.data_ptr() == buf.data_ptr() and layer.keys.shape[-2] == 13


class CopyingLayer(GrowingLayer):
    """Reference: every write and move on a fresh copy of the buffer, from the untouched old one."""

    def hold(self, key_states, value_states, width):
        old = self._kbuf, self._vbuf
        self._kbuf = self._vbuf = None                       # no longer owned: a new buffer, the views copied
        super().hold(key_states, value_states, max(width, old[0].shape[2] if old[0] is not None else 0))

    def write(self, key_states, value_states, at, width, held=False):
        self.hold(key_states, value_states, width)
        kb, vb = self._kbuf.clone(), self._vbuf.clone()
        for b in range(key_states.shape[0]):
            for i, col in enumerate(at[b].tolist()):
                kb[b, :, col], vb[b, :, col] = key_states[b, :, i], value_states[b, :, i]
        self._kbuf, self._vbuf = kb, vb
        self.show(width)
        return self.keys, self.values

    def move(self, rows, src, dst):
        kb, vb = self._kbuf.clone(), self._vbuf.clone()
        for r, s, d in zip(rows.tolist(), src.tolist(), dst.tolist()):
            kb[r, :, d], vb[r, :, d] = self._kbuf[r, :, s], self._vbuf[r, :, s]
        self._kbuf, self._vbuf = kb, vb

    def move_rows(self, src, dst, width):
        kb, vb = self._kbuf.clone(), self._vbuf.clone()
        for s, d in zip(src.tolist(), dst.tolist()):
            kb[d], vb[d] = self._kbuf[s], self._vbuf[s]
        self._kbuf, self._vbuf = kb, vb


def test_batched_bit_identical(tiny):
    ours, ref = twins(tiny)
    g = torch.Generator().manual_seed(1)
    for a in (ours, ref):
        a.batch_reset(3)
    ref.bcache.layers = [CopyingLayer() for _ in ref.bcache.layers]
    for row, n in enumerate((12, 30, 7)):
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        ours.batch_prefill(row, ids)
        ref.batch_prefill(row, ids)
    buf = ours.bcache.layers[0]._kbuf
    for step in range(8):
        sizes = ((step % 3) + 1, 1, 4 - step % 2)[:ours.batch_rows]
        feed = [torch.randint(0, 256, (m,), generator=g).tolist() for m in sizes]
        trees = [_chain_or_fork(m, step) for m in sizes] if step % 2 else None
        for x, y in zip(ours.batch_forward(feed, trees), ref.batch_forward(feed, trees)):
            assert torch.equal(x, y), step
        if trees:
            keep = [[0] + ([2] if m > 2 else []) for m in sizes]       # a path that skips a fed node
            ours.batch_keep(keep)
            ref.batch_keep(keep)
        else:
            lens = [ln - (step % 2 == 0) for ln in ours.batch_lens]
            ours.batch_crop(lens)
            ref.batch_crop(lens)
        if step == 3:
            ours.batch_select([0, 2])
            ref.batch_select([0, 2])
        assert ours.batch_lens == ref.batch_lens
        for lo, lr in zip(ours.bcache.layers, ref.bcache.layers):      # every row's columns (not the free ones)
            for row, n in enumerate(ours.batch_lens):
                assert torch.equal(lo.keys[row, :, :n], lr.keys[row, :, :n])
                assert torch.equal(lo.values[row, :, :n], lr.values[row, :, :n])
    assert ours.bcache.layers[0]._kbuf is buf           # never reallocated: it held every row's columns


def _chain_or_fork(m: int, step: int):
    """A draft tree over m fed tokens: node 0 the root's child, then a fork (nodes 1 and 2 both children of 0),
    then a chain."""
    from types import SimpleNamespace

    parents = [-1, 0, 0, 2, 3][:m]
    depths = [0, 1, 1, 2, 3][:m]
    return SimpleNamespace(parents=parents, depths=depths)


def test_fork_shares_no_buffer(tiny):
    ours, _ = twins(tiny)
    ours.forward(list(range(10)))
    twin = copy.copy(ours).fork()
    twin.forward(list(range(10, 20)))
    assert ours.cache_len == 10 and twin.cache_len == 10
    assert ours.cache.layers[0]._kbuf.data_ptr() != twin.cache.layers[0]._kbuf.data_ptr()


def test_adapter_default_is_ours():
    from mars_bench.models.tiny import tiny_pair

    target, _, _ = tiny_pair()
    assert CausalLMAdapter(target)._cache_cls is GrowingCache
