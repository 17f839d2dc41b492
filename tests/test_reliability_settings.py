"""Bad values, all of them (property-based): every CLI setting either runs or stops with ONE line naming the
setting and what is allowed, before any model loads or file is written; never a traceback.

Most examples go through the same layers as the CLI, in-process: ``check_overrides`` (what Hydra would refuse),
then the override applied to a composed config and ``run.prepare`` (validation, task and data checks). A handful
go through the real ``mars-bench`` subprocess.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from mars_bench.base.errors import ConfigError
from mars_bench.config import schema as C
from mars_bench.config.overrides import check_overrides
from mars_bench.run import runner as R

from .conftest import ROOT, data_dir

C.register()
NUMBERS = ["-1", "0", "1", "2", "7", "nan", "inf", "-inf", "1e99", "-1e99", "0.5", "1.5", "''", "abc", "true",
           "null", "10000000000000000000000", "4294967296", "1e-300"]
BASE = {}


def _base(task: str = "prompts"):
    if task not in BASE:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            BASE[task] = compose(config_name="config", overrides=[
                "model=tiny", f"task={task}", "progress=false", f"data_dir={data_dir()}", "limit=2"])
    return BASE[task]


def outcome(arg: str, results, task: str = "prompts") -> str | None:
    """None when the setting is accepted (the run would start), else the one-line error the CLI prints."""
    try:
        check_overrides([arg])
        o = OverridesParser.create().parse_overrides([arg])[0]
        cfg = OmegaConf.create(OmegaConf.to_container(_base(task)))
        OmegaConf.set_struct(cfg, True)
        if o.key_or_group != "results_dir":
            cfg.results_dir = str(results)
        if o.key_or_group == "task":
            cfg = OmegaConf.create(OmegaConf.to_container(_base(o.value())))
            cfg.results_dir = str(results)
        else:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        R.prepare(cfg)
    except (ConfigError, ValueError) as e:   # what the CLI turns into "mars-bench: error: <e>"
        return str(e)
    return None


def _check(arg: str, tmp_path, task: str = "prompts") -> str | None:
    results = tmp_path / "results"
    msg = outcome(arg, results, task)
    assert not results.exists(), f"{arg}: something was written"
    if msg is not None:
        key = arg.split("=", 1)[0].lstrip("+")
        assert "\n" not in msg and msg.strip(), (arg, msg)
        assert ("allowed" in msg) and (key.split(".")[-1] in msg or "subset" in msg or "override" in msg), (arg, msg)
    return msg


def _accepted_value_is_sane(key: str, raw: str, msg: str | None) -> None:
    """Values outside the documented ranges must never be accepted."""
    if msg is not None:
        return
    try:
        v = float(raw)
    except ValueError:
        v = None
    if key in ("limit", "max_new_tokens", "method.k", "seed") and raw != "null":
        assert v is not None and v == int(v) and v >= (0 if key == "seed" else 1), (key, raw)
    if key in ("temperature", "top_p"):
        assert v is not None and math.isfinite(v) and v >= 0, (key, raw)
        assert key != "top_p" or 0 < v <= 1, (key, raw)


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory):
    """A user cache that already holds the GSM8K file (so nothing is downloaded here)."""
    root = tmp_path_factory.mktemp("cache")
    (root / "data" / "gsm8k").mkdir(parents=True)
    (root / "data" / "gsm8k" / "test.jsonl").write_bytes((data_dir() / "gsm8k" / "test.jsonl").read_bytes())
    return root


SETTINGS = st.sampled_from(["limit", "seed", "temperature", "top_p", "max_new_tokens", "method.k"])
FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(key=SETTINGS, raw=st.sampled_from(NUMBERS) | st.integers(-10**30, 10**30).map(str)
       | st.floats(allow_nan=True, allow_infinity=True).map(repr) | st.text(max_size=8))
def test_numeric_settings_run_or_stop_in_one_line(tmp_path, key, raw):
    arg = f"{key}={raw}"
    _accepted_value_is_sane(key, raw, _check(arg, tmp_path))


PATHY = st.sampled_from(["''", "' '", "..", "../x", "a/../../b", "'ü/日本語'", "'x y'", "/proc/version/x",
                         "/dev/null", "abc"]) | st.text(st.characters(blacklist_characters="'\\\x00",
                                                                        blacklist_categories=("Cs", "Cc")),
                                                        min_size=0, max_size=12).map(lambda s: f"'{s}'")


@FAST
@given(key=st.sampled_from(["results_dir", "data_dir"]), raw=PATHY)
def test_path_settings_run_or_stop_in_one_line(tmp_path, key, raw, monkeypatch, filled_cache):
    monkeypatch.chdir(tmp_path)                  # relative paths land in this test's folder
    monkeypatch.delenv("MARS_BENCH_DATA_DIR", raising=False)
    monkeypatch.setenv("MARS_BENCH_CACHE", str(filled_cache))   # a folder without the file falls back to it
    task = "gsm8k" if key == "data_dir" else "prompts"
    arg = f"{key}={raw}"
    results = tmp_path / "results"
    msg = outcome(arg, results, task)
    if msg is not None:
        assert "\n" not in msg and ("allowed" in msg or "override" in msg), (arg, msg)
    else:
        assert key != "data_dir" or raw.strip("'").strip() not in ("", "/dev/null", "/proc/version/x"), arg
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [], f"{arg}: wrote {written}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.sampled_from(["gsm8k", "prompts", "abc", "''", "humaneval"]),
       subset=st.sampled_from(["null", "paper", "''", "full", "abc", "'日本'", "writing"]))
def test_task_and_subset_run_or_stop_in_one_line(tmp_path, task, subset):
    msg = _check(f"task={task}", tmp_path)
    if msg is None:
        _check(f"subset={subset}", tmp_path, task)


PROTOCOL_ALLOWED = {"protocol.system_prompt": {"none", "llama2"}, "protocol.budget": {"exact", "after_step"},
                    "protocol.task_prompts": {"ours", "authors"}}


@FAST
@given(key=st.sampled_from(sorted(PROTOCOL_ALLOWED) + ["protocol.max_new_tokens", "model.enable_thinking"]),
       raw=st.sampled_from(NUMBERS + ["none", "llama2", "LLAMA2", "exact", "after_step", "after-step", "ours",
                                      "authors", "false", "False", "yes"]) | st.text(max_size=8))
def test_protocol_settings_run_or_stop_in_one_line(tmp_path, key, raw):
    msg = _check(f"{key}={raw}", tmp_path)
    if msg is None and key in PROTOCOL_ALLOWED:
        assert raw in PROTOCOL_ALLOWED[key], (key, raw)
    if msg is None and key == "protocol.max_new_tokens":
        assert raw == "null" or (float(raw) == int(float(raw)) >= 1), raw


# ---- the real CLI: one line on stderr, exit 2, nothing written ---------------------------------------------
@pytest.mark.parametrize("args", [
    ["seed=abc"], ["limit=1e99"], ["temperature=inf"], ["top_p=nan"], ["results_dir=''"], ["task=abc"],
    ["method.k=0"], ["results_dir=../x/ü"], ["task=gsm8k", "data_dir=/nonexistent/data"], ["seed=-1"],
    ["--multirun", "seed=0,abc"], ["--multirun", "method.k=2,0"],
    ["protocol=theirs"], ["protocol=authors", "protocol.budget=soft"],
    ["model.enable_thinking=false"],   # the tiny chat template has no such switch: refused before weights load
])
def test_cli_bad_values_one_line_nothing_written(tmp_path, args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MARS_BENCH_DATA_DIR", None)
    flags = [a for a in args if a.startswith("-")]
    rest = [a for a in args if not a.startswith("-")]
    res = subprocess.run([sys.executable, "-m", "mars_bench.cli", *flags, "model=tiny", "progress=false", "limit=1",
                          *([] if any(a.startswith("results_dir") for a in rest) else [f"results_dir={tmp_path}/r"]),
                          *rest], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("mars-bench: error: ") and "allowed" in lines[0] and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_unicode_and_dotdot_paths_run(tmp_path):
    (tmp_path / "a").mkdir()
    res = subprocess.run([sys.executable, "-m", "mars_bench.cli", "model=tiny", "progress=false", "limit=1",
                          "max_new_tokens=4", "results_dir='../résultats 日本'"], cwd=tmp_path / "a",
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert list((tmp_path / "résultats 日本").rglob("summary.json"))
