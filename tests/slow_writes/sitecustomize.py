"""Test shim for the SLURM cancel test: put this folder on ``PYTHONPATH`` and every process (the launcher and
the SLURM jobs it submits) sleeps ``MARS_BENCH_TEST_WRITE_DELAY`` seconds after each sample line it appends,
so that a sweep of the tiny pair lasts long enough to be cancelled mid-run on any machine (on a fast one the
whole sweep finished between the first line and ``scancel``). Nothing under ``mars_bench/`` knows of it."""
import os
import time

_DELAY = float(os.environ.get("MARS_BENCH_TEST_WRITE_DELAY", "0") or 0)
if _DELAY > 0:
    from mars_bench.store.writer import SampleWriter

    _write = SampleWriter.write

    def write(self, record):
        out = _write(self, record)
        time.sleep(_DELAY)
        return out

    SampleWriter.write = write
