"""The report a person reads: report.md and report.html by question, sections only where there is data, compact
markdown tables (<= 160 columns on the committed packs), each figure once for the phase it answers, no figure
against θ with one θ. The page in a real browser: tests/test_report_browser.py (marker browser)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from mars_bench.report import all_tables, load_frames, write_report
from mars_bench.report.compact import view
from mars_bench.report.docs import combined_section, section
from mars_bench.report.figures import theta_sensitivity
from mars_bench.report.frames import groups
from mars_bench.report.layout import SECTIONS

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "results"
PACKS = sorted((ROOT / "results" / "study").glob("*.tar.xz"))
TD = "toy-pair_fp32_cpu/gsm8k-v1"


def _table_lines(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("|")]


def test_compact_markdown_fits_160_columns_on_every_committed_pack():
    text = "\n".join([section(p, "cmd") for p in PACKS] + [combined_section(PACKS, "cmd")])
    wide = [line for line in _table_lines(text) if len(line) > 160]
    assert _table_lines(text) and not wide, f"{len(wide)} table lines over 160 columns, first: {wide[:1]}"


def test_the_compact_view_names_shared_settings_once_and_keeps_every_column_in_the_csv(tmp_path):
    t = all_tables(load_frames(FIX))["main"]
    md = t.to_markdown()
    assert "model pair: **toy-pair_fp32_cpu** · task: **gsm8k-v1**" in md and "every method but ar: **k=2**" in md
    header = _table_lines(md)[0]
    assert "model pair" not in header and "| method " in header and "speedup" in header
    csv_header = t.to_csv().splitlines()[0].split(",")
    assert {"model", "task", "settings", "speedup_authors", "tau_authors", "truncated"} <= set(csv_header)
    assert "speedup, authors' formula" in t.to_markdown(compact=False)


def test_equal_columns_and_equal_tests_are_shown_once():
    """A column equal to its pair in every row, and a test equal in every number to an earlier metric's (BLEU over
    raw and normalized text), are left out of the compact view and named once under it."""
    frames = load_frames(FIX)
    q = all_tables(frames)["quality"]
    first = q.data.iloc[0]
    twin = first.copy()
    twin["metric"] = first["metric"] + "_raw"
    import pandas as pd

    q.data = pd.DataFrame([first, twin]).reset_index(drop=True)
    from mars_bench.report.tables import _mark_equal_tests

    _mark_equal_tests(q.data)
    v = view(q)
    assert sum(len(b.rows) for b in v.blocks) == 1
    assert (first["metric"] + "_raw", first["metric"]) in v.equal
    theta = all_tables(frames)["theta"]
    theta.data["speedup_no_budget"] = theta.data["speedup"]
    for x in ("_lo", "_hi"):
        theta.data["speedup_no_budget" + x] = theta.data["speedup" + x]
    shown = [h for b in view(theta).blocks for _, h, _ in b.columns]
    assert "w/o budget hits (×)" not in shown
    assert ("speedup without budget hits (×)", "speedup (×)") in view(theta).equal
    theta.data.loc[0, "speedup_no_budget"] = 99.0
    assert "w/o budget hits (×)" in [h for b in view(theta).blocks for _, h, _ in b.columns]


def test_sections_only_where_there_is_data(tmp_path):
    res = write_report(FIX, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    html = (tmp_path / "rep" / "report.html").read_text()
    heads = re.findall(r"^## (.+)$", md, flags=re.M)
    assert heads == ["Problems (lines skipped)", "Definitions", "Speed", "Quality", "θ", "Fidelity"]   # no claims:
    # no study; the fixture holds a truncated line, said first
    assert md.count("tau = mean tokens committed per target verification forward") == 1   # defined once
    for key, title, *_ in SECTIONS:
        assert (f'<section id="{key}">' in html) == (title in heads), key
    for name, t in res["tables"].items():   # an empty table is no file and no section
        assert (tmp_path / "rep" / "tables" / f"{name}.csv").exists() == (not t.empty), name
        assert (f"**{t.name}.**" in md) == (not t.empty) or name in ("paper_ours", "paper_authors"), name
    assert "| – | – |" not in md
    assert "data:image/png;base64," in html and "src=\"figures/" not in html   # self-contained


def test_a_theta_figure_needs_two_thetas(tmp_path):
    root = tmp_path / "r"
    shutil.copytree(FIX, root)
    for d in root.rglob("mars-k2-th0.8-*"):
        shutil.rmtree(d)
    frames = load_frames(root)
    (group,) = [g for g in groups(frames.runs).values() if (g["method"] == "mars").any()]
    assert theta_sensitivity(group) is None
    res = write_report(root, tmp_path / "rep")
    names = [d.name for d in res["drawn"]]
    assert "theta_sensitivity" not in names and "fidelity_vs_theta" not in names and "speedup_tau" in names
    full = load_frames(FIX)
    (two,) = [g for g in groups(full.runs).values() if (g["method"] == "mars").any()]
    assert theta_sensitivity(two) is not None


def test_a_studys_figures_are_drawn_once_for_the_phase_that_answers_them():
    pack = next(p for p in PACKS if p.name == "wmt19.tar.xz")
    from mars_bench.store.pack import unpacked
    from mars_bench.report.layout import draw

    with unpacked(pack) as root:
        frames = load_frames(root)
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        drawn = draw(frames, out)
        names = [d.name for d in drawn]
        assert len(names) == len(set(names)), names          # one settings group per phase: each kind once
        assert set(names) >= {"speedup_tau", "theta_sensitivity", "acceptance_by_depth", "fidelity_vs_theta"}
        for d in drawn:
            joined = d.name in ("speedup_tau", "theta_sensitivity", "rules_frontier")
            assert ("phases joined" in d.caption) == joined and ("quality phase" in d.caption) != joined, d
            assert all(p.is_file() for p in d.paths)


def test_footnotes_every_row_points_to_are_named_once_above_the_block():
    """A footnote on every row of a block (the machine a phase was timed on, its contention check) is named once in
    the block's line; each row keeps its own markers and its '⚠'; the CSV keeps every footnote of every row."""
    import pandas as pd

    from mars_bench.report.compact import _common_notes, note_numbers
    from mars_bench.report.writer import Table

    assert note_numbers("⚠ [2,3,5-7,10]") == [2, 3, 5, 6, 7, 10] and note_numbers("") == note_numbers("–") == []
    assert _common_notes(["⚠ [1-3]", "[2,3,5]"]) == [2, 3] and _common_notes(["[2,3]"]) == []
    t = Table("T", "c", [("label", "method", ""), ("notes", "notes", "")])
    t.footnotes = ["machine", "contention", "dirty", "other"]
    t.data = pd.DataFrame({"label": ["ar", "sd k=4", "mars θ=0.9 k=4"], "notes": ["[1,2]", "⚠ [1-3]", "[1,2,4]"]})
    md = t.to_markdown()
    assert "notes on every row: **[1,2]**" in md
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in _table_lines(md)[2:]}
    assert rows == {"ar": "", "sd": "⚠ [3]", "mars θ=0.9": "[4]"}, rows
    assert t.to_csv().splitlines()[2].endswith("machine | contention | dirty")
    single = Table("T", "c", t.columns, t.data.iloc[:1].copy(), list(t.footnotes))
    assert "on every row" not in single.to_markdown() and "[1,2]" in single.to_markdown()


