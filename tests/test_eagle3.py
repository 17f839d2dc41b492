"""EAGLE-3 heads: checkpoints written here in the published layouts load, draft trees losslessly
(greedy ``exact`` == transformers' generate), keep a cache equal to a fresh run, and bad checkpoints
fail with one line naming the key and the expected shape."""
import collections
import json

import pytest
import torch

from mars_bench.decode import DecodeConfig, Method
from mars_bench.decode.drafters.eagle3 import Eagle3Drafter, Eagle3Head, Eagle3LoadError, feature_layers
from mars_bench.models.eagle3_heads import load_eagle3_drafter, load_eagle3_head
from mars_bench.decode.tree import TreeSpec
from mars_bench.decode.engine import Batch, Request
from mars_bench.decode.generate import generate as generate_tree

from .conftest import EOS, MAX_NEW
H = 64


def head_config(draft_vocab: int, head_dim: int = 24, **extra) -> dict:
    """The published config.json fields (EAGLE LlamaForCausalLMEagle3; Qwen3 heads set head_dim).
    The 2-layer test target is too shallow for the default layers (2, L//2, L-3): set them (SGLang's ids:
    layer outputs, so hidden_states 1, 1, 1)."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": H, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": head_dim, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "vocab_size": 259,
            "draft_vocab_size": draft_vocab, "max_position_embeddings": 2048, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "torch_dtype": "float32",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 0, 0]}, **extra}


def random_state(config: dict, draft_ids: list[int], seed: int = 0) -> dict:
    """Random weights under the published key names; d2t / t2d for the reduced vocabulary."""
    head = Eagle3Head(config)
    gen = torch.Generator().manual_seed(seed)
    sd = {k: (torch.randn(v.shape, generator=gen) * 0.2 if v.is_floating_point() else v)
          for k, v in head.state_dict().items()}
    ids = torch.tensor(sorted(draft_ids))
    sd["d2t"] = ids - torch.arange(len(ids))
    sd["t2d"] = torch.zeros(config["vocab_size"], dtype=torch.bool).index_fill_(0, ids, True)
    return sd


def write(path, config: dict, sd: dict, fmt: str = "safetensors"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    else:
        torch.save(sd, path / "pytorch_model.bin")
    return path



@pytest.fixture(scope="module")
def draft_ids(hf_reference):
    """A reduced draft vocabulary: the 8 tokens the target emits most (so drafts do get accepted)."""
    return [t for t, _ in collections.Counter(t for r in hf_reference for t in r).most_common(8)]


@pytest.fixture(scope="module")
def head_dirs(tmp_path_factory, draft_ids, tiny):
    config = head_config(len(draft_ids))
    sd = random_state(config, draft_ids)
    root = tmp_path_factory.mktemp("eagle3")
    own = tiny[0].model.get_input_embeddings().weight.detach().clone()   # official files may carry a copy
    with_emb = dict(sd, **{"embed_tokens.weight": own})
    return {"safetensors": write(root / "st", config, sd),
            "bin": write(root / "bin", config, with_emb, fmt="bin")}


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_published_layouts_load_and_draft_losslessly(tiny, prompt_ids, hf_reference, head_dirs, draft_ids, fmt):
    target, _, tok = tiny
    drafter = load_eagle3_drafter(str(head_dirs[fmt]), target)
    assert drafter.head.midlayer.self_attn.q_proj.weight.shape == (4 * 24, 2 * H)   # head_dim honoured
    assert sorted(drafter.map.tolist()) == sorted(draft_ids)                         # d2t offsets
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    specs = [TreeSpec(depth=2, top_k=8, total_tokens=24), TreeSpec(depth=3, top_k=3, total_tokens=10)]
    prompts = list(zip(prompt_ids, hf_reference))[: None if fmt == "safetensors" else 4]
    accepted = 0
    for ids, ref in prompts:
        for spec in specs if fmt == "safetensors" else specs[:1]:
            for m in (Method("eagle3", rule="exact"),
                      Method("eagle3_mars", rule="mars", rule_kwargs={"theta": 1.0})):
                res = generate_tree(target, drafter, tok, ids, m, cfg, tree=spec)
                assert res.tokens == ref, (fmt, spec, m.name, tok.decode(ids))
                assert not res.relaxed
                accepted += sum(res.accepted)
    assert accepted > 0


def test_head_cache_equals_a_fresh_run_after_branch_acceptance(tiny, prompt_ids, head_dirs):
    """After steps that accepted non-leftmost branches, the head's next root logits equal those of a
    fresh head run over the target's causal features of the committed sequence."""
    target = tiny[0]
    drafter = load_eagle3_drafter(str(head_dirs["safetensors"]), target)
    spec, cfg = TreeSpec(depth=2, top_k=8, total_tokens=24), DecodeConfig(max_new_tokens=200)
    batch = Batch(target, drafter, tiny[2], Method("eagle3"), cfg, 1, tree=spec)
    row, branches = batch.admit(Request(list(prompt_ids[0])), 0), 0
    for _ in range(12):
        batch.step()
        (p, v), = batch.last
        t = p.tree
        branches += any(t.children[t.parents[j]][0] != j for j in v.path)
    assert branches > 0
    seq, drafter = row.seq, batch.proposer.rows[0]
    incremental = drafter.root(seq)
    fresh = Eagle3Drafter(drafter.head, target)
    with torch.inference_mode():
        hs = target.model(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
    fresh.prefill(seq, hs)
    torch.testing.assert_close(incremental, fresh.root(seq), atol=1e-4, rtol=1e-4)
    assert torch.isinf(incremental).sum() == 259 - 8           # only the draft vocabulary is scored


def test_sampled_eagle3_mars_is_seeded(tiny, prompt_ids, head_dirs):
    target, _, tok = tiny
    drafter = load_eagle3_drafter(str(head_dirs["safetensors"]), target)
    cfg = DecodeConfig(max_new_tokens=16, temperature=1.0)
    m = Method("eagle3_mars", rule="mars", rule_kwargs={"theta": 0.5})
    for children in ("topk", "sample"):
        spec = TreeSpec(depth=2, top_k=4, total_tokens=10, children=children)
        a, b = (generate_tree(target, drafter, tok, prompt_ids[1], m, cfg, seed=3, tree=spec) for _ in range(2))
        assert a.tokens == b.tokens and len(a.tokens) == 16


def test_default_feature_layers_follow_eagle():
    assert feature_layers(32) == [2, 16, 29] and feature_layers(36) == [2, 18, 33]
    assert feature_layers(2, [0, 1, 1]) == [0, 1, 1]
    with pytest.raises(Eagle3LoadError, match="2-layer target"):
        feature_layers(2)
    with pytest.raises(Eagle3LoadError, match="final-normed"):   # transformers' hidden_states[L] is normed
        feature_layers(2, [0, 1, 2])


def _one_line_error(path, match):
    with pytest.raises(Eagle3LoadError) as e:
        load_eagle3_head(str(path))
    msg = str(e.value)
    assert "\n" not in msg and all(m in msg for m in match), msg


def test_bad_checkpoints_fail_with_one_line(tmp_path, draft_ids):
    config = head_config(len(draft_ids))
    good = random_state(config, draft_ids)
    missing = {k: v for k, v in good.items() if k != "fc.weight"}
    _one_line_error(write(tmp_path / "missing", config, missing), ["missing key 'fc.weight'", "[64, 192]"])
    wrong = dict(good, **{"midlayer.self_attn.q_proj.weight": torch.zeros(64, 128)})
    _one_line_error(write(tmp_path / "wrong", config, wrong, "bin"),
                    ["'midlayer.self_attn.q_proj.weight'", "[64, 128]", "expected [96, 128]"])
    extra = dict(good, **{"midlayer.cross_attn.weight": torch.zeros(3)})
    _one_line_error(write(tmp_path / "extra", config, extra), ["unexpected key 'midlayer.cross_attn.weight'"])
    bad_map = dict(good, d2t=good["d2t"] + 300)
    _one_line_error(write(tmp_path / "d2t", config, bad_map), ["d2t maps draft id 0", "[0, 259)"])
    lm = dict(good, **{"lm_head.weight": torch.zeros(9, H)})
    _one_line_error(write(tmp_path / "lm", config, lm), ["'lm_head.weight'", "expected [8, 64]"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(config))
    _one_line_error(tmp_path / "empty", ["no model.safetensors or pytorch_model.bin"])


def test_unreachable_hub_id_is_one_line(monkeypatch):
    import huggingface_hub

    def offline(*a, **kw):
        raise OSError("We couldn't connect to 'https://huggingface.co'\nsecond line")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    _one_line_error("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", ["not a local directory", "OSError"])


def test_head_vocabulary_must_match_the_target(tiny, tmp_path, draft_ids):
    config = dict(head_config(len(draft_ids)), vocab_size=300)
    sd = random_state(config, draft_ids)
    with pytest.raises(Eagle3LoadError, match="vocab_size 300"):
        load_eagle3_drafter(str(write(tmp_path / "v", config, sd)), tiny[0])
