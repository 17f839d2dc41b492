"""The task interface: ``Sample``, and ``Task`` whose defaults come from ``tasks/<name>/task.yaml``.

Each yaml file states a task's defaults once (version, data files, row count, prompt template, stop strings,
``max_new_tokens``, metric directions, subsets); this module only reads and applies them.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import data as D

log = logging.getLogger("mars_bench.tasks")

_DIRECTIONS = {"higher", "lower"}
_BASE_OVERRIDES = ("max_new_tokens", "stop_strings", "system_prompt")


@dataclass
class Sample:
    id: str
    turns: list[str]           # user messages, prompt template already applied (1, or 2 for MT-Bench)
    reference: Any             # what score() compares against
    meta: dict = field(default_factory=dict)


def load_spec(name: str) -> dict:
    path = D.tasks_dir() / name / "task.yaml"
    if not path.is_file():
        raise ValueError(f"{path}: task spec not found (set ${D.ENV_TASKS_DIR} to the repository's tasks/ folder)")
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML ({D.one_line(e)})") from None
    if not isinstance(spec, dict) or spec.get("name") != name:
        raise ValueError(f"{path}: expected a mapping with name: {name}")
    for key in ("version", "max_new_tokens", "metrics"):
        if key not in spec:
            raise ValueError(f"{path}: expected key '{key}'")
    bad = {k: v for k, v in (spec["metrics"] or {}).items() if v not in _DIRECTIONS}
    if bad:
        raise ValueError(f"{path}: metric directions must be 'higher' or 'lower', got {bad}")
    spec["_path"] = str(path)
    spec["_dir"] = str(path.parent)
    return spec


class Task:
    """Base class. Subclasses set ``name`` and implement ``read_rows``, ``make_sample``, ``score``, ``aggregate``."""

    name: str = ""

    def __init__(self, **overrides: Any):
        self.spec = load_spec(self.name)
        self.version: int = int(self.spec["version"])
        self.max_new_tokens: int = int(self.spec["max_new_tokens"])
        self.stop_strings: list[str] = list(self.spec.get("stop_strings") or [])
        self.system_prompt: str | None = self.spec.get("system_prompt")
        self.prompt_template: str = self.spec.get("prompt_template") or "{prompt}"
        self.options: dict = dict(self.spec.get("options") or {})
        self.download = D.http_get   # url -> bytes for files not found locally (a seam: tests pass a stand-in)
        self._apply(overrides)

    # ---- configuration -------------------------------------------------------------------------------
    def _apply(self, overrides: dict) -> None:
        known = list(_BASE_OVERRIDES) + sorted(self.options)
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(f"task {self.name}: unknown option '{key}'; known: {', '.join(known)}")
            if hasattr(value, "items") and not isinstance(value, dict):   # OmegaConf containers
                value = dict(value.items())
            elif not isinstance(value, (str, bytes, dict)) and hasattr(value, "__iter__"):
                value = list(value)
            if key == "max_new_tokens":
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"task {self.name}: max_new_tokens must be an integer >= 1, got {value!r}")
                self.max_new_tokens = value
            elif key == "stop_strings":
                if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
                    raise ValueError(f"task {self.name}: stop_strings must be a list of non-empty strings")
                self.stop_strings = value
            elif key == "system_prompt":
                if value is not None and not isinstance(value, str):
                    raise ValueError(f"task {self.name}: system_prompt must be a string or null")
                self.system_prompt = value
            else:
                self.options[key] = value

    @property
    def metric_directions(self) -> dict[str, str]:
        """'higher' (or 'lower') per metric that ``aggregate`` can return; declared once, in task.yaml."""
        return dict(self.spec["metrics"] or {})

    def format_prompt(self, **fields: Any) -> str:
        return self.prompt_template.format(**fields)

    # ---- data ----------------------------------------------------------------------------------------
    @property
    def data_files(self) -> list[str]:
        """Data files, relative to the data dir (or to the task folder for built-in sets)."""
        return list((self.spec.get("data") or {}).get("files") or [])

    def data_path(self, data_dir, rel: str) -> Path:
        """Where ``rel`` is read from (or would be, once fetched into the cache): see ``data.locate``."""
        if (self.spec.get("data") or {}).get("builtin"):
            return Path(self.spec["_dir"]) / rel
        return D.locate(rel, data_dir, download=None)

    def data_sha256(self, data_dir=None) -> dict[str, str]:
        """sha256 of each data file as read (local copy or verified cached public copy)."""
        out = {}
        for rel in self.data_files:
            p = self.data_path(data_dir, rel)
            out[rel] = D.sha256_file(p) if p.is_file() else "absent"
        return out

    def _check_sha256(self, data_dir) -> None:
        want = (self.spec.get("data") or {}).get("sha256") or {}
        for rel, got in self.data_sha256(data_dir).items():
            if rel in want and got != "absent" and got != want[rel]:
                log.warning("%s: sha256 %s differs from the published %s (row count and fields were checked)",
                            self.data_path(data_dir, rel), got, want[rel])

    def local_file(self, data_dir, rel: str) -> Path:
        """The file to read: a local copy, else the public copy fetched into the cache with ``self.download``
        (sha256 and rows verified). Never None; an unreachable source is a one-line DataError."""
        if (self.spec.get("data") or {}).get("builtin"):
            return self.data_path(data_dir, rel)
        return D.locate(rel, data_dir, download=self.download)

    def display_path(self, data_dir, rel: str) -> str:
        return str(self.data_path(data_dir, rel))

    def jsonl_rows(self, data_dir, rel: str, fields: dict, expected: int, public: str, download) -> list[dict]:
        """Rows of a JSONL data file (local, or the verified public copy in the cache), fields and count checked.

        ``public``/``download`` are the task modules' former fallbacks, unused now (``self.download`` fetches)."""
        path = self.local_file(data_dir, rel)
        rows = D.read_jsonl(path, fields)
        D.check_count(rows, expected, path)
        return rows

    def read_rows(self, data_dir) -> list[dict]:
        raise NotImplementedError

    def make_sample(self, index: int, row: dict) -> Sample:
        raise NotImplementedError

    def load(self, data_dir: str | os.PathLike | None = None, limit: int | None = None,
             subset: str | None = None) -> list[Sample]:
        """All samples in file order, validated (count, fields) before anything is generated.

        ``subset``: a named subset from task.yaml (e.g. 'paper'); ``limit``: then the first N.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"task {self.name}: limit must be an integer >= 0 or null, got {limit!r}")
        rule = self._subset_rule(subset)
        rows = self.read_rows(data_dir)
        self._check_sha256(data_dir)
        samples = [self.make_sample(i, row) for i, row in enumerate(rows)]
        if "first" in rule:
            samples = samples[: int(rule["first"])]
        for key, value in (rule.get("where") or {}).items():
            samples = [s for s in samples if s.meta.get(key) == value]
        return samples if limit is None else samples[:limit]

    def _subset_rule(self, subset: str | None) -> dict:
        subsets = dict(self.spec.get("subsets") or {})
        if subset is None or subset in ("full", "all"):
            return {}
        if subset not in subsets:
            known = ", ".join(["full"] + sorted(subsets))
            raise ValueError(f"task {self.name}: unknown subset '{subset}'; allowed: {known}")
        return dict(subsets[subset] or {})

    # ---- scoring -------------------------------------------------------------------------------------
    def score(self, sample: Sample, outputs: list[str]) -> dict:
        raise NotImplementedError

    def aggregate(self, samples: list[Sample], scored: list[dict], outputs: list[list[str]]) -> dict:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Task {self.name} v{self.version} max_new_tokens={self.max_new_tokens}>"


def mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None
