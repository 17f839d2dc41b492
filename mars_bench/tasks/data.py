"""Finding and reading benchmark files strictly: every problem is one ``ValueError`` line naming file, line and
expectation.

Where a data file is looked for (``locate``), first hit wins:
  1. ``data_dir`` (the ``data_dir`` setting; ``$MARS_BENCH_DATA_DIR`` wins over it) when one is given,
     else a ``shared/data`` folder beside the checkout, when it exists;
  2. the user cache ``<$MARS_BENCH_CACHE or ~/.cache/mars-bench>/data``;
  3. a download of the canonical raw file (``PUBLIC``, stdlib ``urllib`` only) into that cache, kept only when its
     sha256 and row count equal the ones recorded in ``PUBLIC`` (copied from the data MANIFEST.md).
The task modules say which files, fields and counts they expect.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from mars_bench.base.files import sha256_file  # noqa: F401  (D.sha256_file for the task modules)

log = logging.getLogger("mars_bench.tasks")

ENV_DATA_DIR = "MARS_BENCH_DATA_DIR"
ENV_TASKS_DIR = "MARS_BENCH_TASKS_DIR"
ENV_CACHE = "MARS_BENCH_CACHE"              # the existing cache variable (converted models); data goes to <it>/data
DEFAULT_CACHE = "~/.cache/mars-bench"
SIBLING_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"   # <checkout>/../shared/data, if it exists
DOWNLOAD_TIMEOUT_S = 60                    # per file; the largest public file is ~0.5 MB


@dataclass(frozen=True)
class PublicFile:
    url: str          # canonical raw file at a pinned commit (MANIFEST.md names repository, commit and path)
    sha256: str       # of the file as downloaded (for .gz: the compressed bytes)
    rows: int         # lines (for .gz: after decompression)


_GH = "https://raw.githubusercontent.com/"
# Copied from the data MANIFEST.md: the same bytes as the offline copies (sha256 of the stored file).
# The public copies of the tasks' own files are named by their specs (``data.public`` in specs/<task>/task.yaml,
# ``task_sources`` below); here only the MARS authors' release, which several tasks read.
PUBLIC: dict[str, PublicFile] = {}

# The MARS authors' evaluation files (5SSjw/MARS, mars/data/), byte for byte; gsm8k, sum and qa lack a final
# newline (rows count the last line all the same).
_MARS = _GH + "5SSjw/MARS/8909b411bcf69ef9876acf63366d5a72de32cd49/mars/data/"
PUBLIC.update({
    f"mars_release/{name}/question.jsonl": PublicFile(_MARS + f"{name}/question.jsonl", sha256, rows)
    for name, sha256, rows in (
        ("wmt19", "d80f77d68ad8e306c547cd47d5fb55f5ad4067ac2512aff46a84602f20dc34a6", 100),
        ("gsm8k", "54e01fa336148bf0afb81491a477d002da9f6c2e18088b935c6fb8d418ce096e", 121),
        ("humaneval", "382abeadf116ca4d5a33491090b3d7956622e312e66d635189fc67373a6edfed", 164),
        ("mt_bench", "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", 80),
        ("alpaca", "8ad3e5a7fc61b88d8e25edb81a52a2ce00a04494d5694c122cb11a5cc26a00df", 80),
        ("sum", "916876f0c42f938a944de96eed16e51425f29f27438cca5c9ef4737c0fedf771", 80),
        ("qa", "04252e41ab00bcc03b11940b4a3766cf40ae0b76a09c4f56968ba952f0b029f3", 80),
    )
})
PUBLIC["mars_release/judge_prompts.jsonl"] = PublicFile(
    _MARS + "judge_prompts.jsonl", "fd283293406d024f44c174b094ef48031d0687a4682fd3a56b29b138f80281b6", 8)

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
    """``data_dir`` if given, else ``$MARS_BENCH_DATA_DIR``, else None (sibling folder, cache, download)."""
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(ENV_DATA_DIR) or None
    return None if data_dir is None else Path(data_dir).expanduser()


def data_cache_dir() -> Path:
    """Where public copies are cached: ``<$MARS_BENCH_CACHE or ~/.cache/mars-bench>/data``."""
    return Path(os.environ.get(ENV_CACHE) or DEFAULT_CACHE).expanduser() / "data"


def http_get(url: str) -> bytes:
    """The default downloader (stdlib only). Tests pass a local stand-in instead."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
        return resp.read()


