"""The SLURM tier (``pytest -m slurm``; binaries from ``.ci/slurm.sh``): Hydra multirun sweeps through
``hydra/launcher=slurm_local`` on a one-node cluster started here (``tests/slurm_cluster.py``).

A theta sweep with its ar baseline on the tiny pair runs as one SLURM array (one task per sweep job) and gives the
records and report tables of the same sweep run locally (tokens and quality; wall times differ); every theta
point's ar job shares one ar run, decoded once. Faults: the array cancelled (``scancel``) mid-run and the sweep
resubmitted ends with exactly the uninterrupted sweep's samples; two overlapping submissions of the sweep split
the work (the flock claims hold across SLURM jobs); a partition SLURM does not have is refused in one line.
The first test (no cluster, fast tier) checks that Hydra finds the launcher plugin and how a refusal is worded.
"""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mars_bench.store.io import read_samples
from mars_bench.store.spec import read_spec

from .slurm_cluster import MissingBinaries, local_cluster

ROOT = Path(__file__).resolve().parent.parent
SLOW_WRITES = Path(__file__).resolve().parent / "slow_writes"   # sitecustomize: a pause after each sample line
DATA = Path(os.environ.get("MARS_BENCH_DATA_DIR", ROOT.parent / "shared" / "data"))
N = 12                                      # samples; tiny pair, 24 new tokens
SWEEP = ["+sweep=theta", "method=ar,mars", "method.theta=0.85,0.95", "model=tiny", "task=gsm8k", f"limit={N}",
         "max_new_tokens=24", "progress=false"]
LABELS = ["ar-T0-p1-n24-s0", "mars-k4-th0.85-T0-p1-n24-s0", "mars-k4-th0.95-T0-p1-n24-s0"]
JOBS = 4                                    # 2 methods x 2 thetas: the ar jobs of both thetas are one run
# report columns that are (or cite) wall times; Table 9: ms per token / step, the share outside forwards
TIMING = re.compile(r"tokens_per_s|speedup|wall|notes|_ms_|outside")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        with local_cluster(tmp_path_factory.mktemp("slurm")) as c:
            yield c
    except MissingBinaries as e:
        pytest.fail(str(e), pytrace=False)


