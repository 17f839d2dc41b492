"""The aarch64 NEON kernels (panel_gemm.c + panel_bf16_neon.h, quant_gemm.c + quant_neon.h, attend.h), cross-compiled
with Debian's aarch64-linux-gnu-gcc and run under qemu-user (``pytest -m qemu``; toolchain: ``bash .ci/qemu.sh``).

Both builds the neon family makes (``panel.neon_flags``): plain ARMv8-A (bf16 by widening + FMA, int8 dots by
widening multiplies) and ARMv8.2-A + fp16 + dotprod + bf16 (BFDOT, SDOT; qemu ``-cpu max`` runs them), and plain
ARMv8-A built without OpenMP (macOS clang: one thread, the same results). Each kernel
equals a float64 reference within fp32 rounding, each row's result is bit-identical in a call of 9 rows, of 5 rows,
alone and on one thread (row invariance), and where the x86 kernels run here, the int8 kernels and the convert + FMA
bf16 kernel equal them bit for bit (the same integers and fp32 operations per lane). Tiny shapes: qemu is slow, and
speed on ARM is not measured anywhere."""
import ctypes
import logging
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from mars_bench.models import fused, panel, quant

pytestmark = pytest.mark.qemu

ROOT = Path(__file__).resolve().parents[1]
CROSS_CC = os.environ.get("MARS_BENCH_CROSS_CC", "aarch64-linux-gnu-gcc")
QEMU = os.environ.get("MARS_BENCH_QEMU", "qemu-aarch64")
SYSROOT = "/usr/aarch64-linux-gnu"
VARIANTS = {"armv8": panel.neon_flags(set()) + ["-fopenmp"],
            "bf16": panel.neon_flags({"asimdhp", "asimddp", "bf16"}) + ["-fopenmp"],
            "armv8-no-openmp": panel.neon_flags(set())}
ROWS = 9


@pytest.fixture(scope="module")
def toolchain() -> None:
    missing = [t for t in (CROSS_CC, QEMU) if shutil.which(t) is None] + \
              ([SYSROOT] if not Path(SYSROOT, "lib").is_dir() else [])
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `bash .ci/qemu.sh` (apt-get install qemu-user "
                    f"gcc-aarch64-linux-gnu)", pytrace=False)


