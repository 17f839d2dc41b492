"""Paper tables from ``Run`` objects, rendered as markdown, CSV and LaTeX.

    main_table(runs)        speedup and tau per task per method (ours and the authors' formulas), the mean
                            over tasks, quality vs ar with its non-inferiority verdict
    theta_table(runs)       quality, tau, acceptance and speedup vs theta (sd as the lossless reference)
    fidelity_table(runs)    agreement with ar outputs vs theta
    acceptance_table(runs)  acceptance rate per draft position (depth)
    quality_table(runs)     every paired quality test vs ar and vs sd: delta [CI], p-value, MDE, n

Captions cite the definitions of ``mars_bench.records`` (one source). Intervals and tests come from
``Run.stats`` (``mars_bench.stats``); a cell ``v [lo, hi]`` is the point value and its CI, a bare value
has none (the quality table's note says why). CSV files carry ``lo`` / ``hi`` as ``<column>_lo`` / ``_hi``.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from .. import records as R
from .. import stats as S
from .load import DEFAULT_THETA, Run, groups

AUTHORS_DEFINITIONS = (f"Authors' formulas, shown beside ours, never instead: {R.SPEEDUP_AUTHORS_DEFINITION}; "
                       f"{R.TAU_AUTHORS_DEFINITION}")
NI_DEFINITION = ("NI = non-inferiority to ar of the quality metric: the one-sided 95% bound of Δ clears the "
                 "margin declared before looking, margin = stats.ni_margin x |ar's score| (yes / no; – when "
                 "untested)")
ACCEPTANCE_DEFINITION = ("acceptance rate at depth i = accepted drafts at depth i / verification steps "
                         "that proposed a draft at depth i")
ARROW = {"higher": "↑", "lower": "↓"}
TRUNCATION_LIMIT = 0.05   # a run whose share of samples cut at max_new_tokens exceeds this is flagged
CI_DEFINITION = ("v [lo, hi] = value and its 95% CI (bootstrap over samples; speedup paired with ar on the "
                 "same resampled samples); p = paired test vs ar (McNemar exact for binary scores, sacrebleu "
                 "paired bootstrap for BLEU/chrF); MDE = smallest difference this n detects at 80% power, "
                 "5% level; truncated = share of samples stopped at max_new_tokens")


@dataclass
class Table:
    name: str
    caption: str
    columns: list[tuple[str, str, str]]      # (key, header, format) ; format '' = str
    rows: list[dict] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)

    def cell(self, row: dict, key: str, fmt: str) -> str:
        """fmt '.2f[]': value and its interval from ``key_lo`` / ``key_hi``; 'p': a p-value."""
        v = row.get(key)
        if v is None or v == "":
            return "–"
        if fmt == "p" and isinstance(v, (int, float)):
            return "<0.001" if v < 0.001 else format(v, ".3f")
        if fmt.endswith("[]") and isinstance(v, (int, float)) and not isinstance(v, bool):
            lo, hi, f = row.get(key + "_lo"), row.get(key + "_hi"), fmt[:-2]
            return format(v, f) + (f" [{format(lo, f)}, {format(hi, f)}]" if lo is not None and hi is not None else "")
        if fmt and isinstance(v, (int, float)) and not isinstance(v, bool):
            return format(v, fmt)
        return str(v)

    def _csv_keys(self) -> list[str]:
        return [x for k, _, f in self.columns for x in ([k, k + "_lo", k + "_hi"] if f.endswith("[]") else [k])]

    def to_markdown(self) -> str:
        head = [h for _, h, _ in self.columns]
        lines = [f"**{self.name}.** {self.caption}", "", "| " + " | ".join(head) + " |",
                 "|" + "|".join("---" if f == "" else "---:" for _, _, f in self.columns) + "|"]
        for row in self.rows:
            lines.append("| " + " | ".join(self.cell(row, k, f).replace("|", "\\|") for k, _, f in self.columns) + " |")
        if not self.rows:
            lines.append("| " + " | ".join(["–"] * len(head)) + " |")
        lines += [""] + [f"[{i + 1}] {n}" for i, n in enumerate(self.footnotes)]
        return "\n".join(lines).rstrip() + "\n"

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self._csv_keys())
        for row in self.rows:
            w.writerow([self._csv_cell(row, k) for k in self._csv_keys()])
        return buf.getvalue()

    def _csv_cell(self, row: dict, key: str):
        v = row.get(key)
        if key == "notes" and v:   # the footnotes' text, not their markers
            nums = [int(x) for x in v.replace("⚠", "").replace("[", " ").replace("]", " ").replace(",", " ").split()]
            return " | ".join(self.footnotes[i - 1] for i in nums)
        return "" if v is None else (repr(v) if isinstance(v, float) else v)

    def to_latex(self) -> str:
        spec = "".join("l" if f == "" else "r" for _, _, f in self.columns)
        out = ["\\begin{table}[t]", "\\centering", "\\small", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
               " & ".join(tex(h) for _, h, _ in self.columns) + " \\\\", "\\midrule"]
        out += [" & ".join(tex(self.cell(r, k, f)) for k, _, f in self.columns) + " \\\\" for r in self.rows]
        out += ["\\bottomrule", "\\end{tabular}"]
        if self.footnotes:
            out.append("\\par\\footnotesize " + " ".join(f"[{i + 1}] {tex(n)}" for i, n in enumerate(self.footnotes)))
        out += [f"\\caption{{{tex(self.caption)}}}", f"\\label{{tab:{self.name.lower().replace(' ', '-')}}}",
                "\\end{table}"]
        return "\n".join(out) + "\n"


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "θ": r"$\theta$", "τ": r"$\tau$",
        "↑": r"$\uparrow$", "↓": r"$\downarrow$", "×": r"$\times$", "≤": r"$\le$", "–": "--", "→": r"$\to$",
        "Δ": r"$\Delta$", "<": r"$<$", ">": r"$>$", "⚠": r"(!)"}


def tex(s: str) -> str:
    return "".join(_TEX.get(c, c) for c in str(s))


def _notes(table: Table, run: Run) -> str:
    """Footnote markers for a run's problems (corrupt lines) and notes (recomputed numbers)."""
    marks = []
    items = []
    if run.problems:
        items.append(f"{len(run.problems)} problem(s) in {run.tag}: " + "; ".join(run.problems))
    items += [f"{run.tag}: {n}" for n in run.notes if not n.startswith("no speedup")]
    cut = truncated_share(run)
    if cut is not None and cut > TRUNCATION_LIMIT:
        items.append(f"{run.tag}: {cut:.0%} of samples stopped at max_new_tokens (> {TRUNCATION_LIMIT:.0%}): "
                     "its quality reflects the token budget")
    for text in items:
        if text not in table.footnotes:
            table.footnotes.append(text)
        marks.append(str(table.footnotes.index(text) + 1))
    warn = run.problems or (cut is not None and cut > TRUNCATION_LIMIT)
    return ("⚠ " if warn else "") + ",".join(f"[{m}]" for m in marks)


