"""Ctrl-C (SIGINT) and SIGTERM stop a run, or a whole multirun, cleanly.

Each signal raises ``Interrupted`` in the main thread: the sample being decoded is dropped (its record was not
written), every finished one is already in ``samples.jsonl`` (fsynced line by line), and the process exits with
128 + the signal number (130 for SIGINT, 143 for SIGTERM) after one line saying so. A record being appended is
never torn by a signal: ``deferred()`` blocks both signals for the few system calls of one append, and the
interrupt is raised right after it.
"""
from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """Raised by the handlers below; a BaseException so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum


def _raise(signum, frame):
    raise Interrupted(signum)


def install() -> None:
    """Turn SIGINT and SIGTERM into ``Interrupted`` (main thread only, as Python requires)."""
    for sig in SIGNALS:
        signal.signal(sig, _raise)


@contextmanager
def deferred():
    """Hold SIGINT/SIGTERM until the body is done (then the pending one is delivered and raises)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_main(entry) -> None:
    """Call ``entry()`` with the handlers installed; an interrupt becomes one line and exit 130 / 143."""
    install()
    try:
        entry()
    except Interrupted as e:
        print(f"mars-bench: interrupted by {e.name}: the sample in flight was dropped, finished samples are "
              f"kept; rerun the same command to resume (exit {e.exit_code})", file=sys.stderr)
        sys.exit(e.exit_code)
