"""Finding the runs of results trees and reading their files (``samples.jsonl``, ``summary.json``).

Layout (written by ``mars_bench.run.runner``): ``<root>/<model dir>/<task dir>/<run dir>/``. A directory holding
samples.jsonl or summary.json is a run when ``tags.read_spec`` gives its spec (run.json). The folder names only
place a run (which runs compare); what ran is read from the files: the settings from run.json, the model name,
task and task version from summary.json, else the sample records, else config.yaml (task and model name), else
unknown (None; results written before those fields existed). Directories with the same model
dir, task dir and spec (several roots, several workers) are one run: their samples are merged by id (the first
complete record wins; a copy that differs is a problem) and the summary covering most samples is kept. A
corrupt or truncated line is reported as 'file:line: why' in ``RunFiles.problems`` and skipped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import yaml

from mars_bench.store.io import read_samples
from mars_bench.store.spec import RunSpec, read_spec


@dataclass
class RunFiles:
    """What the files of one run hold, merged over its directories."""
    model_dir: str                  # the folder, e.g. tiny_fp32_cpu: a place, never parsed
    task_dir: str                   # the folder, e.g. gsm8k-v1: a place, never parsed
    spec: RunSpec
    dirs: list[Path]
    records: list[dict] = field(default_factory=list)
    summary: dict | None = None
    directions: dict = field(default_factory=dict)   # metric -> 'higher' | 'lower' (the task's)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model: str | None = None        # the model config's name (None: unknown)
    task: str | None = None         # the task's name (None: unknown)
    task_version: int | None = None

    @property
    def key(self) -> str:
        return f"{self.model_dir}/{self.task_dir}/{self.spec.dir_name}"

    @property
    def has_samples(self) -> bool:
        return any((d / "samples.jsonl").exists() for d in self.dirs)


def find_run_dirs(root, problems: list[str] | None = None) -> list[Path]:
    """Run directories under ``root``: those holding samples.jsonl or summary.json whose spec reads. One
    whose run.json cannot be read is skipped and said in ``problems``."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such results directory")
    dirs = {p.parent for name in ("samples.jsonl", "summary.json") for p in root.rglob(name)}
    return sorted(d for d in dirs if _spec(d, problems if problems is not None else []) is not None)


def _spec(run_dir: Path, problems: list[str]) -> RunSpec | None:
    try:
        return read_spec(run_dir)
    except ValueError as e:
        problems.append(f"{e}: directory skipped")
        return None


def find_runs(roots: Iterable, problems: list[str] | None = None) -> list[RunFiles]:
    """Every run under ``roots``, read; directories of the same model dir, task dir and spec merged.
    ``problems``: where directories that are not readable runs are said."""
    by_place: dict[tuple[str, str], list[tuple[RunSpec, list[Path]]]] = {}
    for root in roots:
        for d in find_run_dirs(root, problems):
            spec, runs = read_spec(d), by_place.setdefault((d.parent.parent.name, d.parent.name), [])
            same = next((dirs for s, dirs in runs if s == spec), None)
            if same is None:
                runs.append((spec, [d]))
            else:
                same.append(d)
    found = [read_run(*place, spec, dirs) for place, runs in by_place.items() for spec, dirs in runs]
    _share_directions(found)
    return found


def read_run(model_dir: str, task_dir: str, spec: RunSpec, dirs: list[Path]) -> RunFiles:
    """One run's samples (merged by id) and summary (the one covering most samples)."""
    run, seen, summaries = RunFiles(model_dir, task_dir, spec, list(dirs)), {}, []
    for d in dirs:
        recs, probs = read_samples(d / "samples.jsonl")
        run.problems += probs
        for rec in recs:
            first = seen.setdefault(rec["id"], (d, rec))
            if first[1] is rec:
                run.records.append(rec)
            elif _outputs(first[1]) != _outputs(rec):
                run.problems.append(f"{d / 'samples.jsonl'}: sample {rec['id']!r} differs from the copy in "
                                    f"{first[0]}; kept the first")
        s = _read_summary(d / "summary.json", run.problems)
        if s is not None:
            summaries.append(s)
    run.summary = max(summaries, key=lambda x: x["totals"].get("n_samples", 0), default=None)
    s = run.summary or {}
    run.directions = dict(s.get("metric_directions") or {})
    run.problems += [p for p in s.get("problems") or [] if p not in run.problems]
    written = [s] + run.records
    if any(all(x.get(k) is None for x in written) for k in ("model", "task")):   # older files: config.yaml's names
        written += [_config(d) for d in dirs]
    run.model, run.task, run.task_version = (next((x[k] for x in written if x.get(k) is not None), None)
                                             for k in ("model", "task", "task_version"))
    if len(dirs) > 1:
        run.notes.append(f"merged from {len(dirs)} directories")
    return run


def _config(run_dir: Path) -> dict:
    """The model and task names of a run's config.yaml ({} when it has none or it does not read)."""
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    model, task = cfg.get("model"), cfg.get("task")
    return {"model": model.get("name") if isinstance(model, dict) else None,
            "task": task.get("name") if isinstance(task, dict) else None}


def _outputs(rec: dict) -> list:
    return [t.get("output_ids") for t in rec.get("turns", [])]


def _read_summary(path: Path, problems: list[str]) -> dict | None:
    if not path.exists():
        return None
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(s, dict) or not isinstance(s.get("totals"), dict):
            raise ValueError("not a summary (no 'totals')")
        return s
    except ValueError as e:
        problems.append(f"{path}: unreadable summary ({e}); using samples.jsonl")
        return None


def _share_directions(runs: list[RunFiles]) -> None:
    """A task declares its metric directions once; runs without a summary borrow them."""
    by_task: dict[str, dict] = {}
    for r in runs:
        if r.directions:
            by_task.setdefault(r.task_dir, r.directions)
    for r in runs:
        if not r.directions:
            r.directions = dict(by_task.get(r.task_dir, {}))
