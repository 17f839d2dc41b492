"""The converted-model cache of the embedded pair: check it in full, or list it.

    mars-bench-cache [--cache DIR] verify [--no-rebuild]   sha256 of every cached file against its marker
    mars-bench-cache [--cache DIR] info                     what is cached, its size and its quick status

A load checks sizes and modification times only (``mars_bench.models.cache_marker``); ``verify`` reads every
byte, so it also finds a file changed in place with its size and mtime kept. A directory that fails is
rebuilt from its GGUF (fetched again when that fails too) unless ``--no-rebuild``; exit 1 when anything is
left damaged.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mars_bench.base.files import sha256_file
from mars_bench.models.cache_marker import CACHE_DTYPES, MARKER, cache_problem, hf_dir
from mars_bench.models.embedded import CACHE_ENV, DEFAULT_CACHE, SPECS, default_cache_dir, prepare


def _model_dirs(cache: Path) -> list[Path]:
    root = cache / "hf"
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def _spec_of(path: Path):
    """(spec, dtype) of an embedded model's directory, None for anything else in the cache."""
    return next(((s, d) for s in SPECS.values() for d in CACHE_DTYPES
                 if hf_dir(path.parent.parent, s.name, d) == path), None)


def _gb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file()) / 1e9


def verify(cache: Path, rebuild: bool = True) -> int:
    bad = 0
    for gguf in sorted((cache / "gguf").glob("*.gguf")) if (cache / "gguf").is_dir() else []:
        spec = SPECS.get(gguf.stem)
        ok = spec is None or sha256_file(gguf) == spec.sha256
        print(f"{'ok ' if ok else 'BAD'} {gguf}" + ("" if ok else f": sha256 differs from the pinned {spec.sha256}"))
        bad += not ok
    for d in _model_dirs(cache):
        t0, known = time.monotonic(), _spec_of(d)
        problem = cache_problem(d, known[0].sha256 if known else None, full=True)
        if problem is None:
            print(f"ok  {d} ({_gb(d):.2f} GB hashed in {time.monotonic() - t0:.1f} s)")
            continue
        if not (rebuild and known):
            print(f"BAD {d}: {problem}" + ("" if known else " (not an embedded model: remove it by hand)"))
            bad += 1
            continue
        print(f"BAD {d}: {problem}; rebuilding it", flush=True)
        try:
            prepare(known[0], cache, dtype=known[1], full=True)
            print(f"ok  {d} rebuilt")
        except (RuntimeError, OSError, ValueError) as e:
            print(f"BAD {d}: {e}")
            bad += 1
    if not _model_dirs(cache):
        print(f"no converted models in {cache / 'hf'}")
    return 1 if bad else 0


def info(cache: Path) -> int:
    dirs = _model_dirs(cache)
    for d in dirs:
        try:
            marker = json.loads((d / MARKER).read_text())
        except (OSError, ValueError):
            marker = {}
        problem = cache_problem(d)
        print(f"{d.name}: {marker.get('dtype', '?')}, {_gb(d):.2f} GB, from {marker.get('source', '?')}, "
              f"{'complete' if problem is None else problem}")
    print(f"{len(dirs)} converted model(s) in {cache / 'hf'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mars-bench-cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None, help=f"cache dir (default: ${CACHE_ENV} or {DEFAULT_CACHE})")
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="sha256 of every cached file against its marker; rebuild what fails")
    v.add_argument("--no-rebuild", action="store_true", help="report damaged directories, do not rebuild them")
    sub.add_parser("info", help="list the cached models with size, dtype and quick (size + mtime) status")
    args = ap.parse_args(argv)
    cache = (args.cache or default_cache_dir()).expanduser()
    if not cache.is_dir():
        print(f"mars-bench-cache: error: cache={cache} is not a directory (set --cache or ${CACHE_ENV})",
              file=sys.stderr)
        return 2
    return verify(cache, rebuild=not args.no_rebuild) if args.command == "verify" else info(cache)


if __name__ == "__main__":
    sys.exit(main())
