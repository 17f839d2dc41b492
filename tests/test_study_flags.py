"""Every flag of the study table, recomputed from the committed records (results/study.tar.xz and each shard's
pack, results/study/<name>.tar.xz) by code apart from the report's: the samples.jsonl and summary.json files read as plain JSON. Truncation from the phase the quality
comes from, rows not decoded said so, the commit as recorded (dirty shown as such), the speedup without the
samples that hit the budget beside the headline."""
from __future__ import annotations

import functools
import json
import re
import tarfile
from pathlib import Path

import pytest

from mars_bench.report import load_frames
from mars_bench.store.pack import unpacked
from mars_bench.report.study import study_table
from mars_bench.report.tables import TRUNCATION_LIMIT

RESULTS = Path(__file__).resolve().parent.parent / "results"
PACK = RESULTS / "study.tar.xz"                                       # make reproduce's
ALL_PACKS = [PACK, *sorted((RESULTS / "study").glob("*.tar.xz"))]     # and every committed shard's
NOT_STUDY = {"trees.tar.xz"}    # the T = 1 tree arm runs sampled trees, not study mode: no study table (shards.py)
PACKS = [p for p in ALL_PACKS if p.name not in NOT_STUDY]


def _raw(pack: Path) -> dict:
    """run dir (task dir/run dir) -> {'spec', 'records', 'summary'} read straight from the pack."""
    out: dict = {}
    with tarfile.open(pack, "r:xz") as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) < 4 or not m.isfile():
                continue
            key, text = "/".join(parts[1:3]), tar.extractfile(m).read().decode()
            run = out.setdefault(key, {})
            if parts[3] == "samples.jsonl":
                run["records"] = [json.loads(line) for line in text.splitlines() if line.strip()]
            elif parts[3] in ("run.json", "summary.json"):
                run[parts[3].split(".")[0]] = json.loads(text)
    return out


@functools.lru_cache(maxsize=None)
def _load(pack: Path):
    assert pack.is_file(), f"{pack} is missing: run `make reproduce` and commit it"
    with unpacked(pack) as root:
        frames = load_frames(root)
    return frames, study_table(frames.runs), _raw(pack)


@pytest.fixture(params=PACKS, ids=lambda p: p.name)
def committed(request):
    return _load(request.param)


@pytest.mark.parametrize("pack", ALL_PACKS, ids=lambda p: p.name)
def test_a_pack_has_a_study_table_unless_it_is_a_tree_arm(pack):
    frames, table, raw = _load(pack)
    assert raw and not frames.runs.empty
    assert table.data.empty == (pack.name in NOT_STUDY)


@pytest.fixture
def study():
    """make reproduce's pack only: the tests whose expectations are that study's findings."""
    return _load(PACK)


def _hit(rec: dict) -> bool:
    return any(t["stop_reason"] == "max_new_tokens" for t in rec["turns"])


def _by_tag(raw: dict, task_dir: str, tag: str) -> dict:
    found = [r for k, r in raw.items() if k.startswith(task_dir + "/") and k.split("/")[1].startswith(tag + "@")]
    assert len(found) == 1, (task_dir, tag)
    return found[0]


def _timed(frames, row) -> tuple[str, str]:
    """(tag, ar's tag) of a study row's timed run."""
    runs = frames.runs
    t = runs[(runs["task_dir"] == row["task"]) & (runs["phase"] == "timed") & (runs["label"] == row["label"])].iloc[0]
    base = runs[runs["run"] == t["baseline"]]
    return t["tag"], (base.iloc[0]["tag"] if len(base) else t["tag"])   # ar: no baseline but itself


def _notes(table, row) -> list[str]:
    return table.notes_of(row["notes"])


def _quality_flags(loaded) -> set:
    """The quality-phase truncation flags the records call for, checked against the table's notes."""
    frames, table, raw = loaded
    runs = frames.runs
    flagged, expected = set(), set()
    for row in table.rows:
        quality = runs[(runs["phase"] == "quality") & (runs["task"] == row["task"].rsplit("-v", 1)[0])
                       & (runs["label"] == row["label"])]
        notes = " | ".join(_notes(table, row))
        if len(quality):
            q = quality.iloc[0]
            recs = _by_tag(raw, row["task"], q["tag"])["records"]
            k, n = sum(map(_hit, recs)), len(recs)   # the budget hit in any turn (MT-Bench: either of two)
            if k / n > TRUNCATION_LIMIT:
                expected.add(q["tag"])
                assert f"{q['tag']} quality phase: {k} of {n} samples" in notes
        flagged |= set(re.findall(r"(\S+) quality phase: \d+ of \d+ samples", notes))
        # never a quality flag worded from the timed phase
        assert "its quality" not in " ".join(x for x in _notes(table, row) if "timed phase" in x)
    assert flagged == expected
    return expected


