"""mars_bench/report/serving.py's pooling over rounds and scripts/bench_serve.py's rounds, without vLLM: synthetic
served runs (typed ``ServedRun``s as ``serving.load`` reads them), the CI of x exact recomputed here from the runs'
tokens and call wall times (scipy's t quantile), the quality over prompts, and the bench's --rounds settings. The
served runs of vLLM itself: tests/test_vllm_serve.py (``vllm`` tier)."""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student

from mars_bench.report import serving
from mars_bench.store.spec import RunSpec

from .conftest import ROOT

sys.path[:0] = [str(ROOT / "scripts")]
import bench_serve as B  # noqa: E402

METRICS = {"accuracy_strict": {"higher": True, "test": "binary", "per_sample": "correct_strict"}}
PROMPTS = 4


def spec(rule: str, seed: int, c: int = 4) -> RunSpec:
    return RunSpec("sd", rule, 0.0, 1.0, 16, seed, k=2, settings={"theta": 0.9} if rule == "mars" else {},
                   batch_size=c, engine="vllm", engine_version="0.32.0", serve=True)


def run_of(rule: str, seed: int, wall: float, correct: list[int], c: int = 4) -> serving.ServedRun:
    """PROMPTS records of 10 new tokens each (two steps: proposed 2 / 2, accepted 2 / 1 for mars, 1 / 0 for sd),
    one call of ``wall`` seconds; ``correct``: each prompt's score."""
    acc = [2, 1] if rule == "mars" else [1, 0]
    recs = [{"id": f"p{i}", "n_relaxed": int(rule == "mars"), "score": {"correct_strict": correct[i]},
             "turns": [{"new_tokens": 10, "proposed": [2, 2], "accepted": acc, "output_ids": [i, seed],
                        "ttft_s": 0.01 * (i + 1), "tpot_s": 0.002, "itl_s": [0.003, 0.004]}]}
            for i in range(PROMPTS)]
    per_pos = [PROMPTS * sum(a >= i for a in acc) for i in (1, 2)]
    calls = [{"wall_s": wall, "metrics": {"num_drafts": 2 * PROMPTS, "accepted_per_pos": per_pos}}]
    return serving.ServedRun(spec(rule, seed, c), recs, {"metric_specs": METRICS}, calls,
                             Path(f"/r/{rule}{seed}"), "gsm8k-v1", "tiny")


SD_WALL, MARS_WALL = (2.0, 2.2, 1.9), (1.6, 1.9, 1.5)
SD_OK, MARS_OK = ([1, 0, 1, 0], [1, 0, 1, 1], [1, 0, 1, 0]), ([1, 0, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0])


def three_rounds() -> list:
    return [run_of("exact", s, SD_WALL[s], SD_OK[s]) for s in range(3)] + \
           [run_of("mars", s, MARS_WALL[s], MARS_OK[s]) for s in range(3)]


def test_x_exact_is_the_geometric_mean_over_rounds_with_a_t_interval_on_log_ratios():
    df = serving.rows(three_rounds())
    assert list(df["rule"]) == ["exact", "mars"] and list(df["rounds"]) == [3, 3]
    mars = df[df["rule"] == "mars"].iloc[0]
    # recomputed here from tokens and wall times: tokens/s = 40 / wall, so the ratio of a round = sd wall / mars wall
    logs = np.log([a / b for a, b in zip(SD_WALL, MARS_WALL)])
    half = student.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert mars["vs_exact"] == pytest.approx(math.exp(logs.mean()))
    assert (mars["vs_exact_lo"], mars["vs_exact_hi"]) == pytest.approx((math.exp(logs.mean() - half),
                                                                        math.exp(logs.mean() + half)))
    assert mars["vs_exact_lo"] < mars["vs_exact"] < mars["vs_exact_hi"] and mars["vs_exact_n"] == 3
    assert mars["tokens_per_s"] == pytest.approx(np.mean([40 / w for w in MARS_WALL]))
    assert serving.ratio_text(mars) == f"{mars['vs_exact']:.2f} [{mars['vs_exact_lo']:.2f}, {mars['vs_exact_hi']:.2f}]"
    assert serving.ratio_text(df[df["rule"] == "exact"].iloc[0]) == "-"


