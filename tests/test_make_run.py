"""`make run`, the first thing a new user sees: its job must decode a task whose answers finish inside the
budget (the authors' WMT19 zh-en segments at the authors' 512 new tokens), so the quality column measures
translations, not the token budget."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir

from mars_bench.config import schema as C
from mars_bench.config.settings import max_new_tokens_of
from mars_bench.config.validation import validate
from mars_bench.tasks import get_task

from .conftest import ROOT, data_dir

C.register()


def run_args() -> list[str]:
    """The overrides `make run` passes to mars-bench, read from the Makefile."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    assert "$(BIN)/mars-bench $(RUN_ARGS)" in recipe and "$(BIN)/mars-bench-report results" in recipe
    return shlex.split(re.search(r"^RUN_ARGS\s*:=\s*(.+)$", text, re.M).group(1))


def composed():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=run_args())
    validate(cfg)
    return cfg


def test_make_run_decodes_the_authors_wmt19_set_at_their_budget():
    cfg = composed()
    assert (cfg.model.source, cfg.task.name, cfg.subset, cfg.temperature) == ("embedded", "wmt19_zh_en", "paper", 0)
    assert [list(x) for x in cfg.interleave] == [["method=ar"], ["method=sd"], ["method=mars"]]
    task = get_task(cfg.task.name)
    budget = max_new_tokens_of(cfg, task.max_new_tokens)
    authors = yaml.safe_load((ROOT / "mars_bench" / "conf" / "protocol" / "authors.yaml").read_text())
    assert budget == authors["max_new_tokens"] == 512
    samples = task.load(data_dir(), limit=cfg.limit, subset=cfg.subset)
    assert len(samples) == cfg.limit and all(s.id.startswith("wmt19_zh_en/newstest2018/") for s in samples)
    # a byte-level BPE token covers at least one byte: a translation as long as the longest reference
    # (in UTF-8 bytes) fits the budget with room to spare, so an answer is cut only if it rambles on
    assert max(len(s.reference.encode()) for s in samples) <= budget


@pytest.mark.slow
def test_make_run_job_truncates_nothing(tmp_path):
    """The job itself on the embedded pair (~5 min on 2 cores): no method cuts a sample at the budget."""
    res = subprocess.run([sys.executable, "-m", "mars_bench.cli", *run_args(), f"results_dir={tmp_path}",
                          "progress=false"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    summaries = sorted(tmp_path.glob("*/wmt19_zh_en-*/*/summary.json"))
    assert [json.loads(p.read_text())["method"] for p in summaries] and len(summaries) == 3
    for p in summaries:
        s = json.loads(p.read_text())
        assert s["stop_reasons"]["max_new_tokens"] == 0.0 and s["totals"]["n_samples"] == composed().limit, p
