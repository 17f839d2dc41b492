"""The converted-model cache's completeness marker: size, modification time and sha256 of every file,
written last at conversion (after the files are hashed once) and checked at every load.

A load (``cache_problem``) compares sizes and mtimes only, which catches a truncated, rewritten or replaced
file without reading gigabytes; a file whose mtime moved but whose size did not is hashed, and either
vouched for again (a copy or ``touch``) or reported. ``full=True`` (``mars-bench-cache verify``) hashes
every file. A marker of an earlier version (no mtimes, or no hashes) gets one full check, and the missing
fields are then recorded, so its next load is quick. Part of ``embedded.py``'s cache."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from mars_bench.base.files import sha256_file

log = logging.getLogger("mars_bench.models.embedded")
MARKER = "MARS_BENCH_COMPLETE"
CHUNK = 1 << 20
CACHE_DTYPES = ("fp32", "bf16")   # dtypes a converted model can be stored in; fp32 is the GGUF's exact values


def hf_dir(cache: Path, name: str, dtype: str = "fp32") -> Path:
    """Where model ``name`` converted to ``dtype`` lives in ``cache``."""
    if dtype not in CACHE_DTYPES:
        raise ValueError(f"cache dtype={dtype!r}; allowed: {', '.join(CACHE_DTYPES)}")
    return Path(cache) / "hf" / (name if dtype == "fp32" else f"{name}-{dtype}")


def cache_problem(hf_dir: Path, source_sha256: str | None = None, full: bool = False) -> str | None:
    """None if ``hf_dir`` holds a marker whose files all exist as recorded (and the recorded source hash);
    else what is wrong, in a few words. Sizes and mtimes are compared; sha256 only for files whose mtime
    changed, for every file when ``full`` or when the marker predates mtimes."""
    hf_dir = Path(hf_dir)
    try:
        info = json.loads((hf_dir / MARKER).read_text())
        sizes = info["files"]
        stats = {n: (hf_dir / n).stat() for n in sizes}
        for n, size in sizes.items():
            if stats[n].st_size != size:
                return f"{n} has {stats[n].st_size} bytes, the marker says {size}"
        mtimes = info.get("mtime_ns") or {}
        hashes = info.get("sha256") or {}
    except FileNotFoundError as e:
        return f"{Path(e.filename).name} missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable marker ({type(e).__name__})"
    if source_sha256 is not None and info.get("source_sha256") != source_sha256:
        return "built from a different source file"
    stale = [n for n in sizes if n not in hashes or mtimes.get(n) != stats[n].st_mtime_ns]
    for n in (list(sizes) if full else stale):
        actual = sha256_file(hf_dir / n)
        if n in hashes and actual != hashes[n]:
            return f"{n} does not match its recorded sha256"
        hashes[n] = actual
    if stale:
        _record(hf_dir, {**info, "sha256": hashes, "mtime_ns": {n: stats[n].st_mtime_ns for n in sizes}})
    return None


def is_complete(hf_dir: Path, source_sha256: str | None = None, full: bool = False) -> bool:
    return cache_problem(hf_dir, source_sha256, full) is None


def _record(hf_dir: Path, info: dict) -> None:
    """Rewrite the marker after a full check vouched for its files; a read-only cache keeps the old one."""
    try:
        _dump_atomic(hf_dir / MARKER, info)
        log.info("%s: files hashed and their sizes and mtimes recorded in the marker", hf_dir)
    except OSError as e:
        log.info("%s: could not update the marker (%s); the next load hashes again", hf_dir, e)


def _dump_atomic(path: Path, info: dict) -> None:
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(info, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_marker(tmp: Path, gguf_path: Path, dtype: str = "fp32") -> None:
    """Written last: its presence (with matching file sizes, mtimes and hashes) makes a directory usable."""
    from importlib.metadata import version

    versions = {p: version(p) for p in ("torch", "transformers", "tokenizers", "safetensors", "gguf")}
    files, mtimes, hashes = {}, {}, {}
    for p in sorted(tmp.iterdir()):  # make the data durable before the marker vouches for it
        with open(p, "rb") as f:
            os.fsync(f.fileno())
        st = p.stat()
        files[p.name], mtimes[p.name], hashes[p.name] = st.st_size, st.st_mtime_ns, sha256_file(p)
    info = {"source": gguf_path.name, "source_sha256": sha256_file(gguf_path), "dtype": dtype,
            "versions": versions, "files": files, "mtime_ns": mtimes, "sha256": hashes}
    with open(tmp / MARKER, "w") as f:
        json.dump(info, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
