"""Small file helpers shared by the data loaders and the model cache."""
from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()
