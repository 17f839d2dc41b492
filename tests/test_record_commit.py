"""Every record names the commit of the code that decoded it, so a run resumed at other code says so: its records
carry both commits, and the report's commit column, its footnote and a pack's stamp name both."""
from __future__ import annotations

from mars_bench.run import runner as R
from mars_bench.report import load_frames
from mars_bench.report.docs import provenance
from mars_bench.report.frames import record_commits
from mars_bench.report.study import commit_note, flags_commit
from mars_bench.store.io import read_samples

from .test_cli import tiny_cfg

OLD, NEW = "a" * 40, "b" * 40 + "+dirty"


def test_a_run_resumed_at_other_code_names_both_commits(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "process_commit", lambda: OLD)
    R.run(tiny_cfg(tmp_path, "method=ar", "limit=2"))
    monkeypatch.setattr(R, "process_commit", lambda: NEW)
    R.run(tiny_cfg(tmp_path, "method=ar", "limit=4"))      # resumes the same run: 2 more samples at other code
    [samples] = list(tmp_path.rglob("samples.jsonl"))
    recs, problems = read_samples(samples)
    assert not problems and [r["commit"] for r in recs] == [OLD, OLD, NEW, NEW]
    both = f"{OLD}, {NEW}"
    assert record_commits(recs) == both and record_commits([{"id": "x"}]) is None   # older records name none
    assert provenance(tmp_path)["commits"] == {OLD, NEW}
    assert list(load_frames(tmp_path).runs["commit"]) == [both]
    assert commit_note(both).startswith(f"records written at 2 commits ({both})")
    assert commit_note(OLD) == f"records written at commit {OLD}"


def test_a_run_at_one_commit_names_it_once(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "process_commit", lambda: OLD)
    R.run(tiny_cfg(tmp_path, "method=ar", "limit=2"))
    assert provenance(tmp_path)["commits"] == {OLD}
    assert list(load_frames(tmp_path).runs["commit"]) == [OLD]



def test_a_study_resumed_at_other_code_is_flagged(tmp_path, monkeypatch):
    """A study whose mars quality run holds records of two commits (as a resumed one writes them, above): its row
    is flagged and the footnote names both."""
    import json
    import subprocess
    import sys

    from mars_bench.report.study import study_table

    from .conftest import data_dir
    from .test_cli import ROOT

    subprocess.run([sys.executable, "-m", "mars_bench.cli", "model=tiny", "+compare=methods", "progress=false",
                    "max_new_tokens=16", "limit=4", "study.batch_size=2", "study.timed_min=2", "study.timed_max=2",
                    f"data_dir={data_dir()}", f"results_dir={tmp_path}"], cwd=ROOT, check=True, capture_output=True)
    [samples] = [p for p in tmp_path.rglob("samples.jsonl")
                 if p.parent.name.startswith("mars-") and "-b2-" in p.parent.name]
    recs = [json.loads(x) for x in samples.read_text().splitlines()]
    assert len({r["commit"] for r in recs}) == 1
    for r in recs[2:]:
        r["commit"] = NEW
    samples.write_text("".join(json.dumps(r) + "\n" for r in recs))
    table = study_table(load_frames(tmp_path).runs)
    mars = next(r for r in table.rows if r["method"].startswith("mars"))
    note = f"records written at 2 commits ({', '.join(sorted({recs[0]['commit'], NEW}))})"
    # the quality run's note names its phase (the row's timed run is at one commit)
    assert mars["notes"].startswith("⚠") and any(f.startswith(f"quality phase: {note}") for f in table.footnotes), \
        table.footnotes

    # commits whose decoding code git finds equal (a shard parked, then resumed after a commit to docs): one run's
    # decoding, named without the flag
    import mars_bench.store.provenance as P

    for r in recs[2:]:
        r["commit"] = "c" * 40
    samples.write_text("".join(json.dumps(r) + "\n" for r in recs))
    written = {r["commit"] for r in recs}
    monkeypatch.setattr(P, "same_code", lambda commit, root=None, against=None: {commit, against} <= written)
    table = study_table(load_frames(tmp_path).runs)
    both = ", ".join(sorted(written))
    assert both in set(load_frames(tmp_path).runs["commit"])
    assert flags_commit(both) == recs[0]["commit"].endswith("+dirty")   # a dirty tree is still flagged
    assert flags_commit(f"{OLD}, {NEW}") and flags_commit(NEW) and not flags_commit(OLD)
    note = f"records written at 2 commits ({both}) of the same decoding code"
    assert any(f.startswith(f"quality phase: {note}") for f in table.footnotes), table.footnotes
    assert not any("resumed at other code" in f or "different code" in f for f in table.footnotes), table.footnotes


def test_a_row_whose_phases_are_at_different_commits_names_each_phase(monkeypatch):
    """A study row joins its quality run and its timed run: at one commit they share one note; at different commits
    each phase's is named, and the row is flagged unless git finds their decoding code equal (humaneval's pack:
    quality at 89e9ad7, resumed and timed at 86fd16f)."""
    import mars_bench.store.provenance as P
    from mars_bench.report.study import phase_commit_notes

    a, c = "a" * 40, "c" * 40
    assert phase_commit_notes({"quality": a, "timed": a}) == ([], [commit_note(a)])
    assert phase_commit_notes({"timed": a}) == ([], [commit_note(a)])
    assert phase_commit_notes({"quality": None, "timed": None}) == ([], [commit_note(None)])   # older records
    monkeypatch.setattr(P, "same_code", lambda commit, root=None, against=None: False)
    warn, items = phase_commit_notes({"quality": a, "timed": c})
    assert items == [f"quality phase: {commit_note(a)}", f"timed phase: {commit_note(c)}"]
    assert len(warn) == 1 and warn[0].startswith(f"its phases were decoded at different code ({a}; {c})")
    monkeypatch.setattr(P, "same_code", lambda commit, root=None, against=None: True)
    assert phase_commit_notes({"quality": a, "timed": c}) == ([], items)
    # a dirty phase is flagged as such, once, whatever git says of the others
    warn, items = phase_commit_notes({"quality": NEW, "timed": c})
    assert warn == [f"quality phase: {commit_note(NEW)}"] and items == [f"timed phase: {commit_note(c)}"]
