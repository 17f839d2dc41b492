"""The preallocated KV caches move no history (issue 32): a batched decode (tiny pair, sd k=4 and a tree method,
4 prompts of ragged lengths at batch size 3: a row finishes and its slot is refilled, rows leave at the end)
never gathers a cache's columns beyond a step's fed tokens, keeps each layer's buffer between steps (a new one
only when the capacity grows), and gives ar's tokens; a single sequence's ``keep`` moves the path's columns in
place (the prefix bytes untouched) to exactly what index selection gives, and the next forward is bit-identical.
``CacheCopies`` counts the gathers (a ``TorchDispatchMode``: every aten op, whoever calls it)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from mars_bench.decode import DecodeConfig, Method
from mars_bench.decode import engine
from mars_bench.decode.generate import Request, generate, generate_batch
from mars_bench.decode.tree import TreeSpec
from mars_bench.models import kvcache

from .conftest import EOS, MAX_NEW

aten = torch.ops.aten
TREE = TreeSpec(depth=3, top_k=3, total_tokens=12)


class CacheCopies(TorchDispatchMode):
    """Records the gathers (index_select, gather, index, cat) of KV tensors ([rows, heads, columns, dim] with
    these heads and dim): ``seq``, per op along the sequence axis, the most columns copied for one row;
    ``rows``, per op along the row axis, the rows copied."""

    def __init__(self, heads: int, dim: int):
        super().__init__()
        self.heads, self.dim, self.seq, self.rows = heads, dim, [], []

    def _kv(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] == self.heads and t.shape[3] == self.dim

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.cat.default:
            dim = args[1] if len(args) > 1 else 0
            if self._kv(args[0][0]) and dim % 4 in (0, 2):
                (self.seq if dim % 4 == 2 else self.rows).append(out.shape[dim])
        elif func is aten.index_select.default and self._kv(args[0]) and args[1] % 4 in (0, 2):
            (self.seq if args[1] % 4 == 2 else self.rows).append(args[2].numel())
        elif func is aten.gather.default and self._kv(args[0]) and args[1] % 4 == 2:
            self.seq.append(args[2].shape[2])
        elif func is aten.index.Tensor and self._kv(args[0]):
            idx = list(args[1]) + [None] * 4
            if idx[2] is not None:      # (rows, columns) pairs: the most pairs of one row
                rows = idx[0] if idx[0] is not None else torch.zeros_like(idx[2])
                self.seq.append(int(torch.bincount(rows.reshape(-1)).max()))
            elif idx[0] is not None:
                self.rows.append(idx[0].numel())
        return out


def counter(adapter) -> CacheCopies:
    c = adapter.model.config
    return CacheCopies(c.num_key_value_heads, c.hidden_size // c.num_attention_heads)


@pytest.mark.parametrize("method, tree, fed", [(Method("sd", k=4), None, 0), (Method("sd_tree"), TREE, 12)])
def test_batched_decode_moves_no_history(tiny, prompt_ids, monkeypatch, method, tree, fed):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=2 * MAX_NEW, eos_ids=(EOS,))
    prompts = [prompt_ids[i] for i in (0, 5, 3, 7)]
    assert len({len(p) for p in prompts}) > 1 and min(len(p) for p in prompts) > TREE.total_tokens
    ar = [generate(target, None, tok, p, Method("ar"), cfg).tokens for p in prompts]
    allocations, reallocated, steps, inside = [0], [], [0], [False]     # allocations: inside steps (prefills apart)
    real_capacity, real_step = kvcache.capacity, engine.Batch.step

    def capacity(columns):
        allocations[0] += inside[0]
        return real_capacity(columns)

    def buffers():
        """(storage, columns) of every batched layer's key buffer (its keys where it holds none)."""
        caches = [a.bcache for a in (target, draft) if a.bcache is not None]
        kbufs = [layer._kbuf if layer._kbuf is not None else layer.keys for c in caches for layer in c.layers
                 if layer.is_initialized]
        return [(k.data_ptr(), k.shape[2]) for k in kbufs]

    def step(batch):
        before = buffers()
        inside[0] = True
        out = real_step(batch)
        inside[0], steps[0] = False, steps[0] + 1
        after = buffers()
        reallocated.extend(b != a for b, a in zip(before, after))
        assert all(b == a or a[1] > b[1] for b, a in zip(before, after)), "a buffer replaced without growing"
        return out

    monkeypatch.setattr(kvcache, "capacity", capacity)
    monkeypatch.setattr(engine.Batch, "step", step)
    got = {}
    with counter(target) as copies:
        generate_batch(target, draft, tok, [Request(p, key=i) for i, p in enumerate(prompts)], method, cfg, 3,
                       lambda req, res: got.__setitem__(req.key, res.tokens), tree=tree)
    assert [got[i] for i in range(4)] == ar
    # sd: no column of any row gathered; trees: at most a step's fed columns of a row (the accepted path)
    assert max(copies.seq, default=0) <= fed, f"a gather of {max(copies.seq)} columns of one row"
    assert max(copies.rows, default=0) < 3       # rows leaving: only the ones behind a gap move, never all
    layers = len(target.bcache.layers)
    assert steps[0] > 2 * len(prompts) and sum(reallocated) <= 2 * layers and allocations[0] <= 2 * layers, (
        f"{allocations[0]} buffers allocated in {steps[0]} steps")        # at most a growth per cache


def test_keep_moves_the_path_in_place(tiny, prompt_ids):
    ours, ref = tiny[0].fork(), tiny[0].fork()
    ref._cache_cls = DynamicCache                 # transformers' layers: keep selects by index
    ref.reset()
    ids = prompt_ids[2]
    start = len(ids)
    for a in (ours, ref):
        a.forward(ids + [11, 12, 13, 14, 15, 16], logits=False)
    offsets = [0, 2, 5]
    layers = ours.cache.layers
    ptrs = [(layer._kbuf.data_ptr(), layer._vbuf.data_ptr()) for layer in layers]
    prefix = [(layer._kbuf[:, :, :start].clone(), layer._vbuf[:, :, :start].clone()) for layer in layers]
    with counter(ours) as copies:
        ours.keep(start, offsets)
    ref.keep(start, offsets)
    assert max(copies.seq) <= len(offsets) and not copies.rows
    for layer, r, p, (k0, v0) in zip(layers, ref.cache.layers, ptrs, prefix):
        assert (layer._kbuf.data_ptr(), layer._vbuf.data_ptr()) == p and layer.owns()
        assert torch.equal(layer._kbuf[:, :, :start], k0) and torch.equal(layer._vbuf[:, :, :start], v0)
        assert torch.equal(layer.keys, r.keys) and torch.equal(layer.values, r.values)
    assert ours.cache_len == ref.cache_len == start + len(offsets)
    assert torch.equal(ours.forward([21, 22]), ref.forward([21, 22]))
    assert [(layer._kbuf.data_ptr(), layer._vbuf.data_ptr()) for layer in layers] == ptrs
