"""Paper tables from ``Run`` objects, rendered as markdown, CSV and LaTeX.

    main_table(runs)        speedup (two definitions) and tau per task per method
    theta_table(runs)       quality, tau, acceptance and speedup vs theta (sd as the lossless reference)
    fidelity_table(runs)    agreement with ar outputs vs theta
    acceptance_table(runs)  acceptance rate per draft position (depth)

Captions cite the definitions of ``mars_bench.records`` (one source).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from .. import records as R
from .load import DEFAULT_THETA, Run, groups

MEAN_RATIO_DEFINITION = ("speedup (mean) = mean over samples of (tokens/s of the method / tokens/s of ar "
                         "on the same sample), as in the authors' scripts")
ACCEPTANCE_DEFINITION = ("acceptance rate at depth i = accepted drafts at depth i / verification steps "
                         "that proposed a draft at depth i")
ARROW = {"higher": "↑", "lower": "↓"}


@dataclass
class Table:
    name: str
    caption: str
    columns: list[tuple[str, str, str]]      # (key, header, format) ; format '' = str
    rows: list[dict] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)

    def cell(self, row: dict, key: str, fmt: str) -> str:
        v = row.get(key)
        if v is None or v == "":
            return "–"
        if fmt and isinstance(v, (int, float)) and not isinstance(v, bool):
            return format(v, fmt)
        return str(v)

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
        w.writerow([k for k, _, _ in self.columns])
        for row in self.rows:
            w.writerow([self._csv_cell(row, k) for k, _, _ in self.columns])
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
        "↑": r"$\uparrow$", "↓": r"$\downarrow$", "×": r"$\times$", "≤": r"$\le$", "–": "--", "→": r"$\to$"}


def tex(s: str) -> str:
    return "".join(_TEX.get(c, c) for c in str(s))


def _notes(table: Table, run: Run) -> str:
    """Footnote markers for a run's problems (corrupt lines) and notes (recomputed numbers)."""
    marks = []
    items = []
    if run.problems:
        items.append(f"{len(run.problems)} problem(s) in {run.tag}: " + "; ".join(run.problems))
    items += [f"{run.tag}: {n}" for n in run.notes if not n.startswith("no speedup")]
    for text in items:
        if text not in table.footnotes:
            table.footnotes.append(text)
        marks.append(str(table.footnotes.index(text) + 1))
    return ("⚠ " if run.problems else "") + ",".join(f"[{m}]" for m in marks)


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
    sp = run.speedup or {}
    return {"n": run.n_samples, "tau": run.totals.get("tau"), "acceptance": run.totals.get("acceptance_rate"),
            "speedup": 1.0 if run.method == "ar" else sp.get("speedup"),
            "speedup_mean": 1.0 if run.method == "ar" else sp.get("speedup_mean_ratio"),
            "tokens_per_s": run.totals.get("tokens_per_s")}


def _base(run: Run) -> dict:
    return {"model": run.model_dir, "task": run.task_dir, "settings": run.settings_label,
            "method": run.method, "k": run.k, "theta": run.theta, "label": run.label}


def main_table(runs: list[Run], theta: float = DEFAULT_THETA) -> Table:
    """Speedup and tau per task per method. mars at ``theta`` (all thetas where that one is missing)."""
    t = Table("Table 1", f"Speedup over ar and tau per task and method (mars at θ={theta:g}). {R.TAU_DEFINITION}. "
              f"{R.SPEEDUP_DEFINITION}. {MEAN_RATIO_DEFINITION}. Quality: the task's first declared metric "
              "(↑ higher is better, ↓ lower).",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("n", "n", "d"), ("tokens_per_s", "tokens/s", ".2f"),
               ("tau", "τ", ".2f"), ("speedup", "speedup (×)", ".2f"), ("speedup_mean", "speedup mean (×)", ".2f"),
               ("acceptance", "accept. rate", ".3f"), ("metric", "quality metric", ""),
               ("quality", "quality", ".3f"), ("notes", "notes", "")])
    for group in groups(runs).values():
        has_main = {r.family for r in group if r.relaxed and r.theta == theta}
        for r in group:
            if r.relaxed and r.family in has_main and r.theta != theta:
                continue
            m = headline_metric(r)
            t.rows.append({**_base(r), **_speed_cells(r), "notes": _notes(t, r),
                           "metric": f"{m} {ARROW.get(r.metric_directions.get(m), '')}".strip() if m else None,
                           "quality": r.quality.get(m) if m else None})
    return t


