"""The task interface: ``Sample``, and ``Task`` whose defaults come from ``tasks/specs/<name>/task.yaml``.

Each yaml file states a task's defaults once (version, data files, row count, prompt template, stop strings,
``max_new_tokens``, metrics, subsets, options); this module only reads and applies them.

Metrics are registered once, in task.yaml, each with its direction and the paired test that compares two runs::

    metrics:
      accuracy_strict: {higher: true, test: binary, per_sample: correct_strict}
      bleu: {higher: true, test: corpus_bleu, per_sample: hypothesis}
      strict_format_rate: {higher: true, test: none}

``per_sample`` names the key of a record's ``score`` dict (what ``score()`` returns) that holds the sample's value:
0/1 for ``binary``, a float for ``mean``, the hypothesis text for ``corpus_bleu`` / ``corpus_chrf``; None values
are left out. ``test: none`` has no per-sample value.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mars_bench.tasks import data as D

log = logging.getLogger("mars_bench.tasks")

METRIC_TESTS = ("binary", "mean", "corpus_bleu", "corpus_chrf", "none")
PROMPT_SOURCES = ("ours", "authors")   # the values of the ``prompts`` task option
_BASE_OVERRIDES = ("max_new_tokens", "stop_strings", "system_prompt")


@dataclass(frozen=True)
class MetricSpec:
    """One registered metric: its direction, the paired test comparing two runs, and its per-sample score key."""
    name: str
    higher: bool
    test: str
    per_sample: str | None = None
    needs_format: str | None = None   # a format-rate metric; at 0 (the model never wrote the format) this one says
    #                                   nothing, and reports lead with the next declared metric (frames.headline)

    @property
    def direction(self) -> str:
        return "higher" if self.higher else "lower"


def parse_metrics(raw: Any, path: Any) -> dict[str, MetricSpec]:
    """task.yaml ``metrics:`` as MetricSpecs; anything malformed is one ValueError line naming the metric."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: metrics must be a mapping of name -> {{higher, test, per_sample}}")
    out = {}
    for name, entry in raw.items():
        where = f"{path}: metric '{name}'"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected {{higher: bool, test: {'|'.join(METRIC_TESTS)}, per_sample: key}}, "
                             f"got {entry!r}")
        unknown = sorted(set(entry) - {"higher", "test", "per_sample", "needs_format"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: higher, test, per_sample, needs_format")
        fmt = entry.get("needs_format")
        if fmt is not None and fmt not in raw:
            raise ValueError(f"{where}: needs_format={fmt!r}; allowed: a metric of this task ({', '.join(raw)})")
        higher, test, per_sample = entry.get("higher"), entry.get("test"), entry.get("per_sample")
        if not isinstance(higher, bool):
            raise ValueError(f"{where}: higher={higher!r}; allowed: true or false")
        if test not in METRIC_TESTS:
            raise ValueError(f"{where}: test={test!r}; allowed: {', '.join(METRIC_TESTS)}")
        if test == "none" and per_sample is not None:
            raise ValueError(f"{where}: per_sample={per_sample!r} with test none; allowed: null")
        if test != "none" and not (isinstance(per_sample, str) and per_sample):
            raise ValueError(f"{where}: per_sample={per_sample!r}; allowed: the score key holding the "
                             f"per-sample value (required by test {test})")
        out[name] = MetricSpec(name, higher, test, per_sample, fmt)
    return out


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
    spec["_metrics"] = parse_metrics(spec["metrics"], path)
    sets = spec.get("sets") or {}
    for sub, rule in (spec.get("subsets") or {}).items():
        if (rule or {}).get("set") is not None and rule["set"] not in sets:
            raise ValueError(f"{path}: subset '{sub}' names set {rule['set']!r}; allowed: {', '.join(sorted(sets))}")
    authors = spec.get("authors_prompts")
    if authors is not None and not (isinstance(authors, dict) and isinstance(authors.get("file"), str)
                                    and isinstance(authors.get("rows"), int)):
        raise ValueError(f"{path}: authors_prompts must be {{file: <path>, rows: <int>, sha256: {{...}}}}")
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
        self.data_set: str | None = None   # the data set of the subset last loaded (None: the task's main set)
        self._apply(overrides)
        self._check_prompts_option()

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

    def _check_prompts_option(self) -> None:
        if "prompts" in self.options and self.options["prompts"] not in PROMPT_SOURCES:
            raise ValueError(f"task {self.name}: prompts={self.options['prompts']!r}; allowed: "
                             f"{', '.join(PROMPT_SOURCES)}")

    @property
    def prompts(self) -> str:
        """Whose user turns the samples carry: 'ours' (task.yaml's template) or 'authors' (byte for byte from the
        MARS authors' file, ``authors_prompts`` in task.yaml). The prompt text changes the outputs, so a run with
        any value but 'ours' must carry it in its run tag (see ``output_options``)."""
        return self.options.get("prompts", "ours")

    def output_options(self) -> dict[str, str]:
        """Task options that change the prompts, hence the outputs, and so must be part of the run tag:
        ``{'prompts': 'authors'}`` when the authors' prompts are used, else {} (our prompts, named by the version)."""
        return {} if self.prompts == "ours" else {"prompts": self.prompts}

    @property
    def metrics(self) -> dict[str, MetricSpec]:
        """Every metric ``aggregate`` can return (besides counts and signatures), registered once in task.yaml."""
        return dict(self.spec["_metrics"])

    @property
    def metric_directions(self) -> dict[str, str]:
        """'higher' (or 'lower') per registered metric (derived from ``metrics``)."""
        return {name: m.direction for name, m in self.spec["_metrics"].items()}

    def format_prompt(self, **fields: Any) -> str:
        return self.prompt_template.format(**fields)

    # ---- data ----------------------------------------------------------------------------------------
    @property
    def data(self) -> dict:
        """The ``data`` block of the selected set: task.yaml's ``data``, or ``sets.<name>`` for a subset that
        names another set (``set: <name>``)."""
        if self.data_set is None:
            return dict(self.spec.get("data") or {})
        return dict(self.spec["sets"][self.data_set])

    @property
    def data_files(self) -> list[str]:
        """Data files of the selected set (plus the authors' prompt file with ``prompts: authors``), relative to
        the data dir (or to the task folder for built-in sets)."""
        files = list(self.data.get("files") or [])
        authors = (self.spec.get("authors_prompts") or {}).get("file")
        if self.prompts == "authors" and authors and authors not in files:
            files.append(authors)
        return files

    def rows_expected(self, rel: str) -> int:
        rows = self.data.get("rows")
        if rel == (self.spec.get("authors_prompts") or {}).get("file") and rel not in (self.data.get("files") or []):
            return int(self.spec["authors_prompts"]["rows"])
        return int(rows[rel]) if isinstance(rows, dict) else int(rows)

    def data_path(self, data_dir, rel: str) -> Path:
        """Where ``rel`` is read from (or would be, once fetched into the cache): see ``data.locate``."""
        if self.data.get("builtin"):
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
        want = {**((self.spec.get("authors_prompts") or {}).get("sha256") or {}), **(self.data.get("sha256") or {})}
        for rel, got in self.data_sha256(data_dir).items():
            if rel in want and got != "absent" and got != want[rel]:
                raise D.DataError(self.data_path(data_dir, rel), f"sha256 {got}; allowed: {want[rel]} (the recorded "
                                                                 "copy, byte for byte)")

    def local_file(self, data_dir, rel: str) -> Path:
        """The file to read: a local copy, else the public copy fetched into the cache with ``self.download``
        (sha256 and rows verified). Never None; an unreachable source is a one-line DataError."""
        if self.data.get("builtin"):
            return self.data_path(data_dir, rel)
        return D.locate(rel, data_dir, download=self.download)

    def display_path(self, data_dir, rel: str) -> str:
        return str(self.data_path(data_dir, rel))

    def jsonl_rows(self, data_dir, rel: str, fields: dict, expected: int) -> list[dict]:
        """Rows of a JSONL data file (local, or the verified public copy in the cache), fields and count checked."""
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
        self.data_set = rule.get("set")
        rows = self.read_rows(data_dir)
        samples = [self.make_sample(i, row) for i, row in enumerate(rows)]
        if self.prompts == "authors":
            samples = self._with_authors_turns(data_dir, samples)
        self._check_sha256(data_dir)
        if "first" in rule:
            samples = samples[: int(rule["first"])]
        for key, value in (rule.get("where") or {}).items():
            samples = [s for s in samples if s.meta.get(key) == value]
        return samples if limit is None else samples[:limit]

    def _with_authors_turns(self, data_dir, samples: list[Sample]) -> list[Sample]:
        """The samples the authors' file covers, each with the authors' user turns byte for byte, matched by position
        (their file in question_id order); each of our question texts (``meta['questions']``) must be inside the
        authors' turn at the same position, else a one-line DataError."""
        block = self.spec.get("authors_prompts") or {}
        if not block:
            raise ValueError(f"task {self.name}: prompts=authors; allowed: ours (no authors' prompt file)")
        rel = block["file"]
        path = self.local_file(data_dir, rel)
        rows = D.read_jsonl(path, {"question_id": "int", "turns": "list"})
        D.check_count(rows, int(block["rows"]), path)
        rows = sorted(rows, key=lambda r: r["question_id"])
        if len(rows) > len(samples):
            raise D.DataError(path, f"expected at most {len(samples)} rows (one per sample), found {len(rows)}")
        out = []
        for sample, row in zip(samples, rows):
            ours, theirs = list(sample.meta.get("questions") or []), row["turns"]
            if len(ours) != len(theirs) or not all(isinstance(t, str) and q in t for q, t in zip(ours, theirs)):
                raise D.DataError(path, f"question_id {row['question_id']}: its turns do not contain the text of "
                                        f"our sample {sample.id} ({D.one_line(ours[:1], 80)}); allowed: the same "
                                        "questions in the same order")
            out.append(Sample(sample.id, list(theirs), sample.reference,
                              {**sample.meta, "authors_question_id": row["question_id"]}))
        return out

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
