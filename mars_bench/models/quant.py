"""Group-quantized draft weights (``model.draft_quant=q4|q8``) run by ``quant_gemm.c`` (AVX512-VNNI, else AVX2).

Why: a draft forward of one token is bound by streaming its weights from DRAM. The embedded 0.5B draft
holds ~494M linear weights (136M of them the 151,936 x 896 LM head); fbgemm's int8 path streams them at
about half the machine's rate (~60 ms per token where the 1.5B bf16 target takes ~200 ms). 4-bit codes
with an fp16 scale per 32 weights (4.5 bits a weight, llama.cpp's Q4_0 layout in spirit) quarter the
bytes of bf16; 8-bit codes with the same groups (8.5 bits) halve them. Activations are quantized per row
and group of 32 to int8, so a row's result never depends on the other rows of a call (tested, as for
every fast-path kernel). A draft only proposes and the target decides, so lossless methods stay lossless
and only acceptance (tau) moves; ``records.draft_quant`` says ``q4g32`` or ``q8g32``.

Weights: per column n and group g of 32 k, q4 takes the value of largest magnitude m, d = m / -8 (fp16)
and q = clamp(round(w / d), -8, 7); q8 takes d = max|w| / 127 and q = round(w / d). ``reference`` is the
same product in float64 from the unpacked codes, which the tests hold the kernel to.

Built like ``panel_gemm.c`` (``panel.build``, the kernel family of ``panel.isa()``): AVX512-VNNI where the compiler
targets it, else AVX2 + FMA + F16C (``quant_avx2.h``: its own code layout, the same integers and fp32 steps, so
equal results; ``QuantLinear.kernel`` says which); on aarch64 the neon family (``quant_neon.h``: signed codes, SDOT
where the CPU has dotprod, else widening multiplies; the same integers and fp32 steps, tested under qemu-user,
speed unmeasured). Without any of them or a compiler (``MARS_BENCH_CPU_ISA=generic``)
``available()`` is False, ``unavailable()`` says why, and the loader falls back to the int8 draft with one
logged line.
"""
from __future__ import annotations

import ctypes
import logging
import subprocess
from pathlib import Path

import torch
from torch import nn

from mars_bench.models import panel

log = logging.getLogger(__name__)
SRC = Path(__file__).with_name("quant_gemm.c")
GROUP, WIDTH = 32, 32            # k per scale; output columns per panel
BITS = {"q4": 4, "q8": 8}
_state: dict = {}


KINDS = {1: "vnni", 2: "avx2", 3: "neon"}   # quant_kind(): AVX512-VNNI, else AVX2 + FMA + F16C; aarch64 NEON


def library():
    """The loaded kernel library, or None (``unavailable()`` says why)."""
    if not _state:
        try:
            lib = ctypes.CDLL(str(panel.build(src=SRC)))
            kind = KINDS.get(lib.quant_kind())
            if kind is None:
                raise RuntimeError("the compiler targeted neither AVX512-VNNI, AVX2 + FMA + F16C nor aarch64 NEON")
            lib.quant_linear.restype = ctypes.c_int
            lib.quant_linear.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                         ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            lib.quant_block_bytes.restype = ctypes.c_long
            _state["lib"], _state["kind"] = lib, kind
            log.info("quantized draft kernel: %s (%s family)", kind, panel.isa())
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            _state["why"] = str(e)
    return _state.get("lib")


def kind() -> str | None:
    """'vnni', 'avx2' or 'neon': which kernel (and code layout) the library runs; None without one."""
    return _state.get("kind") if library() is not None else None


def available() -> bool:
    return library() is not None


def runs_as(scheme: str) -> str:
    """The draft quantization that runs for ``model.draft_quant=scheme``: q4 / q8 without their kernel run int8."""
    return "int8" if scheme in BITS and not available() else scheme


def unavailable() -> str | None:
    library()
    return _state.get("why")


