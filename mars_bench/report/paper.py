"""The paper's speed table layout, regenerated from results: the authors' columns (MT-Bench, HumanEval, GSM8K,
Alpaca, CNN/DM, mean), speedup and tau per method, our formulas and theirs in rows of their own.

    paper_table(runs, theta)   one row per (model pair, decoding settings, method, formula); per task its speedup
                               [CI] and tau from the batch-size-1 runs (a study's timed phase for speed, its
                               quality phase for tau: ``frames.study_groups``; plain batch-size-1 runs as they
                               are); a task without such a run is '–' (missing, never estimated), and the mean is
                               over the five tasks only when every one is there ('mean of present' beside it). The
                               machine kind each task was timed on is named (``frames.machine_kind``); a speedup
                               mean over tasks timed on different kinds is refused ('–', flagged ⚠).
    paper_tables(runs, theta)  the same numbers split by formula, ours (Table 8a) and the authors' (Table 8b), as
                               a person reads them: the tasks as columns, per method a row for the speedup [CI] and
                               a row for tau (the paper's Speedup / tau pair per task, one above the other).
"""
from __future__ import annotations

import pandas as pd

from mars_bench.store import metrics as M
from mars_bench.report.columns import val
from mars_bench.report.frames import DEFAULT_THETA, at_theta, study_groups
from mars_bench.report.writer import Table

PAPER_TASKS = (("mt_bench", "MT-Bench"), ("humaneval", "HumanEval"), ("gsm8k", "GSM8K"), ("alpaca", "Alpaca"),
               ("cnn_dm", "CNN/DM"))
FORMULAS = (("ours", "speedup", "tau"), ("authors'", "speedup_authors", "tau_authors"))


def speed_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs a speed table may show: a study's methods joined (timed speed, quality-phase tau), and plain runs
    at batch size 1 (outside studies: their speed is a latency)."""
    joined = list(study_groups(runs).values())
    plain = runs[runs["phase"].isna() & (runs["batch_size"].fillna(1) == 1)] if len(runs) else runs
    parts = [p for p in joined + [plain] if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else runs.iloc[:0]


def paper_table(runs: pd.DataFrame, theta: float = DEFAULT_THETA) -> Table:
    """The authors' speed table layout (module doc)."""
    names = [t for t, _ in PAPER_TASKS]
    cols = [("model", "model pair", ""), ("settings", "settings", ""), ("label", "method", ""),
            ("formula", "formula", "")]
    for task, head in PAPER_TASKS:
        cols += [(f"{task}/speedup", f"{head} speedup (×)", ".2f[]"), (f"{task}/tau", f"{head} τ", ".2f")]
    cols += [("mean/speedup", "mean speedup (×)", ".2f"), ("mean/tau", "mean τ", ".2f"),
             ("present", "tasks present", ""), ("mean_present/speedup", "mean of present: speedup (×)", ".2f"),
             ("mean_present/tau", "mean of present: τ", ".2f"), ("machine", "timed on", "")]
    t = Table("Table 8", "The paper's speed table layout (the authors' columns: MT-Bench, HumanEval, GSM8K, Alpaca, "
              "CNN/DM, mean), regenerated from the results read: speedup over ar [95% CI] and τ per task and method "
              f"(mars at θ={theta:g}), batch size 1 (a study's timed phase; τ from its quality phase, except a greedy "
              "lossless method's, e.g. sd's: not decoded for quality, its τ is over the timed samples). Rows 'ours': "
              f"{M.SPEEDUP_DEFINITION}; {M.TAU_DEFINITION}. Rows \"authors'\": {M.SPEEDUP_AUTHORS_DEFINITION}; "
              f"{M.TAU_AUTHORS_DEFINITION}. '–' = the task was not run (missing, not estimated); the mean is over "
              "the five tasks only when all five are present, 'mean of present' over those there. 'timed on': the "
              "machine kind of each task's timed samples; a speedup mean over tasks timed on different kinds is "
              "refused (⚠, '–'): per-token costs differ between kinds.", cols)
    chosen = speed_rows(runs)
    chosen = chosen[chosen["task"].isin(names)] if len(chosen) else chosen
    if len(chosen):
        chosen = pd.concat([at_theta(g, theta) for _, g in chosen.groupby("group", sort=False)])
    by_method: dict[tuple, dict] = {}
    for _, r in chosen.iterrows():
        key = (r["model_dir"], r["temperature"], r["top_p"], r["max_new_tokens"], r["seed"], r["label"])
        by_method.setdefault(key, {"model": r["model_dir"], "settings": f"T={r['temperature']:g} p={r['top_p']:g} "
                                   f"n≤{r['max_new_tokens']} seed={r['seed']}", "label": r["label"],
                                   "tasks": {}})["tasks"][r["task"]] = r
    out = []
    for m in by_method.values():
        for formula, sp, tau in FORMULAS:
            row = {"model": m["model"], "settings": m["settings"], "label": m["label"], "formula": formula}
            for task, r in m["tasks"].items():
                s = 1.0 if r["method"] == "ar" else val(r, sp)
                row.update({f"{task}/speedup": s, f"{task}/tau": val(r, tau)})
                if r["method"] != "ar":
                    row.update({f"{task}/speedup_lo": val(r, sp + "_lo"), f"{task}/speedup_hi": val(r, sp + "_hi")})
            kinds = {x: val(r, "machine_kind") or "unrecorded" for x, r in m["tasks"].items()}
            for what in ("speedup", "tau"):
                have = [row[f"{x}/{what}"] for x in names if row.get(f"{x}/{what}") is not None]
                mixed = what == "speedup" and len(set(kinds.values())) > 1   # no mean across machine kinds
                row[f"mean_present/{what}"] = sum(have) / len(have) if have and not mixed else None
                row[f"mean/{what}"] = row[f"mean_present/{what}"] if len(have) == len(names) else None
            row["machine"] = timed_on(kinds)
            row["present"] = f"{len(m['tasks'])} of {len(names)}: " + ", ".join(
                h for x, h in PAPER_TASKS if x in m["tasks"])
            out.append(row)
    t.data = pd.DataFrame(out)
    return t


