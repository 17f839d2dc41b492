"""Kernel families for the CPU kernel tests (models/panel.py ``isa``): every family this CPU runs (avx512 and avx2
on an AVX-512 machine, avx2 on an AVX2 one; only the forced one under ``MARS_BENCH_CPU_ISA``), each switched on
for one test, so every fallback is tested wherever the suite runs."""
import pytest

from mars_bench.models import panel, quant

FAMILIES = panel.families()


def family_params() -> list:
    """pytest params, one per family here; one skipped param naming why where there is none."""
    if FAMILIES:
        return [pytest.param(f, id=f) for f in FAMILIES]
    return [pytest.param(None, marks=pytest.mark.skip(reason=f"no kernel family here: {panel.unavailable()}"))]


def use_family(monkeypatch, family: str) -> None:
    """Build and load ``family``'s libraries for this test (the cached default ones come back after it)."""
    monkeypatch.setenv(panel.ISA_ENV, family)
    monkeypatch.setattr(panel, "_state", {})
    monkeypatch.setattr(quant, "_state", {})
    assert panel.library() is not None, panel.unavailable()
    assert panel.family() == family
