"""A study's tables (study mode: docs/reproduce.md): its two phases joined, each flag computed from the phase its
value comes from.

    study_table(runs)   one row per method (``frames.study_pairs``): quality, Δ vs ar, non-inferiority, τ and the
                        identical-to-ar share from the quality phase (every sample, batched); tokens/s and speedup
                        from the timed phase (batch size 1, the first samples), and the speedup without the samples
                        that hit the token budget in either method beside it. A greedy lossless method is not
                        decoded in the quality phase (its tokens are ar's): its row says so.

Notes (footnotes) per row: where a method not decoded in the quality phase takes its quality from, the quality
run's share of samples cut at max_new_tokens in any turn (k of n, beside ar's quality run, flagged above
TRUNCATION_LIMIT), the timed run's runaway samples (their effect on the speedup), its samples timed under contention
(counted and named, left out of its speedups; flagged) or that contention was not recorded, the machine kind it was
timed on, problems
and restated numbers of either run, and the commit the records were written at ('+dirty': uncommitted changes
in the tree, never shown as the clean commit; a run resumed at other code names each commit, flagged; a row whose
two phases were written at different commits names each phase's, flagged unless they decode alike).
"""
from __future__ import annotations

import pandas as pd

from mars_bench.report.columns import val
from mars_bench.report.frames import headline, is_twin, study_pairs
from mars_bench.report.definitions import (BASE, CI_DEFINITION, NI_DEFINITION, NO_BUDGET_DEFINITION, SPEED_DEFS, TRUNCATION_LIMIT,
                          metric_label, paired_cells)
from mars_bench.report.compact import note_marks
from mars_bench.report.writer import Table, ci

QUALITY_COLUMNS = {**ci("tau"), **ci("pct_identical", "identical")}
SPEED_COLUMNS = {"n": "n_timed", **ci("tokens_per_s"), **ci("speedup"), **ci("speedup_authors"),
                 **ci("speedup_no_budget"), "n_no_budget": "n_no_budget"}


def study_table(runs: pd.DataFrame) -> Table:
    """The study's phases joined, one row per timed run (see the module doc)."""
    t = Table("Table 7", "The study, two phases joined: quality, Δ vs ar, non-inferiority, τ and identical-to-ar "
              "share from batched decoding of every sample (n quality; tokens equal to batch size 1, tested); "
              "tokens/s and speedup from batch-size-1 interleaved timing of the first n timed samples. sd under "
              "greedy decoding is not decoded in the quality phase ('quality from' and its note say so): its tokens "
              "are ar's (asserted on the timed samples), so its quality is ar's and its τ and identical share are "
              "over the timed samples. The speedup without budget hits is over the timed samples (n beside it). "
              "Each truncation note states the share and n of the phase its value comes from. "
              f"{SPEED_DEFS} {NO_BUDGET_DEFINITION}. {NI_DEFINITION}. {CI_DEFINITION}.",
              [("model", "model pair", ""), ("task", "task", ""), ("settings", "settings", ""), ("label", "method", ""),
               ("theta", "θ", "g"), ("source", "quality from", ""), ("n_quality", "n quality", "d"),
               ("metric", "quality metric", ""), ("quality", "quality", ".3f[]"), ("d_ar", "Δ vs ar", ".3f[]"),
               ("p_d_ar", "p vs ar", "p"), ("mde_d_ar", "MDE", ".3f"), ("ni", "NI vs ar", ""),
               ("tau", "τ", ".2f[]"), ("identical", "identical to ar (%)", ".0f"), ("n_timed", "n timed", "d"),
               ("tokens_per_s", "tokens/s (B=1)", ".2f[]"), ("speedup", "speedup (×)", ".2f[]"),
               ("speedup_no_budget", "speedup without budget hits (×)", ".2f[]"),
               ("n_no_budget", "n without budget hits", "d"),
               ("speedup_authors", "speedup, authors' formula (×)", ".2f[]"), ("notes", "notes", "")])
    t.compact = ["model", "task", "settings", "label", "n_quality", "metric", "quality", "d_ar", "p_d_ar", "ni", "tau",
                 "n_timed", "tokens_per_s", "speedup", "notes"]   # the speedup without budget hits: in the note
    t.brief = {"tokens_per_s": ".2f", "quality": "sig[]", "d_ar": "sig[]", "tau": ".2f"}   # τ's CI: csv, full view
    t.short = {"tokens_per_s": "tokens/s", "p_d_ar": "p", "ni": "NI"}
    t.hoist = ("metric", "n_quality", "n_timed")
    by_key = {r["run"]: r for _, r in runs.iterrows()}
    out = []
    for timed, q in study_pairs(runs):
        own = is_twin(timed, q)
        row = {**{v: timed[k] for k, v in BASE.items()}, **_values(q if own else timed, QUALITY_COLUMNS),
               **_values(timed, SPEED_COLUMNS), "source": _source(timed, q, own),
               "n_quality": val(q, "n") if own else None}
        m = headline(q) if q is not None else None
        if q is not None and not m:
            row["metric"] = "none reported (e.g. no judge configured)"
        if m:
            row.update({"metric": metric_label(q, m), **_values(q, ci(f"quality/{m}", "quality"))})
            if own:
                row.update({v: val(q, k.format(m=m)) for k, v in paired_cells("d_ar", "ar").items()})
                ni = val(q, f"vs_ar/{m}/ni_passes")
                row["ni"] = None if ni is None else ("yes" if ni else "no")
        ar_q = by_key.get(val(q, "baseline")) if own else None
        source = [f"{timed['label']}: not decoded in the quality phase, its quality is ar's"
                  + row["source"].removeprefix("not decoded: ar's")] if q is not None and not own else []
        row["notes"] = study_notes(t, timed, q if own else None, ar_q, source)
        out.append(row)
    t.data = pd.DataFrame(out)
    return t


