"""The CPU fast path's MKL kernel (prepacked linears; the fallback where the panel kernel is unavailable)
gives the plain path's outputs. The panel kernel: tests/test_panel.py."""
import pytest
import torch

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.models import fastpath
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.tiny import tiny_pair

pytestmark = pytest.mark.skipif(not fastpath.available(), reason="torch built without MKL")


def test_packed_linear_matches_plain_for_every_row_count():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40000)
    packed = fastpath.PackedLinear(lin)
    for rows in (1, 4, 8):
        packed.pack(rows)
        assert packed.packed is not None          # 40000 outputs: an LM-head-sized matrix packs at any M
        for m in (1, 2, 4, 8, 9):
            x = torch.randn(1, m, 96)
            torch.testing.assert_close(packed(x), lin(x), atol=1e-4, rtol=1e-5)
    packed.pack(None)
    assert packed.packed is None


def test_small_matrices_pack_only_from_min_rows():
    p = fastpath.PackedLinear(torch.nn.Linear(64, 128))
    p.pack(2)
    assert p.packed is None
    p.pack(fastpath.MIN_ROWS)
    assert p.packed is not None


def test_fast_path_greedy_outputs_equal_plain_path(prompt_ids):
    target, draft, tok = tiny_pair()
    plain_t, plain_d = CausalLMAdapter(target), None
    plain_d = CausalLMAdapter(draft, out_vocab=plain_t.vocab)
    ft, fd, _ = tiny_pair()
    fast_t = CausalLMAdapter(fastpath.enable_fast_path(ft, kernel="mkl"))
    fast_d = CausalLMAdapter(fastpath.enable_fast_path(fd, kernel="mkl"), out_vocab=fast_t.vocab)
    assert any(isinstance(m, fastpath.PackedLinear) for m in fast_t.model.modules())
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=(258,))
    for method in (Method("ar"), Method("sd", k=3), Method("sd", k=7),
                   Method("mars", k=3, rule="mars", rule_kwargs={"theta": 0.9})):
        for ids in prompt_ids[:8]:
            a = generate(plain_t, plain_d, tok, ids, method, cfg).tokens
            b = generate(fast_t, fast_d, tok, ids, method, cfg).tokens
            assert a == b, (method, ids)
    assert any(m.packed is not None for m in fast_t.model.modules() if isinstance(m, fastpath.PackedLinear))


def test_adapter_packing_off_gives_the_plain_path():
    t, _, _ = tiny_pair()
    a = CausalLMAdapter(fastpath.enable_fast_path(t, kernel="mkl"))
    packed = lambda: [m.packed is not None for m in a.model.modules() if isinstance(m, fastpath.PackedLinear)]  # noqa: E731
    a.expect(5)
    assert all(packed())
    a.packing = False
    a.expect(5)
    assert not any(packed()) and a.rows is None
