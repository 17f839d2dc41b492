"""The concurrent writer of samples.jsonl: one JSON line per finished sample, flushed and fsynced, each sample
claimed first so that processes sharing a run directory never decode one twice (policy: ``locking``)."""
from __future__ import annotations

import errno
import json
import logging
import os
import platform
from pathlib import Path

from mars_bench.base.interrupts import deferred
from mars_bench.base.locking import APPEND_LOCK, Claims, StorageError, exclusive, storage_errors
from mars_bench.store.contention import retimes
from mars_bench.store.records import SampleRecord
from mars_bench.store.io import read_samples

log = logging.getLogger("mars_bench")


def writer_name() -> str:
    """This process, as the records it writes name it (several may share a run directory)."""
    return f"{platform.node()}:{os.getpid()}"


class SampleWriter:
    """Appends one JSON line per finished sample, flushed and fsynced; shares a run directory safely.

    Several processes may use one run directory at once: each sample is claimed first (``claimed``), so no
    sample is decoded twice and no line is duplicated (policy: ``locking``). A sample whose record another
    process decoded under contention is not done (``contention.retimes``): a rerun decodes it again, and its new
    line replaces the old one on reading (``io.read_samples``). Every write error is a one-line ``StorageError`` naming the path;
    a failed append is cut back so that the file holds whole lines only."""

    def __init__(self, path: Path, on_start=None):
        """``on_start()``: called once, when this writer first claims a sample (its run directory created),
        before that sample is decoded; the runner writes the run's spec there."""
        self.path = Path(path)   # a new run directory is created only when the first sample is claimed
        self._lock = self.path.parent / APPEND_LOCK
        self._on_start = on_start
        self._claims: Claims | None = None
        self.done: set = set()
        self._offset = None   # bytes of samples.jsonl already read (whole lines)
        if self.path.parent.is_dir():
            self.refresh()
        else:
            _check_writable(self.path.parent)

    @property
    def claims(self) -> Claims:
        if self._claims is None:
            with storage_errors(self.path.parent):
                self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._on_start is not None:
                self._on_start()
            self._claims = Claims(self.path.parent)
        return self._claims

    def refresh(self) -> set:
        """Add the ids finished since the last call (by any process); a torn last line is a killed writer's
        (appends hold the lock) and is cut off. Reads only the new bytes."""
        with exclusive(self._lock), storage_errors(self.path):
            if self._offset is None:
                existing, _ = read_samples(self.path, repair=True)
                self.done = {r["id"] for r in existing if not retimes(r, writer_name())}   # flagged: re-timed
                self._offset = self.path.stat().st_size if self.path.exists() else 0
                return self.done
            if not self.path.exists():
                return self.done
            with open(self.path, "r+b") as f:
                f.seek(self._offset)
                data = f.read()
                end = data.rfind(b"\n") + 1
                if end < len(data):
                    f.truncate(self._offset + end)
        for raw in data[:end].split(b"\n"):
            try:
                rec = json.loads(raw) if raw.strip() else None
            except ValueError:
                continue          # reported by read_samples when the run is summarized
            if isinstance(rec, dict) and "id" in rec:
                self.done.add(rec["id"])
        self._offset += end
        return self.done

    def claim(self, sample_id: str, wait: bool = False) -> bool:
        """True: this process holds ``sample_id`` and it is not finished; decode it, then ``write`` it."""
        if not self.claims.take(sample_id, wait=wait):
            return False
        if sample_id in self.refresh():
            self.claims.release(sample_id)
            return False
        return True

    def claimed(self, todo: list) -> "_Claimed":
        """The (index, sample) pairs of ``todo`` this process gets to decode (see ``locking``)."""
        return _Claimed(self, todo)

    def write(self, record: "dict | SampleRecord") -> None:
        if isinstance(record, SampleRecord):
            record = record.to_dict()
        record = {**record, "writer": writer_name()}   # which process decoded it
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        kept = f"{len(self.done)} finished samples are kept in {self.path}"
        with deferred(), exclusive(self._lock), storage_errors(self.path, kept):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError:
                    try:
                        os.ftruncate(fd, start)   # never leave half a record behind
                    except OSError:
                        pass                      # read_samples(repair=True) cuts it on the next run
                    raise
            finally:
                os.close(fd)
        self.done.add(record["id"])
        self.claims.release(record["id"])

    def close(self) -> None:
        if self._claims is not None:
            self._claims.release_all()


def _check_writable(folder: Path) -> None:
    """A folder to be created must have a writable nearest existing ancestor (read-only mounts included)."""
    p = Path(folder).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not os.access(p, os.W_OK | os.X_OK):
        err = OSError(errno.EROFS if _read_only(p) else errno.EACCES,
                      os.strerror(errno.EROFS if _read_only(p) else errno.EACCES))
        raise StorageError(p, err)


def _read_only(p: Path) -> bool:
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class _Claimed:
    """Free samples first (no waiting); then, waiting, the ones other processes held, unless finished by then."""

    def __init__(self, writer: SampleWriter, todo: list):
        self.writer, self.todo = writer, list(todo)

    def __len__(self) -> int:
        return len(self.todo)

    def __iter__(self):
        later = []
        for item in self.todo:
            if item[1].id in self.writer.done:
                continue
            if self.writer.claim(item[1].id):
                yield item
            elif item[1].id not in self.writer.done:
                later.append(item)
        if later:
            log.info("%d samples are being decoded by another process on %s; waiting for them",
                     len(later), self.writer.path.parent)
        for item in later:
            if self.writer.claim(item[1].id, wait=True):   # its holder died or never wrote it: ours now
                yield item