def _slow(env: dict) -> dict:
    """``env`` with a 0.5 s pause after each sample line (tests/slow_writes): a run of 12 samples lasts >= 6 s."""
    path = os.pathsep.join(filter(None, [str(SLOW_WRITES), os.environ.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "MARS_BENCH_TEST_WRITE_DELAY": "0.5"}


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, **(extra or {}), "MARS_BENCH_DATA_DIR": str(DATA), "OMP_NUM_THREADS": "1",
            "HYDRA_FULL_ERROR": "0"}


def _cmd(results: Path, *extra: str, launcher: str | None = "slurm_local") -> list[str]:
    hydra = [f"hydra/launcher={launcher}"] if launcher else []
    return [sys.executable, "-m", "mars_bench.cli", "-m", *hydra, *SWEEP, *extra, f"results_dir={results}"]


def _sweep(results: Path, env: dict, *extra: str, launcher: str | None = "slurm_local") -> subprocess.CompletedProcess:
    res = subprocess.run(_cmd(results, *extra, launcher=launcher), cwd=ROOT, env=_env(env), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _runs(results: Path) -> dict[str, Path]:
    task_dir = results / "tiny_fp32_cpu" / "gsm8k-v2"
    runs = {read_spec(d).label: d for d in task_dir.iterdir() if d.is_dir() and read_spec(d) is not None}
    assert sorted(runs) == LABELS
    return runs


def _records(results: Path) -> dict[str, list[dict]]:
    """label -> its records as samples.jsonl holds them (every line, duplicates included)."""
    out = {}
    for label, d in _runs(results).items():
        recs, problems = read_samples(d / "samples.jsonl")
        assert problems == [], problems
        out[label] = recs
    return out


def _tokens(records: dict[str, list[dict]]) -> dict:
    """label -> sample id -> what decoding and scoring produced (no times)."""
    keys = ("new_tokens", "steps", "n_accepted", "n_relaxed", "score")
    return {label: {r["id"]: ([t["output_ids"] for t in r["turns"]], [r[k] for k in keys]) for r in recs}
            for label, recs in records.items()}


def _once_each(records: dict[str, list[dict]]) -> None:
    """Every run holds every sample exactly once: none lost, none decoded twice."""
    for label, recs in records.items():
        ids = [r["id"] for r in recs]
        assert len(ids) == N and len(set(ids)) == N, (label, len(ids), len(set(ids)))


def _tables(results: Path) -> dict[str, list[dict]]:
    """The report's CSV tables without their timing columns, and without the rows of a long table that hold a
    timing (the paper layout's ``quantity`` = 'speedup (×)' rows)."""
    from mars_bench.cli.report import main

    assert main([str(results), "--no-figures"]) == 0
    out = {}
    for path in sorted((results / "report" / "tables").glob("*.csv")):
        with path.open(newline="") as f:
            out[path.stem] = [{k: v for k, v in row.items() if not TIMING.search(k)} for row in csv.DictReader(f)
                              if not TIMING.search(row.get("quantity") or "")]
    return out


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The same sweep run locally (Hydra's basic launcher, one job after another): the reference."""
    results = tmp_path_factory.mktemp("local") / "results"
    _sweep(results, {}, launcher=None)
    records = _records(results)
    _once_each(records)
    return _tokens(records), _tables(results)


def _array_tasks(results: Path) -> dict[str, list[int]]:
    """SLURM array job id -> its tasks that returned a result (submitit's folders under the sweep dir)."""
    out: dict[str, list[int]] = {}
    for pkl in (results / "multirun" / ".submitit").glob("*/*_result.pkl"):
        job, task = pkl.parent.name.split("_")
        out.setdefault(job, []).append(int(task))
    return {job: sorted(tasks) for job, tasks in out.items()}


@pytest.mark.slurm
def test_sweep_on_slurm_equals_the_local_sweep(cluster, local, tmp_path):
    results = tmp_path / "results"
    _sweep(results, cluster.env)
    assert list(_array_tasks(results).values()) == [list(range(JOBS))]   # one array, one task per sweep job
    records = _records(results)
    _once_each(records)      # both theta points' ar jobs wrote one ar run, each sample once: ar decoded once
    expected_tokens, expected_tables = local
    assert _tokens(records) == expected_tokens
    tables = _tables(results)
    assert tables == expected_tables and tables["quality"] and tables["theta"]


@pytest.mark.slurm
def test_cancelled_sweep_resubmitted_ends_with_the_uninterrupted_samples(cluster, local, tmp_path):
    results = tmp_path / "results"
    # >= 6 s a run: the cancel lands mid-run however fast the machine (on a fast one the sweep ended between the
    # first line and scancel)
    proc = subprocess.Popen(_cmd(results), cwd=ROOT, env=_env(_slow(cluster.env)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    task_dir = results / "tiny_fp32_cpu" / "gsm8k-v2"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:   # a mars run's first finished sample
            if any(p.read_bytes().count(b"\n") for p in task_dir.glob("mars-*/samples.jsonl")):
                break
            time.sleep(0.05)
        jobs = {job.split("_")[0] for job, _ in cluster.queue()}
        assert proc.poll() is None and jobs, "the sweep ended before it could be cancelled"
        cluster.cmd("scancel", *jobs)
        cluster.wait_empty(60)
    finally:   # the launcher waits for results that will never come (no accounting here to tell it)
        proc.terminate()
        proc.wait(timeout=60)
    cut = {d: (d / "samples.jsonl").read_bytes() for d in task_dir.iterdir() if (d / "samples.jsonl").exists()}
    cut = {d: b[:b.rfind(b"\n") + 1] for d, b in cut.items()}     # a line torn by SIGKILL is repaired on resume
    partial = [d for d, b in cut.items() if 0 < b.count(b"\n") < N]
    counts = {d.name: b.count(b"\n") for d, b in cut.items()}
    assert partial, f"no run was cut mid-way (lines per run: {counts})"
    assert not all((d / "summary.json").exists() for d in partial)

    _sweep(results, cluster.env)                # the same command again
    records = _records(results)
    _once_each(records)
    assert _tokens(records) == local[0]
    for d in partial:                           # the cut run kept its lines; new jobs added the rest
        final = (d / "samples.jsonl").read_bytes()
        assert final.startswith(cut[d])
        before = {json.loads(line)["writer"] for line in cut[d].splitlines()}
        after = {json.loads(line)["writer"] for line in final[len(cut[d]):].splitlines()}
        assert after and not before & after


@pytest.mark.slurm
def test_overlapping_submissions_share_the_work(cluster, local, tmp_path):
    """Two submissions of one sweep at once, one job at a time each (array_parallelism=1): their i-th jobs run
    side by side on the same run; the claims split its samples between them. Each run lasts >= 6 s (``_slow``):
    on a quiet machine a tiny run could end before the other submission's job started (CI saw no shared run)."""
    results = tmp_path / "results"
    cmd = _cmd(results, "hydra.launcher.array_parallelism=1")
    env = _env(_slow(cluster.env))
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    arrays = _array_tasks(results)
    assert len(arrays) == 2 and all(tasks == list(range(JOBS)) for tasks in arrays.values())
    records = _records(results)
    _once_each(records)
    assert _tokens(records) == local[0]
    shared = [label for label, recs in records.items() if len({r["writer"] for r in recs}) >= 2]
    assert shared, "no run was decoded by jobs of both submissions"


@pytest.mark.slurm
def test_a_partition_slurm_does_not_have_is_refused_in_one_line(cluster, tmp_path):
    results = tmp_path / "results"
    res = subprocess.run(_cmd(results, "hydra.launcher.partition=no_such_partition"), cwd=ROOT,
                         env=_env(cluster.env), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("mars-bench: error: SLURM refused the sweep's jobs: ")
    assert "Invalid partition name specified" in lines[0]                        # SLURM's reason
    assert "hydra.launcher.partition=no_such_partition" in lines[0]              # the value given
    assert not (results / "tiny_fp32_cpu").exists() and not cluster.queue()     # nothing ran, nothing queued


def test_the_launcher_plugin_is_found_and_a_refusal_is_one_line():
    """Fast tier: the package ships the plugin Hydra instantiates for hydra/launcher=slurm, and sbatch's refusal
    (as submitit raises it) becomes one line naming SLURM's reason and the settings given."""
    import io

    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher
    from submitit.core.utils import FailedJobError

    from mars_bench.run.slurm import _HideSbatchErrors, message, refusal

    assert "hydra_plugins.mars_bench_slurm.SlurmLauncher" in {f"{p.__module__}.{p.__name__}"
                                                              for p in Plugins.instance().discover(Launcher)}
    stderr = "sbatch: error: Batch job submission failed: Invalid partition name specified"
    err = FailedJobError(stderr)
    err.__cause__ = subprocess.CalledProcessError(1, ["sbatch", "/x/.submission_file.sh"], output="", stderr=stderr)
    reason = refusal(err)
    assert reason == "Batch job submission failed: Invalid partition name specified"
    line = message(reason, {"partition": "nope", "gres": None, "mem_gb": 2})
    assert "\n" not in line and "hydra.launcher.partition=nope" in line and "gres" not in line
    assert refusal(FailedJobError("Job (task=0) failed during processing with trace: ...")) is None   # a bug
    out = io.StringIO()
    hide = _HideSbatchErrors(out)
    for text in ("keep\n", stderr, "\n", "also kept", "\n"):
        hide.write(text)
    assert out.getvalue() == "keep\nalso kept\n"