def _values(run, names: dict) -> dict:
    return {v: val(run, k) for k, v in names.items()}


def _source(timed, q, own: bool) -> str | None:
    """Where the row's quality comes from: the method's own quality run, or ar's (not decoded for quality)."""
    if q is None:
        return None
    if own:
        return f"own run, b={val(q, 'batch_size')}"
    same = val(timed, "pct_identical")
    n = val(timed, "n_compared")
    ident = f"; identical on {round(same * n / 100)} of {n} timed" if same is not None and n else ""
    return f"not decoded: ar's{ident}"


def _budget_share(run) -> tuple[int, int, float] | None:
    """(samples cut at max_new_tokens in any turn, samples, share) of one run; None without samples."""
    n, k = val(run, "n"), val(run, "n_budget_any")
    if k is None:
        share = val(run, "truncated")
        k = None if share is None or not n else round(share * n)
    return (int(k), int(n), k / n) if k is not None and n else None


def quality_budget_note(q, ar_q) -> str | None:
    """The quality run's budget cuts when above TRUNCATION_LIMIT: 'k of n (x%)', beside ar's quality run."""
    cut = _budget_share(q)
    if cut is None or cut[2] <= TRUNCATION_LIMIT:
        return None
    base = _budget_share(ar_q) if ar_q is not None else None
    ar = f"; ar's quality run: {base[0]} of {base[1]}" if base else ""
    return (f"{q['tag']} quality phase: {cut[0]} of {cut[1]} samples ({cut[2]:.1%}) stopped at max_new_tokens in "
            f"at least one turn (> {TRUNCATION_LIMIT:.0%}{ar}): its quality includes outputs cut at the token budget")


def timed_budget_note(timed) -> str | None:
    """The timed run's runaway samples: how many, and where the speedup without them is."""
    cut, dropped = _budget_share(timed), val(timed, "n_budget_dropped")
    if not dropped and (cut is None or cut[0] == 0):
        return None
    cuts = (f"{cut[0]} of {cut[1]} samples ({cut[2]:.0%}) stopped at max_new_tokens in at least one turn" if cut
            else "samples hit the budget")
    clean, lo, hi = (val(timed, f"speedup_no_budget{x}") for x in ("", "_lo", "_hi"))
    without = "" if clean is None else f": {clean:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None
                                                             else "") + f" over n = {val(timed, 'n_no_budget')}"
    return (f"{timed['tag']} timed phase: {cuts}; {dropped or 0} of its {val(timed, 'n')} speed pairs hit the budget "
            f"in it or in ar: its speedup includes them, the speedup without budget hits leaves them out{without}")


def contention_notes(timed) -> tuple[list[str], list[str]]:
    """(flagged, plain) notes on how a timed run was timed: its samples timed under contention (counted and named;
    left out of every speedup, ``metrics.speed_pairs``), or that its records do not say (written before contention
    was measured: its speedups may include samples timed on a busy machine), or that none was flagged; and the
    machine kind it ran on."""
    kind = [f"timed phase on {val(timed, 'machine_kind')}"] if val(timed, "machine_kind") else []
    seen, k = val(timed, "contention"), val(timed, "n_contended")
    if seen == "not recorded":
        return [], kind + ["contention not recorded (records written before it was measured, docs/timing.md): "
                           "these speedups may include samples timed on a busy machine"]
    if seen == "partly recorded":
        kind.append("contention recorded for only part of the timed samples (a run resumed across the change): "
                    "the rest may have been timed on a busy machine")
    if k:
        return [f"{timed['tag']} timed phase: {k} of {val(timed, 'n')} samples timed under contention "
                f"(docs/timing.md), left out of its speedups: {val(timed, 'contended')}"], kind
    if seen == "recorded":
        kind.append("contention recorded on every timed sample, none flagged (docs/timing.md)")
    return [], kind


