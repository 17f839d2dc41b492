"""Paper tables: each a DataFrame selected from ``Frames.runs``, written with pandas as markdown, CSV and LaTeX.

    main_table(runs)        speedup and tau per task per method (ours and the authors' formulas), the mean
                            over tasks, quality vs ar with its non-inferiority verdict
    theta_table(runs)       quality, tau, acceptance and speedup vs theta (sd as the lossless reference)
    rules_table(runs)       verification rules side by side: speed, quality and fidelity
    fidelity_table(runs)    agreement with ar outputs vs theta
    acceptance_table(runs)  acceptance rate per draft position (depth)
    quality_table(runs)     every paired quality test vs ar and vs sd: delta [CI], p-value, MDE, n
    costs_table(runs)       where a step's time goes at batch size 1: draft ms per drafted token and per step,
                            target ms per verification step (an EAGLE-3 head against a draft model)
    study_table(runs)       a study's two phases joined: quality and tau from batched decoding of every
                            sample, speedup from the timed batch-size-1 subset (each number from one phase;
                            ``study.py``)
    paper_table(runs)       the authors' speed table layout: MT-Bench, HumanEval, GSM8K, Alpaca, CNN/DM, mean
                            (``paper.py``)
    claims_table(runs)      the paper's claims as a study's intervals resolve them (``claims.py``)

Captions cite the definitions of ``mars_bench.store.metrics`` (one source). A cell ``v [lo, hi]`` is the value and
its 95% CI (the frame's ``<column>_lo`` / ``_hi``), a bare value has none (the quality table's note says why).
CSV files carry the raw numbers, intervals as ``<column>_lo`` / ``_hi``.
"""
from __future__ import annotations

import pandas as pd

from mars_bench.store import metrics as M
from mars_bench import stats as S
from mars_bench.report.claims import claims_table
from mars_bench.report.columns import paired_test, val
from mars_bench.report.definitions import (ACCEPTANCE_DEFINITION, AUTHORS_DEFINITIONS, BASE, CI_DEFINITION, NI_DEFINITION,
                          NO_BUDGET_DEFINITION, SPEED_DEFS, TRUNCATION_LIMIT, metric_label, paired_cells)
from mars_bench.report.frames import DEFAULT_THETA, at_theta, groups, headline, reported, rows
from mars_bench.report.paper import paper_table, paper_tables  # noqa: F401 (paper_table: the API)
from mars_bench.report.study import study_table
from mars_bench.report.compact import note_marks
from mars_bench.report.writer import ARROW, Table, ci, cells, select

SPEED = {"n": "n", "acceptance_rate": "acceptance", **ci("tokens_per_s"), **ci("tau"), **ci("tau_authors"),
         **ci("speedup"), **ci("speedup_authors"), **ci("speedup_no_budget")}
MEAN_KEYS = ("speedup", "tau", "speedup_authors", "tau_authors")   # averaged over tasks in the main table


def _notes(table: Table, run) -> str:
    """Footnote markers for a run's problems (unreadable lines), notes (restated numbers), truncation."""
    tag, problems, cut = run["tag"], val(run, "problems", []), val(run, "truncated")
    items = [f"{len(problems)} problem(s) in {tag}: " + "; ".join(problems)] if problems else []
    items += [f"{tag}: {n}" for n in val(run, "notes", []) if not n.startswith("no speedup")]
    if cut is not None and cut > TRUNCATION_LIMIT:
        n, k = val(run, "n"), val(run, "n_budget")
        count = f"{k} of {n} samples ({cut:.1%})" if k is not None and n else f"{cut:.1%} of samples"
        items.append(f"{tag}: {count} stopped at max_new_tokens (> {TRUNCATION_LIMIT:.0%}): its numbers include "
                     "outputs cut at the token budget")
    machines = val(run, "machines") or []
    if len(machines) > 1:
        items.append(f"{tag}: decoded on {len(machines)} machines ({'; '.join(machines)}): its speedup pairs only "
                     "samples decoded on the same machine as ar's")
    marks = [table.footnote(text) for text in items]
    warn = problems or (cut is not None and cut > TRUNCATION_LIMIT)
    return note_marks(marks, bool(warn))


