"""The engines' registry (engines/__init__.py, issue 31): an engine is its module and its conf/engine YAML; one
declared that way alone is validated, recorded and run by the runner, and a name without a YAML is refused in
one line."""
import json
import shutil
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mars_bench.base.errors import ConfigError
from mars_bench.config.settings import method_of
from mars_bench.config.validation import validate
from mars_bench import engines
from mars_bench.run import runner as R
from mars_bench.store.spec import read_spec

from .test_cli import tiny_cfg


def test_the_engines_are_the_yaml_files_native_first():
    assert engines.names()[0] == "native" and "vllm" in engines.names()
    assert set(engines.names()) == {p.stem for p in engines.CONF.glob("*.yaml")}


def test_an_engine_without_a_yaml_is_refused_in_one_line(tmp_path):
    cfg = tiny_cfg(tmp_path, "method=ar", "task=gsm8k", "limit=1")
    cfg.engine.name = "nope"
    method = validate(cfg)                              # the schema leaves engine.name to the engines
    with pytest.raises(ConfigError) as e:
        engines.validate(cfg, method)
    assert str(e.value) == f"engine.name='nope'; allowed: {', '.join(engines.names())}"


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """A test engine declared only as a module (in sys.modules) plus a YAML in a copy of conf/engine: its
    ``Models`` wraps the native one, so its tokens are native's. ``built`` records each construction."""
    conf = tmp_path / "conf_engine"
    shutil.copytree(engines.CONF, conf)
    (conf / "fake.yaml").write_text("engine:\n  name: fake\n")
    monkeypatch.setattr(engines, "CONF", conf)
    built = []

    class Models:
        def __init__(self, cfg, methods):
            native = OmegaConf.create(OmegaConf.to_container(cfg))
            native.engine.name = "native"
            self._native = R.engine_models(native, methods)
            built.append([m.name for m in methods])

        def __getattr__(self, name):
            return getattr(self._native, name)

    def check(cfg, method):
        assert method == method_of(cfg)                  # the job's Method, resolved by validation
        if cfg.temperature > 0:
            raise ValueError(f"temperature={cfg.temperature} cannot run on engine=fake; allowed: 0")
        return "fake-1.0"

    module = types.ModuleType("mars_bench.engines.fake")
    module.Models, module.check = Models, check
    monkeypatch.setitem(__import__("sys").modules, "mars_bench.engines.fake", module)
    return built


def test_an_engine_declared_by_its_module_and_yaml_runs_and_is_recorded(tmp_path, fake_engine):
    assert "fake" in engines.names()
    cfg = tiny_cfg(tmp_path / "runs", "method=sd", "task=gsm8k", "limit=2", "max_new_tokens=8")
    cfg.engine.name = "fake"
    summary = R.run(cfg)
    assert fake_engine == [["sd"]]                       # the runner built the engine's Models, once
    spec = read_spec(summary["run_dir"])
    assert (spec.engine, cfg.engine.version) == ("fake", "fake-1.0")
    native = R.run(tiny_cfg(tmp_path / "runs", "method=sd", "task=gsm8k", "limit=2", "max_new_tokens=8"))
    assert native["run_dir"] != summary["run_dir"]        # another engine: another run directory
    ids = [[json.loads(x)["turns"][0]["output_ids"] for x in (Path(s["run_dir"]) / "samples.jsonl").read_text()
            .splitlines()] for s in (summary, native)]
    assert sorted(ids[0]) == sorted(ids[1]) and len(ids[0]) == 2


def test_what_an_engine_cannot_run_is_refused_in_one_line(tmp_path, fake_engine):
    cfg = tiny_cfg(tmp_path, "method=sd", "task=gsm8k", "limit=1", "temperature=1.0")
    cfg.engine.name = "fake"
    with pytest.raises(ConfigError) as e:
        R.run(cfg)
    assert str(e.value) == "temperature=1.0 cannot run on engine=fake; allowed: 0"
    assert not fake_engine and not (tmp_path / "tiny_fp32_cpu").exists()


def test_each_engine_declares_its_own_settings_and_another_engines_are_refused_in_one_line():
    from dataclasses import fields

    from mars_bench.config.overrides import check_overrides
    from mars_bench.config.schema import Config

    assert {f.name for f in fields(Config)} >= {"engine"} and "EngineConfig" not in dir(__import__(
        "mars_bench.config.schema", fromlist=["x"]))
    check_overrides(["engine=vllm", "engine.tensor_parallel_size=2", "engine.tiny_shape.head_dim=16"])
    check_overrides(["engine=llamacpp", "engine.max_model_len=256"])
    for argv, line in [
        (["engine.tensor_parallel_size=2"],
         "engine.tensor_parallel_size is a setting of engine=vllm; allowed with engine=native: name, version"),
        (["engine=llamacpp", "engine.gpu_memory_utilization=0.5"],
         "engine.gpu_memory_utilization is a setting of engine=vllm; allowed with engine=llamacpp: "),
    ]:
        with pytest.raises(ConfigError) as e:
            check_overrides(argv)
        assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_vllms_tiny_shape_is_declared_once_in_its_yaml():
    from mars_bench.engines.vllm import engine as engine_vllm

    declared = OmegaConf.load(engines.CONF / "vllm.yaml").engine.tiny_shape
    assert engine_vllm.TINY_SHAPE == dict(declared) and engine_vllm.TINY_SHAPE["head_dim"] == 32
