"""Reading results trees into ``Run`` objects: results files only, never models or task data.

Layout (written by ``mars_bench.run``): ``<root>/<model>_<dtype>_<device>/<task>-v<ver>/<run_tag>/``
with ``samples.jsonl`` (one record per finished sample), ``summary.json`` and ``config.yaml``.

* Many roots, or one root written by many workers: directories with the same
  (model dir, task dir, run tag) are one run; their samples are merged by id (first complete record wins).
* ``summary.json`` is used when it covers the samples found; otherwise totals are recomputed from
  ``samples.jsonl`` with ``records.totals`` and the run is marked (``Run.notes``).
* A corrupt or truncated line is reported as 'file:line: why' in ``Run.problems`` and skipped.
* Speedup and fidelity are recomputed from samples (``records.speedup``, ``summary.fidelity_vs_ar``) when
  the summary lacks them or is stale and the matching ``ar-...`` sibling (same T, p, n, seed) exists.
* Intervals and paired tests (``Run.stats``, see ``mars_bench.stats``) and stop-reason shares
  (``Run.stop_reasons``) come from summary.json; where it has none or they are stale (old results, merged
  workers) they are computed from samples with ``summary.run_stats`` and the run says so, each metric tested
  as registered (summary.json's ``metric_specs``, else the task's task.yaml). BLEU / chrF need the task's
  references, which results files do not hold: those stay untested, with a note.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterable

from .. import records as R
from ..decode.rules import RULES
from ..tags import RunTag

DEFAULT_THETA = RULES["mars"].knob_map["theta"].default   # the paper's default, registered once


@dataclass
class Run:
    model_dir: str                  # e.g. tiny_fp32_cpu (model name, dtype, device)
    task_dir: str                   # e.g. gsm8k-v1
    tag: str                        # e.g. mars-k4-th0.9-T0-p1-n32-s0 (mars_bench.tags.RunTag)
    dirs: list[Path]
    rt: RunTag                      # the parsed tag: scheme, rule, its settings, decoding settings
    model: str = ""
    task: str = ""
    task_version: int | None = None
    records: list[dict] = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    quality: dict = field(default_factory=dict)
    metric_directions: dict = field(default_factory=dict)
    speedup: dict | None = None
    fidelity: dict | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: dict | None = None
    stats: dict | None = None           # summary.json "stats": CIs, paired tests vs ar / sd, MDEs
    stop_reasons: dict | None = None    # share of samples per stop reason (max_new_tokens = truncated)
    sd_tag: str | None = None           # the sd run compared with (mars runs whose sd sibling exists)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model_dir, self.task_dir, self.tag)

    # ---- what the tag says (mars_bench.tags; rules from the registry) -----------------------------
    @property
    def method(self) -> str:
        """The run's head name: ar, sd, mars, sd_tree, sd+topk_delta, ..."""
        return self.rt.head

    @property
    def rule(self):
        return RULES[self.rt.rule]

    @property
    def k(self) -> int | None:
        return self.rt.k

    @property
    def temperature(self) -> float:
        return self.rt.temperature

    @property
    def top_p(self) -> float:
        return self.rt.top_p

    @property
    def max_new_tokens(self) -> int:
        return self.rt.max_new_tokens

    @property
    def seed(self) -> int:
        return self.rt.seed

    @property
    def sweep_knob(self) -> str | None:
        """The knob a rules sweep varies for this run's rule (theta for mars)."""
        return self.rule.sweep if self.relaxed else None

    @property
    def sweep_value(self) -> float | None:
        return self.rt.settings.get(self.sweep_knob) if self.sweep_knob else None

    @property
    def theta(self) -> float | None:
        """theta of a rule that has one (mars, mars_prob), else None."""
        return self.rt.settings.get("theta") if self.relaxed else None

    @property
    def flags(self) -> tuple[str, ...]:
        """Every other setting in the tag: tree shape, the rule's other settings, p_min, draft quant."""
        rt = self.rt
        parts = self.rule.tag_parts(rt.settings, rt.temperature, rt.top_p) if self.relaxed else []
        if self.sweep_knob:
            knob = self.rule.knob_map[self.sweep_knob]
            parts = [p for p in parts if p != f"{knob.tag}{self.sweep_value:g}"]
        out = [x for x in (rt.tree, "sample" if rt.sample_children else None) if x] + parts
        out += [f"pmin{rt.p_min:g}"] if rt.p_min else []
        out += [f"q{rt.topk_q}"] if rt.topk_q != "onehot" else []
        return tuple(out + ([f"draft{rt.draft_quant}"] if rt.draft_quant else []))

    @property
    def settings(self) -> tuple:
        """Everything but the method: runs with equal settings are compared with each other."""
        return (self.model_dir, self.task_dir, self.temperature, self.top_p, self.max_new_tokens, self.seed)

    @property
    def ar_tag(self) -> str:
        """The tag of the ar run with the same settings."""
        return self.rt.baseline().format()

    @property
    def lossless_tag(self) -> str | None:
        """The tag of the same drafting with rule exact (a lossy rule's sd reference)."""
        ref = self.rt.lossless_reference()
        return ref.format() if ref else None

    @property
    def relaxed(self) -> bool:
        """A lossy verification rule (mars, topk_delta, ...; the registry's ``lossless`` flag)."""
        return self.rt.scheme != "ar" and not self.rule.lossless

    @property
    def lossless(self) -> bool:
        """A speculative method that is lossless (sd, sd_tree, eagle3 with rule exact; not a tree verified with
        the authors' q, ``topk_q=draft``, which is lossy with any rule)."""
        return self.rt.lossless

    @property
    def family(self) -> tuple:
        """Runs of one family differ only in their rule's sweep knob (a theta sweep is one family)."""
        return (self.rt.scheme, self.rt.rule, self.k, self.flags)

    @property
    def family_label(self) -> str:
        return " ".join([self.method] + ([f"k={self.k}"] if self.k is not None else []) + list(self.flags))

    @property
    def label(self) -> str:
        if self.method == "ar":
            return "ar"
        out = self.method + (f" {'θ' if self.sweep_knob == 'theta' else self.sweep_knob}={self.sweep_value:g}"
                             if self.sweep_knob else "")
        out += f" k={self.k}" if self.k is not None else ""
        return out + "".join(f" {f}" for f in self.flags)

    @property
    def sort_key(self) -> tuple:
        role = 0 if self.method == "ar" else (2 if self.relaxed else 1)
        return (self.settings, role, self.method, self.k or 0, self.flags,
                self.sweep_value if self.sweep_value is not None else -1.0)

    @property
    def n_samples(self) -> int:
        return int(self.totals.get("n_samples") or 0)

    @property
    def settings_label(self) -> str:
        return f"T={self.temperature:g} p={self.top_p:g} n≤{self.max_new_tokens} seed={self.seed}"

    @property
    def title(self) -> str:
        """Model pair and task for figure titles, e.g. 'tiny (fp32, cpu) | prompts v1'."""
        extra = self.model_dir[len(self.model):].strip("_").split("_") if self.model_dir.startswith(self.model) else []
        model = f"{self.model} ({', '.join(extra)})" if extra and extra != [""] else self.model_dir
        return f"{model} | {self.task} v{self.task_version}"


