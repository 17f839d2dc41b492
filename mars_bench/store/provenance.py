"""Where and from what a record was made: the git commit, the library versions (``manifest``) and the machine
a sample is decoded on (``machine``: CPU, the instruction sets the kernels choose between, threads, GPU)."""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]   # the checkout
# what decides a record's content (git pathspecs); the report, its CLI, the readers of run directories and the shard
# plan only read or order records. Paths as they were before the move into packages stay excluded, so that commits
# from either side of it compare as they did.
DECODING = ("mars_bench", "tasks", "hydra_plugins", "pyproject.toml", ":(exclude)mars_bench/report",
            ":(exclude)mars_bench/cli/report.py", ":(exclude)mars_bench/store/pack.py",
            ":(exclude)mars_bench/store/read.py", ":(exclude)mars_bench/run/shards.py",
            ":(exclude)mars_bench/shards.py")


OUTPUTS = "results"   # what runs write into the checkout (packs, parts): not code, so never '+dirty'


def git_commit(root: Path | None = None) -> str:
    """HEAD of the checkout, '+dirty' when a tracked file outside ``OUTPUTS`` has uncommitted changes (a shard's
    pack written by an earlier shard of the same command does not change the code the next one decodes with);
    'unknown' without git."""
    try:
        root = ROOT if root is None else root
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":(exclude){OUTPUTS}"], cwd=root, capture_output=True, text=True,
                               timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def same_code(commit: str | None, root: Path | None = None, against: str | None = None) -> bool:
    """Whether the working tree at ``root`` (or commit ``against``) decodes as ``commit`` did: known commits
    without uncommitted changes and no difference between them in the ``DECODING`` paths."""
    root = ROOT if root is None else root
    if any(not c or c == "unknown" or c.endswith("+dirty") for c in (commit, *([against] if against else []))):
        return False
    try:
        diff = subprocess.run(["git", "diff", "--quiet", commit, *([against] if against else []), "--", *DECODING],
                              cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return diff.returncode == 0


@functools.cache
def process_commit() -> str:
    """``git_commit()`` once per process: the code this process imported, which every record it writes names."""
    return git_commit()


def manifest() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "platform": platform.platform(),
            "processor": platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "git_commit": git_commit()}


# the instruction sets the CPU kernels choose between (models/panel.py, fastpath.py), as /proc/cpuinfo names them
ISA_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")


def machine(device: str = "cpu") -> dict:
    """The machine a record is decoded on: CPU model name, which of ISA_FLAGS it has, torch's threads, and the GPU
    when the model runs on CUDA. Speeds are compared only between records of equal machines (``speed_pairs``)."""
    import torch

    from mars_bench.models.panel import cpu

    model, flags = cpu()
    gpu = torch.cuda.get_device_name(0) if device != "cpu" and torch.cuda.is_available() else None
    return {"cpu": model or platform.machine(), "isa": [f for f in ISA_FLAGS if f in flags],
            "threads": torch.get_num_threads(), "gpu": gpu}


def machine_label(m: dict | None) -> str:
    """One line for headers: 'Intel(R) Xeon(R) Processor (amx_bf16, avx512_bf16, ...; 2 threads)'."""
    if not m:
        return "unrecorded"
    isa = ", ".join(m.get("isa") or []) or "none of " + "/".join(ISA_FLAGS)
    return f"{m.get('gpu') or m.get('cpu')} ({isa}; {m.get('threads')} threads)"
