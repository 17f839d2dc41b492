"""A job's settings resolved once and handed down (issue 47): ``method_of`` once per job, validation included;
Hydra's global state read by the CLI only; the summary written from typed values, no config below the runner;
a study builds each job once however often its timed sample grows; the loaded models from a plain factory; the
default engine named once."""
from __future__ import annotations

import ast
import json
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mars_bench import engines
from mars_bench.config import schema as C
from mars_bench.config import settings as decode_settings
from mars_bench.config.overrides import Launch
from mars_bench.run import runner as R
from mars_bench.store.spec import NATIVE, RunSpec

from .conftest import ROOT, data_dir
from .test_cli import tiny_cfg

PKG = Path(__file__).resolve().parents[1] / "mars_bench"
HYDRA_GLOBALS = {"hydra.core.hydra_config", "hydra.core.global_hydra"}   # HydraConfig, GlobalHydra
# Hydra callbacks run inside Hydra and are handed its state by it: the sweep validator composes each job's config
HYDRA_PLUGINS = {"run/callbacks.py"}


def _reads_hydra_globals(path: Path) -> list[int]:
    """Lines of ``path`` that import Hydra's global state or name ``HydraConfig`` / ``GlobalHydra``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module in HYDRA_GLOBALS or (
                node.module == "hydra.core" and {a.name for a in node.names} & {"hydra_config", "global_hydra"})):
            out.append(node.lineno)
        elif isinstance(node, ast.Import) and {a.name for a in node.names} & HYDRA_GLOBALS:
            out.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in ("HydraConfig", "GlobalHydra"):
            out.append(node.lineno)
    return sorted(set(out))


def test_only_the_cli_reads_hydras_global_state(tmp_path):
    found = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if not rel.startswith("cli/") and rel not in HYDRA_PLUGINS:
            found += [f"{rel}:{line}" for line in _reads_hydra_globals(p)]
    assert not found, f"Hydra's global state read below the CLI: {found}"
    assert _reads_hydra_globals(PKG / "cli" / "app.py")          # the CLI does read it (launch_of)
    planted = tmp_path / "x.py"                                   # the check can fail
    planted.write_text("def f():\n    from hydra.core.hydra_config import HydraConfig\n    return HydraConfig.get()\n")
    assert _reads_hydra_globals(planted) == [2, 3]


@pytest.fixture
def counted_method_of(monkeypatch):
    """Every ``method_of`` the package holds, counted (a new caller anywhere is counted too)."""
    calls = []
    real = decode_settings.method_of

    def counted(cfg):
        calls.append(cfg.method.name)
        return real(cfg)

    for module in [m for name, m in list(sys.modules.items())
                   if name.startswith("mars_bench.") and getattr(m, "method_of", None) is real]:
        monkeypatch.setattr(module, "method_of", counted)
    return calls


def test_validation_returns_the_method_the_job_takes(tmp_path, counted_method_of):
    job = R.Job(tiny_cfg(tmp_path, "method=mars", "rule.theta=0.8", "task=gsm8k", "limit=1"))
    assert counted_method_of == ["mars"]                          # once: validation's, handed to the job
    assert job.method == decode_settings.method_of(job.cfg) and job.tag.settings["theta"] == 0.8


def _study_cfg(tmp_path, *extra):
    from mars_bench.cli.app import variant_configs

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True, overrides=[
            "+compare=methods", "model=tiny", "task=gsm8k", f"results_dir={tmp_path}", f"data_dir={data_dir()}",
            "progress=false", "max_new_tokens=8", *extra])
        return cfg, Launch(variants=variant_configs(cfg, list(cfg.hydra.overrides.task)))


def test_a_study_builds_each_job_once_however_often_its_timed_sample_grows(tmp_path, monkeypatch,
                                                                            counted_method_of):
    from mars_bench.run import study

    cfg, launch = _study_cfg(tmp_path, "limit=9", "study.batch_size=2", "study.timed_min=2", "study.timed_max=9",
                             "study.timed_ci=0.001")   # a CI that never gets that narrow: grows to timed_max
    built, rounds = [], []
    real_prepare, real_interleaved = R.prepare, study.run_interleaved
    monkeypatch.setattr(R, "prepare", lambda c: built.append(c.method.name) or real_prepare(c))
    monkeypatch.setattr(study, "run_interleaved",
                        lambda jobs, *a, **k: rounds.append(len(jobs[0].samples)) or real_interleaved(jobs, *a, **k))
    summaries = study.run_study(cfg, launch)
    methods = [v.method.name for v in launch.variants]
    assert len(rounds) >= 2 and rounds == sorted(rounds) and rounds[-1] == 9, rounds   # it grew, more than once
    quality = len(summaries) - len(methods)
    assert len(built) == len(methods) + quality                   # one Job per run directory, whatever the rounds
    assert counted_method_of == built                             # and one Method each, validation's
    for s in summaries[quality:]:                                 # the timed runs record the sample they timed
        assert s["config"]["limit"] == rounds[-1]
        assert OmegaConf.load(Path(s["run_dir"]) / "config.yaml").limit == rounds[-1]


def test_the_summary_is_written_from_typed_values(tmp_path):
    """No config reaches summarize_run: the spec, the model's name, the stats settings, the resolved config as a
    plain dict; what the summary says of the run is the spec's."""
    from mars_bench.stats import StatsSettings
    from mars_bench.store.summary import summarize_run

    job = R.Job(tiny_cfg(tmp_path, "method=mars", "task=gsm8k", "limit=2", "max_new_tokens=6", "temperature=0.5",
                         "seed=3"))
    R.run(job.cfg)
    written = json.loads((job.run_dir / "summary.json").read_text())
    config = {"a plain dict": ["kept as it is"]}
    s = summarize_run(job.run_dir, job.task, job.samples, job.tag, model="another-name", data_dir=job.data_dir,
                      settings=StatsSettings(n_boot=150), config=config, draft_quant="q9")
    assert (s["model"], s["config"], s["draft_quant"], s["stats"]["settings"]["n_boot"]) == (
        "another-name", config, "q9", 150)
    assert (s["temperature"], s["top_p"], s["seed"], s["batch_size"]) == (
        job.tag.temperature, job.tag.top_p, job.tag.seed, job.tag.batch_size) == (0.5, 1.0, 3, 1)
    assert written["config"] == job.config and written["model"] == job.model == "tiny"
    assert "theta" not in s and s["rule_settings"]["theta"] == job.tag.settings["theta"]   # theta once


def test_the_models_come_from_a_plain_factory(tmp_path):
    job = R.Job(tiny_cfg(tmp_path, "method=sd", "task=gsm8k", "limit=1"))
    models = R.models_for([job])
    assert type(models) is R.NativeModels and not isinstance(R.models_for, type)


def test_the_default_engine_is_named_once():
    assert engines.NATIVE is NATIVE and engines.names()[0] == NATIVE
    assert {f.name: f.default for f in fields(RunSpec)}["engine"] == NATIVE
    assert C.engine_default()["name"] == NATIVE                        # the schema's default is that engine
