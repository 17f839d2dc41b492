"""docs/results.md's study table is what the report makes of the committed records (results/study.tar.xz,
written by `make reproduce`): unpack, load, join the phases, and find every row of the table in docs/results.md."""
from __future__ import annotations

from pathlib import Path

from mars_bench.report import load_frames
from mars_bench.store.pack import unpacked
from mars_bench.report.tables import study_table

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / "results" / "study.tar.xz"


def test_readme_study_table_is_the_reports_reading_of_the_committed_records():
    assert PACK.is_file(), f"{PACK} is missing: run `make reproduce` and commit it"
    with unpacked(PACK) as root:
        frames = load_frames(root)
    assert not frames.problems
    runs = frames.runs
    assert set(runs["phase"]) == {"quality", "timed"}
    table = study_table(runs).to_markdown()
    body = [line for line in table.splitlines() if line.startswith("|") and not line.startswith("|:")]
    results_md = (ROOT / "docs" / "results.md").read_text()
    missing = [line for line in body if line not in results_md]
    assert len(body) > 2 and not missing, (f"docs/results.md lacks {len(missing)} study table line(s), first: "
                                           f"{missing[:1]}")
    # the study's sizes as make reproduce promises them: the authors' 100 WMT19 segments, >= 40 GSM8K questions
    n = {(r["task"], r["phase"]): r["n"] for _, r in runs.iterrows() if r["method"] == "ar"}
    assert n[("wmt19_zh_en", "quality")] == 100 and n[("gsm8k", "quality")] >= 40
