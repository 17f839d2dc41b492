"""Study mode (``study.batch_size``): quality from batched decoding of every sample, speed from batch-size-1
interleaved timing of the first samples, greedy lossless methods only timed (their tokens asserted equal to ar's);
records carry their phase, both phases resume, and the report joins them (``study_table``) without mixing."""
from __future__ import annotations

import json
from pathlib import Path

from mars_bench.report import load_frames
from mars_bench.cli.report import main as report_main
from mars_bench.report.frames import study_groups
from mars_bench.store.pack import pack
from mars_bench.report.tables import study_table
from mars_bench.run.study import identity_problem

from .test_interleaved import cli

STUDY = ["+compare=methods", "task=gsm8k", "limit=6", "max_new_tokens=12", "study.batch_size=3",
         "study.timed_min=2", "study.timed_max=4"]


def runs(root: Path) -> dict:
    """(head, batch size) -> records of every run under root."""
    out = {}
    for f in root.rglob("samples.jsonl"):
        spec = json.loads((f.parent / "run.json").read_text())
        recs = [json.loads(line) for line in f.read_text().splitlines()]
        out[(recs[0]["method"], spec["batch_size"])] = recs
    return out


def test_study_phases_records_resume_and_table(tmp_path):
    res = cli(*STUDY, f"results_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    got = runs(tmp_path)
    # quality phase: every sample, batched, ar and mars only (greedy sd's tokens are ar's)
    assert sorted(k for k in got if k[1] == 3) == [("ar", 3), ("mars", 3)]
    assert all(len(got[k]) == 6 and {r["phase"] for r in got[k]} == {"quality"} for k in got if k[1] == 3)
    # timed phase: batch size 1, all three methods, the same first samples, between timed_min and timed_max
    timed = {k: v for k, v in got.items() if k[1] == 1}
    assert sorted(timed) == [("ar", 1), ("mars", 1), ("sd", 1)]
    n_timed = {len(v) for v in timed.values()}
    assert len(n_timed) == 1 and 2 <= n_timed.pop() <= 4
    assert all({r["phase"] for r in v} == {"timed"} and {r["timing"] for r in v} == {"interleaved"}
               for v in timed.values())
    ids = [r["index"] for r in timed[("ar", 1)]]
    assert sorted(ids) == list(range(len(ids)))                 # the first samples of the set
    # batched quality tokens = batch-size-1 tokens on the timed samples; greedy sd = ar
    for head in ("ar", "mars"):
        q = {r["id"]: r["turns"][0]["output_ids"] for r in got[(head, 3)]}
        assert all(q[r["id"]] == r["turns"][0]["output_ids"] for r in timed[(head, 1)]), head
    ar = {r["id"]: r["turns"][0]["output_ids"] for r in timed[("ar", 1)]}
    assert all(ar[r["id"]] == r["turns"][0]["output_ids"] for r in timed[("sd", 1)])

    frames = load_frames(tmp_path)
    assert set(frames.runs["phase"]) == {"quality", "timed"}
    table = study_table(frames.runs)
    rows = {r["method"]: r for r in table.rows}
    assert sorted(rows) == ["ar", "mars", "sd"]
    mars = rows["mars"]
    assert rows["ar"]["n_quality"] == 6 and mars["n_quality"] == 6
    assert rows["sd"]["n_quality"] is None and rows["sd"]["source"].startswith("not decoded: ar's")   # only timed
    assert rows["sd"]["n_timed"] == len(ids) and rows["sd"]["speedup"] is not None
    assert rows["ar"]["metric"].startswith("accuracy") and rows["ar"]["quality"] is not None
    assert rows["sd"]["quality"] == rows["ar"]["quality"]        # sd's quality is ar's (its tokens are)
    assert mars["p_d_ar"] is not None or mars["d_ar"] is not None
    assert rows["sd"]["d_ar"] is None and rows["sd"]["identical"] == 100.0
    timed_mars = frames.runs[(frames.runs["phase"] == "timed") & (frames.runs["label"] == mars["label"])].iloc[0]
    quality_mars = frames.runs[(frames.runs["phase"] == "quality") & (frames.runs["method"] == "mars")].iloc[0]
    assert mars["speedup"] == timed_mars["speedup"] and mars["tau"] == quality_mars["tau"]   # each from one phase
    assert "Table 7" in table.to_markdown() and "n timed" in table.to_markdown()

    joined = study_groups(frames.runs)
    assert len(joined) == 1
    g = next(iter(joined.values()))
    jm = g[g["method"] == "mars"].iloc[0]
    assert jm["speedup"] == timed_mars["speedup"] and jm["tau"] == quality_mars["tau"] and jm["n_timed"] == len(ids)
    # packed (what results/study.tar.xz is), the report recomputes the same table from the pack alone
    packed = tmp_path.parent / f"{tmp_path.name}-study.tar.xz"
    members = pack(tmp_path, packed)
    assert len(members) == 5 * 4 and all(Path(m).name in ("run.json", "samples.jsonl", "summary.json", "config.yaml")
                                         for m in members)
    assert report_main([str(packed), "--out", str(tmp_path.parent / "rep"), "--no-figures"]) == 0
    assert (tmp_path.parent / "rep" / "tables" / "study.md").read_text() == table.to_markdown()
    first = packed.read_bytes()
    assert pack(tmp_path, packed) == members and packed.read_bytes() == first   # the same bytes each time

    again = cli(*STUDY, f"results_dir={tmp_path}")                # both phases resume: nothing decoded twice
    assert again.returncode == 0, again.stderr
    assert "(0 decodes to do)" in again.stderr + again.stdout
    assert {k: len(v) for k, v in runs(tmp_path).items()} == {k: len(v) for k, v in got.items()}


def test_study_refuses_bad_settings(tmp_path):
    r = f"results_dir={tmp_path}"
    for args, needle in [(["study.batch_size=1"], "study.batch_size=1"),
                         (["study.batch_size=2", "batch_size=2"], "batch_size=2 with study.batch_size"),
                         (["study.batch_size=2", "study.timed_ci=0"], "study.timed_ci=0"),
                         (["study.batch_size=2", "study.timed_min=4", "study.timed_max=2"], "study.timed_max=2"),
                         (["study.batch_size=2", "interleave=[['method=sd'],['method=mars']]"], "without ar")]:
        res = cli("+compare=methods", "limit=2", *args, r)
        assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
    res = cli("study.batch_size=2", r)
    assert res.returncode == 2 and "interleave is empty" in res.stderr
    assert not any(tmp_path.rglob("samples.jsonl"))


def test_identity_problem_names_the_first_differing_sample():
    same = {"a": {"identical": True}, "b": {"identical": True}}
    assert identity_problem(same, 2) is None
    assert "1 of 2 samples differ" in identity_problem({**same, "b": {"identical": False}}, 2)
    assert "(first: b)" in identity_problem({**same, "b": {"identical": False}}, 2)
    assert "only 2 of 3" in identity_problem(same, 3)
