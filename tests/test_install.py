"""A non-editable install carries its configs and task specs: `mars-bench model=tiny` runs from it with
the checkout nowhere on the path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_non_editable_install_runs_the_tiny_pair(tmp_path):
    import shutil

    src, site = tmp_path / "src", tmp_path / "site"   # a copy: the build leaves nothing in the checkout
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "results", "build", "*.egg-info", "__pycache__", ".pytest_cache", "wandb"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(src)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr
    assert (site / "mars_bench" / "conf" / "config.yaml").is_file()
    assert (site / "mars_bench" / "tasks" / "specs" / "prompts" / "task.yaml").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("MARS_BENCH_TASKS_DIR",)}
    env.update(PYTHONPATH=str(site), OMP_NUM_THREADS="1")
    work = tmp_path / "elsewhere"
    work.mkdir()
    res = subprocess.run([sys.executable, "-m", "mars_bench.cli", "model=tiny", "method=sd", "limit=2",
                          "max_new_tokens=6", "progress=false", f"results_dir={work / 'r'}"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (summary,) = (work / "r").rglob("summary.json")
    s = json.loads(summary.read_text())
    assert s["totals"]["n_samples"] == 2 and s["rule"] == "exact"
    assert str(site) in subprocess.run([sys.executable, "-c", "import mars_bench; print(mars_bench.__file__)"],
                                       cwd=work, env=env, capture_output=True, text=True).stdout
