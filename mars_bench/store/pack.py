"""A results tree as one compressed file to commit or share: ``pack(root, path)`` writes every run's run.json,
samples.jsonl, summary.json and config.yaml (paths relative to ``root``) into a ``.tar.xz``; ``unpacked(path)``
extracts one into a temporary folder for ``load_frames``. The report reads such a file as a root
(``mars-bench-report results/study.tar.xz``), so every number of a table can be recomputed without decoding."""
from __future__ import annotations

import contextlib
import tarfile
import tempfile
from pathlib import Path

from mars_bench.base.errors import InputError
from mars_bench.store.read import find_run_dirs

RUN_FILES = ("run.json", "samples.jsonl", "summary.json", "config.yaml")
SUFFIX = ".tar.xz"


def is_pack(path) -> bool:
    return str(path).endswith(SUFFIX) and Path(path).is_file()


def pack(root: str | Path, path: str | Path) -> list[str]:
    """Write the run files under ``root`` to ``path`` (.tar.xz, written whole or not at all); returns the members."""
    root, path = Path(root), Path(path)
    if not str(path).endswith(SUFFIX):
        raise InputError(f"pack file {str(path)!r}; allowed: a name ending in {SUFFIX}")
    members = sorted(str(d / name) for d in find_run_dirs(root) for name in RUN_FILES if (d / name).is_file())
    if not members:
        raise FileNotFoundError(f"no run directories under {root}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for m in members:
            info = tar.gettarinfo(m, arcname=str(Path(m).relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""   # the same bytes each time
            with open(m, "rb") as f:
                tar.addfile(info, f)
    tmp.replace(path)
    return [str(Path(m).relative_to(root)) for m in members]


@contextlib.contextmanager
def unpacked(path: str | Path):
    """A temporary folder holding the results tree packed in ``path`` (removed on exit)."""
    with tempfile.TemporaryDirectory(prefix="mars-bench-pack-") as tmp, tarfile.open(path, "r:xz") as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp)
