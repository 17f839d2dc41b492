"""Small-M GEMM (``panel_gemm.c``) for the CPU fast path, built once per machine and kernel family.

Why: scoring k + 1 tokens with a 1.5B fp32 target should cost about what 1 token costs (the weights
stream from DRAM once either way), but MKL's small-M kernels, packed or not, run at ~70 GFLOPS here
and a forward of 8 tokens cost 1.44x a forward of 1. ``panel_gemm.c`` streams each weight panel once
with software prefetch and keeps up to 12 rows x 32 columns of accumulators in registers. Measured
here (2 cores, AVX-512), ms per call, MKL packed vs panel: LM head 151,936 x 1536 at M=8 46.9 vs 35.8,
M=17 61.7 vs 46.4; MLP 8960 x 1536 at M=5 3.04 vs 2.13; equal at M=1. At M >= 64 MKL's large-M GEMM is
as fast, so more rows than ``MAX_ROWS`` (prefill) go to ``F.linear``.

Kernel families (``isa()``; ``$MARS_BENCH_CPU_ISA`` = avx512 | avx2 | neon | generic forces one, default the best
the CPU runs): avx512 (``-march=native``: AVX-512F, AVX512_BF16 / AMX bf16 where present) and avx2 (``-mavx2 -mfma
-mf16c``: 6 rows x 16 columns fp32, ``panel_bf16_avx2.h`` for bf16 weights), so every x86 machine tests and times
the avx2 kernels too; on aarch64 neon (``neon_flags``: 12 rows x 8 columns fp32, ``panel_bf16_neon.h`` for bf16
weights: BFDOT where the CPU has bf16, else widening + FMA; tested under qemu-user, ``tests/test_neon_qemu.py``,
speed unmeasured). ``PanelLinear.kernel`` names the family (``panel-avx2-bf16``, ``panel-neon-bf16``,
``panel-bfdot-bf16``) and speed tables never mix kinds. generic builds nothing.

The library is compiled with the system C compiler (``$CC``, default ``cc``; ``-O3 <family flags> -fopenmp``)
into ``<cache>/kernels/`` (atomic rename, keyed by source, flags and CPU), and loaded after torch so it shares
torch's OpenMP runtime. A compiler without OpenMP (macOS clang) builds without it: one logged line, one thread.
No kernel family, no compiler, or a failed build: ``library()`` returns None, says why
in ``unavailable()``, and the fast path falls back to MKL packed GEMM.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)
SRC = Path(__file__).with_name("panel_gemm.c")
MAX_ROWS = 32          # rows per call the panel kernel takes; more (prefill) go to MKL sgemm
_state: dict = {}      # "lib" (ctypes.CDLL) or "why" (str), set by the first library() call


def cpu() -> tuple[str, set]:
    """(model name, feature flags) from /proc/cpuinfo (``parse_cpuinfo``); empty where it cannot be read."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return "", set()
    return parse_cpuinfo(text)


def parse_cpuinfo(text: str) -> tuple[str, set]:
    """(model name, feature flags) of the first CPU of a /proc/cpuinfo text (x86 ``flags``, aarch64 ``Features``).
    On x86 the name carries the family and model numbers: virtual machines often report a bare name ("AMD
    EPYC") for CPUs of different generations (family 23 = Zen 1/2, 25 = Zen 3/4), whose speeds differ ~2x."""
    def field(name: str) -> str:
        return next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                     if ln.split(":", 1)[0].strip() == name), "")

    model = field("model name")
    family, number = field("cpu family"), field("model")
    if model and family and number:
        model = f"{model} (family {family} model {number})"
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith(("flags", "Features"))), [])
    return model, set(flags)


def _kernel_dir() -> Path:
    from mars_bench.models.embedded import default_cache_dir

    return default_cache_dir() / "kernels"


ISA_ENV = "MARS_BENCH_CPU_ISA"           # forces the kernel family; unset or "auto": the best this CPU runs
ISAS = ("avx512", "avx2", "neon", "generic")   # generic: no C kernels (MKL packed GEMM, torch attention, int8 draft)
FLAGS = {"avx512": ["-march=native"], "avx2": ["-mavx2", "-mfma", "-mf16c", "-mtune=native"]}
ARM = ("aarch64", "arm64")
NEON_EXTS = (("asimdhp", "+fp16"), ("asimddp", "+dotprod"), ("bf16", "+bf16"))   # /proc/cpuinfo Features -> -march


