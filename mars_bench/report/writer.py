"""A table as data: ``Table.data`` holds the raw values (one row per table row, intervals as ``<key>_lo`` /
``<key>_hi``), ``Table.columns`` what is shown and how; pandas writes it as markdown (tabulate), CSV and
LaTeX. Cells are formatted here only: ``v [lo, hi]`` for a value with its interval, '–' for none.

The CSV and LaTeX carry every column; the markdown (and the HTML page, ``html.py``) show the compact view
(``compact.py``): the columns that answer the table's question (``Table.compact``), the rows split by model pair,
task and settings, each block under one line naming them."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import pandas as pd

from mars_bench.report.columns import val
from mars_bench.report.compact import markdown, md_table, note_numbers

ARROW = {"higher": "↑", "lower": "↓"}
_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "θ": r"$\theta$", "τ": r"$\tau$",
        "↑": r"$\uparrow$", "↓": r"$\downarrow$", "×": r"$\times$", "≤": r"$\le$", "–": "--", "→": r"$\to$",
        "Δ": r"$\Delta$", "<": r"$<$", ">": r"$>$", "⚠": r"(!)"}


def tex(s) -> str:
    return "".join(_TEX.get(c, c) for c in str(s))


def fmt_cell(v, fmt: str, lo=None, hi=None) -> str:
    """fmt '.2f[]': the value and its interval; 'sig[]': the same with the decimals that give the largest of value
    and bounds three significant digits (3 decimals below 1, 2 below 10, 1 below 100, else none: a BLEU of 24.6
    and an accuracy of 0.312 alike); 'p': a p-value; 'd': a count; '' or text: as is."""
    if v is None or (isinstance(v, str) and v == ""):
        return "–"
    number = isinstance(v, numbers.Real) and not isinstance(v, bool) and type(v).__name__ != "bool_"
    if not (fmt and number):
        return str(v)
    if fmt == "p":
        return "<0.001" if v < 0.001 else format(v, ".3f")
    if fmt == "d":
        return format(int(v), "d")
    if fmt == "sig[]":
        top = max(abs(x) for x in (v, lo, hi) if x is not None)
        fmt = f".{next((d for d, bound in ((3, 1), (2, 10), (1, 100)) if top < bound), 0)}f[]"
    if fmt.endswith("[]"):
        f = fmt[:-2]
        return format(v, f) + (f" [{format(lo, f)}, {format(hi, f)}]" if lo is not None and hi is not None else "")
    return format(v, fmt)


def ci(src: str, dst: str | None = None) -> dict:
    """A column and its interval columns, renamed to ``dst`` (a ``select`` / ``cells`` mapping)."""
    dst = dst or src
    return {src: dst, f"{src}_lo": f"{dst}_lo", f"{src}_hi": f"{dst}_hi"}


def select(runs: pd.DataFrame, names: dict) -> pd.DataFrame:
    """The frame's columns ``names`` (frame column -> table key), renamed; absent ones empty."""
    return runs.reindex(columns=list(names)).rename(columns=names)


def cells(runs: pd.DataFrame, metrics, names: dict) -> pd.DataFrame:
    """Per run the columns of a metric: ``names`` maps a frame column with ``{m}`` in it to a table key;
    ``metrics``: one metric per run (None: empty cells), or one metric for all."""
    ms = metrics if isinstance(metrics, list) else [metrics] * len(runs)
    rows = [r for _, r in runs.iterrows()]
    return pd.DataFrame({key: [val(r, pat.format(m=m)) if m else None for r, m in zip(rows, ms)]
                         for pat, key in names.items()}, index=runs.index)


