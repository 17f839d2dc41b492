"""The compact view of a ``Table`` (what the markdown and the HTML page show; the CSV and LaTeX keep every column).

    blocks(table)     the table's rows split by model pair, task and settings (``CONTEXT``), in their order, each
                      block named by those values once (a line above it, not three columns repeated in every row),
                      with the table's compact columns (``Table.compact``; every column when None; headed by
                      ``Table.short`` where it names a shorter header) less
                      - the context columns, and a ``Table.hoist`` column (e.g. the quality metric) with one value
                        in the block besides '–': named in the block's line instead (a row's '–' there is
                        said by its footnote, e.g. a method not decoded in the quality phase);
                      - a column '–' in every row of the block (nothing to read);
                      - a column equal in every row to the one it is paired with in ``Table.same`` (e.g. the
                        speedup without budget hits where no sample hit the budget), and a row whose data names
                        the row it equals in ``_same_as`` (a pair of labels, e.g. bleu_raw's test when it is
                        bleu's): said once under the table;
                      - the words every method's label shares (k=4, a draft quantization; not θ): named once;
                        so are the words after θ that every θ row's label has and no other has (a rule's
                        settings, e.g. 'ratio margin'); the method a claim names (its words before ': ') alike,
                        the table's hidden '_relaxed' saying which claims name a lossy method or θ sweep;
                      - the footnotes every row of the block points to (the machine a phase was timed on, its
                        contention check): named once, the rows keep their own (and their '⚠');
                      - the ``Table.aside`` columns (long text, e.g. a claim's evidence): a row number '#' in the
                        table and the text listed under it, one line per row.
    markdown(table)   the blocks as pipe tables (``md_table``).
A ``table`` is a ``writer.Table`` (which imports this module, so it is not imported here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


CONTEXT = ("model", "task", "settings")
EMPTY = "–"


@dataclass
class Block:
    context: list[tuple[str, str]]            # (header, value) naming the block
    columns: list[tuple[str, str, str]]       # (key, header, format) shown
    rows: list[list[str]]                     # the shown cells
    aside: list[tuple[str, str, str]] = field(default_factory=list)   # (row number, header, text)


@dataclass
class View:
    blocks: list[Block]
    equal: list[tuple[str, str]]              # (header left out, header it equals in every row)


def view(t) -> View:
    """The blocks of ``t`` (module doc)."""
    keys = [k for k, _, _ in t.columns]
    head = {k: h for k, h, _ in t.columns}
    cells = [dict(zip(keys, r)) for r in t.cells(keys, brief=True)]
    shown = [k for k in (t.compact if t.compact is not None else keys) if k in keys]
    equal = [(head[k], head[kept]) for k, kept in t.same if k in shown and kept in shown
             and all(c[k] == c[kept] for c in cells)]
    shown = [k for k in shown if head[k] not in {a for a, _ in equal}]
    same_rows = list(t.data["_same_as"]) if "_same_as" in t.data else [None] * len(cells)
    flags = list(t.data["_relaxed"]) if "_relaxed" in t.data else None   # which rows name a lossy method
    equal += list(dict.fromkeys(tuple(x) for x in same_rows if isinstance(x, (tuple, list))))
    context = [k for k in CONTEXT if k in shown]
    order: dict[tuple, list[int]] = {}
    for i, c in enumerate(cells):
        if not isinstance(same_rows[i], (tuple, list)):   # a row equal to another one shown: said once
            order.setdefault(tuple(c[k] for k in context), []).append(i)
    blocks = []
    for values, idx in order.items():
        hoisted = [k for k in t.hoist if k in shown and k not in context
                   and len({cells[i][k] for i in idx} - {EMPTY}) == 1]
        cols = [k for k in shown if k not in context and k not in hoisted and k not in t.aside
                and any(cells[i][k] != EMPTY for i in idx)]
        aside = [k for k in t.aside if k in shown and any(cells[i][k] != EMPTY for i in idx)]
        named = [(head[k], v) for k, v in zip(context, values)] + [
            (head[k], next(cells[i][k] for i in idx if cells[i][k] != EMPTY)) for k in hoisted]
        key = next((k for k in ("label", "claim") if k in cols), None)   # the cell that names a method first
        subject = {i: _subject(cells[i][key]) for i in idx} if key else {}
        lossy = {i: None if flags is None else bool(flags[i]) for i in subject}
        shared = _shared_flags(list(subject.values()))
        relaxed = [x for x in _relaxed_flags(list(subject.values()), list(lossy.values())) if x not in shared]
        named += [(h, " ".join(w)) for h, w in (("every method but ar", shared), ("every θ row", relaxed)) if w]
        for i in subject:
            gone = set(shared) | (set(relaxed) if _is_lossy(subject[i], lossy[i]) else set())
            words = " ".join(x for x in subject[i].split() if x not in gone)
            cells[i] = {**cells[i], key: words + cells[i][key][len(subject[i]):]}
        common = _common_notes([cells[i]["notes"] for i in idx]) if "notes" in cols else []
        if common:
            named.append((f"{head['notes']} on every row", note_marks(common)))
            for i in idx:
                left = [n for n in note_numbers(cells[i]["notes"]) if n not in common]
                cells[i] = {**cells[i], "notes": note_marks(left, "⚠" in cells[i]["notes"]) or "⚠" * (
                    "⚠" in cells[i]["notes"])}
        columns = ([("#", "#", "d")] if aside else []) + [(k, t.short.get(k, h), f) for k, h, f in t.columns
                                                           if k in cols]
        rows = [([str(i + 1)] if aside else []) + [cells[i][k] for k in cols] for i in idx]
        notes = [(str(i + 1), head[k], cells[i][k]) for i in idx for k in aside if cells[i][k] != EMPTY]
        blocks.append(Block(named, columns, rows, notes))
    return View(blocks, equal)


def _shared_flags(labels: list[str]) -> list[str]:
    """The words after the method's name that every label but ar's has (k=4, a draft quantization, a tree shape),
    when at least two do: named once above the block."""
    words = [x.split()[1:] for x in labels if x not in ("ar", EMPTY)]
    if len(words) < 2:
        return []
    common = set(words[0]).intersection(*words[1:])
    return [x for x in words[0] if x in common and not x.startswith("θ=")]


def _common_notes(marks: list[str]) -> list[int]:
    """The footnotes every row of a block (two or more rows) points to: named once above it."""
    nums = [set(note_numbers(m)) for m in marks]
    return sorted(set.intersection(*nums)) if len(nums) >= 2 else []


def _theta_at(words: list[str]) -> int | None:
    return next((j for j, x in enumerate(words) if x.startswith("θ=")), None)


def _subject(cell: str) -> str:
    """The method a cell names: a label, or a claim's words before ': '."""
    return cell.split(": ", 1)[0]