def _common(table: Table, runs: pd.DataFrame) -> pd.DataFrame:
    """The columns every run table has: what the run is, its speed, truncation and footnote markers."""
    out = pd.concat([select(runs, BASE), select(runs, SPEED)], axis=1)
    out["truncated"] = 100.0 * runs["truncated"].astype(float)
    out["notes"] = [_notes(table, r) for r in rows(runs)]
    return out


def _ni_header(runs: pd.DataFrame) -> str:
    margins = {val(r, "ni_margin", S.StatsSettings.ni_margin) for r in rows(runs)}
    return f"NI {100 * margins.pop():g}% vs ar" if len(margins) == 1 else "NI vs ar"


def main_table(runs: pd.DataFrame, theta: float = DEFAULT_THETA) -> Table:
    """Speedup and tau per task per method, then their mean over the tasks present for the same model pair,
    method and decoding settings (the paper's 'Mean' column). mars at ``theta`` (all thetas where that one
    is missing). Quality: the task's first declared metric, its tests vs ar and vs sd."""
    shown = pd.concat([at_theta(g, theta) for g in groups(runs).values()]) if len(runs) else runs
    t = Table("Table 1", f"Speedup over ar and tau per task and method (mars at θ={theta:g}); 'mean of N tasks' "
              f"rows average each column over the tasks they name (same pair, method, T, p, seed). {SPEED_DEFS} "
              f"{AUTHORS_DEFINITIONS}. Quality: the task's first declared metric (↑ higher is better, ↓ lower); "
              f"Δ = mars - ar (or - sd) on the same samples. {NI_DEFINITION}. {CI_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("n", "n", "d"), ("tokens_per_s", "tokens/s", ".2f[]"),
               ("tau", "τ", ".2f[]"), ("speedup", "speedup (×)", ".2f[]"),
               ("speedup_authors", "speedup, authors' formula (×)", ".2f[]"),
               ("tau_authors", "τ, authors' formula", ".2f[]"), ("acceptance", "accept. rate", ".3f"),
               ("metric", "quality metric", ""), ("quality", "quality", ".3f[]"),
               ("d_ar", "Δ vs ar", ".3f[]"), ("p_d_ar", "p vs ar", "p"), ("mde_d_ar", "MDE", ".3f"),
               ("ni", _ni_header(shown), ""), ("d_sd", "Δ vs sd", ".3f[]"), ("p_d_sd", "p vs sd", "p"),
               ("truncated", "truncated (%)", ".1f"), ("notes", "notes", "")])
    t.compact = ["model", "task", "settings", "label", "n", "tokens_per_s", "tau", "speedup", "metric", "quality",
                 "d_ar", "p_d_ar", "ni", "notes"]
    t.brief, t.short = {"tokens_per_s": ".2f", "quality": "sig[]", "d_ar": "sig[]"}, {"p_d_ar": "p", "ni": "NI"}
    t.hoist = ("metric", "n")
    ms = [headline(r) for r in rows(shown)]
    data = pd.concat([_common(t, shown), cells(shown, ms, {**ci("quality/{m}", "quality"), **paired_cells("d_ar", "ar"),
                                                           **paired_cells("d_sd", "sd"), "vs_ar/{m}/ni_passes": "ni"})], axis=1)
    data["ni"] = data["ni"].map({True: "yes", False: "no"})
    data["metric"] = [metric_label(r, m) for r, m in zip(rows(shown), ms)]
    data["_task"] = shown["task"]
    data["_across"] = ["|".join(str(r[k]) for k in ("model_dir", "temperature", "top_p", "seed", "label"))
                       for r in rows(shown)]
    t.data = pd.concat([data, mean_rows(data)], ignore_index=True)
    return t


