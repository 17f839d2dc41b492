"""Run directories in tests. A run directory is named by its spec (``RunSpec.dir_name``: label and digest),
so tests find it either as the runner does (``run_dir``: the spec computed here from the same overrides) or
by the label its run.json gives (``find_run``, ``labels``)."""
from __future__ import annotations

from pathlib import Path

from mars_bench.store.spec import read_spec

from .conftest import data_dir


def run_dir(results: Path, *overrides: str) -> Path:
    """The run directory that ``mars-bench <overrides> results_dir=<results>`` writes, computed in this process."""
    from mars_bench.run.runner import Job

    from .test_cli import cfg_of

    return Job(cfg_of(*overrides, f"results_dir={results}", f"data_dir={data_dir()}")).run_dir


def by_label(task_dir: Path) -> dict[str, Path]:
    """label -> run directory, for every run in ``task_dir`` (a label twice fails the test)."""
    out = {}
    for d in sorted(p for p in Path(task_dir).iterdir() if p.is_dir()):
        spec = read_spec(d)
        if spec is not None:
            assert spec.label not in out, f"two runs labelled {spec.label} in {task_dir}"
            out[spec.label] = d
    return out


def labels(task_dir: Path) -> list[str]:
    """The labels of the runs in ``task_dir``, sorted."""
    return sorted(by_label(task_dir))


def find_run(task_dir: Path, label: str) -> Path:
    """The run directory in ``task_dir`` labelled ``label``."""
    runs = by_label(task_dir)
    assert label in runs, f"no run labelled {label} in {task_dir}; found: {sorted(runs)}"
    return runs[label]
