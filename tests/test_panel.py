"""The AVX-512 panel GEMM (mars_bench/models/panel.py): equal to F.linear up to rounding for every row count,
greedy outputs of the fast path equal the plain path, an atomic cached build, and a clean fallback to MKL."""
import pytest
import torch

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.models import fastpath, panel
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.tiny import tiny_pair

needs_kernel = pytest.mark.skipif(panel.library() is None, reason=f"panel kernel unavailable: {panel.unavailable()}")


@needs_kernel
@pytest.mark.parametrize("out_f,in_f,bias", [(64, 64, True), (256, 1536, False), (1536, 8960, True), (32768, 96, True)])
def test_panel_linear_matches_f_linear_for_every_row_count(out_f, in_f, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(in_f, out_f, bias=bias)
    pl = panel.PanelLinear(lin)
    pl.pack(1)
    for m in (1, 2, 3, 7, 11, 12, 13, 24, 25, 32):      # 1..3 chunks of 12 rows, ragged tails
        x = torch.randn(1, m, in_f)
        got = pl(x)
        torch.testing.assert_close(got, lin(x), atol=2e-5 * in_f ** 0.5, rtol=1e-4)
        assert not torch.equal(got, torch.zeros_like(got))


@needs_kernel
def test_panel_layer_uses_the_kernel_only_when_on_and_small():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96)
    pl = panel.PanelLinear(lin)
    with torch.no_grad():
        pl.panels.zero_()                      # poison the pack: any kernel call now returns the bias only
    x = torch.randn(3, 64)
    assert torch.equal(pl(x), lin(x))          # off until a row count is announced: plain F.linear
    pl.pack(3)
    torch.testing.assert_close(pl(x), lin.bias.expand(3, 96))
    big = torch.randn(panel.MAX_ROWS + 1, 64)
    assert torch.equal(pl(big), lin(big))      # prefill-sized calls go to F.linear
    pl.pack(None)
    assert torch.equal(pl(x), lin(x))


@needs_kernel
def test_a_batch_announcing_more_rows_keeps_each_row_bit_identical():
    """Batched decoding announces B x (k + 1) rows (40 at B = 8, k = 4): the kernel then takes the whole
    call, and each row's output is the same, bit for bit, as in a call of that row alone."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(1536, 256)
    pl = panel.PanelLinear(lin)
    pl.pack(40)
    x = torch.randn(40, 1536)
    y = pl(x)
    assert not torch.equal(y, lin(x))          # the kernel, not F.linear, computed the 40-row call
    for i in (0, 13, 39):
        assert torch.equal(y[i], pl(x[i:i + 1])[0])
    big = torch.randn(41, 1536)
    assert torch.equal(pl(big), lin(big))      # more than announced (a prefill): F.linear


@needs_kernel
def test_fast_path_greedy_outputs_equal_plain_path(prompt_ids):
    target, draft, tok = tiny_pair()
    plain_t = CausalLMAdapter(target)
    plain_d = CausalLMAdapter(draft, out_vocab=plain_t.vocab)
    ft, fd, _ = tiny_pair()
    fast_t = CausalLMAdapter(fastpath.enable_fast_path(ft))
    fast_d = CausalLMAdapter(fastpath.enable_fast_path(fd), out_vocab=fast_t.vocab)
    assert fastpath.kind(fast_t.model) == "panel-avx512"
    assert isinstance(fast_t.model.model.layers[0].mlp.down_proj, panel.PanelLinear)
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=(258,))
    for method in (Method("ar"), Method("sd", k=3), Method("sd", k=7), Method("sd_tree", k=4),
                   Method("mars", k=3, rule="mars", rule_kwargs={"theta": 0.9})):
        for ids in prompt_ids[:8]:
            assert generate(plain_t, plain_d, tok, ids, method, cfg).tokens == \
                generate(fast_t, fast_d, tok, ids, method, cfg).tokens, (method, ids)


@needs_kernel
def test_build_is_cached_and_atomic(tmp_path):
    so = panel.build(tmp_path)
    assert so.exists() and so.parent == tmp_path
    mtime = so.stat().st_mtime_ns
    assert panel.build(tmp_path) == so and so.stat().st_mtime_ns == mtime      # reused, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [so.name]                  # no temp file left behind


def test_failed_build_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(panel, "cpu", lambda: ("test cpu", {"avx512f"}))
    with pytest.raises(RuntimeError, match=r"no C compiler .*no-such-cc.* \(set \$CC\)"):
        panel.build(tmp_path / "k")
    assert not any((tmp_path / "k").iterdir())
    fake_cc = tmp_path / "cc"
    fake_cc.write_text("#!/bin/sh\necho 'panel_gemm.c:1: error: nope' >&2\nexit 1\n")
    fake_cc.chmod(0o755)
    monkeypatch.setenv("CC", str(fake_cc))
    with pytest.raises(RuntimeError, match=r"failed on panel_gemm.c: panel_gemm.c:1: error: nope$"):
        panel.build(tmp_path / "k")
    assert not any((tmp_path / "k").iterdir())


def test_without_avx512_the_fast_path_falls_back_to_mkl(monkeypatch):
    monkeypatch.setattr(panel, "cpu", lambda: ("old cpu", {"avx2", "fma"}))
    monkeypatch.setattr(panel, "_state", {})
    assert panel.library() is None and "lacks AVX-512F" in panel.unavailable()
    t, _, _ = tiny_pair()
    fast = fastpath.enable_fast_path(t)
    assert fastpath.kind(fast) == ("mkl-packed" if fastpath.available() else "off")