@dataclass
class Table:
    name: str
    caption: str
    columns: list[tuple[str, str, str]]      # (key, header, format); format '' = text
    data: pd.DataFrame = field(default_factory=pd.DataFrame)
    footnotes: list[str] = field(default_factory=list)
    compact: list[str] | None = None         # the keys the markdown and HTML show (None: every column)
    same: list[tuple[str, str]] = field(default_factory=list)   # (key, kept): key left out where equal to kept
    aside: tuple[str, ...] = ()              # long text keys listed under the markdown table, not in it
    hoist: tuple[str, ...] = ("metric",)     # keys named above a block (not a column) when one value in it
    brief: dict[str, str] = field(default_factory=dict)   # key -> its format in the compact view (e.g. no CI)
    short: dict[str, str] = field(default_factory=dict)   # key -> its header in the compact view

    @property
    def empty(self) -> bool:
        return self.data.empty

    def footnote(self, text: str) -> int:
        """The footnote's number (1-based), added when new."""
        if text not in self.footnotes:
            self.footnotes.append(text)
        return self.footnotes.index(text) + 1

    @property
    def rows(self) -> list[dict]:
        """The raw values, one dict per row (None where empty)."""
        return [{k: val(r, k) for k in self.data.columns} for _, r in self.data.iterrows()]

    def cell(self, row, key: str, fmt: str) -> str:
        return fmt_cell(val(row, key), fmt, val(row, key + "_lo"), val(row, key + "_hi"))

    def shown(self, escape=str) -> pd.DataFrame:
        """The cells as shown, one column per shown key ('–' in every cell of an empty table)."""
        body = [[escape(self.cell(r, k, f)) for k, _, f in self.columns] for _, r in self.data.iterrows()]
        return pd.DataFrame(body or [["–"] * len(self.columns)], columns=[k for k, _, _ in self.columns])

    def to_markdown(self, compact: bool = True, caption: str | None = None) -> str:
        """The caption (``caption``: another text, e.g. without the definitions), the table and its footnotes;
        ``compact``: the compact view (``compact.py``), else every column in one table."""
        if compact:
            body = markdown(self)
        else:
            body = md_table(self.shown(), self.columns)
        notes = [f"[{i + 1}] {n}" for i, n in enumerate(self.footnotes)]
        head = f"**{self.name}.** {self.caption if caption is None else caption}"
        return "\n".join([head, "", body, ""] + notes).rstrip() + "\n"

    def cells(self, keys: list[str], brief: bool = False) -> list[list[str]]:
        """The shown cells of ``keys`` (each with its format, ``brief``: the compact view's), one list per row."""
        fmt = {k: f for k, _, f in self.columns} | (self.brief if brief else {})
        return [[self.cell(r, k, fmt[k]) for k in keys] for _, r in self.data.iterrows()]

    def to_csv(self) -> str:
        keys = [x for k, _, f in self.columns for x in ([k, k + "_lo", k + "_hi"] if f.endswith("[]") else [k])]
        df = self.data.reindex(columns=keys)
        if "notes" in df:   # the footnotes' text, not their markers
            df["notes"] = [self._note_text(v) for v in df["notes"]]
        return df.to_csv(index=False, lineterminator="\n")

    def notes_of(self, marks) -> list[str]:
        """The footnotes a row's markers (``note_marks``) point to."""
        return [self.footnotes[i - 1] for i in note_numbers(marks)]

    def _note_text(self, marks) -> str:
        return " | ".join(self.notes_of(marks))

    def to_latex(self) -> str:
        out = self.shown(tex).to_latex(
            index=False, escape=False, header=[tex(h) for _, h, _ in self.columns], position="t",
            column_format="".join("l" if f == "" else "r" for _, _, f in self.columns), caption=tex(self.caption),
            label=f"tab:{self.name.lower().replace(' ', '-')}")
        out = out.replace("\\begin{table}[t]\n", "\\begin{table}[t]\n\\centering\n\\small\n", 1)
        if self.footnotes:
            notes = " ".join(f"[{i + 1}] {tex(n)}" for i, n in enumerate(self.footnotes))
            out = out.replace("\\end{tabular}\n", f"\\end{{tabular}}\n\\par\\footnotesize {notes}\n", 1)
        return out