def find_run_dirs(root: Path) -> list[Path]:
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such results directory")
    dirs = {p.parent for name in ("samples.jsonl", "summary.json") for p in root.rglob(name)}
    return sorted(d for d in dirs if RunTag.parse(d.name) is not None)


def load_runs(roots: str | Path | Iterable[str | Path]) -> list[Run]:
    """Every run under one or more results roots, merged by (model dir, task dir, run tag), sorted."""
    if isinstance(roots, (str, Path)):
        roots = [roots]
    by_key: dict[tuple, list[Path]] = {}
    for root in roots:
        for d in find_run_dirs(Path(root)):
            by_key.setdefault((d.parent.parent.name, d.parent.name, d.name), []).append(d)
    runs = [_load_one(key, dirs) for key, dirs in by_key.items()]
    _share_directions(runs)
    index = {r.key: r for r in runs}
    for r in runs:
        if r.method != "ar":
            _compare_with_ar(r, index.get((r.model_dir, r.task_dir, r.ar_tag)))
    for r in runs:
        ar = index.get((r.model_dir, r.task_dir, r.ar_tag)) if r.method != "ar" else None
        _attach_stats(r, ar, _sd_sibling(r, index))
    return sorted(runs, key=lambda r: r.sort_key)


def groups(runs: Iterable[Run]) -> dict[tuple, list[Run]]:
    """Runs by settings (model dir, task dir, T, p, n, seed), each list sorted ar, sd, mars by theta."""
    out: dict[tuple, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.sort_key):
        out.setdefault(r.settings, []).append(r)
    return out