def one_decoding(commit: str | None) -> bool:
    """Whether the comma-separated commits of a run (``frames.record_commits``) all decode alike, as git in this
    checkout tells (``provenance.same_code``); False where it cannot tell (a commit it lacks, a dirty tree)."""
    from mars_bench.store.provenance import same_code

    commits = (commit or "").split(", ")
    return len(commits) > 1 and all(same_code(c, against=commits[0]) for c in commits[1:])


def flags_commit(commit: str | None) -> bool:
    """Whether a run's commits earn ⚠: a dirty tree, or commits whose decoding code differs (or cannot be
    compared here)."""
    return bool(commit) and ("+dirty" in commit or (", " in commit and not one_decoding(commit)))


def commit_note(commit: str | None) -> str:
    """The footnote naming the code a run's records were decoded at (``frames.record_commits``: one commit, or
    several, comma-separated, when the run was resumed at other code)."""
    if not commit:
        return "records without a recorded commit"
    if ", " in commit:
        if one_decoding(commit):
            return (f"records written at {len(commit.split(', '))} commits ({commit}) of the same decoding code (no "
                    "change between them in shards.DECODING's paths): one run's decoding, resumed after a commit")
        return (f"records written at {len(commit.split(', '))} commits ({commit}): the run was resumed at other code, "
                f"so its samples are not one commit's decoding")
    if commit.endswith("+dirty"):
        return (f"records written at {commit}: the tree had uncommitted changes, so the code is not exactly commit "
                f"{commit.removesuffix('+dirty')[:7]}")
    return f"records written at commit {commit}"


def phase_commit_notes(by_phase: dict) -> tuple[list[str], list[str]]:
    """The commit footnotes of a study row (flagged ones first, then the rest) from its phases' commits
    (``{"quality": ..., "timed": ...}`` for the phases the row has; None where the records name no commit). Phases
    at one commit share one note; phases at different commits are named each, and flagged unless all their commits
    decode alike (``one_decoding``)."""
    one = len(set(by_phase.values())) <= 1
    notes = {commit_note(c) if one else f"{ph} phase: {commit_note(c)}": flags_commit(c) for ph, c in by_phase.items()}
    warn, items = [n for n, flag in notes.items() if flag], [n for n, flag in notes.items() if not flag]
    union = ", ".join(sorted({x for c in by_phase.values() if c for x in c.split(", ")}))
    if not one and not warn and flags_commit(union):
        warn.append(f"its phases were decoded at different code ({'; '.join(map(str, by_phase.values()))}): the row "
                    "joins quality and speed of different decoding")
    return warn, items


def study_notes(table: Table, timed, q, ar_q, items: list[str] | None = None) -> str:
    """Footnote markers of a study row (see the module doc) after ``items``; ⚠ for problems, budget flags and a
    dirty tree."""
    warn, items = [], list(items or [])
    for run in [r for r in (q, timed) if r is not None]:
        problems = val(run, "problems", [])
        if problems:
            warn.append(f"{len(problems)} problem(s) in {run['tag']}: " + "; ".join(problems))
        items += [f"{run['tag']}: {n}" for n in val(run, "notes", []) if not n.startswith("no speedup")]
        machines = val(run, "machines") or []
        if len(machines) > 1:
            items.append(f"{run['tag']}: decoded on {len(machines)} machines ({'; '.join(machines)})")
    quality_cut = quality_budget_note(q, ar_q) if q is not None else None
    warn += [quality_cut] if quality_cut else []
    timed_cut = timed_budget_note(timed)
    warn += [timed_cut] if timed_cut else []
    busy, quiet = contention_notes(timed)
    warn, items = warn + busy, items + quiet
    warn_c, items_c = phase_commit_notes({ph: val(r, "commit") for ph, r in (("quality", q), ("timed", timed))
                                          if r is not None})
    warn, items = warn + warn_c, items + items_c
    marks = [table.footnote(text) for text in warn + items]
    return note_marks(marks, bool(warn))
