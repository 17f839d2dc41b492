"""Row-wise attention (models/attention.py, on with the CPU fast path): a query row's attention is
bit-identical whether it is computed alone (an ar decode step), among the k + 1 rows of a verification
forward, or beside other sequences of a batch with padding; and it is attention (close to transformers'
SDPA on the same inputs, every mask form)."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mars_bench.models import fastpath, panel
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.attention import NAME, rowwise_attention

from .kernels import family_params, use_family

H, H_KV, D = 12, 2, 128     # the embedded target's attention geometry


@pytest.fixture(scope="module")
def module():
    cfg = Qwen2Config(vocab_size=512, hidden_size=H * D, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=H, num_key_value_heads=H_KV, max_position_embeddings=1024)
    return Qwen2ForCausalLM(cfg).model.layers[0].self_attn


def qkv(b, q, kv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, H, q, D, generator=g), torch.randn(b, H_KV, kv, D, generator=g),
            torch.randn(b, H_KV, kv, D, generator=g))


def alone(module, query, key, value, i, j, keys):
    """Row j of sequence i as an ar step computes it: one query row, no mask, its keys only."""
    idx = torch.as_tensor(keys)
    k, v = key[i:i + 1].index_select(2, idx), value[i:i + 1].index_select(2, idx)
    return rowwise_attention(module, query[i:i + 1, :, j:j + 1], k, v, None, scaling=D ** -0.5)[0][0, 0]


def test_verification_rows_equal_the_rows_alone(module):
    query, key, value = qkv(1, 6, 306)
    out, _ = rowwise_attention(module, query, key, value, None, scaling=D ** -0.5)
    for j in range(6):
        assert torch.equal(out[0, j], alone(module, query, key, value, 0, j, range(300 + j + 1))), j
    causal = torch.ones(6, 306, dtype=torch.bool).tril(300)            # the new rows see the cache and their past
    rep = lambda t: t.repeat_interleave(H // H_KV, 1)  # noqa: E731
    ref = torch.nn.functional.scaled_dot_product_attention(query, rep(key), rep(value), attn_mask=causal,
                                                           scale=D ** -0.5).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("form", ["bool", "additive"])
def test_padded_batch_rows_equal_the_rows_alone(module, form):
    """A batch of 3 whose cached columns interleave padding, ragged new rows, a tree-like mask."""
    b, q, kv = 3, 4, 60
    query, key, value = qkv(b, q, kv, seed=1)
    g = torch.Generator().manual_seed(2)
    allowed = torch.rand(b, q, kv, generator=g) < 0.6
    allowed[:, :, :5] = True
    allowed[1, 2] = False                              # a fully masked (padding) row: output zero
    mask = allowed[:, None] if form == "bool" else \
        torch.zeros(b, 1, q, kv).masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
    out, _ = rowwise_attention(module, query, key, value, mask, scaling=D ** -0.5)
    for i in range(b):
        for j in range(q):
            keys = allowed[i, j].nonzero().squeeze(1).tolist()
            if keys:
                assert torch.equal(out[i, j], alone(module, query, key, value, i, j, keys)), (i, j)
            else:
                assert not out[i, j].any()
    keep = allowed.any(-1)                             # SDPA's output for rows that attend to something
    rep = lambda t: t.repeat_interleave(H // H_KV, 1)  # noqa: E731
    ref = torch.nn.functional.scaled_dot_product_attention(query, rep(key), rep(value), attn_mask=allowed[:, None],
                                                           scale=D ** -0.5).transpose(1, 2)
    assert torch.allclose(out[keep], ref[keep], atol=1e-5)


def test_the_fast_path_switches_the_model_to_it_and_scores_rows_alike():
    """On the fast path (panel kernel: row-invariant linears) a whole model scores k + 1 rows exactly
    as it scores them one by one."""
    if panel.library() is None:
        pytest.skip(f"panel kernel unavailable here: {panel.unavailable()}")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=H * D, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=H, num_key_value_heads=H_KV, max_position_embeddings=1024)
    a = CausalLMAdapter(fastpath.enable_fast_path(Qwen2ForCausalLM(cfg).eval()))
    assert a.model.config._attn_implementation == NAME
    g = torch.Generator().manual_seed(0)
    prefix, new = torch.randint(0, 512, (200,), generator=g).tolist(), torch.randint(0, 512, (5,), generator=g).tolist()
    a.forward(prefix, logits=False)
    a.expect(5)
    together = a.forward(new)
    a.crop(200)
    a.expect(1)
    assert torch.equal(together, torch.cat([a.forward([t]) for t in new]))


@pytest.mark.parametrize("family", family_params())
def test_kernel_and_transformers_rows_agree_and_the_kernel_serves_fp32_only(module, family, monkeypatch):
    """Where the panel library is built (each family: 16-lane AVX-512 or 8-lane AVX2 sums) every fp32 row takes
    one C call (rows_attention); other dtypes take transformers' SDPA row by row. On the same inputs the two
    agree (float64 SDPA as the reference), and a row's result is the same alone or among others."""
    use_family(monkeypatch, family)
    from mars_bench.models import attention

    query, key, value = qkv(2, 5, 80, seed=3)
    assert attention._kernel(query, key, value, 0.0) is not None
    assert attention._kernel(query.double(), key.double(), value.double(), 0.0) is None
    assert attention._kernel(query, key, value, 0.1) is None
    lib = panel.library()
    for mask in (None, torch.rand(2, 1, 5, 80, generator=torch.Generator().manual_seed(4)) < 0.7):
        out, _ = rowwise_attention(module, query, key, value, mask, scaling=D ** -0.5)
        assert torch.equal(out, attention._rows_c(lib, module, query, key, value, mask, D ** -0.5))
        ref, _ = rowwise_attention(module, query.double(), key.double(), value.double(), mask, scaling=D ** -0.5)
        torch.testing.assert_close(out, ref.float(), atol=2e-6, rtol=1e-5)
        for i, j in ((0, 0), (1, 3)):        # one row alone gives the same bits (ragged 8- and 16-lane key tails)
            if mask is None:                  # causal, the new rows last: row j sees the first 76 + j keys
                one, _ = rowwise_attention(module, query[i:i + 1, :, j:j + 1], key[i:i + 1, :, :76 + j],
                                           value[i:i + 1, :, :76 + j], None, scaling=D ** -0.5)
            else:
                one, _ = rowwise_attention(module, query[i:i + 1, :, j:j + 1], key[i:i + 1], value[i:i + 1],
                                           mask[i:i + 1, :, j:j + 1], scaling=D ** -0.5)
            assert torch.equal(one[0, 0], out[i, j]), (i, j)