def truncated_share(run: Run) -> float | None:
    return (run.stop_reasons or {}).get("max_new_tokens")


def _put(row: dict, key: str, est: dict | None, value=None) -> dict:
    """row[key] = the estimate's value (or ``value``), row[key_lo / key_hi] = its interval."""
    est = est or {}
    row[key] = est.get("value") if value is None else value
    row[key + "_lo"], row[key + "_hi"] = est.get("lo"), est.get("hi")
    return row


def _test_cells(row: dict, key: str, t: dict | None) -> dict:
    """Delta [CI], p-value and MDE of one paired test into ``key``, ``p_<key>``, ``mde_<key>``."""
    t = t or {}
    _put(row, key, {"value": t.get("delta"), "lo": t.get("lo"), "hi": t.get("hi")})
    row["p_" + key], row["mde_" + key] = t.get("p_value"), t.get("mde")
    return row


def _quality_cells(row: dict, key: str, run: Run, metric: str) -> dict:
    """The run's quality (the task's aggregate) with its CI where the CI is over the same samples."""
    v = run.quality.get(metric)
    return _put(row, key, _same(((run.stats or {}).get("quality") or {}).get(metric), v), value=v)


def quality_ci(run: Run, metric: str) -> tuple[float, float] | None:
    """95% CI of the run's quality ``metric`` (None when not stored or not over the same samples)."""
    row = _quality_cells({}, "q", run, metric)
    return (row["q_lo"], row["q_hi"]) if row["q_lo"] is not None and row["q_hi"] is not None else None


