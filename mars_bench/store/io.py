"""A run's files on disk: atomic writes (text, JSON) and reading samples.jsonl, one record a line (a corrupt or
torn line reported and skipped; a killed writer's torn last line cut off on repair)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from mars_bench.base.locking import storage_errors
from mars_bench.store.contention import disturbed


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_samples(path: Path, repair: bool = False) -> tuple[list[dict], list[str]]:
    """(records, problems). A corrupt or truncated line is reported as 'file:line: why' and skipped.

    ``repair``: a truncated final line (a run killed mid-write) is cut off the file so that a resumed
    run appends cleanly. Later duplicates of an id are ignored (the first complete record wins), except where
    the kept record was decoded under contention (``contention.disturbed``): a later one replaces it (a rerun
    re-times such samples, ``SampleWriter``).
    """
    path = Path(path)
    if not path.exists():
        return [], []
    records, problems, seen, good_bytes = [], [], {}, 0   # seen: id -> its index in records
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        end = offset + len(raw) + 1
        complete = end <= len(data)
        offset = end
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or "id" not in rec:
                raise ValueError("not a sample record (no 'id')")
        except ValueError as e:
            problems.append(f"{path}:{lineno}: {'truncated line' if not complete else e}")
            continue
        if not complete:
            problems.append(f"{path}:{lineno}: truncated line (no newline)")
            continue
        good_bytes = end
        if rec["id"] in seen:
            at = seen[rec["id"]]
            if disturbed(records[at].get("contention")):
                records[at] = rec
            continue
        seen[rec["id"]] = len(records)
        records.append(rec)
    if repair and good_bytes < len(data) and data[good_bytes:].count(b"\n") == 0:
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
    return records, problems