def candidates(rel: str, data_dir) -> list[Path]:
    """Where ``rel`` is looked for, in order (see the module doc); the last one is the cache."""
    given = resolve_data_dir(data_dir)
    if given is not None and not given.is_dir():
        raise DataError(given, f"data folder not found; allowed: an existing folder holding {rel}, or unset "
                               f"(data_dir=null, no ${ENV_DATA_DIR}) to fetch public copies into {data_cache_dir()}")
    first = given if given is not None else (SIBLING_DATA if SIBLING_DATA.is_dir() else None)
    return ([first / rel] if first is not None else []) + [data_cache_dir() / rel]


def locate(rel: str, data_dir, download: Callable[[str], bytes] | None = http_get) -> Path:
    """The file to read for ``rel``: the first candidate that exists, else a verified download into the cache.

    ``download=None``: only say where the file is or would be (nothing fetched)."""
    paths = candidates(rel, data_dir)
    for p in paths[:-1]:
        if p.is_file():
            return p
    cached = paths[-1]
    public = PUBLIC.get(rel)
    if cached.is_file() and (public is None or sha256_file(cached) == public.sha256):
        return cached
    if download is None or public is None:
        return cached
    if cached.is_file():
        log.warning("%s: sha256 differs from the recorded %s; fetching it again", cached, public.sha256)
    return fetch_public(rel, cached, download)


def fetch_public(rel: str, dest: Path, download: Callable[[str], bytes]) -> Path:
    """Download ``PUBLIC[rel]`` to ``dest`` (atomically), only if its sha256 and row count match the record."""
    public = PUBLIC[rel]
    log.info("%s not found locally: fetching %s", rel, public.url)
    try:
        blob = download(public.url)
    except Exception as e:  # noqa: BLE001 - network errors of any kind: one line
        raise DataError(dest, f"file not found, and the download of {public.url} failed ({type(e).__name__}: "
                              f"{e}); put the file there or set ${ENV_DATA_DIR}") from None
    got = hashlib.sha256(blob).hexdigest()
    if got != public.sha256:
        raise DataError(public.url, f"downloaded file has sha256 {got}, expected {public.sha256} "
                                    "(the recorded public copy); not cached")
    try:
        text = gzip.decompress(blob) if rel.endswith(".gz") else blob
    except (OSError, EOFError) as e:
        raise DataError(public.url, f"downloaded file is not valid gzip ({e})") from None
    rows = text.count(b"\n") + (0 if text.endswith(b"\n") or not text else 1)
    if rows != public.rows:
        raise DataError(public.url, f"downloaded file has {rows} rows, expected {public.rows}; not cached")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise DataError(dest, f"cannot write the data cache ({e.strerror or e}); set ${ENV_CACHE} to a "
                              "writable folder") from None
    log.info("cached %s (sha256 and %d rows verified)", dest, rows)
    return dest


def tasks_dir() -> Path:
    """Folder holding ``<task>/task.yaml`` (``mars_bench/tasks/specs/``, linked as ``tasks/``; ``$MARS_BENCH_TASKS_DIR`` wins)."""
    env = os.environ.get(ENV_TASKS_DIR)
    return Path(env) if env else Path(__file__).resolve().parent / "specs"   # shipped as package data


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


def task_sources(root: Path | None = None) -> dict[str, PublicFile]:
    """The public copies the task specs name: ``data.public`` (file -> URL at a pinned commit) in each
    ``<tasks_dir>/<task>/task.yaml``, with the sha256 and row count of the same ``data`` block."""
    out = {}
    for path in sorted((root or tasks_dir()).glob("*/task.yaml")):
        data = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("data") or {}
        for rel, url in (data.get("public") or {}).items():
            rows = data["rows"][rel] if isinstance(data.get("rows"), dict) else data["rows"]
            out[rel] = PublicFile(url, data["sha256"][rel], int(rows))
    return out


PUBLIC.update(task_sources())
