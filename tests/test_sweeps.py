"""Configs, sweeps and launchers: every config composes, sweeps are validated before any job starts,
a theta multirun on the tiny pair yields summaries, tables and figures, finished ar samples are reused,
the submitit launcher runs a sweep, and the W&B logger works offline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mars_bench.config.spec import spec_of
from mars_bench.config import schema as C
from mars_bench.config.validation import validate
from mars_bench.store.spec import read_spec

from .rundirs import find_run

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
DATA = Path(os.environ.get("MARS_BENCH_DATA_DIR", ROOT.parent / "shared" / "data"))
TINY = ["model=tiny", "progress=false"]


def mars_bench(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "MARS_BENCH_DATA_DIR": str(DATA), "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "mars_bench.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


GROUP_OVERRIDES = ([f"{g}={o}" for g in ("model", "method", "task", "logger", "rule", "protocol") for o in options(g)]
                   + [f"+{g}={o}" for g in ("sweep", "experiment", "debug", "compare", "engine/h100")
                      for o in options(g)]
                   + [f"hydra/{g}={o}" for g in ("launcher", "callbacks") for o in options(f"hydra/{g}")])
# jobs per sweep: theta 0.84..0.98 step 0.02 + 1.0 = 9; cpu_reproduction 4 tasks x 3 methods x 3 thetas
# (the GPU table / theta / fidelity presets are interleaved, not sweeps: tests/test_gpu_presets.py)
SWEEP_JOBS = {"+sweep=theta": 9, "+sweep=methods": 3, "+experiment=qwen3_gsm8k_logits": 1,
              "+experiment=cpu_reproduction_full": 4}


@pytest.fixture(scope="module")
def hydra_ctx():
    C.register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield


@pytest.mark.parametrize("override", GROUP_OVERRIDES)
def test_every_config_composes_and_validates(hydra_ctx, override):
    if override.startswith("hydra/launcher="):
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    # EAGLE-3 methods need a head on the model (only qwen3_235b_a22b ships one): a placeholder id validates
    extra = ["model.eagle3=placeholder/eagle3-head"] if override.startswith("method=eagle3") else []
    extra += ["method=sd"] if override.startswith("rule=") else []   # the default method is the mars preset
    extra += ["method=eagle3"] if override == "model=qwen3_235b_a22b" else []   # an EAGLE-3 head, no draft model
    cfg = compose("config", overrides=[override, *extra], return_hydra_config=override.startswith("hydra/"))
    if not override.startswith("hydra/"):
        validate(cfg)
    assert OmegaConf.is_config(cfg)


def test_every_config_file_is_covered():
    groups = [p.parent.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml") if p.parent != CONF]
    assert set(groups) == {"model", "method", "rule", "task", "logger", "sweep", "experiment", "debug", "compare",
                           "protocol", "hydra/launcher", "hydra/callbacks", "engine", "engine/h100"}


def test_paper_model_configs(hydra_ctx):
    q = compose("config", overrides=["model=qwen3_0.6b_32b"]).model
    assert (q.source, q.target, q.draft, q.dtype, q.device, q.device_map) == \
        ("hf", "Qwen/Qwen3-32B", "Qwen/Qwen3-0.6B", "bf16", "cuda", "auto")
    assert q.enable_thinking is False   # the authors run Qwen3 with --disable-thinking
    m = compose("config", overrides=["model=llama31_8b_70b"]).model
    assert (m.target, m.draft, m.dtype, m.device_map) == \
        ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "bf16", "auto")


@pytest.mark.parametrize("override", sorted(SWEEP_JOBS))
def test_every_sweep_job_validates(hydra_ctx, override, monkeypatch):
    from mars_bench.run.callbacks import sweep_jobs, validate_sweep

    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(DATA))
    cfg = compose("config", overrides=[override], return_hydra_config=True)
    assert "validate_sweep" in cfg.hydra.callbacks
    assert validate_sweep(cfg, check_task=DATA.is_dir()) == SWEEP_JOBS[override]
    if override == "+sweep=theta":
        thetas = [float(o.split("=")[1]) for j in sweep_jobs(cfg) for o in j if o.startswith("method.theta=")]
        assert thetas == [0.84, 0.86, 0.88, 0.9, 0.92, 0.94, 0.96, 0.98, 1.0]


def test_sweep_order_later_config_wins(hydra_ctx):
    cfg = compose("config", overrides=["+experiment=qwen3_gsm8k_fidelity", "+sweep=methods"],
                  return_hydra_config=True)
    assert cfg.temperature == 0.0
    assert dict(cfg.hydra.sweeper.params) == {"method": "ar,sd,mars", "method.theta": "0.9"}


def test_out_of_range_sweep_value_fails_before_any_job(tmp_path):
    res = mars_bench("-m", "+sweep=theta", *TINY, "method.theta=0.9,1.5", f"results_dir={tmp_path / 'r'}",
                     "limit=1", "max_new_tokens=4")
    assert res.returncode == 2, res.stderr
    assert "method.theta=1.5; allowed: a number in (0, 1]" in res.stderr
    assert "sweep job #1" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "r").exists()               # nothing launched, nothing written
    # the callback also checks command-line sweeps (hydra/callbacks=validate) and task options
    res = mars_bench("-m", "hydra/callbacks=validate", *TINY, "method.k=2,0", f"results_dir={tmp_path / 'r'}")
    assert res.returncode == 2 and "method.k=0; allowed: an integer >= 1" in res.stderr
    assert not (tmp_path / "r").exists()


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def test_theta_multirun_and_baseline_reuse(tmp_path):
    results = tmp_path / "results"
    common = [*TINY, f"results_dir={results}", "limit=2", "max_new_tokens=12"]
    res = mars_bench("-m", "+sweep=methods", *common)
    assert res.returncode == 0, res.stderr[-2000:]
    task_dir = results / "tiny_fp32_cpu" / "prompts-v1"
    ar = find_run(task_dir, "ar-T0-p1-n12-s0") / "samples.jsonl"
    before = (ar.stat().st_mtime_ns, ar.read_bytes())
    assert _lines(ar) == 2
    # a second sweep that needs ar again: the finished ar samples are reused, not recomputed
    res = mars_bench("-m", "+sweep=theta", "method=ar,mars", "method.theta=0.85,0.95", *common)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (ar.stat().st_mtime_ns, ar.read_bytes()) == before
    assert res.stdout.count("ar: 2 samples (2 already done)") == 2      # one ar job per theta, both no-ops
    tags = sorted(read_spec(p.parent).label for p in task_dir.glob("*/summary.json"))
    assert tags == ["ar-T0-p1-n12-s0", "mars-k4-th0.85-T0-p1-n12-s0", "mars-k4-th0.9-T0-p1-n12-s0",
                    "mars-k4-th0.95-T0-p1-n12-s0", "sd-k4-T0-p1-n12-s0"]
    for tag in tags[1:]:
        s = json.loads((find_run(task_dir, tag) / "summary.json").read_text())
        assert s["totals"]["n_samples"] == 2 and s["speedup"]["n_common"] == 2    # ar existed
    from mars_bench.cli.report import main

    assert main([str(results)]) == 0
    rep = results / "report"
    theta_md = (rep / "tables" / "theta.md").read_text()
    assert all(f"| mars θ={t} " in theta_md for t in ("0.85", "0.9", "0.95")) and "| sd " in theta_md
    assert "every method but ar: **k=4**" in theta_md          # the compact view names shared words once
    figs = sorted(p.name.split("__")[0] for p in (rep / "figures").glob("*.png"))
    assert {"speedup_tau", "theta_sensitivity", "fidelity_vs_theta", "r_distribution",
            "z1_histogram"} <= set(figs)


def test_submitit_local_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    results = tmp_path / "results"
    res = mars_bench("-m", "hydra/launcher=local", "+sweep=theta", "method.theta=0.85,0.95", *TINY,
                     f"results_dir={results}", "limit=1", "max_new_tokens=6")
    assert res.returncode == 0, res.stderr[-2000:]
    task_dir = results / "tiny_fp32_cpu" / "prompts-v1"
    for tag in ("mars-k4-th0.85-T0-p1-n6-s0", "mars-k4-th0.95-T0-p1-n6-s0"):
        assert json.loads((find_run(task_dir, tag) / "summary.json").read_text())["totals"]["n_samples"] == 1
    assert list((results / "multirun" / ".submitit").glob("*/*_result.pkl"))     # ran as submitit jobs


def test_loggers(tmp_path, monkeypatch):
    from mars_bench.run.wandb_logger import NoopLogger, make_logger, sweep_group

    assert isinstance(make_logger(OmegaConf.create({"name": "none"}), tmp_path), NoopLogger)
    with pytest.raises(ValueError, match="logger.name='x'"):
        make_logger(OmegaConf.create({"name": "x"}), tmp_path)
    run_dir = tmp_path / "tiny_fp32_cpu" / "prompts-v1" / "mars-k4-th0.9-T0-p1-n8-s0"
    assert sweep_group(run_dir) == "run/tiny_fp32_cpu/prompts-v1/T0-p1-n8-s0"
    assert sweep_group(tmp_path / "m" / "t" / "T9-p1-n8-s0") == "run/m/t/unknown"   # no spec: never the folder's name
    pytest.importorskip("wandb")
    import shutil

    fx = ROOT / "tests" / "fixtures" / "results" / "worker0"
    shutil.copytree(fx, tmp_path / "res")
    run_dir = tmp_path / "res" / "toy-pair_fp32_cpu" / "gsm8k-v1" / "mars-k2-th0.9-T0-p1-n8-s0"
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = OmegaConf.create({"method": {"name": "mars"}, "task": {"name": "gsm8k"}})
    logger = make_logger(OmegaConf.create({"name": "wandb", "project": "t", "mode": "offline"}), run_dir, cfg)
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        logger.log_sample(json.loads(line))
    logger.log_summary(json.loads((run_dir / "summary.json").read_text()))
    logger.close()
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))           # offline: stored locally
    assert {p.name.split("__")[0] for p in (run_dir / "figures").glob("*.png")} >= {"r_distribution"}


@pytest.mark.parametrize("override", ["+compare=methods", "+sweep=rules", "+experiment=cpu_reproduction",
                                      "+experiment=study_theta", "+experiment=study_methods"])
def test_every_compare_entry_composes_and_validates(hydra_ctx, override):
    """Each entry of an interleaved comparison is a job of its own: it must compose and validate, and
    no two entries may name the same run directory."""
    from mars_bench.store.spec import RunSpec

    base = compose("config", overrides=[override])
    assert len(base.interleave) >= 3
    tags = []
    for entry in base.interleave:
        cfg = compose("config", overrides=[override, *entry])
        validate(cfg)
        tags.append(spec_of(cfg, 64).dir_name)
    assert len(set(tags)) == len(tags) and tags[0].startswith("ar-")


@pytest.mark.parametrize("task", ["wmt19_zh_en", "gsm8k", "humaneval", "mt_bench", "alpaca", "cnn_dm"])
def test_the_reproduce_full_studies_compose_and_validate_per_task(hydra_ctx, task):
    """make reproduce-full: study_theta on WMT19, study_methods on every other task, the paper's subsets."""
    experiment = "study_theta" if task == "wmt19_zh_en" else "study_methods"
    cfg = compose("config", overrides=[f"+experiment={experiment}", f"task={task}"])
    validate(cfg)
    assert cfg.study.batch_size == 16 and cfg.subset == "paper" and cfg.batch_size == 1
    assert [list(e) for e in cfg.interleave][:2] == [["method=ar"], ["method=sd"]]