def test_latency_acceptance_and_identity_are_pooled_over_rounds():
    mars = serving.rows(three_rounds()).iloc[1]
    ttft = [0.01 * (i + 1) for i in range(PROMPTS)] * 3
    assert mars["ttft_p90_ms"] == pytest.approx(np.percentile(ttft, 90) * 1000)
    assert mars["itl_p50_ms"] == pytest.approx(3.5)
    assert mars["positions"] == mars["positions_metrics"] == [1.0, 0.5] and mars["relaxed"] == 3 * PROMPTS
    assert mars["identical_to_exact"] == f"{3 * PROMPTS}/{3 * PROMPTS}"   # output ids [i, seed] in both rules
    assert mars["n"] == PROMPTS and mars["seeds"] == [0, 1, 2]


def test_quality_is_averaged_per_prompt_over_rounds_with_cis_over_prompts():
    df = serving.rows(three_rounds())
    exact, mars = df.iloc[0], df.iloc[1]
    per_prompt = lambda ok: [np.mean([r[i] for r in ok]) for i in range(PROMPTS)]  # noqa: E731
    q = mars["quality"]["accuracy_strict"]
    assert q["value"] == pytest.approx(np.mean(per_prompt(MARS_OK))) and q["n"] == PROMPTS
    assert q["lo"] <= q["value"] <= q["hi"]
    d = mars["quality_vs_exact"]["accuracy_strict"]
    assert d["delta"] == pytest.approx(np.mean(per_prompt(MARS_OK)) - np.mean(per_prompt(SD_OK)))
    assert d["n"] == PROMPTS and d["lo"] <= d["delta"] <= d["hi"]
    assert exact["quality_vs_exact"] == {} and exact["quality"]["accuracy_strict"]["n"] == PROMPTS
    md = serving.render(df)
    assert serving.CAPTION in md and "t-interval" in md and "| -0.250 [" in md


def test_one_round_shows_no_interval_and_never_a_fake_one(tmp_path):
    df = serving.rows([run_of("exact", 0, 2.0, SD_OK[0]), run_of("mars", 0, 1.6, MARS_OK[0])])
    mars = df.iloc[1]
    assert mars["vs_exact"] == pytest.approx(1.25) and mars["vs_exact_n"] == 1
    assert mars["vs_exact_lo"] is None and mars["vs_exact_hi"] is None
    assert serving.ratio_text(mars) == "1.25 (CI n/a: 1 round)"
    md, _ = serving.write_rows(df, tmp_path / "serve.md", figures=False)
    assert "1.25 (CI n/a: 1 round)" in md and (tmp_path / "serve.json").is_file()


def test_rounds_pair_by_seed_and_concurrencies_stay_apart():
    runs = three_rounds() + [run_of("exact", 0, 1.0, SD_OK[0], c=1), run_of("mars", 0, 1.0, MARS_OK[0], c=1)]
    df = serving.rows(runs[:5] + runs[6:])        # mars's round 2 missing at c = 4: two paired rounds left
    at4 = df[(df["concurrency"] == 4) & (df["rule"] == "mars")].iloc[0]
    assert at4["rounds"] == 2 and at4["vs_exact_n"] == 2
    assert at4["vs_exact_rounds"] == pytest.approx([SD_WALL[s] / MARS_WALL[s] for s in (0, 1)])
    at1 = df[(df["concurrency"] == 1) & (df["rule"] == "mars")].iloc[0]
    assert at1["rounds"] == 1 and at1["vs_exact"] == pytest.approx(1.0)


def test_each_round_gets_its_own_seed_and_alternates_the_rule_decoded_first():
    from hydra import compose, initialize_config_dir

    from mars_bench.cli.app import CONF_DIR

    entries = B.serve_entries()
    assert entries == [["method=sd"], ["method=mars", "rule.theta=0.9"]]
    firsts = []
    for r in (1, 2, 3):
        over = B.round_overrides(entries, r)
        assert over[0] == f"seed={r - 1}"
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="config", overrides=["+compare=serve", "model=tiny", *over])
        firsts.append(list(cfg.interleave[0]))
        assert cfg.seed == r - 1 and len(cfg.interleave) == 2
    assert firsts == [["method=sd"], ["method=mars", "rule.theta=0.9"], ["method=sd"]]


