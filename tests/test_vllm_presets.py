"""The paper's pairs on engine=vllm (docs/vllm.md "Scaling out"): each model preset with its H100 preset
(``conf/engine/h100/``) composes, passes the schema's and the engine's checks (vLLM 0.32.0 stood in: nothing is
loaded), and the LLMs the command holds at once fit 80 GB GPUs at the preset's tensor-parallel size: bf16 weights
per GPU (public parameter counts) within 90% of each LLM's share of ``engine.gpu_memory_utilization``
(``engines.vllm.MemoryShare``), the rest left to activations and the KV cache. Default tier, no vLLM."""
import re
import pytest
from hydra import compose, initialize_config_dir

from mars_bench.config import schema as C
from mars_bench import engines
from mars_bench.config.settings import method_of
from mars_bench.engines.vllm import engine as vllm, compat as vllm_compat
from mars_bench.config.validation import validate

from .conftest import ROOT

H100_GB = 80
GPUS_PER_NODE = 8
# parameters (billions) of the public checkpoints: the model cards' counts; the EAGLE-3 head: its layer, fc, lm_head
# and embedding (hidden 4096, MLP 24576, draft vocabulary 32000, target vocabulary 151936)
PARAMS_B = {"Qwen/Qwen3-32B": 32.8, "Qwen/Qwen3-0.6B": 0.6, "meta-llama/Llama-3.1-70B-Instruct": 70.6,
            "meta-llama/Llama-3.1-8B-Instruct": 8.0, "Qwen/Qwen3-235B-A22B": 235.1,
            "lmsys/Qwen3-235B-A22B-EAGLE3": 1.2}
# (H100 preset, the paper's command as overrides, its interleaved methods, LLMs it holds at once)
COMMANDS = {
    "qwen3_0.6b_32b": (["+experiment=qwen3_gsm8k_table"], None, 2),
    "llama31_8b_70b": (["+experiment=llama31_humaneval_table"], None, 2),
    "qwen3_235b_a22b": (["model=qwen3_235b_a22b", "task=gsm8k", "subset=paper", "temperature=1", "method=eagle3",
                                            "method.top_k=1", "method.depth=3"],
                        [["method=eagle3"], ["method=eagle3_mars"]], 1),
}


@pytest.fixture(scope="module")
def hydra_ctx():
    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "mars_bench" / "conf"), version_base="1.3"):
        yield


@pytest.mark.parametrize("preset", sorted(COMMANDS))
def test_each_pair_validates_on_vllm_and_fits_h100(hydra_ctx, monkeypatch, preset):
    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.32.0")
    base, entries, held = COMMANDS[preset]
    base = [*base, "engine=vllm", f"+engine/h100={preset}"]
    cfg = compose("config", overrides=base)
    entries = entries or [list(e) for e in cfg.interleave]
    variants = [compose("config", overrides=[*base, *entry]) for entry in entries]
    specs = set()
    for v in variants:
        engines.validate(v, validate(v))
        assert v.engine.version == "0.32.0" and v.model.device == "cuda" and v.model.dtype == "bf16"
        specs.add(repr(vllm.speculative_config(method_of(v), v.model, v.model.draft)))
    assert len(specs) == held                     # what the preset's sizes were chosen for
    tp, pp = cfg.engine.tensor_parallel_size, cfg.engine.pipeline_parallel_size
    assert GPUS_PER_NODE % tp == 0 and pp == 1    # one node, tensor parallel only
    share = vllm.MemoryShare.of(cfg.engine, len(specs)).gpu_memory_utilization * H100_GB
    for v in variants:                            # each LLM: the target, and the draft model or head it drafts with
        m = method_of(v)
        weights = PARAMS_B[v.model.target] + (PARAMS_B[v.model.draft] if m.name == "sd" else 0) + (
            PARAMS_B[v.model.eagle3] if m.name == "eagle3" else 0)
        assert 2 * weights / tp <= 0.9 * share, (preset, m.name, 2 * weights / tp, share)


def test_the_235b_preset_names_its_eagle3_head(hydra_ctx):
    cfg = compose("config", overrides=["model=qwen3_235b_a22b", "method=eagle3"])
    assert cfg.model.target == "Qwen/Qwen3-235B-A22B" and cfg.model.eagle3 == "lmsys/Qwen3-235B-A22B-EAGLE3"
    assert cfg.model.draft is None and cfg.model.enable_thinking is False


def test_eagle3_on_vllm_is_the_chain_its_tree_knobs_name_and_a_tree_is_refused(hydra_ctx, monkeypatch):
    """vLLM drafts an EAGLE-3 chain: top_k 1 gives depth + 1 drafts (cut at total_tokens - 1, as the native engine
    reads the knobs), so the spec's tree d<depth>-w1-t<total> names what ran; a tree is refused in one line."""
    from mars_bench.base.errors import ConfigError

    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.32.0")
    base = ["model=qwen3_235b_a22b", "engine=vllm", "method=eagle3", "method.top_k=1"]
    for knobs, drafts in ((["method.depth=3"], 4), (["method.depth=5", "method.total_tokens=4"], 3)):
        v = compose("config", overrides=[*base, *knobs])
        engines.validate(v, validate(v))
        assert vllm.speculative_config(method_of(v), v.model, None)["num_speculative_tokens"] == drafts
    for knob, says in (("method.top_k=4", "method.top_k=4 (an EAGLE-3 tree) cannot run on engine=vllm"),
                       ("method.static_paths=[[0],[0,0]]", "method.static_paths (an EAGLE-3 tree)")):
        v = compose("config", overrides=[*base, knob])
        with pytest.raises(ConfigError, match=re.escape(says)) as err:
            engines.validate(v, validate(v))
        assert "\n" not in str(err.value) and "allowed: method.top_k=1" in str(err.value)
