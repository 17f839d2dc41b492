"""Device placement on the GPU path, checked on a CPU: a sharded target (``device_map`` over several GPUs)
keeps cache layers on different devices, and the target's logits on the last one. Here some layers sit on
``meta`` while the rest and the adapter stay on the CPU, and ``StrictDevices`` raises, as CUDA does, when
an op mixes tensors of two devices. The EAGLE-3 head's rotary frequencies stay fp32 after a bf16 load."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from mars_bench.decode.drafters.eagle3 import Eagle3Head
from mars_bench.decode.rules import get_rule
from mars_bench.decode.tree.build import DraftTree
from mars_bench.models.eagle3_heads import load_eagle3_head

from .test_eagle3 import head_config, random_state, write


class StrictDevices(TorchFunctionMode):
    """Raises when a torch op gets tensors (other than 0-dim ones) on two devices; copies (``to``) excepted."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in ("to", "copy_", "__get__", "__set__"):
            devs = {t.device for t in _tensors(args) + _tensors(list((kwargs or {}).values())) if t.dim() > 0}
            if len(devs) > 1:
                raise RuntimeError(f"{name}: tensors on {sorted(map(str, devs))}")
        return func(*args, **(kwargs or {}))


def _tensors(xs) -> list:
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _tensors(x)
    return out


def test_strict_devices_catches_a_mixed_index():
    with pytest.raises(RuntimeError, match="index_select"), StrictDevices():
        torch.empty(3, 2, device="meta").index_select(0, torch.tensor([0, 1]))


def _to_meta(layer, width: int) -> None:
    """A cache layer's buffers (and so its views) on ``meta``."""
    layer._kbuf, layer._vbuf = layer._kbuf.to("meta"), layer._vbuf.to("meta")
    layer.show(width)


def _sharded(tiny, rows: int = 3, feed=None):
    """A fork of the tiny target with ``rows`` batched rows prefilled (then fed ``feed``), its second layer moved
    to meta."""
    t = tiny[0].fork()
    t.batch_reset(rows)
    for b in range(rows):
        t.batch_prefill(b, list(range(5 + 3 * b)))
    if feed:
        t.batch_forward(feed)
    _to_meta(t.bcache.layers[1], t.batch_width)
    return t


def test_batch_select_moves_rows_of_each_layer_on_its_own_device(tiny):
    t = _sharded(tiny)
    with StrictDevices():
        t.batch_select([2, 0])
    assert t.bcache.layers[1].keys.device.type == "meta" and t.bcache.layers[1].keys.shape[0] == 2
    assert t.bcache.layers[0].keys.device.type == "cpu" and t.batch_lens == [11, 5]


def test_batch_keep_moves_columns_of_each_layer_on_its_own_device(tiny):
    t = _sharded(tiny, feed=[[1, 2, 3]] * 3)
    with StrictDevices():
        t.batch_keep([[0, 2], [0], [0, 1, 2]])
    assert t.batch_lens == [7, 9, 14] and [layer.keys.shape[2] for layer in t.bcache.layers[:2]] == [14, 14]
    assert t.bcache.layers[1].keys.device.type == "meta"


@pytest.mark.parametrize("owned", [False, True])
def test_keep_on_each_layer_on_its_own_device(tiny, owned):
    """A layer on another device: its own buffer there (moved in place) or other tensors (index-selected)."""
    t = tiny[0].fork()
    t.forward(list(range(6)), logits=False)
    layer = t.cache.layers[1]
    if owned:
        _to_meta(layer, 6)
    else:
        layer.keys, layer.values = layer.keys.to("meta"), layer.values.to("meta")
    with StrictDevices():
        t.keep(0, [0, 2, 5])
    assert t.cache.layers[1].keys.shape[2] == 3 and t.cache.layers[0].keys.shape[2] == 3


@pytest.mark.parametrize("rule", ["exact", "mars"])
def test_q_draft_meets_the_target_logits_on_their_device(rule):
    """Sampled verification: q_draft drawn on the draft's device (cpu) and the target's logits on another
    (meta): the rule moves q_draft to the logits."""
    k, v = 3, 11
    z = torch.empty(k, v, device="meta")
    p = torch.empty(k, v, device="meta")
    u = torch.empty(k, device="meta")
    draft = torch.zeros(k, dtype=torch.long, device="meta")
    q = torch.softmax(torch.randn(k, v), -1)
    with StrictDevices():
        out = get_rule(rule)(draft, z, p, q, u)
    assert out.accept.device.type == "meta"


def test_sampled_tree_children_q_is_on_the_logits_device():
    q = torch.softmax(torch.randn(7), -1)
    tree = DraftTree([1, 2, 3], [-1, 0, 0], [0, 1, 1], [-1, -1, -1], mode="sample", q={0: q})
    assert tree.children_q(7, torch.device("meta")).device.type == "meta"


def test_eagle3_rotary_stays_fp32_after_a_bf16_load(tmp_path):
    config = head_config(8)
    path = write(tmp_path / "h", config, random_state(config, list(range(8))))
    fp32, _ = load_eagle3_head(str(path))
    bf16, _ = load_eagle3_head(str(path), dtype=torch.bfloat16)
    assert bf16.fc.weight.dtype == torch.bfloat16
    assert bf16.rotary.inv_freq.dtype == torch.float32 and torch.equal(bf16.rotary.inv_freq, fp32.rotary.inv_freq)
    x = torch.zeros(1, 1, 1, 24)
    pos = torch.tensor([[1000]])
    cos32, _ = fp32.rotary(x, pos)
    cos16, _ = bf16.rotary(x.bfloat16(), pos)
    assert (cos16.float() - cos32).abs().max() < 1e-2      # bf16 output rounding only: angles exact
    # what a bf16 inv_freq would do at position 1000: angle errors far beyond output rounding
    drift = (1000 * fp32.rotary.inv_freq.bfloat16().float() - 1000 * fp32.rotary.inv_freq).abs().max()
    assert drift > 0.1


def test_eagle3_head_to_meta_keeps_fp32_rotary_on_the_device():
    head = Eagle3Head(head_config(8)).to(device="meta", dtype=torch.bfloat16)
    assert head.rotary.inv_freq.device.type == "meta" and head.rotary.inv_freq.dtype == torch.float32


@pytest.mark.parametrize("parents", [[-1, 0, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 3, 4, 6, 7], [-1, -1, 0, 1, 3]])
def test_tree_ancestors_built_on_the_device_equal_the_host_loop(parents):
    from mars_bench.decode.tree.mask import ancestors

    depths = []
    for p in parents:
        depths.append(0 if p < 0 else depths[p] + 1)
    host = DraftTree(list(range(len(parents))), parents, depths, [-1] * len(parents)).ancestors() \
        if parents.count(-1) == 1 else None
    got = ancestors(parents, torch.device("cpu"), max(depths))
    want = torch.eye(len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            want[i] |= want[p]
    assert torch.equal(got, want) and (host is None or torch.equal(got, host))
    assert ancestors(parents, torch.device("meta"), max(depths)).device.type == "meta"