@pytest.mark.parametrize("args, says", [(["--rounds", "0"], "--rounds=0; allowed: an integer >= 1"),
                                        (["seed=3"], "override 'seed=3'; allowed: overrides other than seed and "
                                                     "interleave")])
def test_bad_rounds_are_refused_in_one_line(args, says, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_serve.py"), "--runs", str(tmp_path / "r"),
                           *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().startswith(says)
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_exact_alone_or_mars_without_exact_renders():
    only_exact = serving.rows([run_of("exact", 0, 2.0, SD_OK[0])])
    assert serving.ratio_text(only_exact.iloc[0]) == "-" and "| sd " in serving.render(only_exact)
    alone = serving.rows([run_of("mars", 0, 1.6, MARS_OK[0])]).iloc[0]
    assert alone["vs_exact_n"] == 0 and serving.ratio_text(alone) == "-" and alone["identical_to_exact"] is None


def test_a_corpus_metric_is_each_rounds_own_paired_bootstrap_from_its_summary():
    """BLEU has no per-prompt score to pool over rounds: the row carries each round's sacrebleu estimate and paired
    test (the runner's summary.json, made with the references), once where the rounds agree, per round where not."""
    from sacrebleu.metrics import BLEU

    from mars_bench import stats as S

    refs = [f"the cat sat on mat number {i} today" for i in range(12)]
    exact_h = [f"the cat sat on the mat number {i} today" for i in range(12)]
    mars_h = [[f"a cat sat on mat number {i} today" if i < 6 + s else exact_h[i] for i in range(12)] for s in range(2)]
    bleu = {"bleu": {"higher": True, "test": "corpus_bleu", "per_sample": "hypothesis"}}
    st = S.StatsSettings(n_boot=200)

    def served(rule, seed, hyps):
        stats = {"quality": {"bleu": S.corpus_ci(hyps, refs, st)["bleu"]}}
        if rule == "mars":
            stats["quality_vs_sd"] = {"bleu": S.corpus_delta(hyps, exact_h, refs, st)["bleu"]}
        recs = [{"id": f"p{i}", "n_relaxed": 0, "score": {"hypothesis": h},
                 "turns": [{"new_tokens": 10, "proposed": [2], "accepted": [1], "output_ids": [i],
                            "ttft_s": 0.01, "tpot_s": 0.002, "itl_s": [0.003]}]} for i, h in enumerate(hyps)]
        return serving.ServedRun(spec(rule, seed), recs, {"metric_specs": bleu, "stats": stats}, [],
                                 Path(f"/r/{rule}{seed}"), "wmt19_zh_en-v2", "tiny")

    rounds = [served("exact", s, exact_h) for s in range(2)] + [served("mars", s, mars_h[s]) for s in range(2)]
    df = serving.rows(rounds, st)
    exact, mars = df.iloc[0], df.iloc[1]
    want = [BLEU().corpus_score(h, [refs]).score for h in mars_h]
    assert [e["value"] for e in mars["quality"]["bleu"]["per_round"]] == pytest.approx(want)
    deltas = [t["delta"] for t in mars["quality_vs_exact"]["bleu"]["per_round"]]
    assert deltas == pytest.approx([w - BLEU().corpus_score(exact_h, [refs]).score for w in want])
    value, delta = serving.quality_cells(mars["quality"], mars["quality_vs_exact"])["bleu"]
    assert value.startswith("r1: ") and " / r2: " in value and delta.count("n 12") == 2 and delta.startswith("r1: ")
    value, delta = serving.quality_cells(exact["quality"], exact["quality_vs_exact"])["bleu"]
    assert value == serving._value_text(exact["quality"]["bleu"]["per_round"][0]) and delta == "-"
    md = serving.render(df)
    assert "| bleu [95% CI]" in md and "Δ bleu vs exact [95% CI], p, n" in md
    assert serving.point(mars["quality"]["bleu"]) == pytest.approx(np.mean(want))
