"""One writer per sample: processes that share a run directory split its samples between them.

Policy (documented in README "Reliability"): a second ``mars-bench`` on a run directory in use *shares the work*.
Before decoding a sample a process takes an exclusive ``flock`` on ``<run_dir>/.claims/<sample>.lock`` without
waiting; a sample another process holds is skipped and tried again, waiting, once the free ones are done.
After taking a claim the process re-reads ``samples.jsonl``: a sample finished meanwhile is not decoded again.
Appends to ``samples.jsonl`` (and the repair of a torn last line) happen under ``<run_dir>/.samples.lock``, so
lines never interleave. The kernel drops ``flock`` locks when their process dies (``kill -9`` included): a stale
lock never blocks a resume, and a sample whose holder died is decoded by whoever waits for it.
Claim files stay empty (no disk blocks) and are never deleted (deleting a lock file races with its waiters).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("mars_bench")

CLAIMS_DIR = ".claims"
APPEND_LOCK = ".samples.lock"


class StorageError(OSError):
    """A results file cannot be written (full disk, read-only folder...). The message is one line."""

    def __init__(self, path, err: OSError, kept: str = ""):
        what = err.strerror or str(err)
        code = errno.errorcode.get(err.errno, "") if err.errno else ""
        super().__init__(err.errno, f"cannot write {path}: {what}{f' ({code})' if code else ''}"
                                    f"{'; ' + kept if kept else ''}; free space or make it writable, then rerun "
                                    "the same command to resume")
        self.path = str(path)

    def __str__(self) -> str:
        return self.strerror


def storage_errors(path, kept: str = ""):
    """Context manager: any OSError inside becomes a one-line StorageError naming ``path``."""
    @contextmanager
    def cm():
        try:
            yield
        except StorageError:
            raise
        except OSError as e:
            raise StorageError(getattr(e, "filename", None) or path, e, kept) from None
    return cm()


def _claim_name(sample_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", sample_id)[:60]
    return f"{safe}-{hashlib.sha1(sample_id.encode()).hexdigest()[:10]}.lock"


class Claims:
    """Exclusive per-sample claims in ``<run_dir>/.claims`` (see the module doc)."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / CLAIMS_DIR
        with storage_errors(self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, int] = {}

    def take(self, sample_id: str, wait: bool = False) -> bool:
        """True when this process now holds ``sample_id``; False when another one does (``wait=False``)."""
        if sample_id in self._held:
            return True
        path = self.dir / _claim_name(sample_id)
        with storage_errors(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._held[sample_id] = fd
        return True

    def release(self, sample_id: str) -> None:
        fd = self._held.pop(sample_id, None)
        if fd is not None:
            os.close(fd)            # closing drops the flock

    def release_all(self) -> None:
        for sid in list(self._held):
            self.release(sid)


@contextmanager
def exclusive(path: Path):
    """An exclusive ``flock`` on ``path`` (created empty if needed) for the body of the ``with``."""
    with storage_errors(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