def neon_flags(features: set) -> list[str]:
    """The neon family's compiler flags for an aarch64 CPU with these ``Features``: ARMv8.2-A plus the fp16,
    dotprod (SDOT: q8 / q4) and bf16 (BFDOT: bf16 panels) extensions it has, else plain ARMv8-A (convert + FMA,
    widening multiplies)."""
    exts = "".join(ext for feature, ext in NEON_EXTS if feature in features)
    return [f"-march=armv8.2-a{exts}"] if exts else ["-march=armv8-a"]


def _flags(family: str) -> list[str]:
    return neon_flags(cpu()[1]) if family == "neon" else FLAGS[family]


def isa() -> str:
    """The kernel family every C kernel is built for: ``$MARS_BENCH_CPU_ISA`` (avx512 | avx2 | neon | generic)
    where set, else the best this CPU runs (AVX-512F: avx512; AVX2 + FMA + F16C: avx2; aarch64: neon; else
    generic). A forced family the CPU lacks builds nothing and ``unavailable()`` says why."""
    want = (os.environ.get(ISA_ENV) or "auto").strip().lower()
    if want not in ("auto",) + ISAS:
        raise ValueError(f"{ISA_ENV}={want!r}; allowed: auto, {', '.join(ISAS)}")
    if want != "auto":
        return want
    if platform.machine().lower() in ARM:
        return "neon"
    flags = cpu()[1] if platform.machine().lower() in ("x86_64", "amd64") else set()
    return "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma", "f16c"} <= flags else "generic"


def families() -> list[str]:
    """The kernel families the tests run here: the one ``$MARS_BENCH_CPU_ISA`` forces (none for generic), else
    every family this CPU runs (avx512 and avx2 on an AVX-512 machine: each fallback is tested there too)."""
    forced = (os.environ.get(ISA_ENV) or "auto").strip().lower() != "auto"
    out = []
    for family in ("avx512", "avx2", "neon"):
        try:
            _check_isa(family)
        except RuntimeError:
            continue
        out.append(family)
    return [f for f in out if not forced or f == isa()]


def _check_isa(family: str) -> None:
    model, flags = cpu()
    if family == "generic":
        raise RuntimeError(f"{ISA_ENV}=generic (no C kernels)" if os.environ.get(ISA_ENV) else
                           f"CPU {model or platform.machine()!r} lacks AVX2 + FMA and AVX-512F")
    if family == "neon":
        if platform.machine().lower() not in ARM:
            raise RuntimeError(f"CPU {model or platform.machine()!r} is not aarch64 (NEON)")
        return
    need = ["avx512f"] if family == "avx512" else ["avx2", "fma", "f16c"]
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    missing = [f for f in need if not x86 or f not in flags]
    if missing:
        names = {"avx512f": "AVX-512F", "avx2": "AVX2", "fma": "FMA", "f16c": "F16C"}
        raise RuntimeError(f"CPU {model or platform.machine()!r} lacks {', '.join(names[f] for f in missing)}")


