"""CPU fast path: linear layers whose cost barely grows with the number of tokens a forward scores.

Two kernels, best first: the panel GEMM (``panel.py``: one pack serves every M <= 32; avx512 or avx2
family) where the CPU has AVX-512F or AVX2 + FMA and a C compiler is present; else MKL's packed GEMM
described here. ``kind(model)`` says which one a model runs, and run summaries record it.

Why: a 1.5B fp32 forward of a few tokens is memory-bound, so scoring k + 1 tokens should cost about
what 1 token costs. Plain ``F.linear`` (MKL sgemm) instead repacks the weight on every call once
3 <= M <= 15 rows, and a forward of 8 tokens costs 2-3x a forward of 1. MKL's packed GEMM
(``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, what inductor's max-autotune picks
on this CPU) packs once per M: an 8960x1536 matrix measured here at M=1 plain 1.08 ms, M=8 plain
3.1 ms, M=8 packed-for-8 1.23 ms. A pack is only fast for the M it was made for, so the adapter
announces that M (``CausalLMAdapter.expect``): k + 1 for a verifying target, 1 for a draft or ``ar``.
Any other M (prefill, a shortened last step) takes the plain path on the original weights, which
stay as loaded (memory-mapped), so outputs of the two paths agree up to float rounding.

Draft quantization (``model.draft_quant=int8``, the embedded default): a draft only proposes, the
target decides, so a cheaper draft leaves lossless methods lossless and changes only acceptance.
``Int8Linear`` stores per-output-channel int8 weights and runs fbgemm's dynamic int8 GEMM (activations
quantized per row, so no row depends on its batch; records say ``draft_quant: int8row``; the earlier
per-call scheme, tag ``draftint8``, made a row's draft depend on the rows beside it). Measured here on the 0.5B draft: a 1-token forward 87 -> 38 ms; draft argmax
agreeing with the target's on 1,145 teacher-forced GSM8K/HumanEval tokens: fp32 82.1%, int8 80.1%
(75.1% with 7-bit activations, which fbgemm needs on CPUs without VNNI, see ``_full_range``).
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from mars_bench.models import panel

log = logging.getLogger(__name__)

MIN_ROWS = 4            # below this plain sgemm does not repack: no gain from packing
BIG_OUT = 32768         # LM heads (151,936 rows): packing pays even at M = 1 (55 -> 32 ms)


def available() -> bool:
    mkl = getattr(torch.ops, "mkl", None)
    return torch.backends.mkl.is_available() and mkl is not None and hasattr(mkl, "_mkl_linear")


class PackedLinear(nn.Module):
    """An ``nn.Linear`` that also holds an MKL pack of its weight for one row count."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.rows: int | None = None
        self.packed: torch.Tensor | None = None

    def pack(self, rows: int | None) -> None:
        """Pack for ``rows`` rows per call (None: unpack), when that is worth it."""
        if rows == self.rows:
            return
        self.packed, self.rows = None, rows
        if rows and (rows >= MIN_ROWS or self.out_features >= BIG_OUT) and self.weight.dtype == torch.float32:
            with torch.no_grad():
                self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach().contiguous(), rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            flat = x.reshape(-1, self.in_features)
            if flat.shape[0] == self.rows:
                y = torch.ops.mkl._mkl_linear(flat, self.packed, self.weight, self.bias, self.rows)
                return y.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


