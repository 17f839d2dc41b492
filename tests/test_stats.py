"""mars_bench.stats against independent references: scipy (binomtest, norm), sacrebleu (PairedTest and
corpus_score on resampled segments), a published paired interval, and Monte Carlo coverage."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy.stats import binomtest, norm

from mars_bench.config.spec import spec_of
from mars_bench.config.settings import draft_quant_of
from mars_bench import stats as S

FAST = S.StatsSettings(n_boot=1000)


def _pairs(a: int, b: int, c: int, d: int):
    """Paired binary vectors (method, base) of a 2x2 table: a both 1, b method only, c base only, d neither."""
    x = [1] * a + [1] * b + [0] * c + [0] * d
    y = [1] * a + [0] * b + [1] * c + [0] * d
    return x, y


@pytest.mark.parametrize("table", [(5, 1, 9, 5), (40, 12, 3, 45), (0, 0, 7, 3), (10, 4, 4, 2), (3, 0, 0, 7),
                                   (30, 1, 0, 0)])
def test_mcnemar_is_scipy_binomtest_on_discordant_pairs(table):
    a, b, c, d = table
    t = S.binary_delta(*_pairs(*table), FAST)
    want = binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
    assert t["p_value"] == pytest.approx(want, rel=1e-12)
    assert t["discordant"] == [b, c] and t["n"] == sum(table)
    assert t["delta"] == pytest.approx((b - c) / sum(table))
    assert t["value"] == pytest.approx((a + b) / sum(table)) and t["base"] == pytest.approx((a + c) / sum(table))
    assert t["lo"] <= t["delta"] <= t["hi"]


def test_mcnemar_by_hand():
    # b = 1, c = 9: two-sided exact p = 2 * (C(10,0) + C(10,1)) / 2^10 = 2 * 11 / 1024
    assert S.binary_delta(*_pairs(5, 1, 9, 5), FAST)["p_value"] == pytest.approx(22 / 1024)


def test_newcombe_paired_interval_published_example():
    # Fagerland, Lydersen & Laake (2017), ch. 8, Cavo et al. (2012): table 59 6 / 16 80,
    # estimate -0.0621, Newcombe square-and-add 95% CI -0.1186 to -0.0046
    lo, hi = S.newcombe_paired(59, 6, 16, 80, 0.95)
    assert (round(lo, 4), round(hi, 4)) == (-0.1186, -0.0046)


def test_newcombe_exact_coverage_by_enumeration():
    """Exact coverage over every table of n = 20 pairs, weighted by its multinomial probability."""
    from scipy.stats import multinomial

    n, p = 20, [0.3, 0.2, 0.05, 0.45]
    tot = cov = 0.0
    for a in range(n + 1):
        for b in range(n + 1 - a):
            for c in range(n + 1 - a - b):
                w = multinomial.pmf([a, b, c, n - a - b - c], n, p)
                lo, hi = S.newcombe_paired(a, b, c, n - a - b - c, 0.95)
                cov += w * (lo <= p[1] - p[2] <= hi)
                tot += w
    assert 0.93 <= cov / tot <= 0.99


def test_mde_formula():
    t = S.binary_delta(*_pairs(40, 2, 5, 53), FAST)       # n = 100, b = 2, c = 5
    se = math.sqrt((7 / 100 - (3 / 100) ** 2) / 100)
    assert t["mde"] == pytest.approx((norm.ppf(0.975) + norm.ppf(0.8)) * se)
    none = S.binary_delta(*_pairs(50, 0, 0, 50), FAST)    # no discordant pair: share 3/n (rule of three)
    assert none["mde"] == pytest.approx((norm.ppf(0.975) + norm.ppf(0.8)) * math.sqrt(3) / 100)
    assert none["p_value"] == 1.0 and "no discordant pair" in none["note"]
    assert S.reading(none) == f"no loss larger than {none['mde']:.3g} at n = 100"
    assert S.reading(S.binary_delta(*_pairs(30, 0, 20, 50), FAST)).startswith("loss of 0.2")


def _segments(n: int, seed: int):
    rng = random.Random(seed)
    words = "the a cat dog sat on mat house red blue runs quickly slowly over under near far".split()
    refs = [" ".join(rng.choices(words, k=rng.randint(8, 20))) for _ in range(n)]
    base = [" ".join(rng.choices(r.split(), k=max(3, len(r.split()) - 2))) for r in refs]
    meth = [b if i % 3 else " ".join(rng.choices(r.split(), k=len(r.split()))) for i, (b, r) in
            enumerate(zip(base, refs))]
    return base, meth, refs


def test_corpus_delta_is_sacrebleus_paired_bootstrap(monkeypatch):
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    base, meth, refs = _segments(30, 1)
    got = S.corpus_delta(meth, base, refs, S.StatsSettings(n_boot=200))
    _, direct = PairedTest([("b", base), ("m", meth)], metrics={"BLEU": BLEU(), "chrF": CHRF()},
                           references=[refs], test_type="bs", n_samples=200)()
    for name, key in (("bleu", "BLEU"), ("chrf", "chrF2")):
        b, m = direct[key]
        g = got[name]
        assert g["delta"] == pytest.approx(m.score - b.score) and g["p_value"] == pytest.approx(m.p_value)
        assert g["value"] == pytest.approx(m.score) and g["base"] == pytest.approx(b.score)
        assert g["sacrebleu_mean"] == pytest.approx(m.mean) and g["sacrebleu_ci"] == pytest.approx(m.ci)
    # the delta CI: percentiles of paired differences on the segments sacrebleu resamples (its seed 12345),
    # recomputed here with the public corpus_score on each resampled list of segments
    idx = np.random.default_rng(12345).choice(30, size=(200, 30), replace=True)
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        dif = [metric.corpus_score([meth[i] for i in row], [[refs[i] for i in row]]).score
               - metric.corpus_score([base[i] for i in row], [[refs[i] for i in row]]).score for row in idx]
        lo, hi = np.quantile(dif, [0.025, 0.975])
        assert got[name]["lo"] == pytest.approx(lo, abs=1e-3) and got[name]["hi"] == pytest.approx(hi, abs=1e-3)
        assert got[name]["mde"] == pytest.approx((norm.ppf(0.975) + norm.ppf(0.8)) * np.std(dif, ddof=1), rel=1e-3)


def test_corpus_delta_identical_hypotheses():
    base, _, refs = _segments(10, 2)
    got = S.corpus_delta(base, base, refs, FAST)
    for t in got.values():
        assert t["delta"] == 0.0 and t["lo"] is None and t["p_value"] is None and "equal the baseline" in t["note"]


def test_speedup_interval_covers_known_ratio():
    """500 simulated runs of n = 100 paired samples: wall = tokens * u with E[u_ar] / E[u_method] = 2,
    so the true speedup (ratio of expected tokens/s) is 2; 95% intervals must cover it 93-97% of the time."""
    rng = np.random.default_rng(123)
    hits = 0
    for i in range(500):
        tok = rng.integers(20, 300, 100).astype(float)
        e = S.speedup_ci(tok, tok * rng.gamma(4, 0.25 / 4, 100), tok, tok * rng.gamma(4, 0.5 / 4, 100),
                         S.StatsSettings(n_boot=1000, seed=i))
        hits += e["lo"] <= 2.0 <= e["hi"]
    assert 0.93 <= hits / 500 <= 0.97


def test_tau_interval_covers_known_ratio():
    """tau = sum tokens / sum steps; tokens = steps * v with E[v] = 2.5 independent of steps: truth 2.5."""
    rng = np.random.default_rng(7)
    hits = 0
    for i in range(500):
        steps = rng.integers(10, 120, 80).astype(float)
        e = S.ratio_ci(steps * rng.uniform(1.0, 4.0, 80), steps, S.StatsSettings(n_boot=1000, seed=i))
        hits += e["lo"] <= 2.5 <= e["hi"]
    assert 0.93 <= hits / 500 <= 0.97


def test_mean_delta_and_seeded():
    rng = np.random.default_rng(3)
    x, y = rng.normal(7, 1, 60), rng.normal(7, 1, 60) + 0.5
    a, b = S.mean_delta(x, y, FAST), S.mean_delta(x, y, FAST)
    assert a == b                                             # same seed, same resamples
    assert a["delta"] == pytest.approx(np.mean(x - y)) and a["lo"] < a["delta"] < a["hi"]
    assert a["mde"] == pytest.approx(2.8016 * np.std(x - y, ddof=1) / math.sqrt(60), rel=1e-3)
    assert a["p_value"] < 0.05                                # a shift of 0.5 sd at n = 60


@pytest.mark.parametrize("fn,args", [
    (S.speedup_ci, ([8], [2.0], [8], [4.0])), (S.speedup_ci, ([], [], [], [])),
    (S.speedup_ci, ([8] * 5, [2.0] * 5, [8] * 5, [4.0] * 5)),      # all samples identical
    (S.ratio_ci, ([3], [1])), (S.ratio_ci, ([5, 5, 5], [5, 5, 5])), (S.mean_ci, ([],)),
    (S.proportion_ci, (1, 1)), (S.binary_delta, ([1], [0])), (S.binary_delta, ([], [])),
    (S.mean_delta, ([7, 7, 7], [6, 6, 6])), (S.mean_delta, ([7], [6])),
])
def test_degenerate_inputs_give_a_note_not_nan(fn, args):
    out = fn(*args, FAST)
    assert out["note"] and out["lo"] is None and out["hi"] is None
    json.dumps(out, allow_nan=False)                          # no NaN anywhere


def test_settings_defaults_and_bad_values():
    s = S.StatsSettings()
    assert (s.n_boot, s.seed, s.level, s.power) == (10_000, 0, 0.95, 0.8)
    assert S.StatsSettings.from_cfg(OmegaConf.create({"stats": {"n_boot": 500}})).n_boot == 500
    assert S.StatsSettings.from_cfg(OmegaConf.create({"seed": 1})) == s
    for bad, needle in (({"level": 1.5}, "stats.level=1.5; allowed"), ({"n_boot": 10}, "stats.n_boot=10"),
                        ({"nboot": 1}, "unknown key stats.nboot")):
        with pytest.raises(ValueError, match=needle):
            S.StatsSettings.from_cfg(OmegaConf.create({"stats": bad}))


def test_tiny_run_summary_holds_intervals_and_the_report_renders_them(tmp_path):
    """model=tiny through the Hydra entry's run(): summary.json carries lo / hi / p_value / mde / n, the sd
    comparison (sd_dir) and stop-reason shares; W&B gets them; the report prints them without recomputing."""
    from mars_bench.run import runner as R
    from mars_bench.store.spec import RunSpec

    def run_tag(cfg, n):
        return spec_of(cfg, n).dir_name
    from mars_bench.report import all_tables, load_frames
    from mars_bench.report.columns import paired_columns, val
    from mars_bench.store.summary import summarize_run
    from mars_bench.run.wandb_logger import summary_values

    from .test_cli import tiny_cfg

    extra = ("task=gsm8k", "limit=4", "max_new_tokens=12", "method.theta=0.6", "stats.n_boot=500")
    for m in ("ar", "sd", "mars"):
        R.run(tiny_cfg(tmp_path, f"method={m}", *extra))
    cfg = tiny_cfg(tmp_path, "method=mars", *extra)
    task, samples, data_dir, max_new, task_dir, method = R.prepare(cfg)
    cfg_sd = tiny_cfg(tmp_path, "method=sd", *extra)
    spec = spec_of(cfg, max_new)
    s = summarize_run(task_dir / spec.dir_name, task, samples, spec, model=cfg.model.name, data_dir=data_dir,
                      settings=S.StatsSettings.from_cfg(cfg), config=OmegaConf.to_container(cfg, resolve=True),
                      draft_quant=draft_quant_of(cfg, method), ar_dir=task_dir / spec.baseline().dir_name,
                      sd_dir=task_dir / run_tag(cfg_sd, max_new))
    on_disk = json.loads((task_dir / run_tag(cfg, max_new) / "summary.json").read_text())
    st = on_disk["stats"]
    assert st["settings"]["n_boot"] == 500                       # cfg.stats reached the module
    for key in ("tau", "tokens_per_s", "speedup"):
        assert {"value", "lo", "hi", "n", "note"} <= set(st[key]) and st[key]["n"] == 4
    assert st["speedup"]["value"] == pytest.approx(on_disk["speedup"]["speedup"])
    for vs in ("quality_vs_ar", "quality_vs_sd"):
        for metric in ("accuracy_strict", "accuracy_flexible"):
            t = st[vs][metric]
            assert {"delta", "lo", "hi", "p_value", "mde", "n"} <= set(t) and t["n"] == 4
    assert on_disk["sd_run_dir"].endswith(run_tag(cfg_sd, max_new))
    for key in ("tau_authors", "speedup_authors"):               # the authors' formulas, beside ours
        assert st[key]["n"] == 4 and key in on_disk["definitions"] and "authors" in on_disk["definitions"][key]
    assert st["speedup_authors"]["value"] == pytest.approx(on_disk["speedup"]["speedup_authors"])
    assert on_disk["totals"]["tau_authors"] > on_disk["totals"]["tau"]           # idx = forwards - 1 per turn
    ni, ni_base = st["quality_vs_ar"]["accuracy_strict"]["noninferiority"], st["quality_vs_ar"]["accuracy_strict"]["base"]
    assert ni["margin_rel"] == 0.02 and ni["n"] == 4 and ni["margin"] == pytest.approx(0.02 * ni_base)
    assert on_disk["metric_specs"]["accuracy_strict"] == {"higher": True, "test": "binary",
                                                          "per_sample": "correct_strict"}
    shares = on_disk["stop_reasons"]
    assert shares["n"] == 4 and sum(shares[k] for k in ("max_new_tokens", "eos", "stop_string")) == pytest.approx(1)
    json.dumps(on_disk, allow_nan=False)
    values = summary_values(s)                                   # W&B: the run's row of the report's frames
    assert values["speedup_lo"] == st["speedup"]["lo"] and "vs_ar/accuracy_strict/p_value" in values
    assert values["speedup_authors_hi"] == st["speedup_authors"]["hi"]    # the authors' formulas, by their name
    assert values["tau_authors"] == pytest.approx(st["tau_authors"]["value"])
    frames = load_frames(tmp_path)
    mars = frames.runs[frames.runs["method"] == "mars"].iloc[0]
    assert not any("computed from samples" in n for n in mars["notes"])               # read, not redone
    for vs in ("ar", "sd"):
        for metric, t in st[f"quality_vs_{vs}"].items():
            assert {k: val(mars, k) for k in paired_columns(f"vs_{vs}/{metric}", t)} == \
                paired_columns(f"vs_{vs}/{metric}", t)
    main = {row["label"]: row for row in all_tables(frames)["main"].rows}
    row = main[mars["label"]]
    assert (row["speedup_lo"], row["speedup_hi"]) == (st["speedup"]["lo"], st["speedup"]["hi"])
    assert row["p_d_ar"] == st["quality_vs_ar"]["accuracy_strict"]["p_value"]
    assert row["truncated"] == pytest.approx(100 * shares["max_new_tokens"])


def test_one_sample_runs_render_notes_not_nan(tmp_path):
    """A results tree with one sample per run (q0 of the report fixture, no summaries): no interval, a
    clear note, and no 'nan' anywhere in the tables."""
    from pathlib import Path

    from mars_bench.report import all_tables, load_frames
    from mars_bench.report.columns import val

    fix = Path(__file__).parent / "fixtures" / "results" / "worker0" / "toy-pair_fp32_cpu" / "gsm8k-v1"
    for tag in ("ar-T0-p1-n8-s0", "sd-k2-T0-p1-n8-s0"):
        (tmp_path / "r" / "m_fp32_cpu" / "gsm8k-v1" / tag).mkdir(parents=True)
        first = (fix / tag / "samples.jsonl").read_text().splitlines()[0]
        (tmp_path / "r" / "m_fp32_cpu" / "gsm8k-v1" / tag / "samples.jsonl").write_text(first + "\n")
    frames = load_frames(tmp_path / "r")
    sd = frames.runs[frames.runs["method"] == "sd"].iloc[0]
    assert sd["speedup_note"] == "n = 1: one sample, no interval" and val(sd, "speedup_lo") is None
    tables = all_tables(frames)
    row = next(r for r in tables["main"].rows if r["label"] == "sd k=2")
    assert tables["main"].cell(row, "speedup", ".2f[]") == "2.00"          # (8/2) / (8/4), no interval
    for t in tables.values():
        for text in (t.to_markdown(), t.to_csv(), t.to_latex()):
            assert "nan" not in text.lower()
    q = [r for r in tables["quality"].rows if r["label"] == "sd k=2"]
    assert q and all(r["note"] == "n = 1: one sample, no interval" and r["delta_lo"] is None for r in q)
