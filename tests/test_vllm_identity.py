"""The model identity of engine=vllm runs (RunSpec.model / draft_model, models/identity.py) names the weights vLLM
runs: with model=tiny the pair reshaped for vLLM's CPU attention (engines/vllm.tiny_dirs, head size 32), never the
native tiny pair's identity; other sources load as named, so their identity is the native engine's. No vLLM needed.
"""
import json

import pytest

from mars_bench.config.spec import spec_of
from mars_bench.engines.vllm import engine as engine_vllm
from mars_bench.models import tiny


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    from mars_bench.config import schema as C

    from .conftest import ROOT

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "mars_bench" / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _spec(*overrides):
    from mars_bench.config.validation import validate
    from mars_bench.store.spec import RunSpec

    cfg = _cfg(*overrides)
    validate(cfg)
    return spec_of(cfg, 32)


@pytest.fixture(autouse=True)
def _vllm_version(monkeypatch):
    from mars_bench.engines.vllm import compat as vllm_compat

    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.32.0+cpu")


@pytest.mark.parametrize("method", ["ar", "sd", "mars"])
def test_vllm_tiny_identity_is_the_reshaped_pair_not_the_native_tiny(method):
    vllm = _spec("model=tiny", "engine=vllm", f"method={method}")
    native = _spec("model=tiny", f"method={method}")
    assert vllm.model["weights"].startswith("tiny-vllm:")
    assert vllm.model["weights"] != native.model["weights"]
    assert {k: v for k, v in vllm.model.items() if k != "weights"} == \
        {k: v for k, v in native.model.items() if k != "weights"}
    if method == "ar":
        assert vllm.draft_model is None and native.draft_model is None
    else:
        assert vllm.draft_model["weights"] != native.draft_model["weights"]
        assert vllm.draft_model["weights"].startswith(vllm.model["weights"] + ":noise")


def test_vllm_tiny_identity_follows_the_shape_seed_and_noise(monkeypatch):
    base = _spec("model=tiny", "engine=vllm", "method=sd")
    assert _spec("model=tiny", "engine=vllm", "method=sd", "model.seed=1").model["weights"] != base.model["weights"]
    noisier = _spec("model=tiny", "engine=vllm", "method=sd", "model.noise=0.1")
    assert (noisier.model, noisier.draft_model["weights"] != base.draft_model["weights"]) == (base.model, True)
    other = _spec("model=tiny", "engine=vllm", "method=sd", "engine.tiny_shape.head_dim=16")
    assert other.model["weights"] != base.model["weights"]


def test_vllm_identity_of_named_weights_is_the_native_one():
    vllm = _spec("engine=vllm", "method=sd")          # the embedded default pair: vLLM loads its directories
    native = _spec("method=sd", "model.draft_quant=none")
    assert vllm.model["weights"] == native.model["weights"]
    assert vllm.draft_model["weights"] == native.draft_model["weights"]


def test_the_saved_tiny_directories_have_the_shape_the_identity_hashes(tmp_path):
    for d in engine_vllm.tiny_dirs(root=str(tmp_path)):
        config = json.loads((tmp_path / d / "config.json").read_text())
        assert {k: config[k] for k in engine_vllm.TINY_SHAPE} == engine_vllm.TINY_SHAPE
        shape = tiny.tiny_shaped_config(config["vocab_size"], engine_vllm.TINY_SHAPE)
        assert (shape.num_attention_heads, shape.num_hidden_layers) == \
            (config["num_attention_heads"], config["num_hidden_layers"])
