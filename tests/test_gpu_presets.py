"""The GPU experiment presets decode interleaved (+compare-style lists, like the CPU study) with a warm-up;
the capture setting (CUDA graphs through torch.compile) is off by default and refused on a CPU."""
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from mars_bench.config import schema as C
from mars_bench.config.validation import validate
from mars_bench.run import runner
from mars_bench.base.errors import ConfigError
from mars_bench.models.pairs import capture

from .conftest import ROOT

GPU = {"qwen3_gsm8k_table": 3, "llama31_humaneval_table": 3, "qwen3_gsm8k_theta": 11,
       "llama31_humaneval_theta": 11, "qwen3_gsm8k_fidelity": 11}


@pytest.fixture(scope="module")
def hydra_ctx():
    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield


@pytest.mark.parametrize("name", sorted(GPU))
def test_gpu_presets_are_interleaved_not_swept(hydra_ctx, name):
    cfg = compose("config", overrides=[f"+experiment={name}"], return_hydra_config=True)
    entries = [list(e) for e in cfg.interleave]
    assert len(entries) == GPU[name] and entries[:2] == [["method=ar"], ["method=sd"]]
    assert all(e[0] == "method=mars" for e in entries[2:])
    assert not cfg.hydra.sweeper.params            # one process, one load, every method in turn
    assert cfg.model.device == "cuda" and cfg.model.capture == "off" and cfg.model.allow_offload is False
    validate(cfg)


def test_warm_up_decodes_each_method_briefly_and_restores_the_budget():
    calls = []
    ctx = SimpleNamespace(decode=lambda job, sample, index: calls.append((job.label, job.max_new, sample)))
    jobs = [SimpleNamespace(label="ar", max_new=512), SimpleNamespace(label="sd", max_new=8)]
    runner.warm_up(ctx, jobs, "s0")
    assert calls == [("ar", runner.WARMUP_TOKENS, "s0"), ("sd", 8, "s0")]
    assert [j.max_new for j in jobs] == [512, 8]


def test_capture_is_off_by_default_and_refused_on_cpu():
    model = torch.nn.Linear(2, 2)
    assert capture(model, "off", torch.device("cpu")) is model and not hasattr(model, "step_model")
    with pytest.raises(ConfigError, match=r"^model.capture=compile on cpu; allowed there: off"):
        capture(model, "compile", torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"^model.capture='graphs'; allowed: off, compile$"):
        capture(model, "graphs", torch.device("cuda"))
