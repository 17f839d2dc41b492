"""The converted-model cache's completeness marker: sizes and sha256 of every file, written last at
conversion and checked at every load (``cache_problem``), so a truncated or corrupted copy is never used.
Part of ``embedded.py``'s cache; split out to keep that module readable."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..files import sha256_file

log = logging.getLogger("mars_bench.models.embedded")
MARKER = "MARS_BENCH_COMPLETE"
CHUNK = 1 << 20
CACHE_DTYPES = ("fp32", "bf16")   # dtypes a converted model can be stored in; fp32 is the GGUF's exact values


def hf_dir(cache: Path, name: str, dtype: str = "fp32") -> Path:
    """Where model ``name`` converted to ``dtype`` lives in ``cache``."""
    if dtype not in CACHE_DTYPES:
        raise ValueError(f"cache dtype={dtype!r}; allowed: {', '.join(CACHE_DTYPES)}")
    return Path(cache) / "hf" / (name if dtype == "fp32" else f"{name}-{dtype}")


def cache_problem(hf_dir: Path, source_sha256: str | None = None, hashes: bool = True) -> str | None:
    """None if ``hf_dir`` holds a marker whose files all exist with the recorded size and sha256 (and the
    recorded source hash); else what is wrong, in a few words. ``hashes=False`` checks sizes only.

    A marker of an earlier version lists sizes only: its files are hashed once (they pass the size check)
    and the hashes added to the marker, so from then on corruption of the same size is detected too."""
    hf_dir = Path(hf_dir)
    try:
        info = json.loads((hf_dir / MARKER).read_text())
        sizes = info["files"]
        for n, size in sizes.items():
            actual = (hf_dir / n).stat().st_size
            if actual != size:
                return f"{n} has {actual} bytes, the marker says {size}"
    except FileNotFoundError as e:
        return f"{Path(e.filename).name} missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable marker ({type(e).__name__})"
    if source_sha256 is not None and info.get("source_sha256") != source_sha256:
        return "built from a different source file"
    if not hashes:
        return None
    if "sha256" not in info:
        info["sha256"] = {n: sha256_file(hf_dir / n) for n in sizes}
        _dump_atomic(hf_dir / MARKER, info)
        log.info("%s: recorded the sha256 of its files (marker of an earlier version)", hf_dir)
        return None
    for n, expected in info["sha256"].items():
        if sha256_file(hf_dir / n) != expected:
            return f"{n} does not match its recorded sha256"
    return None


def is_complete(hf_dir: Path, source_sha256: str | None = None, hashes: bool = True) -> bool:
    return cache_problem(hf_dir, source_sha256, hashes) is None


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
    """Written last: its presence (with matching file sizes and hashes) is what makes a directory usable."""
    from importlib.metadata import version

    versions = {p: version(p) for p in ("torch", "transformers", "tokenizers", "safetensors", "gguf")}
    files, hashes = {}, {}
    for p in sorted(tmp.iterdir()):  # make the data durable before the marker vouches for it
        with open(p, "rb") as f:
            os.fsync(f.fileno())
        files[p.name], hashes[p.name] = p.stat().st_size, sha256_file(p)
    info = {"source": gguf_path.name, "source_sha256": sha256_file(gguf_path), "dtype": dtype,
            "versions": versions, "files": files, "sha256": hashes}
    with open(tmp / MARKER, "w") as f:
        json.dump(info, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
