"""Batched runs through the runner: a run at batch_size=3 killed with SIGKILL mid-batch and rerun ends with
exactly the samples and outputs of an uninterrupted batch-size-1 run (none lost, none duplicated), and a
two-turn task decodes each sample's turns in sequence in its slot, as at batch size 1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mars_bench.store.io import read_samples

from .conftest import data_dir
from .rundirs import find_run, labels, run_dir

ROOT = Path(__file__).resolve().parent.parent
N = 12
ARGS = ["model=tiny", "method=mars", "method.theta=0.9", "method.k=3", "max_new_tokens=24", "progress=false"]


def _cmd(results: Path, *extra) -> list[str]:
    return [sys.executable, "-m", "mars_bench.cli", *ARGS, f"results_dir={results}", f"limit={N}", *extra]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MARS_BENCH_DATA_DIR": str(data_dir())}


def _outputs(path: Path) -> dict:
    recs, problems = read_samples(path)
    assert problems == []
    return {r["id"]: [t["output_ids"] for t in r["turns"]] for r in recs}


def test_batched_sigkill_then_resume_equals_batch1_run(tmp_path):
    ref = subprocess.run(_cmd(tmp_path / "ref"), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = _outputs(run_dir(tmp_path / "ref", *ARGS) / "samples.jsonl")
    assert len(expected) == N

    samples = run_dir(tmp_path / "cut", *ARGS, "batch_size=3") / "samples.jsonl"
    assert samples.parent.name.startswith("mars-k3-th0.9-b3-T0-p1-n24-s0@")
    proc = subprocess.Popen(_cmd(tmp_path / "cut", "batch_size=3"), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if samples.exists() and samples.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    done = samples.read_bytes().count(b"\n")
    assert 2 <= done < N and not (samples.parent / "summary.json").exists()

    res = subprocess.run(_cmd(tmp_path / "cut", "batch_size=3"), cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{N} samples ({done} already done)" in res.stdout + res.stderr
    recs = [json.loads(line) for line in samples.read_text().splitlines()]
    ids = [r["id"] for r in recs]
    assert len(ids) == N and len(set(ids)) == N                        # none lost, none duplicated
    assert _outputs(samples) == expected                                # the batch-size-1 outputs
    assert {r["batch_size"] for r in recs} == {3}
    summary = json.loads((samples.parent / "summary.json").read_text())
    assert summary["config"]["batch_size"] == 3
    # throughput: the records' wall shares add up to about the decoding wall time, not B times it
    assert summary["totals"]["wall_s"] < sum(t["span_s"] for r in recs for t in r["turns"])


def test_two_turn_task_batched_equals_batch1(tmp_path):
    args = ["model=tiny", "method=sd", "method.k=4", "task=mt_bench", "max_new_tokens=12", "limit=5",
            "progress=false", f"results_dir={tmp_path}"]
    for b in (1, 2):
        r = subprocess.run([sys.executable, "-m", "mars_bench.cli", *args, f"batch_size={b}"], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
    (task_dir,) = (tmp_path / "tiny_fp32_cpu").glob("mt_bench-*")
    assert labels(task_dir) == ["sd-k4-T0-p1-n12-s0", "sd-k4-b2-T0-p1-n12-s0"]
    runs = [find_run(task_dir, label) for label in labels(task_dir)]
    one, two = (_outputs(p / "samples.jsonl") for p in runs)
    assert len(one) == 5 and one == two
    assert all(len(turns) == 2 for turns in two.values())


def test_batch_too_large_for_memory_is_one_line_and_writes_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mars_bench.cli", "model=tiny", "method=sd", "limit=2", "progress=false",
                        "batch_size=100000000", f"results_dir={tmp_path}"], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=180)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "batch_size=100000000 needs" in last and "the largest batch that fits is" in last
    assert "Traceback" not in r.stderr
    assert not list(tmp_path.rglob("*.jsonl")) and not list(tmp_path.rglob("config.yaml"))


def test_interleaved_batched_equals_interleaved_batch1(tmp_path):
    """+compare=methods at batch_size=2: chunks of 4 x B samples, method order rotated per chunk."""
    args = ["model=tiny", "+compare=methods", "limit=10", "max_new_tokens=12", "progress=false",
            f"results_dir={tmp_path}"]
    for b in (1, 2):
        r = subprocess.run([sys.executable, "-m", "mars_bench.cli", *args, f"batch_size={b}"], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
    base = tmp_path / "tiny_fp32_cpu" / "prompts-v1"
    for head in ("ar", "sd-k4", "mars-k4-th0.9"):
        one = _outputs(find_run(base, f"{head}-T0-p1-n12-s0") / "samples.jsonl")
        recs, _ = read_samples(find_run(base, f"{head}-b2-T0-p1-n12-s0") / "samples.jsonl")
        assert len(one) == 10 and {r["id"]: [t["output_ids"] for t in r["turns"]] for r in recs} == one
        assert len({r["order"] for r in recs}) == 2                         # two chunks, rotated order
        assert {r["timing"] for r in recs} == {"interleaved"} and {r["batch_size"] for r in recs} == {2}