def quality_p(run: Run, metric: str) -> float | None:
    """p-value of the paired test of ``metric`` against ar."""
    return (_tests(run, "ar").get(metric) or {}).get("p_value")


def _tests(run: Run, vs: str) -> dict:
    return (run.stats or {}).get(f"quality_vs_{vs}") or {}


def declared_order(run: Run) -> list[str]:
    """The task's metrics in the order its task.yaml declares them (summary.json sorts its keys)."""
    try:
        from ..tasks.base import load_spec

        order = list(load_spec(run.task)["metrics"] or {})
    except Exception:  # task unknown here (results from elsewhere): alphabetical
        order = []
    return order + sorted(m for m in run.metric_directions if m not in order)


def headline_metric(run: Run) -> str | None:
    """The first metric the task declares that this run reports (e.g. accuracy_strict, pass@1, bleu)."""
    return next((m for m in declared_order(run) if m in run.metric_directions
                 and run.quality.get(m) is not None), None)


def _speed_cells(run: Run) -> dict:
    """Speed columns: ours (tau, tokens/s, speedup) and the authors' formulas (tau_authors, speedup_authors;
    none for ar itself, which their scripts only divide by), each with its CI where stored."""
    sp, st = run.speedup or {}, run.stats or {}
    cut = truncated_share(run)
    row = {"n": run.n_samples, "acceptance": run.totals.get("acceptance_rate"),
           "truncated": None if cut is None else 100.0 * cut}
    _put(row, "tau", st.get("tau"), run.totals.get("tau"))
    _put(row, "tau_authors", _same(st.get("tau_authors"), run.totals.get("tau_authors")),
         run.totals.get("tau_authors"))
    if run.method != "ar":
        _put(row, "speedup_authors", _same(st.get("speedup_authors"), sp.get("speedup_authors")),
             sp.get("speedup_authors"))
    _put(row, "tokens_per_s", st.get("tokens_per_s"), run.totals.get("tokens_per_s"))
    return _put(row, "speedup", None if run.method == "ar" else st.get("speedup"),
                1.0 if run.method == "ar" else sp.get("speedup"))


def _same(est: dict | None, value) -> dict | None:
    """The stored estimate when it is of ``value`` (over the same samples), else None (no interval)."""
    ok = est and est.get("value") is not None and value is not None \
        and abs(est["value"] - value) <= 1e-9 * max(1, abs(value))
    return est if ok else None


def _ni_cell(t: dict | None) -> str | None:
    ni = (t or {}).get("noninferiority") or {}
    return {True: "yes", False: "no"}.get(ni.get("passes"))


def _ni_header(runs: list[Run]) -> str:
    margins = {((r.stats or {}).get("settings") or {}).get("ni_margin", S.StatsSettings.ni_margin) for r in runs}
    return f"NI {100 * margins.pop():g}% vs ar" if len(margins) == 1 else "NI vs ar"


def _base(run: Run) -> dict:
    return {"model": run.model_dir, "task": run.task_dir, "settings": run.settings_label,
            "method": run.method, "k": run.k, "theta": run.theta, "label": run.label}


MEAN_KEYS = ("speedup", "tau", "speedup_authors", "tau_authors")   # averaged over tasks in the main table


