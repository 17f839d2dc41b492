"""Counting device-to-host reads: each is a synchronisation on CUDA (the host waits for the device).

``HostReads`` is a ``torch.overrides.TorchFunctionMode`` that counts the tensor methods which hand a
tensor's values to Python: ``item``, ``tolist``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``
and ``numpy`` (``if t:``, ``int(t)``, ``lst[t]``, ``t.tolist()``, ...), and, apart, ``nonzero`` (its output
shape depends on the values, so CUDA syncs there too). Counts are deterministic on CPU, so a test can
bound them where a time could not be asserted:

    with HostReads() as reads:
        generate(...)
    reads.total, reads.counts, reads.sites.most_common(5)   # where = True: file:line of each read

The mode sees every torch call while active (slow: a measuring tool, never left on in a timed run).
"""
from __future__ import annotations

import sys
from collections import Counter

from torch.overrides import TorchFunctionMode

READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"})
SHAPE_SYNCS = frozenset({"nonzero"})


class HostReads(TorchFunctionMode):
    """Counts host reads (``READS``) and value-dependent shapes (``SHAPE_SYNCS``) while active."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.counts: Counter = Counter()
        self.shape_syncs: Counter = Counter()
        self.sites: Counter = Counter()      # "file:line" of the caller of each read (where=True)
        self.where = where

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.counts[name] += 1
            if self.where:
                self.sites[_caller()] += 1
        elif name in SHAPE_SYNCS:
            self.shape_syncs[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _caller() -> str:
    """The first frame outside torch and this module: who asked for the value."""
    f = sys._getframe(2)
    while f is not None and ("/torch/" in f.f_code.co_filename or f.f_code.co_filename == __file__):
        f = f.f_back
    return "?" if f is None else f"{f.f_code.co_filename.rsplit('/', 2)[-2:][-1]}:{f.f_lineno}"