@pytest.fixture(scope="module", params=list(VARIANTS))
def driver(request, toolchain, tmp_path_factory):
    """(variant, path of tests/neon_driver.c linked with both kernel sources for that variant's flags)."""
    out = tmp_path_factory.mktemp("neon") / f"driver-{request.param}"
    src = ROOT / "mars_bench" / "models"
    cmd = [CROSS_CC, "-O3", *VARIANTS[request.param], str(ROOT / "tests" / "neon_driver.c"),
           str(src / "panel_gemm.c"), str(src / "quant_gemm.c"), "-o", str(out), "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr}"
    return request.param, out


def run(binary: Path, args: list, payload: bytes) -> bytes:
    cmd = [QEMU, "-cpu", "max", "-L", SYSROOT, str(binary), *map(str, args)]
    r = subprocess.run(cmd, input=payload, capture_output=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.decode()[-2000:]}"
    return r.stdout


def linear_calls(binary, op: str, K: int, N: int, weights: bytes, bias: np.ndarray, calls: list, threads=2):
    """One driver process: the weights, then each x of ``calls`` as one kernel call -> list of y [M, N] fp32."""
    payload = weights + bias.astype(np.float32).tobytes()
    for x in calls:
        payload += np.int32(len(x)).tobytes() + np.ascontiguousarray(x, np.float32).tobytes()
    out = run(binary, [op, K, N, threads], payload)
    sizes = [len(x) * N for x in calls]
    assert len(out) == 4 * sum(sizes), f"driver wrote {len(out)} bytes, expected {4 * sum(sizes)}"
    flat = np.frombuffer(out, np.float32)
    return [a.reshape(-1, N) for a in np.split(flat, np.cumsum(sizes)[:-1])]


def invariance_calls(x: np.ndarray) -> list:
    """The calls whose rows must agree bit for bit: all rows, the first 5, each row alone."""
    return [x, x[:5]] + [x[i:i + 1] for i in range(len(x))]


def assert_rows_invariant(binary, op, K, N, weights, bias, x) -> np.ndarray:
    """Runs ``invariance_calls(x)`` on 2 threads and all rows on 1; returns the full call's y."""
    ys = linear_calls(binary, op, K, N, weights, bias, invariance_calls(x))
    full = ys[0]
    assert np.array_equal(ys[1], full[:5]), f"{op}: rows of a 5-row call differ from the {len(x)}-row call"
    alone = np.concatenate(ys[2:])
    assert np.array_equal(alone, full), f"{op}: rows alone differ from the {len(x)}-row call " \
                                        f"(max {np.abs(alone - full).max():.3g})"
    one_thread = linear_calls(binary, op, K, N, weights, bias, [x], threads=1)[0]
    assert np.array_equal(one_thread, full), f"{op}: 1 thread differs from 2"
    return full


def rows(K: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((ROWS, K)).astype(np.float32)
    x[1] *= 40.0
    x[3] = 0.0                                       # an all-zero row
    return x


def test_the_builds_report_their_kernels(driver):
    variant, binary = driver
    assert run(binary, ["info"], b"").decode().split() == [f"bfdot={int(variant == 'bf16')}", "quant_kind=3", "width=8"]


@pytest.mark.parametrize("K,N", [(64, 32), (128, 64)])
def test_fp32_panels_match_float64_and_rows_are_invariant(driver, K, N):
    _, binary = driver
    rng = np.random.default_rng(K)
    w, b, x = rng.standard_normal((N, K)).astype(np.float32), rng.standard_normal(N).astype(np.float32), rows(K, N)
    y = assert_rows_invariant(binary, "f32", K, N, w.tobytes(), b, x)
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def bf16_weight(N: int, K: int, seed: int) -> torch.Tensor:
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("K,N", [(64, 32), (128, 64), (96, 40)])
def test_bf16_panels_match_float64_and_rows_are_invariant(driver, K, N):
    """BFDOT rounds x to bf16 (as AVX512_BF16 does); convert + FMA keeps x fp32. The weights are bf16 either way, so
    the products are exact and only the fp32 sum rounds."""
    variant, binary = driver
    w = bf16_weight(N, K, K + N)
    b, x = np.random.default_rng(N).standard_normal(N).astype(np.float32), rows(K, K)
    y = assert_rows_invariant(binary, "bf16", K, N, w.view(torch.int16).numpy().tobytes(), b, x)
    xr = torch.from_numpy(x).to(torch.bfloat16).double().numpy() if variant == "bf16" else x.astype(np.float64)
    ref = xr @ w.double().numpy().T + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def quant_weights(bits: int, K: int, N: int, seed: int):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    codes, scales = quant.quantize(w, bits)
    return w, codes, scales, quant.pack(codes, scales, bits, "neon").numpy().tobytes()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("K,N", [(64, 32), (128, 64)])
def test_int8_kernels_match_their_float64_reference_and_rows_are_invariant(driver, bits, K, N):
    _, binary = driver
    _, codes, scales, packed = quant_weights(bits, K, N, bits + K)
    b, x = np.random.default_rng(bits).standard_normal(N).astype(np.float32), rows(K, bits)
    y = assert_rows_invariant(binary, f"q{bits}", K, N, packed, b, x)
    ref = quant.reference(torch.from_numpy(x), codes, scales, bits, torch.from_numpy(b)).numpy()
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() + 1e-6


x86 = pytest.mark.skipif(not panel.families(), reason=f"no x86 kernel family here: {panel.unavailable()}")


@x86
@pytest.mark.parametrize("bits", [4, 8])
def test_int8_kernels_equal_the_x86_kernels_bit_for_bit(driver, bits):
    _, binary = driver
    K, N = 96, 64
    w, _, _, packed = quant_weights(bits, K, N, 7)
    lin = torch.nn.Linear(K, N)
    with torch.no_grad():
        lin.weight.copy_(w)
    x = rows(K, 3)
    y = linear_calls(binary, f"q{bits}", K, N, packed, lin.bias.detach().numpy(), [x])[0]
    with torch.no_grad():
        host = quant.QuantLinear(lin, bits)(torch.from_numpy(x)).numpy()
    assert np.array_equal(y, host), f"q{bits}: max difference {np.abs(y - host).max():.3g}"


@pytest.mark.skipif("avx2" not in panel.families(), reason="the avx2 kernel family does not run here")
@pytest.mark.parametrize("driver", ["armv8", "armv8-no-openmp"], indirect=True)   # not BFDOT: it rounds x to bf16
def test_convert_fma_bf16_kernel_equals_the_avx2_kernel_bit_for_bit(driver, monkeypatch):   # and sums k pairs first
    """Both are one fp32 FMA chain over k in order (x[k] then x[k + 1] per k pair) with the bias added last."""
    variant, binary = driver
    monkeypatch.setenv(panel.ISA_ENV, "avx2")
    monkeypatch.setattr(panel, "_state", {})
    K, N = 128, 48
    lin = torch.nn.Linear(K, N).to(torch.bfloat16)
    x = rows(K, 5)
    y = linear_calls(binary, "bf16", K, N, lin.weight.detach().view(torch.int16).numpy().tobytes(),
                     lin.bias.detach().float().numpy(), [x])[0]
    with torch.no_grad():
        host = panel.PanelLinear(lin)(torch.from_numpy(x)).numpy()
    assert np.array_equal(y, host), f"max difference {np.abs(y - host).max():.3g}"


def attention_calls(binary, hd, C, H, Hkv, k, v, calls: list) -> list:
    """calls: (q [H, Q, hd], key lists per row) -> out [Q, H, hd] per call, one driver process."""
    payload = k.astype(np.float32).tobytes() + v.astype(np.float32).tobytes()
    for q, keys in calls:
        off = np.concatenate([[0], np.cumsum([len(kk) for kk in keys])]).astype(np.int32)
        flat = np.concatenate([np.asarray(kk, np.int32) for kk in keys] + [np.zeros(0, np.int32)])
        payload += np.int32(q.shape[1]).tobytes() + np.ascontiguousarray(q, np.float32).tobytes()
        payload += off.tobytes() + flat.astype(np.int32).tobytes()
    out = np.frombuffer(run(binary, ["attn", hd, C, H, Hkv, 2], payload), np.float32)
    sizes = [q.shape[1] * H * hd for q, _ in calls]
    assert out.size == sum(sizes)
    return [a.reshape(-1, H, hd) for a in np.split(out, np.cumsum(sizes)[:-1])]


def test_attention_matches_float64_and_rows_are_invariant(driver):
    _, binary = driver
    hd, C, H, Hkv = 32, 14, 4, 2
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((2, Hkv, C, hd)).astype(np.float32) * 0.7
    q = rng.standard_normal((H, ROWS, hd)).astype(np.float32)
    keys = [list(range(5 + r)) for r in range(ROWS)]      # a prefix per row (causal), ragged lengths
    keys[2] = [0, 3, 4, 6]                                # a row that skips keys (padding)
    keys[4] = []                                          # a row with no keys: zeros
    calls = [(q, keys), (q[:, :5], keys[:5])] + [(q[:, r:r + 1], keys[r:r + 1]) for r in range(ROWS)]
    outs = attention_calls(binary, hd, C, H, Hkv, k, v, calls)
    full = outs[0]
    assert np.array_equal(outs[1], full[:5])
    assert np.array_equal(np.concatenate(outs[2:]), full)
    ref = np.zeros((ROWS, H, hd))
    for r in range(ROWS):
        for h in range(H):
            if keys[r]:
                kk, vv = k[h // (H // Hkv), keys[r]].astype(np.float64), v[h // (H // Hkv), keys[r]].astype(np.float64)
                s = kk @ q[h, r].astype(np.float64) / np.sqrt(hd)
                p_attn = np.exp(s - s.max())
                ref[r, h] = p_attn @ vv / p_attn.sum()
    np.testing.assert_allclose(full, ref, rtol=1e-5, atol=1e-5)


def test_on_aarch64_the_neon_family_is_chosen_and_a_compiler_without_openmp_builds_it_in_one_line(
        toolchain, tmp_path, monkeypatch, caplog):
    """As on macOS (arm64, no /proc/cpuinfo, clang without -fopenmp): plain ARMv8-A kernels, one thread, one line
    per library; the libraries are aarch64 code with no OpenMP runtime calls."""
    monkeypatch.delenv(panel.ISA_ENV, raising=False)
    monkeypatch.setattr(panel.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(panel, "cpu", lambda: ("", set()))
    assert panel.isa() == "neon" and panel.families() == ["neon"]
    calls, fake = tmp_path / "calls", tmp_path / "cc"
    fake.write_text(f'''#!/bin/sh
echo "$@" >> {calls}
for a in "$@"; do [ "$a" = -fopenmp ] && {{ echo "clang: error: unsupported option '-fopenmp'" >&2; exit 1; }}; done
exec {shutil.which(CROSS_CC)} "$@"
''')
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with caplog.at_level(logging.WARNING, logger="mars_bench.models.panel"):
        built = [panel.build(tmp_path / "k", src=src) for src in (panel.SRC, quant.SRC)]
    assert [r.getMessage() for r in caplog.records] == [
        f"{name} built without OpenMP (one thread): {fake} -fopenmp failed: clang: error: unsupported option '-fopenmp'"
        for name in ("panel_gemm.c", "quant_gemm.c")]
    assert all(line.split()[1] == "-march=armv8-a" for line in calls.read_text().splitlines())
    for so in built:
        data = so.read_bytes()
        assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 183   # EM_AARCH64
        assert b"GOMP_" not in data and so.name.startswith(so.name.split("-")[0] + "-neon-")


@pytest.mark.skipif(not quant.available(), reason=f"no x86 quant kernel here: {quant.unavailable()}")
@pytest.mark.parametrize("bits", [4, 8])
def test_fused_layer_matches_the_x86_one_and_tokens_do_not_depend_on_their_call(driver, bits):
    """One quantized decoder layer (fused.py): 3 new tokens after a 4-token prefix in one call on cache row 0, and
    the same tokens one call each on row 1 (same prefix): bit-identical on ARM, and equal to the x86 kernel's layer
    up to summation order (norms, attention)."""
    _, binary = driver
    D, F, H, Hkv, hd, cap, prefix, M = 64, 96, 4, 2, 16, 8, 4, 3
    g = torch.Generator().manual_seed(bits)
    shapes = [(H * hd, D), (Hkv * hd, D), (Hkv * hd, D), (D, H * hd), (F, D), (F, D), (D, F)]
    ws = [torch.randn(n, k, generator=g) * k ** -0.5 for n, k in shapes]
    bs = [0.1 * torch.randn(n, generator=g) for n, _ in shapes]
    ln1, ln2 = 1 + 0.1 * torch.randn(D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    kv = torch.randn(2, 2, Hkv, cap, hd, generator=g)           # k, v x cache rows 0, 1
    kv[:, :, :, prefix:] = 0
    kv[:, 1] = kv[:, 0]
    h = torch.randn(M, D, generator=g)
    angle = torch.arange(prefix, prefix + M)[:, None] * torch.rand(hd // 2, generator=g)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)

    def call(row, tokens):
        keys = [list(range(prefix + m + 1)) for m in tokens]
        off = np.concatenate([[0], np.cumsum([len(k) for k in keys])])
        return [np.full(len(tokens), row), prefix + np.asarray(tokens), off, np.concatenate(keys)]

    calls = [(list(range(M)), call(0, range(M)))] + [([m], call(1, [m])) for m in range(M)]
    packs = [quant.pack(*quant.quantize(w, bits), bits, "neon").numpy().tobytes() for w in ws]
    payload = ln1.numpy().tobytes() + ln2.numpy().tobytes() + b"".join(packs)
    payload += b"".join(b.numpy().tobytes() for b in bs)
    payload += kv[0].numpy().tobytes() + kv[1].numpy().tobytes()
    for tokens, ints in calls:
        payload += np.int32(len(tokens)).tobytes() + b"".join(t[tokens].numpy().tobytes() for t in (h, cos, sin))
        payload += b"".join(np.asarray(a, np.int32).tobytes() for a in ints)
    out = np.frombuffer(run(binary, ["fused", bits, D, F, H, Hkv, hd, cap, 2], payload), np.float32).reshape(-1, D)
    joint, alone = out[:M], out[M:]
    assert np.array_equal(joint, alone), f"max difference {np.abs(joint - alone).max():.3g}"

    lib, ints = fused._lib(), [torch.from_numpy(np.asarray(a, np.int32)) for a in calls[0][1]]
    host_w = [quant.pack(*quant.quantize(w, bits), bits, quant.kind()) for w in ws]
    host_h, host_kv = h.clone(), kv.clone().contiguous()
    kernel = ctypes.cast(getattr(lib, f"quant_linear_q{bits}"), ctypes.c_void_p).value
    rc = lib.fused_layer_with(fused.Ptrs(*[kernel] * 7), M, D, host_h.data_ptr(), ln1.data_ptr(), ln2.data_ptr(), 1e-6,
                              fused.Ptrs(*[w.data_ptr() for w in host_w]), fused.Ptrs(*[b.data_ptr() for b in bs]), F,
                              H, Hkv, hd, hd ** -0.5, cos.data_ptr(), sin.data_ptr(), host_kv[0].data_ptr(),
                              host_kv[1].data_ptr(), cap, ints[0].data_ptr(), ints[1].data_ptr(), ints[3].data_ptr(),
                              ints[2].data_ptr(), 2)
    assert rc == 0
    np.testing.assert_allclose(joint, host_h.numpy(), rtol=1e-5, atol=1e-5 * np.abs(host_h.numpy()).max())
    assert not np.allclose(joint, h.numpy())                     # the layer changed h