def _metrics(runs: list[Run]) -> list[str]:
    out = []
    for r in runs:
        out += [m for m in declared_order(r) if m in r.metric_directions and r.quality.get(m) is not None
                and m not in out]
    return out


def theta_table(runs: list[Run]) -> Table:
    """Quality, tau, acceptance and speedup vs theta; the sd run of the same settings is the reference."""
    chosen = [r for g in groups(runs).values() if any(x.relaxed for x in g) for r in g if r.method != "ar"]
    directions = {}
    for r in chosen:
        directions.update(r.metric_directions)
    metrics = _metrics(chosen)
    t = Table("Table 2", "Theta sensitivity: mars at each θ and the lossless methods (sd, θ '–') on the same settings. "
              f"{R.TAU_DEFINITION}. {R.SPEEDUP_DEFINITION}. {MEAN_RATIO_DEFINITION}. relaxed share = relaxed "
              "acceptances / all accepted drafts. ↑ higher is better, ↓ lower.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("theta", "θ", "g"), ("n", "n", "d"), ("tau", "τ", ".2f"),
               ("acceptance", "accept. rate", ".3f"), ("relaxed_share", "relaxed share", ".3f"),
               ("speedup", "speedup (×)", ".2f"), ("speedup_mean", "speedup mean (×)", ".2f")]
              + [(f"q:{m}", f"{m} {ARROW.get(directions.get(m), '')}".strip(), ".3f") for m in metrics]
              + [("notes", "notes", "")])
    for r in chosen:
        acc = r.totals.get("n_accepted") or 0
        t.rows.append({**_base(r), **_speed_cells(r), "notes": _notes(t, r),
                       "relaxed_share": (r.totals.get("n_relaxed") or 0) / acc if acc else None,
                       **{f"q:{m}": r.quality.get(m) for m in metrics}})
    return t


def fidelity_table(runs: list[Run]) -> Table:
    t = Table("Table 3", "Fidelity to ar vs θ: share of samples whose output tokens equal ar's (same target and "
              "settings), median first diverging token over the samples that differ, and mean sentence chrF of "
              f"the output text against ar's. sd is lossless (100% identical under greedy decoding). "
              f"{R.TAU_DEFINITION}. {R.SPEEDUP_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""),
               ("label", "method", ""), ("theta", "θ", "g"), ("n_compared", "n compared", "d"),
               ("pct_identical", "identical to ar (%)", ".1f"),
               ("median_first_divergence", "median first divergence (token)", "g"),
               ("mean_chrf_to_ar", "mean chrF to ar", ".1f"), ("tau", "τ", ".2f"),
               ("speedup", "speedup (×)", ".2f"), ("notes", "notes", "")])
    for r in runs:
        if r.method == "ar" or not r.fidelity:
            continue
        agg = r.fidelity.get("aggregate") or {}
        t.rows.append({**_base(r), **_speed_cells(r), "n_compared": agg.get("n"),
                       "pct_identical": agg.get("pct_identical"),
                       "median_first_divergence": agg.get("median_first_divergence"),
                       "mean_chrf_to_ar": agg.get("mean_chrf_to_ar"), "notes": _notes(t, r)})
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


def all_tables(runs: list[Run], theta: float = DEFAULT_THETA) -> dict[str, Table]:
    return {"main": main_table(runs, theta), "theta": theta_table(runs), "fidelity": fidelity_table(runs),
            "acceptance": acceptance_table(runs)}


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