def main_table(runs: list[Run], theta: float = DEFAULT_THETA) -> Table:
    """Speedup and tau per task per method, then their mean over the tasks present for the same model pair,
    method and decoding settings (the paper's 'Mean' column). mars at ``theta`` (all thetas where that one
    is missing)."""
    t = Table("Table 1", f"Speedup over ar and tau per task and method (mars at θ={theta:g}); 'mean of N tasks' "
              f"rows average each column over the tasks they name (same pair, method, T, p, seed). "
              f"{R.TAU_DEFINITION}. {R.SPEEDUP_DEFINITION}. {AUTHORS_DEFINITIONS}. Quality: the task's first "
              f"declared metric (↑ higher is better, ↓ lower); Δ = mars - ar (or - sd) on the same samples. "
              f"{NI_DEFINITION}. {CI_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("n", "n", "d"), ("tokens_per_s", "tokens/s", ".2f[]"),
               ("tau", "τ", ".2f[]"), ("speedup", "speedup (×)", ".2f[]"),
               ("speedup_authors", "speedup, authors' formula (×)", ".2f[]"),
               ("tau_authors", "τ, authors' formula", ".2f[]"), ("acceptance", "accept. rate", ".3f"),
               ("metric", "quality metric", ""), ("quality", "quality", ".3f[]"),
               ("d_ar", "Δ vs ar", ".3f[]"), ("p_d_ar", "p vs ar", "p"), ("mde_d_ar", "MDE", ".3f"),
               ("ni", _ni_header(runs), ""),
               ("d_sd", "Δ vs sd", ".3f[]"), ("p_d_sd", "p vs sd", "p"),
               ("truncated", "truncated (%)", ".1f"), ("notes", "notes", "")])
    for group in groups(runs).values():
        has_main = {r.family for r in group if r.relaxed and r.theta == theta}
        for r in group:
            if r.relaxed and r.family in has_main and r.theta != theta:
                continue
            m = headline_metric(r)
            row = {**_base(r), **_speed_cells(r), "notes": _notes(t, r), "_task": r.task,
                   "_across": (r.model_dir, r.temperature, r.top_p, r.seed, r.label),
                   "metric": f"{m} {ARROW.get(r.metric_directions.get(m), '')}".strip() if m else None}
            if m:
                _quality_cells(row, "quality", r, m)
                _test_cells(row, "d_ar", _tests(r, "ar").get(m))
                _test_cells(row, "d_sd", _tests(r, "sd").get(m))
                row["ni"] = _ni_cell(_tests(r, "ar").get(m))
            t.rows.append(row)
    t.rows += mean_rows(t.rows)
    return t


def mean_rows(rows: list[dict]) -> list[dict]:
    """One row per (model pair, method, T, p, seed) present on >= 2 tasks: the mean over those tasks of each
    of MEAN_KEYS (None unless every task has it), labelled with the tasks it averages."""
    by: dict[tuple, list[dict]] = {}
    for row in rows:
        by.setdefault(row["_across"], []).append(row)
    out = []
    for key, rs in by.items():
        tasks = sorted({r["_task"] for r in rs})
        if len(tasks) < 2 or len(rs) != len(tasks):   # one row per task, else the mean would weigh one twice
            continue
        mean = {k: (sum(r[k] for r in rs) / len(rs) if all(r.get(k) is not None for r in rs) else None)
                for k in MEAN_KEYS}
        out.append({"model": rs[0]["model"], "task": f"mean of {len(tasks)} tasks ({', '.join(tasks)})",
                    "settings": "; ".join(sorted({r["settings"] for r in rs})), "label": rs[0]["label"],
                    "method": rs[0]["method"], **mean})
    return out


def _metrics(runs: list[Run]) -> list[str]:
    out = []
    for r in runs:
        out += [m for m in declared_order(r) if m in r.metric_directions and r.quality.get(m) is not None
                and m not in out]
    return out


def _tested(runs: list[Run], metric: str) -> bool:
    """Whether any run holds a paired test of ``metric`` against ar (the task registered one)."""
    return any(metric in _tests(r, "ar") for r in runs)