def mean_rows(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (model pair, method, T, p, seed) present on >= 2 tasks: the mean over those tasks of each
    of MEAN_KEYS (None unless every task has it), labelled with the tasks it averages."""
    out = []
    for _, rs in (table.groupby("_across", sort=False) if len(table) else []):
        tasks = sorted(set(rs["_task"]))
        if len(tasks) < 2 or len(rs) != len(tasks):   # one row per task, else the mean would weigh one twice
            continue
        mean = {k: (float(rs[k].astype(float).mean()) if k in rs and rs[k].notna().all() else None) for k in MEAN_KEYS}
        out.append({"model": rs["model"].iloc[0], "task": f"mean of {len(tasks)} tasks ({', '.join(tasks)})",
                    "settings": "; ".join(sorted(set(rs["settings"]))), "label": rs["label"].iloc[0],
                    "method": rs["method"].iloc[0], **mean})
    return pd.DataFrame(out)


def sweep_table(chosen: pd.DataFrame, name: str, caption: str, head: list, tail: list, extra: dict,
                arrow: bool) -> Table:
    """Runs against the values of a swept knob (theta, or each rule's): ``head`` columns, then per metric the
    quality with its CI and, where tested, Δ vs ar with p and MDE, then ``tail``; ``extra``: key -> values of
    columns not in the frame, one per run."""
    metrics = reported(chosen)
    tested = [m for m in metrics if any(val(r, f"vs_ar/{m}/n") is not None for r in rows(chosen))]
    directions = {k: v for r in rows(chosen) for k, v in val(r, "metric_directions", {}).items()}
    per = [c for m in metrics for c in [(f"q:{m}", f"{m} {ARROW.get(directions.get(m), '') if arrow else ''}".strip(),
                                         ".3f[]")]
           + ([(f"d:{m}", f"Δ {m} vs ar", ".3f[]"), (f"p_d:{m}", "p", "p"), (f"mde_d:{m}", "MDE", ".3f")]
              if m in tested else [])]
    lead = [("metric", "quality metric", ""), ("quality", "quality", ".3f[]"), ("d_ar", "Δ vs ar", ".3f[]"),
            ("p_d_ar", "p vs ar", "p")]
    t = Table(name, caption, head + per + tail + lead)
    t.compact = [k for k, _, _ in head if k not in ("theta", "acceptance", "relaxed_share", "speedup_authors", "rule",
                                                      "knob")] + [k for k, _, _ in lead + tail if k != "truncated"]
    t.same = [("speedup_no_budget", "speedup")]
    t.short = {"speedup_no_budget": "w/o budget hits (×)", "p_d_ar": "p"}
    t.brief = {"quality": "sig[]", "d_ar": "sig[]"}
    ms = [headline(r) for r in rows(chosen)]
    parts = [_common(t, chosen)] + [cells(chosen, m, {**ci("quality/{m}", f"q:{m}"), **paired_cells(f"d:{m}", "ar")})
                                    for m in metrics]
    parts.append(cells(chosen, ms, {**ci("quality/{m}", "quality"), **paired_cells("d_ar", "ar")}))
    data = pd.concat(parts, axis=1)
    data["metric"] = [metric_label(r, m) for r, m in zip(rows(chosen), ms)]
    for key, values in extra.items():
        data[key] = list(values)
    t.data = data.reset_index(drop=True)
    return t


def _lossy_groups(runs: pd.DataFrame, min_rules: int) -> pd.DataFrame:
    """The speculative runs of groups holding lossy runs of at least ``min_rules`` rules."""
    keep = [g for g in groups(runs).values() if g.loc[g["relaxed"], "rule"].nunique() >= min_rules]
    chosen = pd.concat(keep) if keep else runs.iloc[:0]
    return chosen[chosen["method"] != "ar"]


def theta_table(runs: pd.DataFrame) -> Table:
    """Quality, tau, acceptance and speedup vs theta; the sd run of the same settings is the reference."""
    chosen = _lossy_groups(runs, 1)
    share = [val(r, "n_relaxed", 0) / val(r, "n_accepted") if val(r, "n_accepted") else None for r in rows(chosen)]
    return sweep_table(
        chosen, "Table 2", "Theta sensitivity: mars at each θ and the lossless methods (sd, θ '–') on the same "
        f"settings. {SPEED_DEFS} {AUTHORS_DEFINITIONS}. {NO_BUDGET_DEFINITION}. relaxed share = relaxed "
        "acceptances / all accepted drafts. "
        f"↑ higher is better, ↓ lower. Δ = the method's quality - ar's on the same samples. {CI_DEFINITION}.",
        [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""), ("label", "method", ""),
         ("theta", "θ", "g"), ("n", "n", "d"), ("tau", "τ", ".2f[]"), ("acceptance", "accept. rate", ".3f"),
         ("relaxed_share", "relaxed share", ".3f"), ("speedup", "speedup (×)", ".2f[]"),
         ("speedup_no_budget", "speedup without budget hits (×)", ".2f[]"),
         ("speedup_authors", "speedup, authors' formula (×)", ".2f[]")],
        [("truncated", "truncated (%)", ".1f"), ("notes", "notes", "")], {"relaxed_share": share}, arrow=True)


def rules_table(runs: pd.DataFrame) -> Table:
    """Verification rules side by side (groups with >= 2 lossy rules): speed, quality and fidelity."""
    chosen = _lossy_groups(runs, 2)
    knob = [f"{val(r, 'sweep_knob')}={r['sweep_value']:g}" if val(r, "sweep_knob") else "–" for r in rows(chosen)]
    fid = select(chosen, {**ci("mean_chrf_to_ar", "chrf"), "pct_identical": "identical"})
    return sweep_table(
        chosen, "Table 6", "Verification rules on the same pair, samples, drafts and k: each lossy rule at each "
        "value of its swept knob, the lossless rule (exact) as the reference. "
        f"{SPEED_DEFS} Δ = the rule's quality - ar's on the same samples; "
        f"chrF to ar = fidelity of the text to the ar output. {CI_DEFINITION}.",
        [("task", "task", ""), ("settings", "settings", ""), ("rule", "rule", ""), ("knob", "knob", ""),
         ("label", "method", ""), ("n", "n", "d"), ("tau", "τ", ".2f[]"), ("speedup", "speedup (×)", ".2f[]")],
        [("chrf", "chrF to ar", ".1f[]"), ("identical", "identical to ar (%)", ".0f"),
         ("truncated", "truncated (%)", ".1f"), ("notes", "notes", "")],
        {"rule": chosen["rule"], "knob": knob, **{k: fid[k] for k in fid}}, arrow=False)


def fidelity_table(runs: pd.DataFrame) -> Table:
    chosen = runs[(runs["method"] != "ar") & runs["n_compared"].notna()]
    t = Table("Table 3", "Fidelity to ar vs θ: share of samples whose output tokens equal ar's (same target and "
              "settings), median first diverging token over the samples that differ, and mean sentence chrF of "
              f"the output text against ar's. sd is lossless (100% identical under greedy decoding). {SPEED_DEFS}"
              " [lo, hi]: 95% CI (Wilson score for the identical share, bootstrap over samples for chrF).",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("theta", "θ", "g"), ("n_compared", "n compared", "d"),
               ("pct_identical", "identical to ar (%)", ".1f[]"),
               ("median_first_divergence", "median first divergence (token)", "g"),
               ("mean_chrf_to_ar", "mean chrF to ar", ".1f[]"), ("tau", "τ", ".2f[]"),
               ("speedup", "speedup (×)", ".2f[]"), ("notes", "notes", "")])
    t.compact = ["model", "task", "settings", "label", "n_compared", "pct_identical", "median_first_divergence",
                 "mean_chrf_to_ar", "notes"]
    fid = select(chosen, {"n_compared": "n_compared", **ci("pct_identical"), "median_first_divergence":
                          "median_first_divergence", **ci("mean_chrf_to_ar")})
    t.data = pd.concat([_common(t, chosen), fid], axis=1).reset_index(drop=True)
    return t


def acceptance_table(runs: pd.DataFrame) -> Table:
    chosen = runs.loc[[m != "ar" and bool(val(r, "acceptance_per_depth")) for m, r in zip(runs["method"], rows(runs))]]
    depth = max((len(d) for d in chosen["acceptance_per_depth"]), default=0)
    t = Table("Table 4", f"Acceptance rate per draft position. {ACCEPTANCE_DEFINITION}; mars counts exact and "
              f"relaxed acceptances. {M.TAU_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("n", "n", "d"), ("tau", "τ", ".2f")]
              + [(f"d{i + 1}", f"depth {i + 1}", ".3f") for i in range(depth)] + [("notes", "notes", "")])
    data = _common(t, chosen)
    for i in range(depth):
        data[f"d{i + 1}"] = [d[i] if i < len(d) else None for d in chosen["acceptance_per_depth"]]
    t.data = data.reset_index(drop=True)
    return t


def quality_table(runs: pd.DataFrame) -> Table:
    """One row per (run, metric, baseline): every paired quality test the runs hold."""
    t = Table("Table 5", "Quality vs ar and vs sd, paired on the same samples: Δ = the method's value - the "
              "baseline's, with its 95% CI; p = McNemar exact (binary scores; CI: Newcombe paired score "
              "interval), sacrebleu paired bootstrap (BLEU, chrF) or paired bootstrap (judge scores); MDE = "
              "the smallest difference this n detects at 80% power and 5% level. A result without significance "
              "reads 'no loss larger than MDE at n', never 'lossless'.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("metric", "metric", ""), ("vs", "vs", ""), ("n_pairs", "n", "d"),
               ("value", "value", ".3f[]"), ("base", "baseline", ".3f[]"), ("delta", "Δ", ".3f[]"),
               ("p_value", "p", "p"), ("mde", "MDE", ".3f"), ("reading", "reading", ""), ("test", "test", ""),
               ("note", "note", ""), ("notes", "notes", "")])
    t.compact = ["model", "task", "settings", "label", "metric", "vs", "n_pairs", "value", "delta", "p_value", "mde",
                 "note", "notes"]
    t.aside = ("note",)
    t.brief = {"value": "sig[]", "delta": "sig[]"}
    out = []
    for r in rows(runs):
        order = val(r, "metrics", [])
        for vs in ("ar", "sd"):
            tested = [k.split("/")[1] for k in r.index if k.startswith(f"vs_{vs}/") and k.endswith("/n")
                      and val(r, k) is not None]
            for m in sorted(tested, key=lambda m: order.index(m) if m in order else 99):
                x = paired_test(r, f"vs_{vs}/{m}")
                sd = f" ({r['sd_tag']})" if vs == "sd" and val(r, "sd_tag") else ""
                out.append({**{v: r[k] for k, v in BASE.items()}, "metric": m, "vs": vs + sd, "n_pairs": x["n"],
                            "reading": S.reading(x, val(r, "metric_directions", {}).get(m, "higher")),
                            "notes": _notes(t, r), **{k: x.get(k) for k in (
                                "p_value", "mde", "test", "note", "value", "value_lo", "value_hi", "base", "base_lo",
                                "base_hi", "delta")}, "delta_lo": x.get("lo"), "delta_hi": x.get("hi")})
    t.data = pd.DataFrame(out)
    _mark_equal_tests(t.data)
    return t


def costs_table(runs: pd.DataFrame) -> Table:
    """Per timed speculative run (batch size 1: a study's timed phase or a plain run), its records' forward
    times per step and per drafted token."""
    t = Table("Table 9", "Where a verification step's time goes, batch size 1 (a study's timed samples): the draft's "
              "forward time per drafted token and per step, the target's forward time per verification step "
              "(records' draft_s, target_s; steps and drafted tokens counted over the same samples), and the share "
              f"of the decoding loop outside both (proposing, verifying, bookkeeping). {M.TAU_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("n", "n", "d"), ("tau", "τ", ".2f"),
               ("draft_ms_token", "draft ms / drafted token", ".1f"), ("draft_ms_step", "draft ms / step", ".1f"),
               ("target_ms_step", "target ms / step", ".1f"), ("outside", "outside forwards (%)", ".1f")])
    keep = [val(r, "method") != "ar" and (val(r, "batch_size") or 1) == 1 and val(r, "phase") != "quality"
            and (val(r, "n_proposed") or 0) > 0 and (val(r, "steps") or 0) > 0 and val(r, "draft_s") is not None
            for r in rows(runs)] if len(runs) else []
    chosen = runs.loc[keep] if len(runs) else runs
    out = []
    for r in rows(chosen):
        share = val(r, "outside_forward_share")
        out.append({**{v: r[k] for k, v in BASE.items()}, "n": val(r, "n"), "tau": val(r, "tau"),
                    "draft_ms_token": 1e3 * r["draft_s"] / r["n_proposed"], "draft_ms_step": 1e3 * r["draft_s"] /
                    r["steps"], "target_ms_step": 1e3 * val(r, "target_s", 0.0) / r["steps"],
                    "outside": None if share is None else 100.0 * share})
    t.data = pd.DataFrame(out)
    return t


TEST_VALUES = ("n_pairs", "value", "value_lo", "value_hi", "base", "delta", "delta_lo", "delta_hi", "p_value")


def _mark_equal_tests(data: pd.DataFrame) -> None:
    """``_same_as`` (``compact.py``): a test equal in every number to an earlier metric's of the same run and
    baseline (BLEU and chrF over raw and normalized text alike) names that one: (its metric, the earlier one)."""
    if data.empty:
        return
    seen: dict[tuple, str] = {}
    out = []
    for _, r in data.iterrows():
        key = (r["label"], r["model"], r["task"], r["settings"], r["vs"]) + tuple(
            None if val(r, k) is None else round(float(val(r, k)), 12) for k in TEST_VALUES)
        first = seen.setdefault(key, r["metric"])
        out.append((r["metric"], first) if first != r["metric"] else None)
    data["_same_as"] = out


def all_tables(runs, theta: float = DEFAULT_THETA) -> dict[str, Table]:
    """Every table of ``runs`` (``Frames.runs``, or the Frames)."""
    runs = getattr(runs, "runs", runs)
    ours, authors = paper_tables(runs, theta)
    return {"main": main_table(runs, theta), "theta": theta_table(runs), "rules": rules_table(runs),
            "fidelity": fidelity_table(runs), "acceptance": acceptance_table(runs), "quality": quality_table(runs),
            "study": study_table(runs), "paper_ours": ours, "paper_authors": authors, "claims": claims_table(runs),
            "costs": costs_table(runs)}


def write_tables(tables: dict[str, Table], out_dir) -> list:
    """``<out_dir>/<name>.md`` / ``.csv`` / ``.tex`` per table."""
    from pathlib import Path

    from mars_bench.store.io import atomic_write_text

    paths = []
    for name, t in tables.items():
        for ext, text in (("md", t.to_markdown()), ("csv", t.to_csv()), ("tex", t.to_latex())):
            paths.append(Path(out_dir) / f"{name}.{ext}")
            atomic_write_text(paths[-1], text)
    return paths