def _is_lossy(label: str, flag: bool | None) -> bool:
    return _theta_at(label.split()) is not None if flag is None else flag


def _relaxed_flags(labels: list[str], lossy: list | None = None) -> list[str]:
    """The words every relaxed label has (after its θ, or after the method's name for a θ sweep's family) and no
    other label has (a rule's settings, e.g. the authors' 'ratio margin' at T = 1): named once above the block.
    ``lossy``: per label whether it names a lossy method (None: the labels with a θ)."""
    pairs = [(x.split(), _is_lossy(x, f)) for x, f in zip(labels, lossy or [None] * len(labels)) if x != EMPTY]
    after = [w[(_theta_at(w) if _theta_at(w) is not None else 0) + 1:] for w, is_lossy in pairs if is_lossy]
    if not after:
        return []
    others = {x for w, is_lossy in pairs if not is_lossy for x in w}
    common = set(after[0]).intersection(*after[1:]) - others
    return [x for x in after[0] if x in common]


def note_marks(marks, warn: bool = False) -> str:
    """A row's footnote markers in one bracket, sorted, runs as ranges: '⚠ [3,4,6,10-12]' ('⚠' when ``warn``)."""
    nums, parts = sorted(set(marks)), []
    for n in nums:
        if parts and n == parts[-1][1] + 1:
            parts[-1][1] = n
        else:
            parts.append([n, n])
    text = ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in parts)
    return (("⚠ " if warn else "") + f"[{text}]") if nums else ""


def note_numbers(marks) -> list[int]:
    """The footnote numbers of a row's markers (``note_marks``' text: '⚠ [3,4,6,10-12]' -> [3, 4, 6, 10, 11, 12])."""
    if not isinstance(marks, str) or "[" not in marks:   # '', '⚠' or the empty cell '–'
        return []
    nums: list[int] = []
    for part in marks[marks.index("[") + 1:marks.rindex("]")].split(","):
        lo, _, hi = part.strip().partition("-")
        nums += range(int(lo), int(hi or lo) + 1)
    return nums


def blocks(t) -> list[Block]:
    return view(t).blocks


def markdown(t) -> str:
    """The compact view as markdown: per block its line, its table, its aside lines; the equal columns once."""
    v = view(t)
    if not v.blocks:
        return "(no rows)"
    out = []
    for b in v.blocks:
        if b.context:
            out += [" · ".join(f"{h}: **{x}**" for h, x in b.context), ""]
        out += [md_table(pd.DataFrame(b.rows, columns=[k for k, _, _ in b.columns]), b.columns), ""]
        out += [f"- #{n} {h}: {text}" for n, h, text in b.aside] + ([""] if b.aside else [])
    if v.equal:
        out += ["Equal in every row, shown once: " + "; ".join(f"{a} = {b}" for a, b in v.equal)
                + " (every column: the table's csv)."]
    return "\n".join(out).rstrip()


def md_table(shown: pd.DataFrame, columns: list[tuple[str, str, str]]) -> str:
    """A pipe table of shown cells (text left, numbers right aligned)."""
    return shown.map(lambda s: s.replace("|", "\\|")).to_markdown(
        index=False, headers=[h for _, h, _ in columns], disable_numparse=True,
        colalign=["left" if f == "" else "right" for _, _, f in columns])