def theta_table(runs: list[Run]) -> Table:
    """Quality, tau, acceptance and speedup vs theta; the sd run of the same settings is the reference."""
    chosen = [r for g in groups(runs).values() if any(x.relaxed for x in g) for r in g if r.method != "ar"]
    directions = {}
    for r in chosen:
        directions.update(r.metric_directions)
    metrics = _metrics(chosen)
    t = Table("Table 2", "Theta sensitivity: mars at each θ and the lossless methods (sd, θ '–') on the same settings. "
              f"{R.TAU_DEFINITION}. {R.SPEEDUP_DEFINITION}. {AUTHORS_DEFINITIONS}. relaxed share = relaxed "
              f"acceptances / all accepted drafts. ↑ higher is better, ↓ lower. Δ = the method's quality - ar's "
              f"on the same samples. {CI_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("theta", "θ", "g"), ("n", "n", "d"), ("tau", "τ", ".2f[]"),
               ("acceptance", "accept. rate", ".3f"), ("relaxed_share", "relaxed share", ".3f"),
               ("speedup", "speedup (×)", ".2f[]"), ("speedup_authors", "speedup, authors' formula (×)", ".2f[]")]
              + [c for m in metrics for c in [(f"q:{m}", f"{m} {ARROW.get(directions.get(m), '')}".strip(), ".3f[]")]
                 + ([(f"d:{m}", f"Δ {m} vs ar", ".3f[]"), (f"p_d:{m}", "p", "p"), (f"mde_d:{m}", "MDE", ".3f")]
                    if _tested(chosen, m) else [])]
              + [("truncated", "truncated (%)", ".1f"), ("notes", "notes", "")])
    for r in chosen:
        acc = r.totals.get("n_accepted") or 0
        row = {**_base(r), **_speed_cells(r), "notes": _notes(t, r),
               "relaxed_share": (r.totals.get("n_relaxed") or 0) / acc if acc else None}
        for m in metrics:
            _quality_cells(row, f"q:{m}", r, m)
            _test_cells(row, f"d:{m}", _tests(r, "ar").get(m))
        t.rows.append(row)
    return t


def rules_table(runs: list[Run]) -> Table:
    """Verification rules side by side (groups with >= 2 lossy rules): speed, quality and fidelity."""
    chosen = [r for g in groups(runs).values() if len({x.rt.rule for x in g if x.relaxed}) >= 2
              for r in g if r.method != "ar"]
    metrics = _metrics(chosen)
    t = Table("Table 6", "Verification rules on the same pair, samples, drafts and k: each lossy rule at each "
              "value of its swept knob, the lossless rule (exact) as the reference. "
              f"{R.TAU_DEFINITION}. {R.SPEEDUP_DEFINITION}. Δ = the rule's quality - ar's on the same samples; "
              f"chrF to ar = fidelity of the text to the ar output. {CI_DEFINITION}.",
              [("task", "task", ""), ("settings", "settings", ""), ("rule", "rule", ""), ("knob", "knob", ""),
               ("label", "method", ""), ("n", "n", "d"), ("tau", "τ", ".2f[]"), ("speedup", "speedup (×)", ".2f[]")]
              + [c for m in metrics for c in [(f"q:{m}", m, ".3f[]")]
                 + ([(f"d:{m}", f"Δ {m} vs ar", ".3f[]"), (f"p_d:{m}", "p", "p"), (f"mde_d:{m}", "MDE", ".3f")]
                    if _tested(chosen, m) else [])]
              + [("chrf", "chrF to ar", ".1f[]"), ("identical", "identical to ar (%)", ".0f"),
                 ("truncated", "truncated (%)", ".1f"), ("notes", "notes", "")])
    for r in chosen:
        agg = (r.fidelity or {}).get("aggregate") or {}
        row = {**_base(r), **_speed_cells(r), "rule": r.rt.rule, "notes": _notes(t, r),
               "knob": f"{r.sweep_knob}={r.sweep_value:g}" if r.sweep_knob else "–",
               "identical": agg.get("pct_identical")}
        _put(row, "chrf", ((r.stats or {}).get("fidelity") or {}).get("mean_chrf_to_ar"), agg.get("mean_chrf_to_ar"))
        for m in metrics:
            _quality_cells(row, f"q:{m}", r, m)
            _test_cells(row, f"d:{m}", _tests(r, "ar").get(m))
        t.rows.append(row)
    return t


