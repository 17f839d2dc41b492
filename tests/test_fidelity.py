"""scripts/fidelity.py: the target's log-likelihood of sampled runs' outputs, teacher-forced over a cached prompt,
equals the target's own transformers forward over prompt + output; runs are grouped with their ar baseline; bad
input is one line."""
import importlib.util

import pytest
import torch
from hydra import compose, initialize_config_dir

from mars_bench.base.errors import InputError
from mars_bench.config import schema as C
from mars_bench.run import runner as R
from mars_bench.store.read import find_runs
from mars_bench.tasks import build_messages

from .conftest import ROOT, data_dir

spec = importlib.util.spec_from_file_location("fidelity", ROOT / "scripts" / "fidelity.py")
F = importlib.util.module_from_spec(spec)
spec.loader.exec_module(F)
C.register()


def _cfg(tmp, *extra):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[
            "model=tiny", f"results_dir={tmp}", f"data_dir={data_dir()}", "progress=false", "max_new_tokens=12",
            "limit=3", "temperature=1.0", *extra])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fidelity")
    for extra in (["method=ar"], ["method=sd", "method.k=3"], ["method=mars", "method.theta=0.6", "method.k=3"]):
        R.run(_cfg(tmp, *extra))
    R.run(_cfg(tmp / "greedy", "method=ar", "temperature=0"))
    return tmp


def test_groups_pair_sampled_runs_with_their_ar(results):
    found = F.groups(find_runs([results]), [])
    assert len(found) == 1                                  # the greedy tree is left out
    ar, runs = found[0]
    assert ar.spec.scheme == "ar" and sorted(r.spec.scheme for r in runs) == ["sd", "sd"]
    assert [r.spec.rule for r in F.groups(find_runs([results]), ["mars-*"])[0][1]] == ["mars"]


def test_scores_equal_the_targets_own_forward(results):
    ar, runs = F.groups(find_runs([results]), [])[0]
    scorer = F.Scorer(ar)
    model = scorer.pair.target.model
    for sid in sorted(rec["id"] for rec in ar.records):   # sample-major, as measure: the cache holds the prompt
        for rec in (next(x for x in run.records if x["id"] == sid) for run in [ar, *runs]):
            got = scorer.score(rec)
            turn = rec["turns"][0]
            out = turn["output_ids"]
            ids = scorer.pair.prompt_ids(build_messages(scorer.task, scorer.samples[rec["id"]], [], 0))
            with torch.no_grad():
                z = model(torch.tensor([ids + out])).logits[0, len(ids) - 1:-1].float()
            logp = torch.log_softmax(z.double(), -1)
            took = logp.gather(-1, torch.tensor(out)[:, None])[:, 0]
            h = -(logp.exp() * logp).sum(-1)
            var = (logp.exp() * logp * logp).sum(-1) - h * h
            assert got.tokens == len(out) == rec["new_tokens"] and got.outside == 0
            assert got.logp == pytest.approx(float(took.sum()), abs=1e-3)
            assert got.cal == pytest.approx(float((took + h).sum()), abs=1e-3)
            assert got.var == pytest.approx(float(var.sum()), rel=1e-4)


def test_rows_pair_on_samples_and_name_lossless(results):
    ar, runs = F.groups(find_runs([results]), [])[0]
    rows = F.measure(ar, runs, F.StatsSettings(n_boot=200))
    assert [r["lossless"] for r in rows] == [True] + [r.spec.rule == "exact" for r in runs]
    assert all(r["n"] == 3 for r in rows) and "delta" not in rows[0]
    for r in rows:
        c = r["calibration"]
        assert c["lo"] < c["gap"] < c["hi"] and c["tokens"] == r["tokens"] and 0 <= c["p_value"] <= 1
    for r in rows[1:]:
        assert r["delta"]["delta"] == pytest.approx(r["mean_logp"] - rows[0]["mean_logp"])
    text = F.markdown([(ar, rows)])
    assert "| ar" in text and "outside top-p" in text and text.count("\n| ") == 2 + len(runs)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_calibration_is_centred_on_draws_from_the_law_and_moves_off_it(top_p):
    """Monte Carlo of the statistic alone: tokens drawn from the sampling law w (softmax(z / T), top-p) give
    z ~ N(0, 1); tokens drawn from a sharper law (T / 2, towards the mode) or a flatter one (2 T) move it to large
    positive / negative z; a draw outside the top-p support is counted, never scored."""
    from mars_bench.decode.sampling import warp

    g = torch.Generator().manual_seed(0)
    z = torch.randn(4000, 50, generator=g) * 2.0
    for t, sign in ((1.0, 0), (0.5, 1), (2.0, -1)):
        draws = torch.multinomial(warp(z, t, top_p), 1, generator=g)[:, 0].tolist()
        s = F.token_scores(z, draws, 1.0, top_p)
        zs = s.cal / s.var ** 0.5
        if sign == 0:
            assert abs(zs) < 4 and s.outside == 0
        else:
            assert zs * sign > 10
    if top_p < 1:
        last = warp(z, 1.0, top_p).argmin(-1).tolist()
        assert F.token_scores(z, last, 1.0, top_p).outside == len(last)


def test_a_prompt_that_does_not_rebuild_is_named(results):
    ar, _ = F.groups(find_runs([results]), [])[0]
    rec = dict(ar.records[0], turns=[dict(ar.records[0]["turns"][0], prompt_tokens=1)])
    with pytest.raises(InputError, match=rec["id"]):
        F.Scorer(ar).score(rec)


def test_bad_input_is_one_line(results, tmp_path, capsys):
    assert F.main([str(tmp_path / "none")]) == 2
    assert F.main([str(results / "greedy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no such results tree" in err[0] and "no sampled (T > 0)" in err[1]
