"""Real ``mars-bench`` processes on the tiny pair: two writers on one run directory share the work (no sample
twice, no duplicate line), a kill -9 leaves no lock that blocks a resume, SIGINT/SIGTERM stop a multirun
cleanly (exit 130/143, finished samples kept, rerun resumes), and a full disk or a read-only results folder is
one line naming the path with every finished sample kept."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mars_bench.base.locking import Claims
from mars_bench.store.io import read_samples

from . import rundirs

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["method=mars", "model=tiny", "method.theta=0.9", "method.k=3", "progress=false"]


def _run_dir(results: Path, n_new: int, method: str = "mars") -> Path:
    """The run directory of ``_cmd(results, ..., n_new)`` (method mars or ar), named by its spec."""
    return rundirs.run_dir(results, f"method={method}", *ARGS[1:], f"max_new_tokens={n_new}")


def _cmd(results: Path, limit: int, n_new: int = 24, *extra: str, args=ARGS) -> list[str]:
    return [sys.executable, "-m", "mars_bench.cli", *extra, *args, f"results_dir={results}", f"limit={limit}",
            f"max_new_tokens={n_new}"]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, **kw)


def _lines(path: Path) -> list[dict]:
    recs, problems = read_samples(path)
    assert problems == []
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == len(recs)        # whole lines only, none skipped
    return recs


def _wait_lines(proc, path: Path, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {n} lines (process rc={proc.poll()})")


def _one_error_line(stderr: str) -> str:
    errs = [ln for ln in stderr.splitlines() if ln.startswith("mars-bench:")]
    assert len(errs) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errs[0]


# ---- 1. one writer per sample ----------------------------------------------------------------------------
def test_two_processes_share_the_work(tmp_path):
    n, n_new = 24, 48
    ref = _run(_cmd(tmp_path / "ref", n, n_new))
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = {r["id"]: r["turns"][0]["output_ids"] for r in _lines(_run_dir(tmp_path / "ref", n_new) / "samples.jsonl")}
    procs = [subprocess.Popen(_cmd(tmp_path / "shared", n, n_new), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    recs = _lines(_run_dir(tmp_path / "shared", n_new) / "samples.jsonl")
    ids = [r["id"] for r in recs]
    assert len(ids) == n and len(set(ids)) == n          # each sample decoded (and written) exactly once
    assert {r["id"]: r["turns"][0]["output_ids"] for r in recs} == expected
    writers = {r["writer"] for r in recs}
    assert len(writers) == 2, writers                     # both processes did part of the work
    for out in outs:                                      # and both summarized the complete run
        assert "'n_relaxed'" in out
    summary = json.loads((_run_dir(tmp_path / "shared", n_new) / "summary.json").read_text())
    assert summary["totals"]["n_samples"] == n


def test_samples_held_elsewhere_are_skipped_then_taken_when_the_holder_dies(tmp_path):
    """This test process holds two claims: the CLI decodes the others first, then waits; one holder 'finishes'
    (its record appended), the other 'dies' (claim dropped without a record): the CLI takes that one over."""
    run_dir = _run_dir(tmp_path, 24)
    held = Claims(run_dir)
    assert held.take("p02") and held.take("p04")
    proc = subprocess.Popen(_cmd(tmp_path, 6), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    samples = run_dir / "samples.jsonl"
    _wait_lines(proc, samples, 4)
    time.sleep(1.0)
    assert proc.poll() is None                              # waiting for the held ones
    got = [r["id"] for r in _lines(samples)]
    assert sorted(got) == ["p00", "p01", "p03", "p05"]
    fake = {**_lines(samples)[0], "id": "p02", "index": 2, "writer": "elsewhere"}
    with open(samples, "a") as f:                           # the holder of p02 finishes it
        f.write(json.dumps(fake) + "\n")
    held.release("p02")
    held.release("p04")                                     # the holder of p04 dies without writing
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out[-2000:]
    recs = _lines(samples)
    assert [r["id"] for r in recs].count("p02") == 1 and len(recs) == 6
    assert next(r for r in recs if r["id"] == "p04")["writer"] != "elsewhere"
    assert "being decoded by another process" in out


def test_stale_lock_of_a_killed_process_does_not_block_a_resume(tmp_path):
    samples = _run_dir(tmp_path, 24) / "samples.jsonl"
    proc = subprocess.Popen(_cmd(tmp_path, 8), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_lines(proc, samples, 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert any((samples.parent / ".claims").iterdir())        # the dead process's lock files are still there
    done = samples.read_bytes().count(b"\n")
    res = _run(_cmd(tmp_path, 8))
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"8 samples ({done} already done)" in res.stdout + res.stderr
    assert "another process" not in res.stdout + res.stderr   # nothing waited on the stale lock
    assert len({r["id"] for r in _lines(samples)}) == 8 == len(_lines(samples))


# ---- 5. interrupts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_a_multirun_cleanly_and_a_rerun_resumes(tmp_path, sig, code):
    cmd = _cmd(tmp_path, 10, 24, "--multirun", args=["method=mars,ar", *ARGS[1:]])
    first = _run_dir(tmp_path, 24) / "samples.jsonl"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_lines(proc, first, 3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-3000:]
    line = _one_error_line(err)
    assert signal.Signals(sig).name in line and "resume" in line
    done = len(_lines(first))                               # whole lines only: nothing torn
    assert 3 <= done < 10 and not (first.parent / "summary.json").exists()
    assert not (_run_dir(tmp_path, 24, "ar")).exists()     # the multirun stopped: no later job started
    res = _run(cmd)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"10 samples ({done} already done)" in res.stdout + res.stderr
    for method in ("mars", "ar"):
        recs = _lines(_run_dir(tmp_path, 24, method) / "samples.jsonl")
        assert len(recs) == 10 == len({r["id"] for r in recs})


# ---- 3. disks ----------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of ``size`` (needs root and mount; the test fails loudly otherwise, it never skips)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = []

    def mount(opts: str) -> Path:
        verb = ["-o", f"remount,{opts}"] if mounted else ["-o", opts]
        subprocess.run(["mount", "-t", "tmpfs", *verb, "tmpfs", str(mnt)], check=True, capture_output=True)
        mounted.append(opts)
        return mnt
    yield mount
    if mounted:
        subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_is_one_line_and_loses_nothing(tmp_path, small_disk):
    results = small_disk("size=12k") / "results"    # 3 pages: run.json, config.yaml, then one page of records
    samples = _run_dir(results, 24) / "samples.jsonl"
    res = _run(_cmd(results, 8))
    assert res.returncode == 1, res.stderr[-3000:]
    line = _one_error_line(res.stderr)
    assert str(samples) in line and "No space left on device" in line and "resume" in line
    done = len(_lines(samples))
    assert 1 <= done < 8
    small_disk("size=1m")
    again = _run(_cmd(results, 8))
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"8 samples ({done} already done)" in again.stdout + again.stderr
    assert len({r["id"] for r in _lines(samples)}) == 8 == len(_lines(samples))


def test_read_only_results_dir_is_one_line_then_resumes(tmp_path, small_disk):
    mnt = small_disk("size=1m,ro")
    results = mnt / "results"
    fresh = _run(_cmd(results, 3))                   # a new run on a read-only disk: refused before decoding
    assert fresh.returncode == 1, fresh.stderr[-3000:]
    assert str(mnt) in _one_error_line(fresh.stderr) and "Read-only file system" in fresh.stderr
    small_disk("rw")
    samples = _run_dir(results, 24) / "samples.jsonl"
    assert _run(_cmd(results, 3)).returncode == 0
    before = samples.read_bytes()
    small_disk("ro")
    res = _run(_cmd(results, 5))
    assert res.returncode == 1, res.stderr[-3000:]
    line = _one_error_line(res.stderr)
    assert str(samples.parent) in line and "Read-only file system" in line
    assert samples.read_bytes() == before
    small_disk("rw")
    again = _run(_cmd(results, 5))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "5 samples (3 already done)" in again.stdout + again.stderr
    assert len(_lines(samples)) == 5
