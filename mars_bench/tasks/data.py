"""Reading benchmark files strictly: every problem is one ``ValueError`` line naming file, line and expectation.

Nothing here knows a benchmark; the task modules say which files, fields and counts they expect.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

ENV_DATA_DIR = "MARS_BENCH_DATA_DIR"
ENV_TASKS_DIR = "MARS_BENCH_TASKS_DIR"

_TYPES = {"str": str, "int": int, "list": list, "dict": dict, "float": (int, float)}


class DataError(ValueError):
    """A data file is missing or malformed. The message is one line: ``<file>[:<line>]: <what>``."""

    def __init__(self, path: Any, what: str, line: int | None = None):
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {one_line(what)}")


def one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """``data_dir`` if given, else ``$MARS_BENCH_DATA_DIR``, else None (public sources)."""
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(ENV_DATA_DIR) or None
    return None if data_dir is None else Path(data_dir).expanduser()


def tasks_dir() -> Path:
    """Folder holding ``<task>/task.yaml`` (the repository's ``tasks/``; ``$MARS_BENCH_TASKS_DIR`` wins)."""
    env = os.environ.get(ENV_TASKS_DIR)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "tasks"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_lines(path: Path) -> list[str]:
    """Text lines without their line ends; a missing/undecodable file is a one-line DataError."""
    if not path.is_file():
        raise DataError(path, "file not found")
    try:
        with _open_text(path) as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise DataError(path, f"expected UTF-8 text ({e.reason} at byte {e.start})") from None
    except (OSError, EOFError) as e:
        raise DataError(path, f"cannot read file ({type(e).__name__}: {e})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def check_fields(row: Any, fields: dict[str, str], path: Any, line: int | None) -> dict:
    """``row`` must be a JSON object holding every ``fields`` name with the given type name."""
    if not isinstance(row, dict):
        raise DataError(path, f"expected a JSON object, got {type(row).__name__}", line)
    for name, tname in fields.items():
        if name not in row:
            raise DataError(path, f"expected field '{name}' ({tname}), it is missing", line)
        want = _TYPES[tname]
        if not isinstance(row[name], want) or isinstance(row[name], bool):
            raise DataError(path, f"expected field '{name}' to be {tname}, got "
                                  f"{type(row[name]).__name__}", line)
    return row


def read_jsonl(path: Path, fields: dict[str, str]) -> list[dict]:
    """Every non-empty line a JSON object with ``fields``; blank lines are errors too (counts stay honest)."""
    rows = []
    for i, raw in enumerate(read_lines(path), start=1):
        if not raw.strip():
            raise DataError(path, "expected a JSON object, got an empty line", i)
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataError(path, f"expected a JSON object, got invalid JSON ({e.msg} at column {e.colno})",
                            i) from None
        rows.append(check_fields(row, fields, path, i))
    return rows


def check_count(rows: list, expected: int | None, path: Any) -> None:
    if expected is not None and len(rows) != expected:
        raise DataError(path, f"expected {expected} rows, found {len(rows)}")


def from_public(path: Path, source: str, fetch: Callable[[], Any]) -> Any:
    """Call ``fetch`` (a lazy download from the public source); any failure is one DataError line."""
    try:
        return fetch()
    except BaseException as e:  # noqa: BLE001 - sacrebleu's downloader calls sys.exit on failure
        if isinstance(e, KeyboardInterrupt):
            raise
        raise DataError(path, f"file not found, and the public source ({source}) failed: "
                              f"{type(e).__name__}: {e}") from None
