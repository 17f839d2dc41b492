"""Which weights a run ran: a short, stable identity for a target, a draft or an EAGLE-3 head.

A run's directory is named by a hash of its ``RunSpec`` (``mars_bench.store.spec``); the spec carries these
identities, so two runs whose weights differ never share a directory, whatever ``model.name`` says.

    tiny       ``tiny:<sha of the architecture config>:seed<seed>`` (+ ``:noise<noise>`` for the draft): the
               random pair is a function of its config and seed
    embedded   ``embedded:<name>@<sha256 of the pinned GGUF>`` (the file is checked against that sha256
               when it is fetched, ``models/embedded.py``)
    local dir  ``dir:<sha256>`` over every file's relative name and size, the whole of every small file
               (config, tokenizer, chat template; weight files up to 16 MiB), and for each large weight file
               its safetensors header (tensor names, dtypes, shapes) and a fixed sample of its bytes: the
               first and last 64 KiB and 256 blocks of 4 KiB evenly spaced between (~1.1 MiB a file, read in
               milliseconds). Fine-tuned or retrained weights of the same shapes change nearly every block,
               so a sample sees them; the path is not part of it (a copied directory is the same model)
    Hub id     ``hub:<id>@<commit sha>``: the revision resolved from the local Hub cache, else from the Hub

A change confined to bytes the sample skips (a handful of edited values in a large file) is seen only by a
full hash: ``dir_digest(path, full=True)``.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from functools import lru_cache
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
SMALL_FILE = 64 << 20     # non-weight files up to this size are hashed whole (tokenizer.json ~ 7-11 MB)
SMALL_WEIGHTS = 16 << 20  # weight files up to this size are hashed whole
EDGE = 64 << 10           # bytes hashed at each end of a large weight file
BLOCKS, BLOCK = 256, 4 << 10   # evenly spaced blocks hashed between the ends


class IdentityError(ValueError):
    """The weights a setting names cannot be identified (bad input: one line)."""


def weights_identity(source: str, ref: str | None, *, seed: int = 0, noise: float | None = None,
                     full: bool = False, engine: str = "native", tiny_shape: dict | None = None) -> str | None:
    """The identity of the weights ``ref`` names under ``source`` (tiny | embedded | hf); None for no ``ref``
    (tiny always has weights). ``noise``: the tiny draft's noise (None for the tiny target). ``tiny_shape``: the
    shape an engine runs the tiny pair in (its ``engine.tiny_shape``, e.g. vLLM's), hence other weights:
    ``tiny-<engine>:...``."""
    if source == "tiny":
        from mars_bench.models.tiny import tiny_config, tiny_shaped_config

        name, config = ((f"tiny-{engine}", tiny_shaped_config(1024, dict(tiny_shape))) if tiny_shape
                        else ("tiny", tiny_config(1024)))
        arch = hashlib.sha256(config.to_json_string(use_diff=False).encode()).hexdigest()[:12]
        return f"{name}:{arch}:seed{int(seed)}" + ("" if noise is None else f":noise{float(noise):g}")
    if ref is None:
        return None
    if source == "embedded":
        from mars_bench.models.embedded import SPECS

        if ref not in SPECS:
            raise IdentityError(f"embedded model {ref!r}; allowed: {', '.join(SPECS)}")
        return f"embedded:{ref}@{SPECS[ref].sha256}"
    if source != "hf":
        raise IdentityError(f"model.source={source!r}; allowed: tiny, embedded, hf")
    path = Path(ref).expanduser()
    if path.is_dir():
        return f"dir:{dir_digest(str(path.resolve()), full)}"
    return f"hub:{ref}@{hub_revision(ref)}"


def dir_digest(path: str, full: bool = False) -> str:
    """The content digest of a local model directory (module doc); ``full``: every byte hashed."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise IdentityError(f"{path} holds no weight file ({', '.join(WEIGHT_SUFFIXES)}); allowed: a model directory")
    h = hashlib.sha256()
    for p in files:
        stat = p.stat()
        key = (str(p.relative_to(root)), stat.st_size, stat.st_mtime_ns, full)
        h.update(_file_digest(str(p), *key[1:]).encode())
        h.update(f"|{key[0]}|{stat.st_size}\n".encode())
    return h.hexdigest()[:16]


def _hidden(rel: Path) -> bool:
    """Lock files and caches beside the weights (.cache/, .locks/, *.lock) change nothing a model computes."""
    return any(part.startswith(".") for part in rel.parts) or rel.suffix == ".lock"


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int, full: bool) -> str:
    """One file's part of the digest, cached per (path, size, mtime): a second run in a process reads nothing."""
    h = hashlib.sha256()
    weights = path.endswith(WEIGHT_SUFFIXES)
    with open(path, "rb") as f:
        if full or size <= (SMALL_WEIGHTS if weights else SMALL_FILE):
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
            return h.hexdigest()
        if path.endswith(".safetensors"):
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= min(size - 8, 100 << 20):
                raise IdentityError(f"{path}: not a safetensors file (header length {n}); allowed: a valid file")
            h.update(f.read(n))
        for offset in [0, size - EDGE] + [EDGE + i * (size - 2 * EDGE - BLOCK) // (BLOCKS - 1) for i in range(BLOCKS)]:
            f.seek(offset)
            h.update(f.read(EDGE if offset in (0, size - EDGE) else BLOCK))
    return h.hexdigest()


@lru_cache(maxsize=64)
def hub_revision(repo_id: str, revision: str | None = None) -> str:
    """The commit sha a Hub id resolves to: the local Hub cache first (offline), else the Hub."""
    try:
        from huggingface_hub import snapshot_download

        snap = snapshot_download(repo_id, revision=revision, local_files_only=True)
        return Path(snap).name
    except Exception:   # not cached: ask the Hub (below)
        pass
    if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0"):
        raise IdentityError(f"model {repo_id!r}: not in the local Hub cache and HF_HUB_OFFLINE is set, so its revision "
                            "is unknown; allowed: a local directory or a cached Hub id")
    try:
        from huggingface_hub import HfApi

        return HfApi().model_info(repo_id, revision=revision).sha
    except Exception as e:
        raise IdentityError(f"model {repo_id!r}: cannot resolve its revision ({type(e).__name__}: {str(e)[:120]}); "
                            "allowed: a local directory or a Hub id that resolves") from None


def pair_identity(mcfg, uses_draft: bool, head: str | None, engine: str = "native",
                  tiny_shape: dict | None = None) -> tuple[dict, dict | None]:
    """(target side, draft side) of a model config for a ``RunSpec``. The target side is everything an ar run
    shares with a speculative one (weights, dtype, device, fast path, sharding); the draft side the proposer's
    weights (None for a run with no draft model or head: ar, prompt lookup). ``head``: the model config key naming
    a drafting head's weights (e.g. eagle3), or None. ``engine``: the weights that engine runs
    (``weights_identity``)."""
    source = mcfg.source
    target = {"weights": weights_identity(source, mcfg.target, seed=mcfg.seed, engine=engine, tiny_shape=tiny_shape), "dtype": mcfg.dtype,
              "device": mcfg.device, "fast_path": mcfg.fast_path, "device_map": mcfg.device_map}
    draft = {}
    if uses_draft:
        draft["weights"] = weights_identity(source, mcfg.draft, seed=mcfg.seed, noise=mcfg.noise, engine=engine,
                                             tiny_shape=tiny_shape)
    if head is not None:
        draft[head] = weights_identity("hf", mcfg[head]) if mcfg[head] else None
    return target, (draft or None)


def describe(spec_model: dict | None) -> str:
    """One line for messages: the weights a spec's target side names ('unknown' for old result trees)."""
    return "unknown (written before run identities)" if not spec_model else json.dumps(spec_model, sort_keys=True)
