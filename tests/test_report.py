"""The report (mars_bench.report) on the hand-made results tree tests/fixtures/results.

The fixture: model dir toy-pair_fp32_cpu, task gsm8k-v1, T=0 p=1 n=8 seed=0, samples q0 q1 q2.
  worker0/  ar (q0 q1 q2) + summary;  sd k=2 (q0 q1 q2) + summary without speedup (ar ran later);
            mars th0.9 (q0 q1) + summary over those 2;  mars th0.8 (q0, a corrupt line 2, q1), no summary
  worker1/  mars th0.9 (q2, then a truncated line 2 without newline: a worker killed mid-write)
Every expected number below is derived by hand from the records (arithmetic in the comments).
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from mars_bench.store import metrics as M
from mars_bench import stats as S
from mars_bench.cli.report import main
from mars_bench.report import all_tables, load_frames, make_figures
from mars_bench.report.columns import paired_test, val
from mars_bench.report.logits import r_values

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "results"
TD = "toy-pair_fp32_cpu/gsm8k-v1"


@pytest.fixture(scope="module")
def frames():
    return load_frames(FIX)


@pytest.fixture(scope="module")
def runs(frames):
    return {r["tag"]: r for _, r in frames.runs.iterrows()}


def missing(v) -> bool:
    """None, NaN or NA: an empty cell of the frame."""
    return val({"v": v}, "v") is None


def test_runs_found_and_merged(runs, frames):
    assert sorted(runs) == ["ar-T0-p1-n8-s0", "mars-k2-th0.8-T0-p1-n8-s0", "mars-k2-th0.9-T0-p1-n8-s0",
                            "sd-k2-T0-p1-n8-s0"]
    m9 = runs["mars-k2-th0.9-T0-p1-n8-s0"]
    assert len(m9["dirs"]) == 2                                   # worker0 + worker1
    assert frames.samples_of(m9)["id"].tolist() == ["q0", "q1", "q2"]  # none lost, none duplicated
    assert (m9["method"], m9["k"], m9["theta"], m9["temperature"], m9["top_p"], m9["max_new_tokens"], m9["seed"]) == \
        ("mars", 2, 0.9, 0.0, 1.0, 8, 0)


def test_ar_numbers(runs):
    ar = runs["ar-T0-p1-n8-s0"]
    # tokens 8 + 6 + 8 = 22 over wall 4 + 2 + 4 = 10 s -> 2.2 tokens/s; one token per forward -> tau 1
    assert ar["new_tokens"] == 22 and ar["tokens_per_s"] == pytest.approx(2.2)
    assert ar["tau"] == pytest.approx(1.0)
    assert ar["quality/accuracy_strict"] == pytest.approx(2 / 3)   # q0, q1 correct, q2 not (summary)
    # the summary covers all 3 samples; it predates intervals, so they are restated from samples
    assert ar["notes"] == ["intervals and tests computed from samples.jsonl by the report (summary.json has none)"]
    # tokens/s per sample 2, 3, 2: a resample of only q1 (prob 1/27 > 2.5%) gives 3, one without q1
    # (prob 8/27) gives 2 -> the 95% percentile interval is [2, 3]
    assert (ar["tokens_per_s_lo"], ar["tokens_per_s_hi"]) == pytest.approx((2.0, 3.0))
    assert missing(ar["tau_lo"]) and "same in every resample" in ar["tau_note"]   # tau = 1
    assert ar["speedup"] == 1.0 and missing(ar["speedup_lo"])                   # ar over itself, by definition
    assert not any(k.startswith("vs_") and not missing(ar[k]) for k in ar.index)
    stops = {k: ar[f"stop/{k}"] for k in ("max_new_tokens", "eos", "stop_string")}
    assert stops == {"max_new_tokens": 1.0, "eos": 0.0, "stop_string": 0.0} and ar["truncated"] == 1.0  # all cut at 8


def test_sd_speedup_recomputed_from_samples(runs):
    sd = runs["sd-k2-T0-p1-n8-s0"]
    # summary.json has speedup null (sd finished before ar); the ar sibling exists, so it is recomputed:
    # sd tokens 22 over wall 2 + 1.5 + 2 = 5.5 s -> 4.0 tokens/s; speedup 4.0 / 2.2 = 20/11 = 1.8182
    assert sd["speedup"] == pytest.approx(20 / 11)
    # per sample: q0 (8/2)/(8/4) = 2, q1 (6/1.5)/(6/2) = 4/3, q2 (8/2)/(8/4) = 2 -> mean 16/9 = 1.7778
    assert sd["speedup_mean_of_ratios"] == pytest.approx(16 / 9)
    # the authors' ratio of means: sd tokens/s 4, 4, 4 -> 4; ar 2, 3, 2 -> 7/3 (the fixture's ar records have
    # no n_retokenized, so ar's generated counts stand in, and the note says so) -> 4 / (7/3) = 12/7
    assert sd["speedup_authors"] == pytest.approx(12 / 7)
    assert "lack n_retokenized" in sd["speedup_authors_note"]
    # paired bootstrap of the ratio of means: only q1 (prob 1/27) gives 4/3, no q1 (8/27) gives 4/2 = 2
    assert (sd["speedup_authors_lo"], sd["speedup_authors_hi"]) == pytest.approx((4 / 3, 2.0))
    # authors' tau: idx = steps - 1 per turn: 3 + 2 + 3 = 8 -> 22/8; only q1 gives 6/2 = 3, no q1 16/6
    assert sd["tau_authors"] == pytest.approx(22 / 8)
    assert (sd["tau_authors_lo"], sd["tau_authors_hi"]) == pytest.approx((8 / 3, 3.0))
    assert sd["n_common"] == 3
    # paired bootstrap: a resample of only q1 (prob 1/27) gives 4/3, one without q1 (prob 8/27) gives 2
    assert (sd["speedup_lo"], sd["speedup_hi"]) == pytest.approx((4 / 3, 2.0))
    t = paired_test(sd, "vs_ar/accuracy_strict")                  # same answers as ar: no discordant pair
    assert (t["delta"], t["p_value"], t["discordant"], t["n"]) == (0.0, 1.0, [0, 0], 3)
    assert t["mde"] is None and "too small" in t["note"]      # n = 3 cannot see any difference in a share
    assert not any(k.startswith("vs_sd/") for k in sd.index if not missing(sd[k])) and missing(sd["sd_tag"])
    # steps 4 + 3 + 4 = 11 -> tau 22/11 = 2; accepted 4 + 3 + 4 = 11 of 8 + 6 + 8 = 22 proposed -> 0.5
    assert sd["tau"] == pytest.approx(2.0) and sd["acceptance_rate"] == pytest.approx(0.5)
    # depth 1: proposed in 4 + 3 + 4 = 11 steps, accepted where n_accepted >= 1: 3 + 3 + 4 = 10 -> 10/11
    # depth 2: proposed 11, accepted where n_accepted >= 2: q0 step 1 only -> 1/11
    assert sd["acceptance_per_depth"] == pytest.approx([10 / 11, 1 / 11])
    # sd is lossless: every output equals ar's
    assert sd["pct_identical"] == 100.0
    assert missing(sd["median_first_divergence"])
    assert any("recomputed" in n for n in sd["notes"])


def test_mars_merged_totals_recomputed(runs):
    m9 = runs["mars-k2-th0.9-T0-p1-n8-s0"]
    # 3 records (worker0: q0 q1, worker1: q2); worker0's summary covers 2 -> totals from samples
    # tokens 8 + 6 + 8 = 22, steps 3 + 2 + 4 = 9 -> tau 22/9 = 2.4444; wall 1 + 1 + 2 = 4 s -> 5.5 tokens/s
    assert m9["n"] == 3
    assert m9["tau"] == pytest.approx(22 / 9)
    assert m9["tokens_per_s"] == pytest.approx(5.5)
    # speedup 5.5 / 2.2 = 2.5; per sample q0 (8/1)/(8/4) = 4, q1 (6/1)/(6/2) = 2, q2 (8/2)/(8/4) = 2 -> 8/3
    assert m9["speedup"] == pytest.approx(2.5)
    assert m9["speedup_mean_of_ratios"] == pytest.approx(8 / 3)
    # authors': mars tokens/s 8, 6, 4 -> mean 6; ar 2, 3, 2 -> 7/3 -> 18/7; tau: idx 2 + 1 + 3 = 6 -> 22/6
    assert m9["speedup_authors"] == pytest.approx(18 / 7)
    assert m9["tau_authors"] == pytest.approx(22 / 6)
    # accepted 5 + 4 + 4 = 13 of 6 + 4 + 8 = 18 proposed; relaxed 1 (q0) + 1 (q2) = 2
    assert m9["acceptance_rate"] == pytest.approx(13 / 18)
    assert (m9["n_relaxed"], m9["n_exact"]) == (2, 11)
    # depth 1: 3 + 2 + 4 = 9 steps, all accepted -> 1; depth 2: accepted in q0 steps 1-2 and q1 steps 1-2 -> 4/9
    assert m9["acceptance_per_depth"] == pytest.approx([1.0, 4 / 9])
    # fidelity: q0 differs from ar at token 4, q1 identical, q2 differs at token 0
    # -> 1/3 identical = 33.33 %, median first divergence over the 2 divergent = (4 + 0) / 2 = 2
    assert m9["pct_identical"] == pytest.approx(100 / 3) and m9["median_first_divergence"] == 2
    assert m9["n_compared"] == 3 and 0 < m9["mean_chrf_to_ar"] < 100
    # quality stays the summary's (over q0, q1: 1 of 2 correct) and the run says so
    assert m9["quality/accuracy_strict"] == pytest.approx(0.5)
    assert any("summary.json covers 2 samples" in n for n in m9["notes"])
    assert any("merged from 2" in n for n in m9["notes"])
    # speedup per sample 4, 2, 2: only q0 (prob 1/27) gives 4, no q0 (8/27) gives 2 -> [2, 4]
    assert (m9["speedup_lo"], m9["speedup_hi"]) == pytest.approx((2.0, 4.0))
    # strict answers: ar q0 q1 right; mars (3 records) q1 only -> discordant b = 0, c = 1: McNemar p = 1
    t = paired_test(m9, "vs_ar/accuracy_strict")
    assert t["discordant"] == [0, 1] and t["delta"] == pytest.approx(-1 / 3) and t["p_value"] == 1.0
    assert m9["sd_tag"] == "sd-k2-T0-p1-n8-s0" and m9["vs_sd/accuracy_strict/n"] == 3


def test_corrupt_and_truncated_lines_reported_and_skipped(runs, frames):
    m8 = runs["mars-k2-th0.8-T0-p1-n8-s0"]
    assert frames.samples_of(m8)["id"].tolist() == ["q0", "q1"]       # the rest of the file is still read
    assert len(m8["problems"]) == 1 and m8["problems"][0].startswith(
        str(FIX / "worker0" / TD / "mars-k2-th0.8-T0-p1-n8-s0" / "samples.jsonl") + ":2:")
    m9 = runs["mars-k2-th0.9-T0-p1-n8-s0"]
    truncated = FIX / "worker1" / TD / "mars-k2-th0.9-T0-p1-n8-s0" / "samples.jsonl"
    assert m9["problems"] == [f"{truncated}:2: truncated line"]
    # no summary for th0.8: totals from its 2 samples, speedup vs ar on q0, q1:
    # mars 14 tokens / (2 + 1.5) s = 4 tokens/s; ar 14 / (4 + 2) s = 7/3 -> 4 / (7/3) = 12/7 = 1.7143
    assert m8["speedup"] == pytest.approx(12 / 7)
    # the three formulas on the same two samples: ours 12/7 = 1.714 (ratio of total tokens/s); mean of the
    # per-sample ratios (8/2)/(8/4) = 2 and (6/1.5)/(6/2) = 4/3 -> 5/3 = 1.667; the authors' ratio of means:
    # mars tokens/s 4 and 4 -> 4, ar 2 and 3 -> 2.5 -> 4 / 2.5 = 1.600
    assert m8["speedup_mean_of_ratios"] == pytest.approx((2 + 4 / 3) / 2)
    assert m8["speedup_authors"] == pytest.approx(1.6)
    # authors' tau: q0 8 tokens in 3 steps, q1 6 in 2 -> 14 / ((3 - 1) + (2 - 1)) = 14/3; ours 14/5
    assert (m8["tau_authors"], m8["tau"]) == pytest.approx((14 / 3, 14 / 5))
    assert not any(k.startswith("quality/") and not missing(m8[k]) for k in m8.index)
    assert m8["metric_directions"]["accuracy_strict"] == "higher"  # directions borrowed
    assert len(frames.problems) == 2


def test_several_roots_equal_one_tree(frames):
    split = load_frames([FIX / "worker0", FIX / "worker1"])
    assert split.runs.equals(frames.runs) and split.samples.equals(frames.samples)


def squeeze(md: str) -> str:
    """Markdown without the padding tabulate aligns columns with."""
    return re.sub(r" +", " ", md)


def test_tables_by_hand(runs, frames):
    t = all_tables(frames)
    main_rows = {row["label"]: row for row in t["main"].rows}
    assert list(main_rows) == ["ar", "sd k=2", "mars θ=0.9 k=2"]     # th0.8 is not the main theta
    assert main_rows["sd k=2"]["speedup"] == pytest.approx(20 / 11)
    assert main_rows["mars θ=0.9 k=2"]["quality"] == pytest.approx(0.5)
    assert main_rows["mars θ=0.9 k=2"]["metric"] == "accuracy_strict ↑"   # first declared metric
    md = squeeze(t["main"].to_markdown(compact=False))   # every column (the compact view: test_report_page)
    from scipy.stats import binomtest, norm

    w = binomtest(2, 3).proportion_ci(0.95, method="wilson")          # ar's and sd's 2 of 3
    q = f"0.667 [{w.low:.3f}, {w.high:.3f}]"
    nc = S.newcombe_paired(2, 0, 0, 1, 0.95)                             # sd vs ar: a=2 both right, d=1
    # sd: authors' speedup 12/7 [4/3, 2] and tau 22/8 [8/3, 3] (test_sd_speedup_recomputed_from_samples);
    # non-inferiority at 2 % of ar's 2/3: Newcombe's lower end at 90 % (the one-sided 95 % bound) is far
    # below -0.0133 with n = 3, so it cannot be shown: "no"
    assert (f"| sd k=2 | 3 | 4.00 | 2.00 | 1.82 [1.33, 2.00] | 1.71 [1.33, 2.00] | 2.75 [2.67, 3.00] | 0.500 | "
            f"accuracy_strict ↑ | {q} | 0.000 [{nc[0]:.3f}, {nc[1]:.3f}] | 1.000 | – | no | – | – | 100.0 | ⚠") in md
    sd = runs["sd-k2-T0-p1-n8-s0"]
    assert sd["vs_ar/accuracy_strict/ni_bound"] == pytest.approx(S.newcombe_paired(2, 0, 0, 1, 0.90)[0])
    assert sd["vs_ar/accuracy_strict/ni_passes"] is False
    assert sd["vs_ar/accuracy_strict/ni_margin"] == pytest.approx(0.02 * 2 / 3) and "NI 2% vs ar" in md
    # mars θ=0.9: quality 0.500 is the stale summary's (2 samples): no interval; tests are over the 3 samples
    nc = S.newcombe_paired(1, 0, 1, 1, 0.95)
    mde = (norm.ppf(0.975) + norm.ppf(0.8)) * math.sqrt((1 / 3 - 1 / 9) / 3)   # b + c = 1 of n = 3
    # authors' speedup: tokens/s 8, 6, 4 over ar's 2, 3, 2: only q0 (1/27) gives 8/2 = 4; q1 and q2 alike give
    # 2, and resamples of those only have prob 8/27 -> [2, 4]; authors' tau 8/2, 6/1, 8/3 per sample: only q1
    # (1/27) gives 6, only q2 (1/27) gives 8/3 -> [2.67, 6.00]
    assert (f"| mars θ=0.9 k=2 | 3 | 5.50 [4.00, 8.00] | 2.44 [2.00, 3.00] | 2.50 [2.00, 4.00] | 2.57 [2.00, 4.00] | "
            f"3.67 [2.67, 6.00] | 0.722 | accuracy_strict ↑ | 0.500 | -0.333 [{nc[0]:.3f}, {nc[1]:.3f}] | 1.000 | "
            f"{mde:.3f} | no |") in md
    assert "stopped at max_new_tokens (> 5%)" in md                   # every fixture sample hit n = 8
    qt = {(row["label"], row["metric"], row["vs"][:2]): row for row in t["quality"].rows}
    assert set(qt) == {(m, k, v) for m in ("sd k=2", "mars θ=0.8 k=2", "mars θ=0.9 k=2")
                       for k in ("accuracy_strict", "accuracy_flexible") for v in ("ar", "sd")
                       if not (m == "sd k=2" and v == "sd")}
    assert qt[("mars θ=0.9 k=2", "accuracy_strict", "ar")]["delta"] == pytest.approx(-1 / 3)
    theta_rows = {row["label"]: row for row in t["theta"].rows}
    assert list(theta_rows) == ["sd k=2", "mars θ=0.8 k=2", "mars θ=0.9 k=2"]
    # relaxed share = relaxed / accepted: th0.8 1 / (5 + 4) = 1/9; th0.9 2/13
    assert theta_rows["mars θ=0.8 k=2"]["relaxed_share"] == pytest.approx(1 / 9)
    assert theta_rows["mars θ=0.9 k=2"]["relaxed_share"] == pytest.approx(2 / 13)
    fid = {row["label"]: row for row in t["fidelity"].rows}
    assert fid["mars θ=0.8 k=2"]["pct_identical"] == pytest.approx(50.0)       # q1 identical, q0 not
    assert fid["mars θ=0.8 k=2"]["median_first_divergence"] == 4
    acc = {row["label"]: row for row in t["acceptance"].rows}
    assert (acc["mars θ=0.8 k=2"]["d1"], acc["mars θ=0.8 k=2"]["d2"]) == pytest.approx((1.0, 4 / 5))
    for name, table in t.items():                                     # definitions cited once, in code
        if name == "quality":                                         # neither tau nor speedup shown there
            continue
        if name == "paper_authors":                                   # the authors' formulas, theirs only
            assert M.TAU_AUTHORS_DEFINITION in table.caption and M.SPEEDUP_AUTHORS_DEFINITION in table.caption
            continue
        assert M.TAU_DEFINITION in table.caption, name
        if name not in ("acceptance", "costs"):      # neither shows a speedup
            assert M.SPEEDUP_DEFINITION in table.caption, name
    rows = list(csv.DictReader(io.StringIO(t["main"].to_csv())))
    assert float(rows[2]["speedup_authors"]) == pytest.approx(18 / 7)
    assert float(rows[2]["tau_authors"]) == pytest.approx(22 / 6)
    assert (float(rows[2]["speedup_lo"]), float(rows[2]["speedup_hi"])) == pytest.approx((2.0, 4.0))
    assert float(rows[2]["p_d_ar"]) == 1.0 and rows[0]["speedup_lo"] == ""   # ar: speedup 1 by definition
    assert "truncated line" in rows[2]["notes"]
    tex = t["main"].to_latex()
    assert "\\caption{" in tex and "mars $\\theta$=0.9 k=2" in tex and "toy-pair\\_fp32\\_cpu" in tex


def test_r_values_by_hand(runs, frames):
    v = r_values(frames.samples_of(runs["mars-k2-th0.9-T0-p1-n8-s0"]))
    # 6 + 4 + 8 = 18 verified positions; q2 has z1 = -0.5 and -1 at two rejected positions
    assert (v["n_total"], v["n_nonpositive"]) == (18, 2)
    assert sorted(v["r"]["R"].tolist()) == pytest.approx([0.95, 0.95])        # 1.9 / 2 twice
    assert len(v["r"]["A"]) == 11 and len(v["r"]["X"]) == 3                    # 5 rejected, 2 left out
    assert sorted(v["r"]["X"].tolist()) == pytest.approx([0.5, 0.5, 0.5])     # 0.5/1 each


def test_cli_writes_tables_and_figures(tmp_path, capsys):
    assert main([str(FIX), "--out", str(tmp_path / "rep")]) == 0
    out, err = capsys.readouterr()
    assert "mars θ=0.9" in out                                   # the console comparison (report.console)
    md = squeeze((tmp_path / "rep" / "tables" / "main.md").read_text())
    assert md.startswith("**Table 1.**") and "| mars θ=0.9 |" in md and "every method but ar: **k=2**" in md
    assert "mars-k2-th0.8-T0-p1-n8-s0/samples.jsonl:2:" in err and "truncated line" in err
    for name in ("main", "theta", "fidelity", "acceptance", "quality"):
        for ext in ("md", "csv", "tex"):
            assert (tmp_path / "rep" / "tables" / f"{name}.{ext}").stat().st_size > 0
    figs = sorted(p.name.split("__")[0] for p in (tmp_path / "rep" / "figures").glob("*.png"))
    assert figs == ["acceptance_by_depth", "fidelity_vs_theta", "r_distribution", "speedup_tau",
                    "theta_sensitivity", "z1_histogram"]
    assert len(list((tmp_path / "rep" / "figures").glob("*.pdf"))) == 6
    assert "## Problems" in (tmp_path / "rep" / "report.md").read_text()


def test_default_out_is_root_report(tmp_path, capsys):
    root = tmp_path / "results"
    shutil.copytree(FIX / "worker0", root)
    assert main([str(root), "--no-figures"]) == 0
    assert (root / "report" / "tables" / "main.md").exists()
    assert main([str(root)]) == 0                    # the report folder itself is not read as runs
    assert main([str(tmp_path / "missing")]) == 2
    capsys.readouterr()


def test_bad_input_is_refused_in_one_line_and_a_bug_keeps_its_traceback(tmp_path, capsys, monkeypatch):
    root = tmp_path / "results"
    shutil.copytree(FIX / "worker0", root)
    assert main([str(root), "--no-figures", "--results-md", str(tmp_path / "x.md")]) == 2   # not a pack
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mars-bench-report: error: --results-md reads a packed results tree; got ")
    assert "allowed: an existing file ending in .tar.xz" in err[-1]
    assert main([str(root), "--no-figures", "--pack", str(tmp_path / "x.zip")]) == 2
    assert "allowed: a name ending in .tar.xz" in capsys.readouterr().err

    def bug(*a, **k):
        raise ValueError("a bug in the report")
    import mars_bench.cli.report as cli
    monkeypatch.setattr(cli, "write_report", bug)
    with pytest.raises(ValueError, match="a bug in the report"):
        main([str(root), "--no-figures"])


def test_summary_only_run(tmp_path):
    run = tmp_path / "r" / TD / "ar-T0-p1-n8-s0"
    run.mkdir(parents=True)
    shutil.copy(FIX / "worker0" / TD / "ar-T0-p1-n8-s0" / "summary.json", run / "summary.json")
    frames = load_frames(tmp_path / "r")
    (r,) = [r for _, r in frames.runs.iterrows()]
    assert frames.samples.empty and r["tokens_per_s"] == pytest.approx(2.2)
    assert any("no samples.jsonl" in n for n in r["notes"])


def test_figure_files(tmp_path):
    paths = make_figures(load_frames(FIX), tmp_path)
    assert len(paths) == 12 and all(p.stat().st_size > 1000 for p in paths)


def test_notebook_executes_on_fixture(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = ROOT / "notebooks" / "analysis.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:                                  # stored without outputs
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    env_before = dict(os.environ)
    os.environ["MARS_BENCH_RESULTS"] = str(FIX)
    os.environ["MARS_BENCH_REPORT_OUT"] = str(tmp_path / "nbreport")
    try:
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "mars θ=0.9 k=2" in text and "truncated line" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_parse_run_tags():
    from mars_bench.store.spec import RunSpec

    t = RunSpec.parse("mars-k4-th0.9-T0-p1-n32-s0")
    assert (t.scheme, t.rule, t.k, t.settings["theta"], t.temperature, t.top_p, t.max_new_tokens, t.seed) == \
        ("sd", "mars", 4, 0.9, 0.0, 1.0, 32, 0)
    assert RunSpec.parse("ar-T1-p0.95-n512-s3").scheme == "ar"
    t = RunSpec.parse("mars-k4-th1e-05-ratio-margin-T1-p1-n8-s0")      # a number with '-' stays whole
    assert (t.settings["theta"], t.settings["nonpositive_top1"], t.settings["sampled_top1"]) == (1e-05, "ratio", "margin")
    t = RunSpec.parse("sd_tree-d4-w4-t16-T0-p1-n64-s0")
    assert (t.scheme, t.rule, t.k, t.tree) == ("sd_tree", "exact", None, "d4-w4-t16")
    t = RunSpec.parse("sd+topk_delta-k4-top10-dl0.3-draftint8-T0-p1-n64-s0")
    assert (t.rule, t.settings, t.draft_quant) == ("topk_delta", {"top_k": 10, "delta": 0.3}, "int8")
    assert t.lossless_reference().label == "sd-k4-draftint8-T0-p1-n64-s0"
    assert t.baseline().label == "ar-T0-p1-n64-s0"
    for name in ("report", "multirun", "mars-k4-th0.9-bogus-T0-p1-n8-s0", "nope+mars-T0-p1-n8-s0"):
        assert RunSpec.parse(name) is None


@pytest.mark.parametrize("tag", [
    "ar-T0-p1-n8-s0", "sd-k4-T0-p1-n8-s0", "mars-k4-th0.85-ratio-T0-p1-n8-s0", "mars_tree-d3-w3-t10-th0.9-T0-p1-n8-s0",
    "sd_tree-paths0a1b2c3d-sample-T1-p1-n8-s0", "sd+fly-k8-win3-ent0.3-T0-p1-n8-s0",
    "sd+typical-k4-eps0.09-al0.3-T0.7-p0.9-n8-s1", "mars-k4-th0.9-margin-nucleusallow-T1-p0.8-n8-s0",
    "sd-k4-pmin0.75-draftint8-T0-p1-n8-s0", "eagle3_mars-d5-w4-t16-th0.9-T0-p1-n8-s0"])
def test_run_tags_round_trip(tag):
    from mars_bench.store.spec import RunSpec

    assert RunSpec.parse(tag).label == tag


def test_theta_figure_marks_significant_thetas_and_draws_error_bars(frames):
    from matplotlib.container import ErrorbarContainer

    from mars_bench.report.figures import speedup_tau, theta_sensitivity

    group = frames.runs.copy()
    m9 = group["tag"] == "mars-k2-th0.9-T0-p1-n8-s0"
    group.loc[m9, "quality/accuracy_strict"] = 1 / 3              # make the stored quality match the samples
    fig = theta_sensitivity(group)
    labels = [lab for ax in fig.axes for lab in ax.get_legend_handles_labels()[1]]
    assert not any("differs from ar" in lab for lab in labels)   # p = 1 everywhere in the fixture
    group.loc[m9, "vs_ar/accuracy_strict/p_value"] = 0.01
    fig = theta_sensitivity(group)
    a3 = fig.axes[2]
    assert "differs from ar (p < 0.05, paired test)" in a3.get_legend_handles_labels()[1]
    bars = [c for c in a3.containers if isinstance(c, ErrorbarContainer)]
    assert bars and any(len(seg.get_segments()) for c in bars for seg in c.lines[2])   # quality CI drawn
    top = speedup_tau(group).axes[0]
    (eb,) = [c for c in top.containers if isinstance(c, ErrorbarContainer)]
    segs = eb.lines[2][0].get_segments()                          # one per run: ar (zero length), sd, mars...
    sd = [s for s in segs if abs(s[0][0] - 1) < 1e-9][0]
    assert (sd[0][1], sd[1][1]) == pytest.approx((4 / 3, 2.0))   # sd's paired-bootstrap interval


def test_costs_table_by_hand(frames):
    """Table 9 from the fixture's sd records: draft 0.5 + 0.375 + 0.5 = 1.375 s over 8 + 6 + 8 = 22 drafted tokens and
    4 + 3 + 4 = 11 steps, target 1 + 0.75 + 1 = 2.75 s; the loop (wall 5.5 s - prefill 0.3 s) outside both 1 - 4.125 /
    5.2. ar has no row (no drafts)."""
    from mars_bench.report.tables import costs_table

    t = costs_table(frames.runs)
    sd = t.data[t.data["label"].str.startswith("sd")].iloc[0]
    assert sd["draft_ms_token"] == pytest.approx(1375 / 22) and sd["draft_ms_step"] == pytest.approx(125.0)
    assert sd["target_ms_step"] == pytest.approx(250.0) and sd["outside"] == pytest.approx(100 * (1 - 4.125 / 5.2))
    assert not (t.data["method"] == "ar").any()
    assert "draft ms / drafted token" in t.to_markdown()
