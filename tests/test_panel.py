"""The panel GEMM (mars_bench/models/panel.py), in every kernel family this CPU runs (avx512, avx2): equal to
F.linear up to rounding for every row count, greedy outputs of the fast path equal the plain path, an atomic
cached build, the family setting ($MARS_BENCH_CPU_ISA) and a clean fallback to MKL."""
import ctypes
import logging
import os
import platform

import pytest
import torch

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.models import fastpath, panel
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.tiny import tiny_pair

from .kernels import family_params, use_family

needs_kernel = pytest.mark.skipif(panel.library() is None, reason=f"panel kernel unavailable: {panel.unavailable()}")


@pytest.mark.parametrize("family", family_params())
@pytest.mark.parametrize("out_f,in_f,bias", [(64, 64, True), (256, 1536, False), (1536, 8960, True), (32768, 96, True)])
def test_panel_linear_matches_f_linear_for_every_row_count(out_f, in_f, bias, family, monkeypatch):
    use_family(monkeypatch, family)
    torch.manual_seed(0)
    lin = torch.nn.Linear(in_f, out_f, bias=bias)
    pl = panel.PanelLinear(lin)
    assert pl.kernel == f"panel-{family}"
    pl.pack(1)
    for m in (1, 2, 3, 6, 7, 11, 12, 13, 24, 25, 32):   # chunks of 12 (avx512) or 6 (avx2) rows, ragged tails
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


@pytest.mark.parametrize("family", family_params())
def test_a_batch_announcing_more_rows_keeps_each_row_bit_identical(family, monkeypatch):
    """Batched decoding announces B x (k + 1) rows (40 at B = 8, k = 4): the kernel then takes the whole
    call, and each row's output is the same, bit for bit, as in a call of that row alone."""
    use_family(monkeypatch, family)
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


@pytest.mark.parametrize("family", family_params())
def test_fast_path_greedy_outputs_equal_plain_path(prompt_ids, family, monkeypatch):
    use_family(monkeypatch, family)
    target, draft, tok = tiny_pair()
    plain_t = CausalLMAdapter(target)
    plain_d = CausalLMAdapter(draft, out_vocab=plain_t.vocab)
    ft, fd, _ = tiny_pair()
    fast_t = CausalLMAdapter(fastpath.enable_fast_path(ft))
    fast_d = CausalLMAdapter(fastpath.enable_fast_path(fd), out_vocab=fast_t.vocab)
    assert fastpath.kind(fast_t.model) == f"panel-{family}"
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
    monkeypatch.delenv(panel.ISA_ENV, raising=False)
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


x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the kernel families are x86")


@x86
def test_without_avx512_the_avx2_kernels_run_and_without_avx2_the_fast_path_falls_back_to_mkl(monkeypatch, caplog):
    if "avx2" not in panel.families():
        pytest.skip(f"the avx2 family does not run here: {panel.unavailable()}")
    monkeypatch.delenv(panel.ISA_ENV, raising=False)
    monkeypatch.setattr(panel, "cpu", lambda: ("zen cpu", {"avx2", "fma", "f16c"}))
    monkeypatch.setattr(panel, "_state", {})
    with caplog.at_level(logging.INFO, logger="mars_bench.models.panel"):
        assert panel.isa() == "avx2" and panel.library() is not None and panel.family() == "avx2"
    assert [r.getMessage() for r in caplog.records] == [
        "panel GEMM: avx2 kernels (the CPU has AVX2 + FMA, no AVX-512F)"]
    assert fastpath.kind(fastpath.enable_fast_path(tiny_pair()[0])) == "panel-avx2"
    monkeypatch.setattr(panel, "cpu", lambda: ("old cpu", {"sse4_2"}))
    monkeypatch.setattr(panel, "_state", {})
    assert panel.isa() == "generic" and panel.library() is None
    assert panel.unavailable() == "CPU 'old cpu' lacks AVX2 + FMA and AVX-512F"
    t, _, _ = tiny_pair()
    fast = fastpath.enable_fast_path(t)
    assert fastpath.kind(fast) == ("mkl-packed" if fastpath.available() else "off")


@x86
def test_the_family_setting_forces_a_kernel_or_says_why_not(monkeypatch):
    monkeypatch.setattr(panel, "cpu", lambda: ("zen cpu", {"avx2", "fma", "f16c"}))
    for value, why in (("generic", "MARS_BENCH_CPU_ISA=generic (no C kernels)"), ("AVX512", "CPU 'zen cpu' lacks AVX-512F")):
        monkeypatch.setenv(panel.ISA_ENV, value)
        monkeypatch.setattr(panel, "_state", {})
        assert panel.isa() == value.lower() and panel.library() is None and panel.unavailable() == why
        assert panel.families() == []
    monkeypatch.setenv(panel.ISA_ENV, "sse")
    monkeypatch.setattr(panel, "_state", {})
    with pytest.raises(ValueError, match=r"^MARS_BENCH_CPU_ISA='sse'; allowed: auto, avx512, avx2, neon, generic$"):
        panel.library()
    monkeypatch.setattr(panel, "cpu", lambda: ("server cpu", {"avx512f", "avx2", "fma", "f16c"}))
    monkeypatch.setenv(panel.ISA_ENV, "avx2")
    assert panel.isa() == "avx2" and panel.families() == ["avx2"]
    monkeypatch.setenv(panel.ISA_ENV, "auto")
    assert panel.isa() == "avx512" and panel.families() == ["avx512", "avx2"]


@x86
def test_each_family_builds_its_own_library(tmp_path):
    built = {f: panel.build(tmp_path, family=f) for f in panel.families()}
    assert len(set(built.values())) == len(built)
    assert all(so.name.startswith(f"panel_gemm-{f}-") for f, so in built.items())


@x86
def test_a_compiler_without_openmp_builds_one_thread_kernels_in_one_line(tmp_path, monkeypatch, caplog):
    """macOS clang has no -fopenmp: the build retries without it, says so once, and the kernel still runs."""
    import shutil

    if not panel.families():
        pytest.skip(f"no kernel family here: {panel.unavailable()}")
    real = shutil.which(os.environ.get("CC", "cc"))
    fake = tmp_path / "cc"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && {{ echo "clang: error: unsupported option \'-fopenmp\'" >&2; exit 1; }}; done\nexec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with caplog.at_level(logging.WARNING, logger="mars_bench.models.panel"):
        so = panel.build(tmp_path / "k")
    assert [r.getMessage() for r in caplog.records] == [
        f"panel_gemm.c built without OpenMP (one thread): {fake} -fopenmp failed: clang: error: unsupported option '-fopenmp'"]
    lib = ctypes.CDLL(str(so))
    lib.panel_linear.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.panel_pack.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_int]
    torch.manual_seed(0)
    n, k = 2 * lib.panel_width(), 64
    w, x = torch.randn(n, k), torch.randn(3, k)
    packed, y = torch.empty(n * k), torch.empty(3, n)
    lib.panel_pack(w.data_ptr(), n, k, packed.data_ptr(), 2)
    assert lib.panel_linear(x.data_ptr(), 3, k, packed.data_ptr(), n, None, y.data_ptr(), 2) == 0
    torch.testing.assert_close(y, x @ w.T, atol=1e-4, rtol=1e-4)
