"""The in-place KV cache (models/kvcache.py): every logit bit-identical to transformers' DynamicCache
through the adapter's whole cache vocabulary (forward, crop, keep, batched forward / crop / select /
compact), and appends really write into the layer's own buffer."""
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
        else:
            n = ours.cache_len
            index = torch.tensor([i for i in range(n) if i % 3])
            ours.keep(index)
            ref.keep(index)
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
    ours.keep(torch.arange(0, 22, 2))               # a new tensor: the next append copies into a new buffer
    ours.forward([8])
    assert layer._kbuf is not buf and layer.keys.shape[-2] == 12


def test_batched_bit_identical(tiny):
    ours, ref = twins(tiny)
    g = torch.Generator().manual_seed(1)
    for a in (ours, ref):
        a.batch_reset(3)
    for row, n in enumerate((12, 30, 7)):
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        ours.batch_prefill(row, ids)
        ref.batch_prefill(row, ids)
    for step in range(6):
        sizes = ((step % 3) + 1, 1, 4 - step % 2)[:ours.batch_rows]
        feed = [torch.randint(0, 256, (m,), generator=g).tolist() for m in sizes]
        for x, y in zip(ours.batch_forward(feed), ref.batch_forward(feed)):
            assert torch.equal(x, y), step
        lens = [ln - (step % 2) for ln in ours.batch_lens]
        ours.batch_crop(lens)
        ref.batch_crop(lens)
        if step == 3:
            ours.batch_select([0, 2])
            ref.batch_select([0, 2])
            ours.batch_compact()
            ref.batch_compact()
    assert ours.batch_lens == ref.batch_lens


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