def test_quality_truncation_flags_come_from_the_quality_phase(committed):
    _quality_flags(committed)


def test_the_study_flags_gsm8k_mars_quality_truncation(study):
    """GSM8K mars θ 0.9's quality run is above the limit in make reproduce's pack (3 of 40)."""
    assert _quality_flags(study)


def test_rows_not_decoded_for_quality_say_so(committed):
    frames, table, raw = committed
    quality_labels = {(r["task_dir"], r["label"]) for _, r in frames.runs.iterrows() if r["phase"] == "quality"}
    rows = table.rows
    assert any(r["method"] == "sd" for r in rows)
    for row in rows:
        decoded = (row["task"], row["label"]) in quality_labels
        assert (row["n_quality"] is not None) == decoded
        assert row["source"].startswith("own run") == decoded
        if not decoded:   # the timed records prove the identity the row states
            tag, ar_tag = _timed(frames, row)
            mine = _by_tag(raw, row["task"], tag)["records"]
            ar = {r["id"]: r for r in _by_tag(raw, row["task"], ar_tag)["records"]}
            same = sum(r["turns"][0]["output_ids"] == ar[r["id"]]["turns"][0]["output_ids"] for r in mine)
            assert row["source"] == f"not decoded: ar's; identical on {same} of {len(mine)} timed"


def test_commit_is_shown_as_recorded(committed):
    _, table, raw = committed
    commits = {r["summary"]["manifest"]["git_commit"] for r in raw.values() if "summary" in r}
    text = " | ".join(table.footnotes)
    for c in commits:
        assert c in text
        if c.endswith("+dirty"):
            assert f"records written at {c}: the tree had uncommitted changes" in text
            assert f"records written at commit {c.removesuffix('+dirty')}" not in text
            assert all(r["notes"].startswith("⚠") for r in table.rows)


def test_speedup_without_budget_hits_recomputed_from_records(committed):
    frames, table, raw = committed
    checked = 0
    for row in table.rows:
        tag, ar_tag = _timed(frames, row)
        mine = _by_tag(raw, row["task"], tag)["records"]
        ar = {r["id"]: r for r in _by_tag(raw, row["task"], ar_tag)["records"]}
        keep = [(r, ar[r["id"]]) for r in mine if r["id"] in ar and not _hit(r) and not _hit(ar[r["id"]])]
        if row["method"] == "ar":   # paired with itself: its runaway samples counted, its speedup 1 either way
            assert row["n_no_budget"] == len(keep) and row["speedup_no_budget"] == 1.0
            if len(keep) < len(mine):
                notes = " | ".join(_notes(table, row))
                assert f"{len(mine) - len(keep)} of its {len(mine)} speed pairs hit the budget" in notes
            continue
        tps = lambda rs: sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)  # noqa: E731
        if not keep:   # every timed pair hit the budget (the eagle3 pack's GSM8K at 128 tokens): no such speedup
            assert row.get("speedup_no_budget") is None and not row.get("n_no_budget")
            checked += 1
            continue
        value = tps([a for a, _ in keep]) / tps([b for _, b in keep])
        assert row["speedup_no_budget"] == pytest.approx(value, rel=1e-9) and row["n_no_budget"] == len(keep)
        if len(keep) < len(mine):   # a runaway sample: flagged on the speed side, with the count
            notes = " | ".join(_notes(table, row))
            assert f"{len(mine) - len(keep)} of its {len(mine)} speed pairs hit the budget" in notes
        checked += 1
    assert checked >= 1


def test_claims_state_only_what_the_intervals_resolve(study):
    from mars_bench.report.claims import claims_table

    frames, table, _ = study
    claims = claims_table(frames.runs).rows
    study = {(r["task"], r["theta"]): r for r in table.rows if r["theta"] is not None}
    trends = [c for c in claims if "as θ falls" in c["claim"]]
    assert trends
    for c in trends:
        key = ("tau" if "τ rises" in c["claim"] else "d_ar" if "loss grows" in c["claim"]
               else "speedup_no_budget" if "budget hits left out" in c["claim"] else "speedup")
        rs = sorted((r for (task, _), r in study.items() if task == c["task"]), key=lambda r: -r["theta"])
        sign = -1 if key == "d_ar" else 1   # a loss grows: Δ falls as θ falls
        lo_end, hi_end = rs[0], rs[-1]      # highest θ, lowest θ
        ends = (hi_end[f"{key}_lo"] > lo_end[f"{key}_hi"]) if sign > 0 else (hi_end[f"{key}_hi"] < lo_end[f"{key}_lo"])
        monotone = all(sign * (b[key] - a[key]) > 0 for a, b in zip(rs, rs[1:]))
        assert c["verdict"].startswith("resolved") == ends, c
        assert ("not monotone" in c["evidence"]) == (not monotone), c
        if not monotone:
            assert c["verdict"] != "resolved at every step"
    loss = [c for c in trends if "loss grows" in c["claim"]]
    assert loss and all(c["verdict"] == "not resolved" for c in loss)   # θ 0.84 loses less than 0.88 / 0.90 here


