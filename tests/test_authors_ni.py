"""The authors' speedup and tau beside ours, non-inferiority tests, the metric registration, the mean over
tasks. References: hand arithmetic, scipy (paired t, Newcombe's interval inverted by a grid), sacrebleu's
corpus_score on the segments its paired bootstrap resamples."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy import stats as sps

from mars_bench.base.errors import ConfigError
from mars_bench.store import metrics as M
from mars_bench import stats as S
from mars_bench.store.io import read_samples

from .test_stats import _segments
from mars_bench.store.summary import LEGACY_METRICS, run_stats, task_metrics

FAST = S.StatsSettings(n_boot=2000)


# ---- the authors' formulas ---------------------------------------------------------------------------
def _rec(sid, turns, n_retokenized=None):
    """A sample record of turns (new_tokens, steps, wall_s); n_retokenized per turn when given."""
    ts = [{"new_tokens": t, "steps": s, "wall_s": w, "proposed": [], "accepted": [],
           **({"n_retokenized": n_retokenized[i]} if n_retokenized else {})} for i, (t, s, w) in enumerate(turns)]
    return {"id": sid, "new_tokens": sum(t for t, _, _ in turns), "steps": sum(s for _, s, _ in turns),
            "wall_s": sum(w for _, _, w in turns), "turns": ts, "prefill_s": 0.0, "target_s": 0.0, "draft_s": 0.0,
            "n_proposed": 0, "n_accepted": 0, "n_exact": 0, "n_relaxed": 0, "score": {}}


def test_authors_speedup_counts_ar_tokens_by_retokenizing_minus_one():
    # a: two turns, 10 tokens in 3 verification steps + 6 in 2, 2 s; b: one turn, 9 tokens in 4 steps, 3 s
    mine = [_rec("a", [(10, 3, 1.0), (6, 2, 1.0)]), _rec("b", [(9, 4, 3.0)])]
    # ar generated 16 and 9 tokens; re-tokenized texts give 12 + 7 (minus 1 each: 11 + 6 = 17) and 10 (-> 9)
    ar = [_rec("a", [(10, 10, 4.0), (6, 6, 4.0)], n_retokenized=[12, 7]), _rec("b", [(9, 9, 6.0)], [10])]
    sp = M.speedup(mine, ar)
    # authors: method tokens/s 16/2 = 8 and 9/3 = 3 -> mean 5.5; ar 17/8 and 9/6 = 1.5 -> mean 1.8125
    assert sp["speedup_authors"] == pytest.approx(5.5 / ((17 / 8 + 1.5) / 2))
    assert sp["speedup_authors_note"] is None
    # ours: (25 / 5) / (25 / 14) = 2.8; mean of per-sample ratios: (8 / 2) and (3 / 1.5) -> 3
    assert sp["speedup"] == pytest.approx(2.8) and sp["speedup_mean_of_ratios"] == pytest.approx(3.0)
    # authors' tau: idx = steps - 1 per turn = 2 + 1 + 3 = 6 -> 25 / 6; ours 25 / 9
    t = M.totals(mine)
    assert (t["tau_authors"], t["idx_authors"], t["tau"]) == pytest.approx((25 / 6, 6, 25 / 9))
    st = run_stats(mine, ar, settings=S.StatsSettings(n_boot=200))
    assert st["speedup_authors"]["value"] == pytest.approx(sp["speedup_authors"])
    assert st["tau_authors"]["value"] == pytest.approx(25 / 6) and st["speedup_authors"]["note"] is None


def test_authors_speedup_without_retokenized_counts_says_so():
    mine, ar = [_rec("a", [(8, 4, 2.0)]), _rec("b", [(6, 3, 1.5)])], [_rec("a", [(8, 8, 4.0)]), _rec("b", [(6, 6, 2.0)])]
    sp = M.speedup(mine, ar)
    assert sp["speedup_authors"] == pytest.approx(4 / 2.5)            # 4, 4 over 2, 3: ar's own counts
    assert "2 of 2 ar records lack n_retokenized" in sp["speedup_authors_note"]
    assert M.totals([_rec("c", [(1, 1, 1.0)])])["tau_authors"] is None   # idx 0: no authors' tau


def test_turn_record_counts_the_stripped_text_with_the_tokenizer():
    from mars_bench.store.recordbuild import turn_record

    res = SimpleNamespace(tokens=[5, 6, 7], steps=2, tau=1.5, stop_reason="eos", prefill_s=0.0, wall_s=1.0,
                          target_s=0.5, draft_s=0.2, proposed=[2, 2], accepted=[1, 0], relaxed=[], z1=[], z2=[],
                          outcome="AX", depth_proposed=[])
    tok = lambda text: SimpleNamespace(input_ids=["<bos>"] + text.split(" "))  # noqa: E731
    assert turn_record(res, [1, 2], " x y z \n", tok)["n_retokenized"] == 4   # <bos> x y z
    assert turn_record(res, [1, 2], "x y")["n_retokenized"] is None


# ---- non-inferiority -----------------------------------------------------------------------------------
def test_ni_settings_knob():
    assert S.StatsSettings().ni_margin == 0.02
    assert S.StatsSettings.from_cfg(OmegaConf.create({"stats": {"ni_margin": 0.05}})).ni_margin == 0.05
    for bad in (0, 1, 1.5, -0.1, True, "0.02"):
        with pytest.raises(ValueError, match=f"stats.ni_margin={bad!r}; allowed: a number in \\(0, 1\\)"):
            S.StatsSettings(ni_margin=bad)


def test_ni_margin_from_the_command_line():
    from mars_bench.config.validation import validate

    from .test_cli import cfg_of

    cfg = cfg_of("model=tiny", "stats.ni_margin=0.05")
    validate(cfg)
    assert S.StatsSettings.from_cfg(cfg).ni_margin == 0.05
    with pytest.raises(ConfigError, match=r"^stats.ni_margin=2; allowed: a number in \(0, 1\)$"):
        validate(cfg_of("model=tiny", "stats.ni_margin=2"))


def _scores(n, shift, seed):
    rng = np.random.default_rng(seed)
    base = rng.normal(7.0, 1.0, n)
    return base + shift + rng.normal(0, 0.2, n), base


@pytest.mark.parametrize("shift,passes", [(0.0, True), (-0.5, False)])
def test_mean_ni_matches_the_paired_t_bound(shift, passes):
    """n = 400 near-normal differences: the bootstrap's one-sided bound and p agree with the paired t."""
    x, y = _scores(400, shift, 1)
    ni = S.mean_delta(x, y, FAST)["noninferiority"]
    margin = 0.02 * abs(y.mean())
    d = x - y
    t_bound = d.mean() - sps.t.ppf(0.95, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    t_p = sps.ttest_1samp(d, -margin, alternative="greater").pvalue
    assert ni["margin"] == pytest.approx(margin) and ni["passes"] is passes
    assert ni["bound"] == pytest.approx(t_bound, abs=0.15 * d.std(ddof=1) / np.sqrt(len(d)))
    assert ni["p_value"] == pytest.approx(t_p, abs=0.02) if passes else ni["p_value"] > 0.5
    assert (ni["p_value"] < 0.05) is passes


def test_mean_ni_lower_is_better_flips_the_side():
    x, y = _scores(400, 0.5, 2)                        # a clear increase of a lower-is-better score
    ni = S.mean_delta(x, y, FAST, higher=False)["noninferiority"]
    assert ni["passes"] is False and ni["bound"] > ni["margin"]
    ni = S.mean_delta(y + 0.01, y, FAST, higher=False)["noninferiority"]   # a constant difference: no interval
    assert ni["passes"] is None and "same in every resample" in ni["note"]
    x, y = _scores(400, -0.5, 3)
    assert S.mean_delta(x, y, FAST, higher=False)["noninferiority"]["passes"] is True


def _pairs(a, b, c, d):
    return [1] * (a + b) + [0] * (c + d), [1] * a + [0] * b + [1] * c + [0] * d


@pytest.mark.parametrize("table,passes", [
    ((1800, 10, 10, 180), True),      # n = 2000, 10 discordant each way: clearly within 2 % of 0.905
    ((1600, 0, 200, 200), False),     # loses 10 points
    ((2, 0, 0, 1), False),            # n = 3: cannot be shown
])
def test_binary_ni_inverts_newcombe(table, passes):
    ni = S.binary_delta(*_pairs(*table), FAST)["noninferiority"]
    a, b, c, d = table
    n = sum(table)
    margin = 0.02 * (a + c) / n
    assert ni["margin"] == pytest.approx(margin) and ni["passes"] is passes
    assert ni["bound"] == pytest.approx(S.newcombe_paired(a, b, c, d, 0.90)[0])
    # p by brute force: the smallest tail t on a grid whose Newcombe lower end (level 1 - 2t) clears -margin
    grid = np.linspace(1e-4, 0.4999, 5000)
    clears = [t for t in grid if S.newcombe_paired(a, b, c, d, 1 - 2 * t)[0] > -margin]
    if clears:
        assert ni["p_value"] == pytest.approx(clears[0], abs=2e-4)
    else:
        assert ni["p_value"] >= 0.4999
    assert (ni["p_value"] < 0.05) is passes


def test_ni_tiny_n_has_a_note():
    for out in (S.binary_delta([1], [1], FAST), S.mean_delta([7.0], [6.0], FAST)):
        ni = out["noninferiority"]
        assert ni["passes"] is None and ni["note"].startswith("n = 1") and ni["bound"] is None
        json.dumps(ni, allow_nan=False)


def test_corpus_ni_is_the_percentile_of_sacrebleus_paired_resamples(monkeypatch):
    from sacrebleu.metrics import BLEU

    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    base, meth, refs = _segments(30, 1)
    got = S.corpus_delta(meth, base, refs, S.StatsSettings(n_boot=200))["bleu"]
    idx = np.random.default_rng(12345).choice(30, size=(200, 30), replace=True)   # sacrebleu's resamples
    bleu = BLEU()
    dif = np.array([bleu.corpus_score([meth[i] for i in row], [[refs[i] for i in row]]).score
                    - bleu.corpus_score([base[i] for i in row], [[refs[i] for i in row]]).score for row in idx])
    margin = 0.02 * got["base"]
    ni = got["noninferiority"]
    assert ni["margin"] == pytest.approx(margin)
    assert ni["bound"] == pytest.approx(np.quantile(dif, 0.05), abs=1e-3)
    assert ni["p_value"] == pytest.approx((1 + np.sum(dif <= -margin)) / 201)
    assert ni["passes"] is bool(np.quantile(dif, 0.05) > -margin)


# ---- metrics from the task registration ----------------------------------------------------------------
def _spec(name, higher, test, per_sample):
    return SimpleNamespace(name=name, higher=higher, test=test, per_sample=per_sample)


STUB = SimpleNamespace(metrics={
    "accuracy_strict": _spec("accuracy_strict", True, "binary", "correct_strict"),
    "bleu": _spec("bleu", True, "corpus_bleu", "hypothesis"),
    "bleu_raw": _spec("bleu_raw", True, "corpus_bleu", "hypothesis_raw"),
    "chrf_raw": _spec("chrf_raw", True, "corpus_chrf", "hypothesis_raw"),
    "format_rate": _spec("format_rate", True, "none", None)})


def test_registration_drives_the_tests_bleu_raw_on_raw_hypotheses(monkeypatch):
    from sacrebleu.metrics import BLEU, CHRF

    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    base, meth, refs = _segments(12, 4)
    raw = lambda h: h + " ( translated )"  # noqa: E731  the uncleaned output
    mk = lambda hyps, ok: [{"id": f"s{i}", "new_tokens": 4, "steps": 2, "wall_s": 1.0,  # noqa: E731
                            "turns": [{"steps": 2}], "score": {"hypothesis": h, "hypothesis_raw": raw(h),
                                                              "correct_strict": ok[i]}}
                           for i, h in enumerate(hyps)]
    ok = [1] * 10 + [0, 1]
    recs, ar = mk(meth, ok), mk(base, [1] * 12)
    metrics = task_metrics(STUB)
    assert set(metrics) == {"accuracy_strict", "bleu", "bleu_raw", "chrf_raw"}     # test none: untested
    st = run_stats(recs, ar, settings=S.StatsSettings(n_boot=200), metrics=metrics,
                   references={f"s{i}": r for i, r in enumerate(refs)})
    vs = st["quality_vs_ar"]
    assert vs["bleu_raw"]["value"] == pytest.approx(BLEU().corpus_score([raw(h) for h in meth], [refs]).score)
    assert vs["bleu_raw"]["base"] == pytest.approx(BLEU().corpus_score([raw(h) for h in base], [refs]).score)
    assert vs["bleu"]["value"] == pytest.approx(BLEU().corpus_score(meth, [refs]).score)
    assert vs["chrf_raw"]["value"] == pytest.approx(CHRF().corpus_score([raw(h) for h in meth], [refs]).score)
    assert vs["accuracy_strict"]["discordant"] == [0, 1] and "noninferiority" in vs["accuracy_strict"]
    assert st["quality"]["bleu_raw"]["value"] == pytest.approx(vs["bleu_raw"]["value"])
    assert "format_rate" not in vs


def test_registration_as_dicts_and_the_legacy_fallback():
    from mars_bench.store.summary import from_registration

    got = from_registration({"pass@1": {"higher": True, "test": "binary", "per_sample": "passed"},
                             "ter": {"higher": False, "test": "mean", "per_sample": "ter"}})
    assert got["ter"].higher is False and got["ter"].get({"ter": 0.3}) == 0.3
    old = task_metrics(SimpleNamespace(metric_directions={"bleu": "higher", "chrf": "higher", "n_x": "higher"}))
    assert old == {"bleu": LEGACY_METRICS["bleu"], "chrf": LEGACY_METRICS["chrf"]}
    with pytest.raises(ValueError, match="test='wilcoxon'; allowed"):
        from_registration({"x": {"higher": True, "test": "wilcoxon", "per_sample": "x"}})


# ---- the mean over tasks in the main table ---------------------------------------------------------------
def test_main_table_mean_over_tasks():
    import pandas as pd

    from mars_bench.report.tables import mean_rows

    def row(task, label, speedup, tau, sa, ta):
        return {"model": "m", "settings": f"T=0 n≤{8 if task == 'gsm8k' else 16}", "label": label, "method": label,
                "_task": task, "_across": ("m", 0.0, 1.0, 0, label), "speedup": speedup, "tau": tau,
                "speedup_authors": sa, "tau_authors": ta}
    rows = [row("gsm8k", "sd", 2.0, 3.0, 1.5, 4.0), row("humaneval", "sd", 3.0, 4.0, None, 5.0),
            row("gsm8k", "ar", 1.0, 1.0, None, 1.1)]
    means = mean_rows(pd.DataFrame(rows))                    # ar is on one task only: no mean row
    assert len(means) == 1
    mean = means.iloc[0]
    assert mean["task"] == "mean of 2 tasks (gsm8k, humaneval)" and mean["label"] == "sd"
    assert (mean["speedup"], mean["tau"], mean["tau_authors"]) == pytest.approx((2.5, 3.5, 4.5))
    assert mean["speedup_authors"] is None                   # missing on one task: no mean
    assert mean["settings"] == "T=0 n≤16; T=0 n≤8"


def test_main_table_has_the_mean_row_for_two_tasks(tmp_path):
    """The report fixture's worker0 tree under two task folders: each method's mean row averages the two."""
    import shutil
    from pathlib import Path

    from mars_bench.report import all_tables, load_frames

    src = Path(__file__).parent / "fixtures" / "results" / "worker0" / "toy-pair_fp32_cpu" / "gsm8k-v1"
    for task in ("gsm8k-v1", "gsm8k_copy-v1"):
        shutil.copytree(src, tmp_path / "toy-pair_fp32_cpu" / task)
    for f in (tmp_path / "toy-pair_fp32_cpu" / "gsm8k_copy-v1").rglob("*.json*"):   # the task the records name
        f.write_text(f.read_text().replace('"task": "gsm8k"', '"task": "gsm8k_copy"'))
    sd = tmp_path / "toy-pair_fp32_cpu" / "gsm8k_copy-v1" / "sd-k2-T0-p1-n8-s0" / "samples.jsonl"
    sd.write_text("\n".join(sd.read_text().splitlines()[:2]) + "\n")     # q0, q1 only: other numbers
    rows = all_tables(load_frames(tmp_path))["main"].rows
    per_task = {(r["task"], r["label"]): r for r in rows}
    mean = {r["label"]: r for r in rows if r["task"].startswith("mean of")}
    assert set(mean) == {"ar", "sd k=2", "mars θ=0.9 k=2"}
    assert mean["sd k=2"]["task"] == "mean of 2 tasks (gsm8k, gsm8k_copy)"
    for key in ("speedup", "tau", "speedup_authors", "tau_authors"):
        a, b = per_task[("gsm8k-v1", "sd k=2")][key], per_task[("gsm8k_copy-v1", "sd k=2")][key]
        assert mean["sd k=2"][key] == pytest.approx((a + b) / 2)
    assert per_task[("gsm8k_copy-v1", "sd k=2")]["speedup"] == pytest.approx(12 / 7)   # 14/3.5 over 14/6
    assert mean["sd k=2"]["speedup"] == pytest.approx((20 / 11 + 12 / 7) / 2)


def test_old_summary_is_restated_whole_by_the_writer(tmp_path):
    """A summary written before the authors' formulas were stored is stale: the report restates its
    statistics from samples with the writer's own function (summary.run_stats), in whole, and says so; it
    never patches single numbers into a stored block."""
    import shutil
    from pathlib import Path

    from mars_bench.store import summary as W
    from mars_bench.report import load_frames
    from mars_bench.stats import StatsSettings
    from mars_bench.tasks.base import load_spec

    shutil.copytree(Path(__file__).parent / "fixtures" / "results" / "worker0", tmp_path / "r")
    task_dir = tmp_path / "r" / "toy-pair_fp32_cpu" / "gsm8k-v1"
    sd_dir = task_dir / "sd-k2-T0-p1-n8-s0"
    sd_recs, _ = read_samples(sd_dir / "samples.jsonl")
    ar_recs, _ = read_samples(task_dir / "ar-T0-p1-n8-s0" / "samples.jsonl")
    fidelity = W.fidelity_vs_ar(sd_recs, ar_recs)
    stats = W.run_stats(sd_recs, ar_recs, None, StatsSettings(), W.from_registration(load_spec("gsm8k")["metrics"]),
                        fidelity=fidelity)
    stats = {k: v for k, v in stats.items() if k not in ("tau_authors", "speedup_authors")}
    stats["quality_vs_ar"]["accuracy_strict"]["note"] = "stored"       # a marker: restated, so gone
    totals = {k: v for k, v in M.totals(sd_recs).items() if k not in ("tau_authors", "idx_authors")}
    speedup = {k: v for k, v in M.speedup(sd_recs, ar_recs).items() if not k.startswith("speedup_authors")}
    old = json.loads((sd_dir / "summary.json").read_text())
    (sd_dir / "summary.json").write_text(json.dumps({**old, "stats": stats, "totals": totals, "speedup": speedup,
                                                     "fidelity": fidelity}))
    runs = load_frames(tmp_path / "r").runs
    sd = runs[runs["method"] == "sd"].iloc[0]
    assert sd["vs_ar/accuracy_strict/note"] != "stored"
    assert sd["speedup_authors"] == pytest.approx(12 / 7)           # 4 / (7/3), as in test_report
    assert (sd["speedup_authors_lo"], sd["speedup_authors_hi"]) == pytest.approx((4 / 3, 2.0))
    assert sd["tau_authors"] == pytest.approx(22 / 8) and sd["tau_authors_lo"] == pytest.approx(8 / 3)
    assert "intervals and tests computed from samples.jsonl by the report (summary.json's are stale)" in sd["notes"]