def fidelity_table(runs: list[Run]) -> Table:
    t = Table("Table 3", "Fidelity to ar vs θ: share of samples whose output tokens equal ar's (same target and "
              "settings), median first diverging token over the samples that differ, and mean sentence chrF of "
              f"the output text against ar's. sd is lossless (100% identical under greedy decoding). "
              f"{R.TAU_DEFINITION}. {R.SPEEDUP_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("theta", "θ", "g"), ("n_compared", "n compared", "d"),
               ("pct_identical", "identical to ar (%)", ".1f[]"),
               ("median_first_divergence", "median first divergence (token)", "g"),
               ("mean_chrf_to_ar", "mean chrF to ar", ".1f[]"), ("tau", "τ", ".2f[]"),
               ("speedup", "speedup (×)", ".2f[]"), ("notes", "notes", "")])
    t.caption += (" [lo, hi]: 95% CI (Wilson score for the identical share, bootstrap over samples for chrF).")
    for r in runs:
        if r.method == "ar" or not r.fidelity:
            continue
        agg, fst = r.fidelity.get("aggregate") or {}, (r.stats or {}).get("fidelity") or {}
        row = {**_base(r), **_speed_cells(r), "n_compared": agg.get("n"),
               "median_first_divergence": agg.get("median_first_divergence"), "notes": _notes(t, r)}
        for key in ("pct_identical", "mean_chrf_to_ar"):
            est = fst.get(key) if (fst.get(key) or {}).get("n") == agg.get("n") else None
            _put(row, key, est, agg.get(key))
        t.rows.append(row)
    return t


def acceptance_table(runs: list[Run]) -> Table:
    chosen = [r for r in runs if r.method != "ar" and r.totals.get("acceptance_per_depth")]
    depth = max((len(r.totals["acceptance_per_depth"]) for r in chosen), default=0)
    t = Table("Table 4", f"Acceptance rate per draft position. {ACCEPTANCE_DEFINITION}; mars counts exact and "
              f"relaxed acceptances. {R.TAU_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("n", "n", "d"), ("tau", "τ", ".2f")]
              + [(f"d{i + 1}", f"depth {i + 1}", ".3f") for i in range(depth)] + [("notes", "notes", "")])
    for r in chosen:
        t.rows.append({**_base(r), **_speed_cells(r), "notes": _notes(t, r),
                       **{f"d{i + 1}": a for i, a in enumerate(r.totals["acceptance_per_depth"])}})
    return t


def quality_table(runs: list[Run]) -> Table:
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
    for r in runs:
        for vs in ("ar", "sd"):
            for m, x in sorted(_tests(r, vs).items(), key=lambda kv: declared_order(r).index(kv[0])
                               if kv[0] in declared_order(r) else 99):
                row = {**_base(r), "metric": m, "vs": vs + (f" ({r.sd_tag})" if vs == "sd" and r.sd_tag else ""),
                       "n_pairs": x.get("n"), "p_value": x.get("p_value"), "mde": x.get("mde"),
                       "reading": S.reading(x, r.metric_directions.get(m, "higher")), "test": x.get("test"),
                       "note": x.get("note"), "notes": _notes(t, r)}
                _put(row, "value", {"value": x.get("value"), "lo": x.get("value_lo"), "hi": x.get("value_hi")})
                _put(row, "base", {"value": x.get("base"), "lo": x.get("base_lo"), "hi": x.get("base_hi")})
                _put(row, "delta", {"value": x.get("delta"), "lo": x.get("lo"), "hi": x.get("hi")})
                t.rows.append(row)
    return t


def all_tables(runs: list[Run], theta: float = DEFAULT_THETA) -> dict[str, Table]:
    return {"main": main_table(runs, theta), "theta": theta_table(runs), "rules": rules_table(runs),
            "fidelity": fidelity_table(runs),
            "acceptance": acceptance_table(runs), "quality": quality_table(runs)}


def write_tables(tables: dict[str, Table], out_dir) -> list:
    from pathlib import Path

    from ..records import atomic_write_text

    out_dir = Path(out_dir)
    paths = []
    for name, t in tables.items():
        for ext, text in (("md", t.to_markdown()), ("csv", t.to_csv()), ("tex", t.to_latex())):
            p = out_dir / f"{name}.{ext}"
            atomic_write_text(p, text)
            paths.append(p)
    return paths