def test_paper_layout_shows_missing_tasks_as_missing(committed):
    from mars_bench.report.paper import PAPER_TASKS, paper_table

    frames, table, _ = committed
    paper = paper_table(frames.runs)
    present = {t.rsplit("-v", 1)[0] for t in frames.runs["task_dir"]}
    speed = {(r["task"].rsplit("-v", 1)[0], r["label"]): r["speedup"] for r in table.rows}
    for row in paper.rows:
        for task, _ in PAPER_TASKS:
            if task not in present:
                assert row.get(f"{task}/speedup") is None and row.get(f"{task}/tau") is None
            elif row["formula"] == "ours":
                assert row[f"{task}/speedup"] == pytest.approx(speed[(task, row["label"])])
        complete = all(t in present for t, _ in PAPER_TASKS)
        assert (row["mean/speedup"] is not None) == complete


def test_faster_than_sd_is_the_paired_ratio_recomputed_from_records(committed):
    """Each lossy method's 'faster than sd' claim reads its speed over sd on the same timed samples (the methods ran
    interleaved): sum tokens / sum wall of one over the other's, recomputed here from the records; the verdict is
    what its interval says."""
    import math
    from dataclasses import replace

    from mars_bench.report.claims import claims_table, n_to_decide

    frames, table, raw = committed
    runs = frames.runs
    claims = {(c["task"], c["claim"].split(": faster than ")[0]): c for c in claims_table(runs).rows
              if ": faster than " in c["claim"] and not c["claim"].endswith("faster than ar")}
    checked = unpaired = 0
    for _, t in runs[(runs["phase"] == "timed") & runs["relaxed"]].iterrows():
        if t["reference"] is None:   # its study decoded no lossless run of the same drafting (study_trees_t1: the
            want = t["spec"].lossless_reference()   # lossless tree is the best one measured, another shape)
            assert not any(s.lossless and replace(s, batch_size=1) == want for s in runs["spec"]), t["run"]
            assert (t["task_dir"], t["label"]) not in claims and t.get("speedup_vs_sd") is None, t["run"]
            unpaired += 1
            continue
        ref = runs[runs["run"] == t["reference"]]
        assert len(ref) == 1, t["run"]
        mine = {r["id"]: r for r in _by_tag(raw, t["task_dir"], t["tag"])["records"]}
        sd = {r["id"]: r for r in _by_tag(raw, t["task_dir"], ref.iloc[0]["tag"])["records"]}
        both = sorted(mine.keys() & sd.keys())
        tps = lambda rs: sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)  # noqa: E731
        value = tps([mine[i] for i in both]) / tps([sd[i] for i in both])
        assert t["speedup_vs_sd"] == pytest.approx(value, rel=1e-9) and t["n_vs_sd"] == len(both)
        c = claims[(t["task_dir"], t["label"])]
        assert c["n"] == str(len(both)) and f"{value:.2f} [" in c["evidence"]
        lo, hi = t["speedup_vs_sd_lo"], t["speedup_vs_sd_hi"]
        assert c["verdict"] == ("resolved" if lo > 1 else "refuted" if hi < 1 else "not resolved")
        if c["verdict"] == "not resolved":   # the sizing by power, from this interval (claims.n_to_decide)
            need = n_to_decide(len(both), value, lo, hi, 1.0, log=True)
            assert need > len(both) and f"n ~{math.ceil(need):,} if" in c["evidence"], c
        else:
            assert "decided with" not in c["evidence"], c
        checked += 1
    assert checked == len(claims) and checked + unpaired >= 1


def test_a_row_whose_phases_name_different_commits_names_each_phase(committed):
    frames, table, raw = committed
    runs = frames.runs
    for row in table.rows:
        tag, _ = _timed(frames, row)
        timed = {r["commit"] for r in _by_tag(raw, row["task"], tag)["records"] if r.get("commit")}
        quality = runs[(runs["phase"] == "quality") & (runs["task_dir"] == row["task"])
                       & (runs["label"] == row["label"])]
        if not len(quality) or not timed:
            continue
        q = {r["commit"] for r in _by_tag(raw, row["task"], quality.iloc[0]["tag"])["records"] if r.get("commit")}
        notes = " | ".join(_notes(table, row))
        if q != timed:
            assert "quality phase: records written at" in notes and "timed phase: records written at" in notes, notes
        else:
            assert "phase: records written at" not in notes, notes