def quantize(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes u = q + offset as uint8 [N, K], fp16 scales [N, K / 32]) of a weight [N, K]."""
    n, k = w.shape
    wg = w.detach().float().reshape(n, k // GROUP, GROUP)
    if bits == 4:
        m = wg.gather(-1, wg.abs().argmax(-1, keepdim=True)).squeeze(-1)
        d = (m / -8).half()
        lo, hi, off = -8, 7, 8
    else:
        d = (wg.abs().amax(-1) / 127).half()
        lo, hi, off = -127, 127, 128
    df = d.float().unsqueeze(-1)
    q = torch.where(df != 0, wg / torch.where(df != 0, df, 1), 0).round().clamp(lo, hi)
    return (q + off).to(torch.uint8).reshape(n, k), d


def pack(codes: torch.Tensor, scales: torch.Tensor, bits: int, layout: str = "vnni") -> torch.Tensor:
    """The kernel's layout (``quant_gemm.c`` for vnni, ``quant_avx2.h`` for avx2, ``quant_neon.h`` for neon): per
    panel of 32 columns and group, the codes then the scales."""
    n, k = codes.shape
    p, g = n // WIDTH, k // GROUP
    if layout not in KINDS.values():
        raise ValueError(f"layout={layout!r}; allowed: {', '.join(KINDS.values())}")
    if layout == "neon" and bits == 8:   # (p, v, j, g, o, i) -> (p, g, v, o, j, i); signed q = u - 128 as int8
        q = (codes.to(torch.int16) - 128).to(torch.int8).view(torch.uint8)
        c = q.reshape(p, 8, 4, g, 8, 4).permute(0, 3, 1, 4, 2, 5).reshape(p, g, 1024)
    elif layout == "neon":               # (p, v, j, g, s, o, i) -> (p, g, v, o, j, i, s); s = low / high nibble
        c = codes.reshape(p, 8, 4, g, 2, 4, 4).permute(0, 3, 1, 5, 2, 6, 4)
        c = (c[..., 0] | (c[..., 1] << 4)).reshape(p, g, 512)
    elif layout == "avx2" and bits == 8:   # (p, v, j, g, t, i) -> (p, g, t, v, j, i)
        c = codes.reshape(p, 4, 8, g, 16, 2).permute(0, 3, 4, 1, 2, 5).reshape(p, g, 1024)
    elif layout == "avx2":               # (p, v, j, g, o, s, i) -> (p, g, o, v, j, i, s); s = low / high nibble
        c = codes.reshape(p, 4, 8, g, 8, 2, 2).permute(0, 3, 4, 1, 2, 6, 5)
        c = (c[..., 0] | (c[..., 1] << 4)).reshape(p, g, 512)
    elif bits == 8:                      # (p, h, j, g, o, i) -> (p, g, h, o, j, i)
        c = codes.reshape(p, 2, 16, g, 8, 4).permute(0, 3, 1, 4, 2, 5).reshape(p, g, 1024)
    else:                                # (p, h, j, g, o, s, i) -> (p, g, h, o, j, i, s); s = low / high nibble
        c = codes.reshape(p, 2, 16, g, 4, 2, 4).permute(0, 3, 1, 4, 2, 6, 5)
        c = (c[..., 0] | (c[..., 1] << 4)).reshape(p, g, 512)
    s = scales.reshape(p, WIDTH, g).permute(0, 2, 1).contiguous().view(torch.uint8).reshape(p, g, 2 * WIDTH)
    return torch.cat([c, s], dim=-1).contiguous()


def reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bits: int, bias=None) -> torch.Tensor:
    """The kernel's product in float64: per-row, per-group int8 activations times the dequantized codes."""
    n, k = codes.shape
    xg = x.float().reshape(-1, k // GROUP, GROUP)
    m = xg.abs().amax(-1, keepdim=True)
    xq = torch.where(m > 0, xg * (127.0 / torch.where(m > 0, m, 1)), 0).round().clamp(-127, 127)   # fp32, as in C
    dx = (m / 127.0).double()
    off = 8 if bits == 4 else 128
    q = (codes.double() - off).reshape(n, k // GROUP, GROUP)
    dots = torch.einsum("mgi,ngi->mng", xq.double(), q)                    # exact integers
    y = (dots * scales.double().unsqueeze(0) * dx.squeeze(-1).unsqueeze(1)).sum(-1)
    return y if bias is None else y + bias.double()


class QuantLinear(nn.Module):
    """An ``nn.Linear`` held as group-quantized panels (inference only; fp32 in and out)."""

    def __init__(self, linear: nn.Linear, bits: int):
        super().__init__()
        lib = library()
        if lib is None:
            raise RuntimeError(f"quantized draft kernel unavailable: {unavailable()}")
        if linear.in_features % GROUP:
            raise ValueError(f"in_features={linear.in_features} is not a multiple of {GROUP}")
        self.in_features, self.out_features, self.bits = linear.in_features, linear.out_features, bits
        self.n_pad = -(-self.out_features // WIDTH) * WIDTH
        w = linear.weight.detach()
        if self.n_pad != self.out_features:
            w = torch.cat([w, w.new_zeros(self.n_pad - self.out_features, self.in_features)])
        codes, scales = quantize(w, bits)
        self.layout = _state["kind"]
        self.panels = pack(codes, scales, bits, self.layout)
        self.bias = None
        if linear.bias is not None:
            b = linear.bias.detach().float()
            self.bias = torch.cat([b, b.new_zeros(self.n_pad - self.out_features)])
        self._run = lib.quant_linear

    @property
    def kernel(self) -> str:
        return f"q{self.bits}g{GROUP}-{self.layout}"

    @property
    def address(self) -> int:
        """The C address of this layer's kernel with the bits bound (``quant_linear_q4`` / ``_q8``): how
        ``fused_layer_with`` (models/fused.py) calls it."""
        return ctypes.cast(getattr(library(), f"quant_linear_q{self.bits}"), ctypes.c_void_p).value

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("QuantLinear is inference-only (the kernel has no backward)")
        flat = x.reshape(-1, self.in_features).float().contiguous()
        y = torch.empty(flat.shape[0], self.n_pad)
        if not flat.shape[0]:
            return y[:, :self.out_features].reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        rc = self._run(self.bits, flat.data_ptr(), flat.shape[0], self.in_features, self.panels.data_ptr(), self.n_pad,
                       None if self.bias is None else self.bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise MemoryError(f"quant kernel could not allocate scratch for {flat.shape[0]} x {self.in_features}")
        if self.n_pad != self.out_features:
            y = y[:, :self.out_features]
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def quantize_model(model: nn.Module, scheme: str) -> nn.Module:
    """Swap every ``nn.Linear`` (LM head included) for a ``QuantLinear`` of ``scheme`` (q4 | q8)."""
    bits = BITS[scheme]
    if next(model.parameters()).device.type != "cpu":
        raise ValueError(f"model.draft_quant={scheme!r} runs on CPU only")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, QuantLinear(child, bits))
                del child
    return model