def problems(runs: Iterable[Run]) -> list[str]:
    return [p for r in runs for p in r.problems]


# ---- one run -------------------------------------------------------------------------------------
def _load_one(key: tuple, dirs: list[Path]) -> Run:
    model_dir, task_dir, tag = key
    run = Run(model_dir=model_dir, task_dir=task_dir, tag=tag, dirs=list(dirs), rt=RunTag.parse(tag))
    task, _, ver = task_dir.rpartition("-v")
    run.task, run.task_version = (task, int(ver)) if ver.isdigit() else (task_dir, None)
    records, seen, summaries = [], {}, []
    for d in dirs:
        recs, probs = R.read_samples(d / "samples.jsonl")
        run.problems += probs
        for rec in recs:
            first = seen.get(rec["id"])
            if first is None:
                seen[rec["id"]] = (d, rec)
                records.append(rec)
            elif _outputs(first[1]) != _outputs(rec):
                run.problems.append(f"{d / 'samples.jsonl'}: sample {rec['id']!r} differs from the copy in "
                                    f"{first[0]}; kept the first")
        s = _read_summary(d / "summary.json", run.problems)
        if s is not None:
            summaries.append(s)
    run.records = records
    run.model = next((x["model"] for x in summaries + records if x.get("model")), model_dir)
    has_samples = any((d / "samples.jsonl").exists() for d in dirs)
    s = max(summaries, key=lambda x: x.get("totals", {}).get("n_samples", 0), default=None)
    run.summary = s
    if s is not None:
        run.metric_directions = dict(s.get("metric_directions") or {})
        run.quality = dict(s.get("quality") or {})
        run.problems += [p for p in s.get("problems") or [] if p not in run.problems]
    summary_n = (s or {}).get("totals", {}).get("n_samples")
    if s is not None and (not has_samples or summary_n == len(records)):
        run.totals = dict(s["totals"])
        if records and "tau_authors" not in run.totals:   # a summary written before the authors' tau
            run.totals.update({k: v for k, v in R.totals(records).items() if k in ("idx_authors", "tau_authors")})
        run.speedup, run.fidelity = s.get("speedup"), s.get("fidelity")
        if not has_samples:
            run.notes.append("no samples.jsonl: numbers from summary.json only")
    else:
        run.totals = R.totals(records)
        if s is None:
            run.notes.append("no summary.json: totals from samples.jsonl, no quality metrics")
        else:
            run.notes.append(f"summary.json covers {summary_n} samples, samples.jsonl {len(records)}: "
                             f"totals recomputed; quality is over the {summary_n}")
    if len(dirs) > 1:
        run.notes.append(f"merged from {len(dirs)} directories")
    return run


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


def _share_directions(runs: list[Run]) -> None:
    """A task declares its metric directions once; runs without a summary borrow them."""
    by_task = {}
    for r in runs:
        if r.metric_directions:
            by_task.setdefault(r.task_dir, r.metric_directions)
    for r in runs:
        if not r.metric_directions:
            r.metric_directions = dict(by_task.get(r.task_dir, {}))


def _compare_with_ar(run: Run, ar: Run | None) -> None:
    """Speedup and fidelity against the ar sibling, recomputed when the summary's are missing or stale."""
    if ar is None or not ar.records or not run.records:
        if run.speedup is None:
            run.notes.append(f"no speedup: no ar run {run.ar_tag} with samples beside it")
        return
    ar_ids = {r["id"] for r in ar.records}
    n_common = sum(r["id"] in ar_ids for r in run.records)
    fid_n = ((run.fidelity or {}).get("aggregate") or {}).get("n")
    if run.speedup is not None and run.speedup.get("n_common") == n_common and fid_n == n_common \
            and "speedup_authors" in run.speedup:
        return
    from ..summary import fidelity_vs_ar

    run.speedup = R.speedup(run.records, ar.records)
    run.fidelity = fidelity_vs_ar(run.records, ar.records)
    run.notes.append(f"speedup and fidelity recomputed from samples ({n_common} in common with ar)")


