"""Resumable results: a run killed with SIGKILL mid-way and rerun ends with exactly the samples and outputs
of an uninterrupted run (none lost, none duplicated), including after a torn last line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mars_bench.store.io import read_samples
from mars_bench.store.spec import read_spec

from .rundirs import run_dir

ROOT = Path(__file__).resolve().parent.parent
N = 10                   # samples; tiny pair, 24 new tokens: ~0.1-0.3 s each after a ~4 s start
ARGS = ["model=tiny", "method=mars", "method.theta=0.9", "method.k=3", "max_new_tokens=24", "progress=false"]


def _run_dir(results: Path) -> Path:
    """Where the command writes: named by its spec, computed here (the same in every process)."""
    return run_dir(results, *ARGS)


def _cmd(results: Path, limit: int = N) -> list[str]:
    return [sys.executable, "-m", "mars_bench.cli", *ARGS, f"results_dir={results}", f"limit={limit}"]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _outputs(path: Path) -> dict:
    recs, problems = read_samples(path)
    assert problems == []
    return {r["id"]: [t["output_ids"] for t in r["turns"]] for r in recs}


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    ref = subprocess.run(_cmd(tmp_path / "ref"), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = _outputs(_run_dir(tmp_path / "ref") / "samples.jsonl")
    assert len(expected) == N

    samples = _run_dir(tmp_path / "cut") / "samples.jsonl"
    proc = subprocess.Popen(_cmd(tmp_path / "cut"), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if samples.exists() and samples.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    done = samples.read_bytes().count(b"\n")
    assert 2 <= done < N and not (samples.parent / "summary.json").exists()
    assert read_spec(samples.parent).label == "mars-k3-th0.9-T0-p1-n24-s0"      # run.json came first
    with open(samples, "ab") as f:          # a write torn by the kill: half a record, no newline
        f.write(b'{"id": "p09", "index": 9, "new_tok')

    res = subprocess.run(_cmd(tmp_path / "cut"), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{N} samples ({done} already done)" in res.stdout + res.stderr
    lines = samples.read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert len(ids) == N and len(set(ids)) == N                        # none lost, none duplicated
    assert _outputs(samples) == expected                                # same outputs as uninterrupted
    summary = json.loads((samples.parent / "summary.json").read_text())
    ref_summary = json.loads((_run_dir(tmp_path / "ref") / "summary.json").read_text())
    for key in ("n_samples", "new_tokens", "steps", "n_accepted", "n_relaxed"):
        assert summary["totals"][key] == ref_summary["totals"][key], key
    assert summary["problems"] == []


def test_larger_limit_only_adds_samples(tmp_path):
    first = subprocess.run(_cmd(tmp_path, 2), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr[-2000:]
    samples = _run_dir(tmp_path) / "samples.jsonl"
    head = samples.read_bytes()
    again = subprocess.run(_cmd(tmp_path, 3), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr[-2000:]
    assert samples.read_bytes().startswith(head) and samples.read_bytes().count(b"\n") == 3
    assert "3 samples (2 already done)" in again.stdout + again.stderr