def build(out_dir: Path | None = None, src: Path = SRC, family: str | None = None) -> Path:
    """Compile ``src`` (default ``panel_gemm.c``) for this CPU and kernel family (default ``isa()``); once,
    reused while source, compiler, flags and CPU are unchanged."""
    family = family or isa()
    _check_isa(family)
    model, flags = cpu()
    cc = os.environ.get("CC", "cc")
    opts = _flags(family)
    headers = b"".join(h.read_bytes() for h in sorted(src.parent.glob("*.h")))   # included by the sources
    key = hashlib.sha256(src.read_bytes() + headers +
                         f"|{cc}|{' '.join(opts)}|{model}|{' '.join(sorted(flags))}".encode()).hexdigest()[:16]
    out_dir = Path(out_dir) if out_dir is not None else _kernel_dir()
    so = out_dir / f"{src.stem}-{family}-{key}.so"
    if so.exists():
        return so
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{so.name}.tmp-{os.getpid()}"
    cmd = [cc, "-O3", *opts, "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(tmp)]
    try:
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        except subprocess.CalledProcessError as e:   # e.g. macOS clang: no OpenMP; the kernels then run one thread
            subprocess.run([c for c in cmd if c != "-fopenmp"], check=True, capture_output=True, text=True, timeout=300)
            last = (e.stderr.strip().splitlines() or ["no output"])[-1]
            log.warning("%s built without OpenMP (one thread): %s -fopenmp failed: %s", src.name, cc, last)
        os.replace(tmp, so)       # a killed build leaves only a dot-temp file, never a half-written .so
    except FileNotFoundError:
        raise RuntimeError(f"no C compiler {cc!r} (set $CC)") from None
    except subprocess.CalledProcessError as e:
        last = (e.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{cc} failed on {src.name}: {last}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return so


def library():
    """The loaded kernel library, or None (``unavailable()`` says why)."""
    if not _state:
        family = isa()
        try:
            lib = ctypes.CDLL(str(build(family=family)))
            lib.panel_linear.restype = ctypes.c_int
            lib.panel_linear.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                         ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            lib.panel_pack.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_int]
            P, L, I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
            lib.rows_attention.restype = I
            lib.rows_attention.argtypes = [P, L, L, L, P, L, L, P, L, L, I, I, I, I, I, P, P, ctypes.c_float, P, I]
            _state["bf16"] = bool(lib.panel_bf16_available())
            _state["amx"] = _state["bf16"] and bool(lib.panel_amx_init())
            if _state["bf16"]:
                for fn in (lib.panel_linear_bf16, lib.panel_linear_amx):
                    fn.restype, fn.argtypes = ctypes.c_int, lib.panel_linear.argtypes
                lib.panel_pack_bf16.argtypes = lib.panel_pack.argtypes
            _state["bfdot"] = _state["bf16"] and family == "neon" and bool(lib.panel_neon_bfdot())
            _state["lib"], _state["width"], _state["family"] = lib, lib.panel_width(), family
            log.info("panel GEMM: %s kernels (%s)", family, _why_family(family))
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            _state["why"] = str(e)
            log.info("panel GEMM unavailable (%s); the CPU fast path uses MKL packed GEMM", e)
    return _state.get("lib")


def _why_family(family: str) -> str:
    if os.environ.get(ISA_ENV, "auto").strip().lower() not in ("", "auto"):
        return f"{ISA_ENV}={family}"
    if family == "neon":
        return f"aarch64, {' '.join(_flags(family))}"
    return "the CPU has AVX-512F" if family == "avx512" else "the CPU has AVX2 + FMA, no AVX-512F"


def family() -> str | None:
    """The kernel family the loaded library runs (avx512 | avx2 | neon), None where there is none."""
    return _state.get("family") if library() is not None else None


def drop_file_pages(t: torch.Tensor) -> bool:
    """Release the resident pages of a weight that lives in a private file mapping (a memory-mapped
    safetensors file), for weights already packed and no longer used: a later access would read the file's
    bytes again (so any in-place change since loading would be lost). Anonymous memory is never touched.
    True if pages were released."""
    start, size = t.data_ptr(), t.untyped_storage().nbytes()
    page = os.sysconf("SC_PAGE_SIZE")
    lo, hi = -(-start // page) * page, (start + size) // page * page
    if hi <= lo:
        return False
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                a, b = (int(x, 16) for x in parts[0].split("-"))
                if a <= start < b:
                    if len(parts) < 6 or parts[4] == "0" or not parts[1].endswith("p") or hi > b:
                        return False            # anonymous, shared or not one mapping: leave it alone
                    break
            else:
                return False
    except OSError:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise(lo, hi - lo, 4) == 0   # MADV_DONTNEED


def unavailable() -> str | None:
    library()
    return _state.get("why")


def bf16_available() -> bool:
    """The bf16-weight kernels are built in where the compiler targets AVX512_BF16 (-march=native) or, in the
    avx2 family, AVX2 + FMA (``panel_bf16_avx2.h``), and in the neon family (``panel_bf16_neon.h``)."""
    return library() is not None and _state["bf16"]


def amx_available() -> bool:
    """AMX-BF16 tiles present and granted by the OS (one arch_prctl request per process)."""
    return bf16_available() and _state["amx"]


def bfdot_available() -> bool:
    """aarch64 BFDOT (the CPU lists bf16): bf16 panels run ``panel-bfdot-bf16`` instead of widening + FMA."""
    return bf16_available() and _state["bfdot"]


def fits(linear: nn.Linear) -> bool:
    w = linear.weight
    if library() is None or w.device.type != "cpu":
        return False
    if w.dtype == torch.bfloat16:   # outputs are padded up to whole panels
        return bf16_available() and linear.in_features % 2 == 0
    return w.dtype == torch.float32 and linear.out_features % _state["width"] == 0


class PanelLinear(nn.Module):
    """An ``nn.Linear`` held as weight panels; calls of <= MAX_ROWS rows use the kernel.

    fp32 weights: the original weight stays (prefill-sized calls and the plain path use ``F.linear``);
    ``pack(None)`` switches the kernel off (the plain path, for side-by-side benchmarks), any row count
    switches it on: one pack serves every M, so the hint's value does not matter here.

    bf16 weights (``panel_linear_bf16``): only the bf16 panels and an fp32 bias are kept (half the
    memory of the bf16 model, a quarter of fp32), inputs and outputs are fp32, and every call of any row
    count runs the kernel, so a row's logits do not depend on how many rows a forward scores (prefill
    included); ``pack`` is a no-op.
    """

    def __init__(self, linear: nn.Linear, amx: bool | None = None):
        """``amx``: bf16 weights only; None = AMX tiles where available, False = the AVX512_BF16 kernel."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.on, self.rows = False, 0
        w = linear.weight.detach().contiguous()
        lib, threads = library(), torch.get_num_threads()
        self.bf16, self.amx, self.family = w.dtype == torch.bfloat16, False, _state["family"]
        self.bfdot = self.bf16 and _state["bfdot"]
        if self.bf16:
            self.weight = None
            self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)
            self.n_pad = -(-self.out_features // _state["width"]) * _state["width"]
            if self.n_pad != self.out_features:   # e.g. a vocabulary of 259: zero rows up to whole panels
                w = torch.cat([w, w.new_zeros(self.n_pad - self.out_features, self.in_features)])
                if self.bias is not None:
                    self.bias = nn.Parameter(torch.cat([self.bias, self.bias.new_zeros(self.n_pad - self.out_features)]),
                                             requires_grad=False)
            self.panels = torch.empty(w.numel(), dtype=torch.bfloat16)
            lib.panel_pack_bf16(w.data_ptr(), self.n_pad, self.in_features, self.panels.data_ptr(), threads)
            self.amx = amx_available() and self.in_features % 32 == 0 and amx is not False
            self._run = lib.panel_linear_amx if self.amx else lib.panel_linear_bf16
        else:
            self.weight, self.bias, self.n_pad = linear.weight, linear.bias, linear.out_features
            self.panels = torch.empty(w.numel())
            lib.panel_pack(w.data_ptr(), self.out_features, self.in_features, self.panels.data_ptr(), threads)
            self._run = lib.panel_linear

    def pack(self, rows: int | None) -> None:
        self.on, self.rows = rows is not None, rows or 0   # a batch announces B x (k + 1) rows

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"

    @property
    def kernel(self) -> str:
        """'panel-amx-bf16', 'panel-bfdot-bf16' (aarch64 BFDOT), 'panel-<family>-bf16' or 'panel-<family>' (family
        avx512 | avx2 | neon): speed tables never mix kinds."""
        if self.amx or self.bfdot:
            return f"panel-{'amx' if self.amx else 'bfdot'}-bf16"
        return f"panel-{self.family}" + ("-bf16" if self.bf16 else "")

    @property
    def address(self) -> int:
        """The C address of the kernel this layer calls (``fused_layer_with`` in quant_gemm.c calls it from C:
        models/fused.py)."""
        return ctypes.cast(self._run, ctypes.c_void_p).value

    @property
    def bf16_inputs(self) -> bool:
        """True where the kernel rounds its inputs to bf16 (AMX, AVX512_BF16, BFDOT); the avx2 and neon convert +
        FMA kernels keep them fp32."""
        return self.bf16 and (self.amx or self.bfdot or self.family == "avx512")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        grad = torch.is_grad_enabled() and x.requires_grad
        if self.bf16:
            if grad:
                raise RuntimeError("PanelLinear with bf16 weights is inference-only (the kernel has no backward)")
        elif not (self.on and flat.shape[0] <= max(MAX_ROWS, self.rows) and flat.dtype == torch.float32 and not grad):
            return F.linear(x, self.weight, self.bias)
        flat = flat.float().contiguous()
        y = torch.empty(flat.shape[0], self.n_pad)
        rc = self._run(flat.data_ptr(), flat.shape[0], self.in_features, self.panels.data_ptr(), self.n_pad,
                       None if self.bias is None else self.bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise MemoryError(f"panel kernel could not allocate {flat.shape[0]} x {self.in_features} floats")
        if self.n_pad != self.out_features:
            y = y[:, :self.out_features].contiguous()
        return y.reshape(*x.shape[:-1], self.out_features)


def set_bf16_kernel(model: nn.Module, amx: bool) -> int:
    """Run every bf16 ``PanelLinear`` of ``model`` on AMX tiles (where available) or the AVX512_BF16 kernel (both
    read the same panels): the other CPU kind's kernel measured on this machine. Returns the layers switched."""
    lib, n = library(), 0
    for m in model.modules():
        if isinstance(m, PanelLinear) and m.bf16:
            m.amx = bool(amx and amx_available() and m.in_features % 32 == 0)
            m._run = lib.panel_linear_amx if m.amx else lib.panel_linear_bf16
            n += 1
    return n