def paper_tables(runs: pd.DataFrame, theta: float = DEFAULT_THETA) -> tuple[Table, Table]:
    """Table 8a (ours) and 8b (the authors' formulas): ``paper_table``'s rows of one formula, a row per method and
    quantity (speedup [CI], tau), the tasks as columns (module doc)."""
    full = paper_table(runs, theta)
    out = []
    for (formula, _, _), name in zip(FORMULAS, ("Table 8a", "Table 8b")):
        defs = (f"{M.SPEEDUP_DEFINITION}; {M.TAU_DEFINITION}" if formula == "ours"
                else f"{M.SPEEDUP_AUTHORS_DEFINITION}; {M.TAU_AUTHORS_DEFINITION}")
        cols = [("model", "model pair", ""), ("settings", "settings", ""), ("label", "method", ""),
                ("quantity", "", "")] + [(task, head, ".2f[]") for task, head in PAPER_TASKS] + [
                ("mean", "mean", ".2f"), ("mean_present", "mean of present", ".2f"), ("present", "tasks present", ""),
                ("machine", "timed on", "")]
        beside = " (beside ours, never instead)" if formula != "ours" else ""
        t = Table(name, f"The paper's speed table layout, {'our' if formula == 'ours' else formula} formulas{beside}: "
                  f"speedup over ar [95% CI] and τ per task (the authors' columns) and method (mars at θ={theta:g}), "
                  "batch size 1 (a study's timed phase; τ from its quality phase, except a greedy lossless method's, which "
                  "is not decoded there: its τ is over its timed samples). "
                  f"{defs}. '–' = the task was not run (missing, not estimated); the mean is over the five tasks "
                  "only when all five are present, 'mean of present' over those there; 'timed on': the machine kind of "
                  "each task's timed samples, and no speedup mean over different kinds.", cols)
        t.compact = [k for k, _, _ in cols]
        t.hoist = ("present", "machine")
        t.same = [("mean_present", "mean")]
        rows = []
        for r in full.rows:
            if r["formula"] != formula:
                continue
            for what, label in (("speedup", "speedup (×)"), ("tau", "τ")):
                row = {"model": r["model"], "settings": r["settings"], "label": r["label"], "quantity": label,
                       "present": r["present"], "machine": r.get("machine"), "mean": r.get(f"mean/{what}"),
                       "mean_present": r.get(f"mean_present/{what}")}
                for task, _ in PAPER_TASKS:
                    row.update({task + x: r.get(f"{task}/{what}{x}") for x in ("", "_lo", "_hi")})
                rows.append(row)
        t.data = pd.DataFrame(rows)
        out.append(t)
    return out[0], out[1]


def timed_on(kinds: dict) -> str:
    """The machine kind(s) a row's tasks were timed on (task -> ``frames.machine_kind``): one kind once; several
    flagged ⚠ with each task's, the speedup mean refused."""
    if len(set(kinds.values())) <= 1:
        return next(iter(kinds.values()), "")
    heads = dict(PAPER_TASKS)
    by_kind: dict[str, list] = {}
    for task, kind in kinds.items():
        by_kind.setdefault(kind, []).append(heads.get(task, task))
    return (f"⚠ {len(by_kind)} machine kinds, no speedup mean: "
            + "; ".join(f"{', '.join(ts)}: {k}" for k, ts in by_kind.items()))