# ---- intervals and tests -----------------------------------------------------------------------------
def _sd_sibling(run: Run, index: dict) -> Run | None:
    """The lossless run a lossy run is compared with: the same drafting and settings with rule exact
    (``RunTag.lossless_reference``: sd for a lossy chain rule, sd_tree for mars_tree, ...)."""
    ref = run.lossless_tag
    x = index.get((run.model_dir, run.task_dir, ref)) if ref else None
    return x if x is not None and x.records else None


def registered_metrics(run: Run) -> dict:
    """The run's metric registration (name -> summary.Paired): summary.json's ``metric_specs``, else the
    task's registration in this checkout (task.yaml), else none (results from a task unknown here)."""
    from ..summary import from_registration
    from ..tasks.base import load_spec

    stored = (run.summary or {}).get("metric_specs")
    if stored is not None:
        return from_registration(stored)
    try:
        return from_registration(load_spec(run.task)["metrics"])
    except ValueError:   # a task this checkout does not know, or a task.yaml it cannot read
        return {}


def _attach_stats(run: Run, ar: Run | None, sd: Run | None) -> None:
    """Run.stats / Run.stop_reasons from summary.json when current, else (parts) from samples."""
    from .. import stats as S
    from ..summary import authors_speedup_ci, quality_tests, run_stats, stop_reasons

    s = run.summary or {}
    stored = s.get("stats")
    known = {f.name for f in fields(S.StatsSettings)}
    settings = S.StatsSettings(**{k: v for k, v in ((stored or {}).get("settings") or {}).items() if k in known})
    run.sd_tag = sd.tag if sd is not None else None
    fresh = stored is not None and (stored.get("tau") or {}).get("n") == run.n_samples
    run.stop_reasons = s.get("stop_reasons") if s.get("stop_reasons") and fresh else (
        stop_reasons(run.records) if run.records else None)
    if not run.records:
        run.stats = stored
        if stored is None:
            run.notes.append("no intervals: summary.json has none and there are no samples")
        return
    reg = registered_metrics(run)
    names = list(run.quality) or list(run.metric_directions) or [   # no summary anywhere: what the scores hold
        m.name for m in reg.values() if not m.corpus and any(m.get(r.get("score") or {}) is not None
                                                             for r in run.records)]
    metrics = {k: reg[k] for k in names if k in reg}
    n_ar = sum(r["id"] in {x["id"] for x in ar.records} for r in run.records) if ar and ar.records else 0
    if not fresh:
        run.stats = run_stats(run.records, ar.records if ar and ar.records else None,
                              sd.records if sd else None, settings, metrics, fidelity=run.fidelity)
        run.notes.append("intervals and tests computed from samples.jsonl by the report"
                         + (" (summary.json has none)" if stored is None else " (summary.json's are stale)"))
        return
    run.stats = dict(stored)
    redone = []
    if "tau_authors" not in stored:   # a summary written before the authors' formulas were stored
        run.stats["tau_authors"] = S.ratio_ci([r["new_tokens"] for r in run.records],
                                              [R.authors_idx(r) for r in run.records], settings)
        redone.append("the authors' tau")
    if ar and ar.records and (stored.get("speedup") or {}).get("n") != n_ar:
        fresh_ar = run_stats(run.records, ar.records, None, settings, metrics, fidelity=run.fidelity)
        run.stats.update({k: fresh_ar[k] for k in ("speedup", "speedup_authors", "quality_vs_ar", "fidelity")})
        redone.append("tests vs ar")
    elif ar and ar.records and "speedup_authors" not in stored:
        run.stats["speedup_authors"] = authors_speedup_ci(run.records, ar.records, settings)
        redone.append("the authors' speedup")
    if sd is not None and stored.get("quality_vs_sd") is None:
        run.stats["quality_vs_sd"] = quality_tests(run.records, sd.records, metrics, settings)
        redone.append("tests vs sd")
    if redone:
        run.notes.append(f"{' and '.join(redone)} computed from samples.jsonl by the report")
