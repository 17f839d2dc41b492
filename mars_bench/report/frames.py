"""Results as data: ``load_frames(roots) -> Frames``, the one reader of the report, the notebook and W&B.

    frames = load_frames(["results", "other_worker/results"])
    frames.runs      one row per run: its spec and every statistic of its summary (``columns.py`` lists
                     them), and run (its key: model dir/task dir/the spec's directory name), model_dir,
                     task_dir, spec (the RunSpec), group (model dir/task dir/its ar baseline's directory name:
                     the runs compared with each other), baseline and reference (the keys of its ar run and of its lossless
                     reference, matched by spec), sd_tag, metrics (the task's, in declared order), title,
                     dirs, problems (unreadable lines), notes (what was merged or restated), phase (a study's),
                     commit (the manifest's; '+dirty' kept), n_budget, n_budget_any, speedup_no_budget [lo, hi],
                     n_no_budget,
                     n_budget_dropped (runaway samples and the speedup without them: ``_budget_columns``),
                     speedup_vs_sd [lo, hi], n_vs_sd (a lossy run's speed over its lossless reference, paired:
                     ``_sd_speed_columns``), contention, n_contended, contended, machine_kind (what the machine
                     did while the run's samples were timed, and which machine it was: ``_contention_columns``)
    frames.samples   one row per sample and run (``columns.sample_row``), with run (the key) and the
                     output's fidelity to ar's (identical_to_ar, first_divergence, chrf_to_ar)

Runs come sorted: by model dir, task dir and settings, then ar, the lossless methods, the lossy rules, each by
method, k, flags and sweep value. Statistics are summary.json's (``mars_bench.store.summary``); a missing or stale
summary is restated from the samples by the writer's functions (``restate.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import pandas as pd

from mars_bench.decode.rules import RULES
from mars_bench.report.columns import run_row, sample_row, val
from mars_bench.store.read import RunFiles, find_runs
from mars_bench.store import metrics as M
from mars_bench.store.provenance import machine_label
from mars_bench.store import records as R
from mars_bench import stats as S
from mars_bench.store import summary as W
from mars_bench.report.restate import current_summary, stats_settings

DEFAULT_THETA = RULES["mars"].knob_map["theta"].default   # the paper's default, registered once
INTEGERS = ("k", "batch_size", "max_new_tokens", "seed", "task_version", "n", "new_tokens", "steps", "idx_authors",
            "n_proposed", "n_accepted", "n_exact", "n_relaxed", "n_common", "n_compared", "quality_n", "n_budget", "n_budget_any",
            "n_no_budget", "n_budget_dropped", "n_vs_sd", "n_contended", "n_vs_native")
KEYS = ("run", "model_dir", "task_dir", "model", "task", "task_version", "tag", "group", "spec", "method", "scheme",
        "rule", "k", "theta", "sweep_knob", "sweep_value", "temperature", "top_p", "max_new_tokens", "seed", "flags",
        "family", "label", "settings_label", "title", "relaxed", "lossless", "n", "truncated", "n_compared",
        "acceptance_per_depth", "metrics", "sd_tag", "problems", "notes", "phase", "commit", "n_budget",
        "speedup_no_budget", "n_no_budget", "n_budget_dropped", "contention", "n_contended", "contended",
        "machine_kind")   # columns even without runs


@dataclass
class Frames:
    runs: pd.DataFrame
    samples: pd.DataFrame
    skipped: list[str] = field(default_factory=list)   # directories not read as runs (unreadable run.json)

    @property
    def problems(self) -> list[str]:
        """Every problem found while reading (skipped directories, unreadable lines, differing copies)."""
        return self.skipped + [p for ps in self.runs["problems"] for p in ps]

    def samples_of(self, run) -> pd.DataFrame:
        """The sample rows of one run (a runs row or its key)."""
        key = run if isinstance(run, str) else run["run"]
        return self.samples[self.samples["run"] == key]


def load_frames(roots: str | Path | Iterable[str | Path]) -> Frames:
    """Every run under one or more results roots (see the module doc)."""
    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    skipped: list[str] = []
    found = find_runs(roots, skipped)
    rows, samples = [], []
    for run in found:
        ar = _match(found, run, run.spec.baseline()) if run.spec.scheme != "ar" else None
        ref = _match(found, run, run.spec.lossless_reference())
        native = _match(found, run, run.spec.baseline(native=True)) if run.spec.engine != "native" else None
        s = current_summary(run, ar, ref)
        rows.append({**_row(run, s, ar, ref), **_budget_columns(run, s, ar), **_sd_speed_columns(run, s, ref),
                     **_contention_columns(run), **_sd_speed_columns(run, s, native, "native")})
        per = ((s.get("fidelity") or {}).get("per_sample")) or {}
        samples += [{"run": run.key, **sample_row(rec), **_fidelity(per.get(rec["id"]))} for rec in run.records]
    _baseline_formats(rows)
    rows.sort(key=_order)
    return Frames(_typed(pd.DataFrame(rows).reindex(columns=_columns(rows))),
                  pd.DataFrame(samples, columns=None if samples else ["run", "id"]), skipped)


def _baseline_formats(rows: list[dict]) -> None:
    """Each run's row gets its ar baseline's format rates (``baseline_quality/<rate>``, the rates the task's metrics
    name as ``needs_format``), so that ``headline`` picks one metric for a method and its ar: GSM8K's strict accuracy
    is skipped for both when ar never wrote '#### <answer>', even if the method did once."""
    by_key = {r["run"]: r for r in rows}
    for r in rows:
        base = by_key.get(r.get("baseline"))
        for entry in _registration(str(r.get("task") or "")).values():
            fmt = entry.get("needs_format") if isinstance(entry, dict) else None
            if fmt and base is not None:
                r[f"baseline_quality/{fmt}"] = base.get(f"quality/{fmt}")


def _match(found: list[RunFiles], run: RunFiles, spec) -> RunFiles | None:
    """The run of the same model dir and task dir whose spec equals ``spec``."""
    if spec is None:
        return None
    return next((r for r in found if (r.model_dir, r.task_dir) == (run.model_dir, run.task_dir) and r.spec == spec),
                None)


def _row(run: RunFiles, s: dict, ar: RunFiles | None, ref: RunFiles | None) -> dict:
    ref = ref if ref is not None and ref.records else None
    row = {"run": run.key, "model_dir": run.model_dir, "task_dir": run.task_dir, "model": run.model, "task": run.task,
           "task_version": run.task_version}
    row.update({k: v for k, v in run_row(run.spec, s).items() if k not in row})
    row.update(spec=run.spec, group=f"{run.model_dir}/{run.task_dir}/{run.spec.baseline().dir_name}",
               baseline=ar.key if ar is not None else None, reference=ref.key if ref is not None else None,
               sd_tag=ref.spec.label if ref is not None else None, metrics=declared_metrics(run.task, run.directions),
               title=_title(run), dirs=[str(d) for d in run.dirs], problems=list(run.problems), notes=list(run.notes),
               phase=_phase(run.records))
    return row


def record_commits(records: list) -> str | None:
    """The commits a run's records were decoded at, sorted and comma-separated (a run resumed at other code names
    each); None when none names one."""
    found = sorted({r.get("commit") for r in records if r.get("commit")})
    return ", ".join(found) or None


def _budget_columns(run: RunFiles, s: dict, ar: RunFiles | None) -> dict:
    """Provenance and runaway samples: commit (the commits its records name, comma-separated, else the summary
    manifest's, for records written before they named one; '+dirty' when the tree had uncommitted changes),
    n_budget (samples whose last turn stopped at max_new_tokens, the count behind ``truncated``), n_budget_any
    (samples with the budget hit in any turn: a multi-turn sample cut in its first turn counts), and
    the speedup over ar without the speed pairs where either sample hit the budget in any turn
    (``summary.budget_free_speedup``): speedup_no_budget [lo, hi], n_no_budget, n_budget_dropped."""
    out = {"commit": record_commits(run.records) or ((s.get("manifest") or {}).get("git_commit")) or None,
           "n_budget": sum(W.hit_budget_last(rec) for rec in run.records) if run.records else None,
           "n_budget_any": sum(W.hit_budget(rec) for rec in run.records) if run.records else None}
    if run.spec.scheme == "ar" and run.records:
        kept = sum(not W.hit_budget(r) for r in run.records)   # ar's pairs with itself: a hit drops the pair
        out.update(speedup_no_budget=1.0, n_no_budget=kept, n_budget_dropped=len(run.records) - kept)
    elif ar is not None and ar.records and run.records:
        est = W.budget_free_speedup(run.records, ar.records, stats_settings(s.get("stats")))
        out.update(speedup_no_budget=est["value"], speedup_no_budget_lo=est["lo"], speedup_no_budget_hi=est["hi"],
                   n_no_budget=est["n"], n_budget_dropped=est["n_dropped"])
    return out


def _sd_speed_columns(run: RunFiles, s: dict, ref: RunFiles | None, name: str = "sd") -> dict:
    """A lossy run's speed over its lossless reference (sd for mars: the same drafting, exact verification), paired
    on the samples both decoded on one machine (``metrics.speed_pairs``): speedup_vs_sd [lo, hi] (``stats.speedup_ci``,
    the reference in ar's place) and n_vs_sd. The paper's claim that MARS is faster than sd is read from it, not
    from two speedups over ar whose intervals overlap. ``name`` native: another engine's run (llama.cpp's) over the
    native engine's ar of the same settings (``RunSpec.baseline(native=True)``): speedup_vs_native, n_vs_native."""
    if ref is None or not ref.records or not run.records:
        return {}
    pairs = M.speed_pairs(R.as_records(run.records), R.as_records(ref.records))
    if not pairs:
        return {}
    col = lambda i, k: [getattr(p[i], k) for p in pairs]  # noqa: E731
    est = S.speedup_ci(col(0, "new_tokens"), col(0, "wall_s"), col(1, "new_tokens"), col(1, "wall_s"),
                       stats_settings(s.get("stats")))
    return {f"speedup_vs_{name}": est["value"], f"speedup_vs_{name}_lo": est["lo"], f"speedup_vs_{name}_hi": est["hi"],
            f"n_vs_{name}": est["n"]}


def _contention_columns(run: RunFiles) -> dict:
    """Whether the run's records say what the machine did while they were timed (contention: recorded | not
    recorded | partly recorded), how many were timed under contention (n_contended; None where not recorded) and
    which (contended: their ids, comma-separated), all left out of every speedup (``metrics.speed_pairs``); and the
    machine kind(s) they were decoded on (machine_kind: ``machine_kind``, '; '-separated)."""
    recs = R.as_records(run.records)
    seen = M.contention_recorded(recs) if recs else False
    flagged = M.contended(recs)
    return {"contention": {True: "recorded", False: "not recorded", None: "partly recorded"}[seen],
            "n_contended": len(flagged) if seen is not False else None, "contended": ", ".join(flagged) or None,
            "machine_kind": "; ".join(sorted({machine_kind(r.machine) for r in recs})) or None}


def machine_kind(m: dict | None) -> str:
    """A record's machine as a kind speeds compare within: CPU name (with family and model where recorded),
    instruction sets, threads; a bare name without family and model is marked (its generation is unknown: "AMD
    EPYC" covers CPUs ~2.5x apart per token)."""
    label = machine_label(m)
    bare = bool(m) and not m.get("gpu") and "(family " not in str(m.get("cpu") or "")
    return label + (" [generation not recorded]" if bare else "")


def _phase(records: list) -> str | None:
    """The study phase that wrote a run's records (quality | timed; mixed if several; None outside studies)."""
    phases = {r.get("phase") for r in records} - {None}
    return phases.pop() if len(phases) == 1 else ("mixed" if phases else None)


def _fidelity(per: dict | None) -> dict:
    per = per or {}
    return {"identical_to_ar": per.get("identical"), "first_divergence": per.get("first_divergence"),
            "chrf_to_ar": per.get("chrf_to_ar")}


def _title(run: RunFiles) -> str:
    """Model pair and task for figure titles, e.g. 'tiny (fp32, cpu) | prompts v1': names from the run's files,
    dtype and device from its run.json ('?' where results written before a field existed lack it)."""
    ident = run.spec.model or {}
    extra = [str(ident[k]) for k in ("dtype", "device") if ident.get(k)]
    model = (run.model or "?") + (f" ({', '.join(extra)})" if extra else "")
    version = f" v{run.task_version}" if run.task_version is not None else " v?"
    return f"{model} | {run.task or '?'}{version}"


@lru_cache(maxsize=None)
def _declared(task: str) -> tuple[str, ...]:
    return tuple(_registration(task))


@lru_cache(maxsize=None)
def _registration(task: str) -> dict:
    """The task's metrics as its task.yaml declares them (name -> entry), in order; {} for a task unknown here
    (results from elsewhere: alphabetical order then)."""
    from mars_bench.tasks.base import load_spec

    try:
        return dict(load_spec(task)["metrics"] or {})
    except Exception:
        return {}


def declared_metrics(task: str, directions: dict) -> list[str]:
    """The task's metrics in the order its task.yaml declares them (summary.json sorts its keys)."""
    order = [m for m in _declared(task) if m in directions]
    return order + sorted(m for m in directions if m not in order)


def _order(row: dict) -> tuple:
    role = 0 if row["method"] == "ar" else (2 if row["relaxed"] else 1)
    return (row["model_dir"], row["task_dir"], row["temperature"], row["top_p"], row["max_new_tokens"], row["seed"],
            row["group"], role, row["method"], row["k"] or 0, row["flags"],
            -1.0 if row["sweep_value"] is None else row["sweep_value"])


def _columns(rows: list[dict]) -> list[str]:
    """Every column of ``rows`` in order of appearance, and KEYS even without runs."""
    return list(dict.fromkeys([k for row in rows for k in row] + list(KEYS)))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Counts as nullable integers (k=2, not 2.0)."""
    for col in df.columns:
        if col in INTEGERS or (col.startswith("vs_") and col.endswith("/n")):
            try:
                df[col] = df[col].astype("Int64")
            except (TypeError, ValueError):
                pass
    return df.reset_index(drop=True)


# ---- selections shared by the tables, the console and the figures ---------------------------------------
def groups(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Runs by settings group (those compared with each other), in the frame's order."""
    return {key: g for key, g in runs.groupby("group", sort=False)}


def at_theta(runs: pd.DataFrame, theta: float) -> pd.DataFrame:
    """ar, the lossless methods and each lossy family at ``theta`` (every value where that one is missing)."""
    has = set(runs.loc[runs["relaxed"] & (runs["theta"] == theta), "family"])
    hide = runs["relaxed"] & runs["family"].isin(has) & (runs["theta"] != theta)
    return runs[~hide]


def study_pairs(runs: pd.DataFrame) -> list[tuple[pd.Series, pd.Series | None]]:
    """(timed run, quality run) for every run of a study's timed phase, in the frame's order. The quality run is
    the timed run's twin of the quality phase (the same spec at another batch size), or, for a greedy lossless
    method (only timed: its tokens are ar's), ar's quality run; None when absent."""
    quality = [r for _, r in runs.iterrows() if r["phase"] == "quality"]
    out = []
    for _, t in runs[runs["phase"] == "timed"].iterrows():
        spec = t["spec"]
        greedy_lossless = spec.lossless and spec.temperature == 0
        want = spec.baseline() if greedy_lossless else spec
        twin = next((q for q in quality if (q["model_dir"], q["task_dir"]) == (t["model_dir"], t["task_dir"])
                     and replace(q["spec"], batch_size=1) == want), None)
        out.append((t, twin))
    return out


def is_twin(timed, quality) -> bool:
    """Whether a study pair's quality run decoded the timed run's own method (not ar's, standing in for it)."""
    return quality is not None and replace(quality["spec"], batch_size=1) == timed["spec"]


SPEED_COLUMNS = tuple(f"{k}{x}" for k in ("tokens_per_s", "speedup", "speedup_authors", "speedup_no_budget",
                                          "speedup_vs_sd") for x in ("", "_lo", "_hi")) + (
    "n_no_budget", "n_budget_dropped", "n_vs_sd", "settings_label", "contention", "n_contended", "contended",
    "machine_kind")


def study_groups(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per group of a study's timed runs, one row per method joined as ``study_table`` joins them: the quality
    run's row with the timed run's speed columns (SPEED_COLUMNS, ``n_timed``); a method only timed (greedy
    lossless) keeps its timed row. The theta figure of such a group draws tau and quality from every sample
    and speedup from the timed ones."""
    out: dict[str, list] = {}
    for timed, q in study_pairs(runs):
        own = is_twin(timed, q)
        row = q.copy() if own else timed.copy()
        for k in SPEED_COLUMNS:
            row[k] = timed.get(k)
        row["n_timed"] = timed["n"]
        out.setdefault(timed["group"], []).append(row)
    return {g: pd.DataFrame(rs).reset_index(drop=True) for g, rs in out.items()}


FORMAT_MIN = 0.5   # a needs_format metric leads only where at least this share of answers wrote the format


def headline(row) -> str | None:
    """The first metric the task declares that this run reports (e.g. accuracy_strict, pass@1, bleu), skipping one
    whose ``needs_format`` rate is below ``FORMAT_MIN`` in this run or in its ar baseline (e.g. GSM8K's strict
    accuracy when the model mostly or never wrote '#### <answer>', as the embedded pair greedy (rate 0) and at T = 1
    (3-7%): an answer without the format scores 0 whatever its number, so the metric measures the format; a method
    and its ar get one metric)."""
    reg = _registration(str(val(row, "task") or ""))
    for m in val(row, "metrics", []):
        fmt = (reg.get(m) or {}).get("needs_format") if isinstance(reg.get(m), dict) else None
        rates = (val(row, f"quality/{fmt}"), val(row, f"baseline_quality/{fmt}")) if fmt else ()
        unformatted = any(r is not None and r < FORMAT_MIN for r in rates)
        if val(row, f"quality/{m}") is not None and not unformatted:
            return m
    return None


def reported(runs: pd.DataFrame) -> list[str]:
    """The metrics any of ``runs`` reports, in declared order."""
    out: list[str] = []
    for _, r in runs.iterrows():
        out += [m for m in val(r, "metrics", []) if val(r, f"quality/{m}") is not None and m not in out]
    return out


def rows(runs: pd.DataFrame) -> list[pd.Series]:
    """The runs as a list of rows."""
    return [r for _, r in runs.iterrows()]