def test_a_claims_block_names_the_words_its_methods_share_once():
    """A claim's method (its words before ': ') loses the words every method of the block has and, on the claims that
    name a lossy method or a θ sweep (the table's hidden '_relaxed'), the words only those have; named once above."""
    import pandas as pd

    from mars_bench.report.writer import Table

    t = Table("Claims", "c", [("claim", "claim", ""), ("verdict", "verdict", "")])
    t.data = pd.DataFrame({"claim": ["sd k=4 q4: faster than ar", "mars k=4 ratio margin q4: τ rises as θ falls",
                                     "mars θ=0.9 k=4 ratio margin q4: faster than sd k=4 q4"],
                           "verdict": ["resolved"] * 3, "_relaxed": [False, True, True]})
    md = t.to_markdown()
    assert "every method but ar: **k=4 q4**" in md and "every θ row: **ratio margin**" in md, md
    cells = [line.split("|")[1].strip() for line in _table_lines(md)[2:]]
    assert cells == ["sd: faster than ar", "mars: τ rises as θ falls", "mars θ=0.9: faster than sd k=4 q4"]
    assert "_relaxed" not in t.to_csv()


def test_the_compact_view_names_the_relaxed_rows_rule_settings_once():
    from mars_bench.report.compact import _relaxed_flags

    labels = ["ar", "eagle3 d5-w4-t16", "sd k=4 draftq4g32", "eagle3_mars θ=0.9 d5-w4-t16 ratio margin"]
    assert _relaxed_flags(labels) == ["ratio", "margin"]                 # the tree shape is eagle3's too: kept
    assert _relaxed_flags(["ar", "mars θ=0.84 ratio margin", "mars θ=0.9 ratio margin"]) == ["ratio", "margin"]
    assert _relaxed_flags(["ar", "mars θ=0.9 ratio margin", "mars θ=0.95"]) == []     # not every θ row has them
    assert _relaxed_flags(["ar", "sd k=4", "mars θ=0.9 k=4"]) == []
    pack = ROOT / "results" / "study" / "eagle3_t1.tar.xz"
    md = section(pack, "cmd")
    assert "every θ row: **ratio margin**" in md and "| eagle3_mars θ=0.9 d5-w4-t16 " in md
    assert " ratio margin |" not in md