def enable_fast_path(model: nn.Module, kernel: str = "auto") -> nn.Module:
    """Swap every fp32 ``nn.Linear`` (LM head included) for a ``PanelLinear`` or, where the panel kernel
    is unavailable (``kernel="mkl"`` forces this), a ``PackedLinear``; a no-op without either. Attention
    runs row-wise (``attention.py``): a query row's output does not depend on the rows beside it.

    A bf16 model (loaded with ``dtype=bf16``) keeps its linear weights in bf16 panels (AMX tiles, else
    AVX512_BF16, else AVX2 + FMA) and runs everything else in fp32: norms, rotary, attention, residual stream and
    the embedding lookup (``model.float()`` after the swap; bf16 values are exact in fp32). Without a bf16
    kernel it falls back, with one logged line, to fp32 weights (the same bf16-rounded values)."""
    if kernel not in ("auto", "mkl"):
        raise ValueError(f"fast-path kernel={kernel!r}; allowed: auto, mkl")
    if any(p.dtype == torch.bfloat16 for p in model.parameters()):
        if not any(type(m) is nn.Linear for m in model.modules()) or (kernel == "auto" and panel.bf16_available()):
            model = _swap_bf16(model)
        else:
            why = "model.fast_path=mkl" if kernel == "mkl" else \
                panel.unavailable() or "the avx512 family without AVX512_BF16 (MARS_BENCH_CPU_ISA=avx2 runs bf16 panels)"
            log.warning("bf16 fast path unavailable (%s): running the bf16-rounded weights in fp32", why)
        model.float()
    if hasattr(model, "set_attn_implementation"):   # attention row-invariant too (models/attention.py)
        from mars_bench.models.attention import use_rowwise

        use_rowwise(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            if kernel == "auto" and panel.fits(child):
                setattr(parent, name, panel.PanelLinear(child))
            elif available():
                setattr(parent, name, PackedLinear(child))
    return model


def _swap_bf16(model: nn.Module) -> nn.Module:
    """Each bf16 weight is freed as soon as its panels exist (no list holds the replaced layers), so the
    peak while packing is the model plus one layer, not twice the model."""
    parents = [m for m in model.modules() if any(type(c) is nn.Linear for c in m.children())]
    for parent in parents:
        for name in [n for n, c in parent.named_children() if type(c) is nn.Linear]:
            child = getattr(parent, name)
            if child.weight.dtype == torch.bfloat16 and panel.fits(child):
                setattr(parent, name, panel.PanelLinear(child))   # keeps only the packed bf16 copy
                panel.drop_file_pages(child.weight)
            del child
    return model


def kind(model: nn.Module) -> str:
    """Which fast-path kernel ``model`` runs: 'panel-amx-bf16', 'panel-bfdot-bf16', 'panel-<family>-bf16',
    'panel-<family>' (family avx512 | avx2 | neon), 'mkl-packed' or 'off' (the first kind found, LM head first: one
    model runs one kind)."""
    head = getattr(model, "lm_head", None)
    mods = ([head] if head is not None else []) + list(model.modules())
    for m in mods:
        if isinstance(m, panel.PanelLinear):
            return m.kernel
    return "mkl-packed" if any(isinstance(m, PackedLinear) for m in mods) else "off"


class Int8Linear(nn.Module):
    """A linear layer with per-channel int8 weights, run by fbgemm's dynamic int8 GEMM (CPU only).

    Activations are quantized per ROW, so a row's output never depends on the other rows of the call
    (batching, k + 1 verification rows): fbgemm's dynamic GEMM picks one scale for the whole input from
    its min and max, so each row is divided by its own max |x| (into [-1, 1]) and one pinning row
    [1, -1, 0, ...] fixes the input range to exactly [-1, 1]; the int32 accumulation is exact, and the
    output is scaled back per row, the bias added last. The pinning row costs one extra GEMM row."""

    def __init__(self, linear: nn.Linear, full_range: bool):
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(q, None)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.reduce_range = not full_range
        pin = torch.zeros(1, self.in_features)
        pin[0, 0], pin[0, -1] = 1.0, -1.0
        self.pin = pin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        s = flat.abs().amax(1, keepdim=True).clamp_min(1e-30)
        y = torch.ops.quantized.linear_dynamic(torch.cat([flat / s, self.pin]), self.packed, self.reduce_range)
        y = y[:-1] * s
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def int8_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


def _full_range() -> bool:
    """8-bit activations are exact in fbgemm only with VNNI (int32 dot products, no int16 saturation)."""
    flags = panel.cpu()[1]
    return "avx512_vnni" in flags or "avx_vnni" in flags


def quantize_int8(model: nn.Module) -> nn.Module:
    """Swap every ``nn.Linear`` (LM head included) for an ``Int8Linear``; embeddings stay as loaded."""
    import warnings

    if not int8_available():
        raise RuntimeError("model.draft_quant=int8 needs torch's fbgemm engine (x86 CPU); allowed here: none")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"model.draft_quant='int8' runs on CPU only, not on {device}; allowed there: none")
    torch.backends.quantized.engine = "fbgemm"
    full = _full_range()
    with warnings.catch_warnings():   # torch marks its quantized-tensor constructors deprecated; the ops are current
        warnings.simplefilter("ignore")
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Int8Linear(child, full))
    return model


def set_rows(model: nn.Module, rows: int | None) -> None:
    """Announce the usual row count (None: plain path) to every fast-path layer."""
    for m in model.modules():
        if isinstance(m, (PackedLinear, panel.PanelLinear)):
            m.pack(rows)
