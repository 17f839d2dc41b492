"""A head that Speculators 0.9.0 itself trained (tests/fixtures/eagle3_tiny: ``make eagle3-head-tiny``, the tiny
pair's 4-layer target, ~160 KB) loads in both shipped formats and decodes losslessly: greedy EAGLE-3 with it is
token-identical to the target's own greedy decoding, and mars at theta 1 to exact, in the Speculators layout
and converted to the EAGLE / SpecForge layout. Heads the loader cannot compute exactly are refused in one line
naming the setting. (Its forward against Speculators' own: tests/test_eagle3_speculators.py, marker speculators.)"""
import json
import shutil
from pathlib import Path

import pytest
import torch

from mars_bench.decode import DecodeConfig, Method
from mars_bench.decode.drafters.eagle3 import Eagle3LoadError
from mars_bench.decode.generate import generate as generate_tree
from mars_bench.decode.tree import TreeSpec
from mars_bench.models.eagle3_heads import format_of, load_eagle3_drafter, load_eagle3_head, speculators_to_eagle

from .conftest import EOS

FIXTURE = Path(__file__).parent / "fixtures" / "eagle3_tiny"
MAX_NEW = 24


@pytest.fixture(scope="module")
def target4(tmp_path_factory):
    """The tiny pair's target family with 4 layers (the head's target: features 1, 2, 3), as an adapter."""
    from transformers import Qwen2ForCausalLM

    from mars_bench.models.adapter import CausalLMAdapter
    from mars_bench.run.eagle3_recipe import tiny_target

    path = tiny_target(tmp_path_factory.mktemp("eagle3_target"))
    return CausalLMAdapter(Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()), path


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle3_heads")
    return {"speculators": FIXTURE, "eagle": speculators_to_eagle(FIXTURE, out / "eagle")}


def test_both_formats_load_the_same_head(heads):
    assert format_of(json.loads((heads["speculators"] / "config.json").read_text())) == "speculators"
    assert format_of(json.loads((heads["eagle"] / "config.json").read_text())) == "eagle"
    (a, emb_a), (b, emb_b) = (load_eagle3_head(str(heads[f])) for f in ("speculators", "eagle"))
    assert a.layer_ids == b.layer_ids == [1, 2, 3]         # vLLM ids 1, 2, 3 == SGLang ids 0, 1, 2
    for (k, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == kb and torch.equal(va, vb), k
    assert emb_a is not None and torch.equal(emb_a, emb_b)


@pytest.mark.parametrize("fmt", ["speculators", "eagle"])
def test_trained_head_decodes_losslessly(target4, heads, prompt_ids, fmt):
    target, _ = target4
    from mars_bench.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    drafter = load_eagle3_drafter(str(heads[fmt]), target)
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    accepted = 0
    for ids in prompt_ids[:4]:
        ref = target.model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                    eos_token_id=EOS, pad_token_id=256)[0, len(ids):].tolist()
        for spec in (TreeSpec(depth=3, top_k=4, total_tokens=16), TreeSpec(depth=4, top_k=1, total_tokens=4)):
            exact = generate_tree(target, drafter, tok, ids, Method("eagle3", rule="exact"), cfg, tree=spec)
            mars = generate_tree(target, drafter, tok, ids,
                                 Method("eagle3_mars", rule="mars", rule_kwargs={"theta": 1.0}), cfg, tree=spec)
            assert exact.tokens == ref, (fmt, spec, tok.decode(ids))
            assert mars.tokens == exact.tokens and not mars.relaxed
            accepted += sum(exact.accepted)
    assert accepted > 0          # the trained head's drafts do get accepted


def _variant(tmp_path, name, edit) -> Path:
    out = tmp_path / name
    shutil.copytree(FIXTURE, out)
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


def _layer(**kw):
    return lambda c: c["transformer_layer_config"].update(kw)


@pytest.mark.parametrize("name, edit, words", [
    ("norm_before_fc", lambda c: c.update(norm_before_fc=True), ["norm_before_fc=true"]),
    ("norm_output", lambda c: c.update(norm_output=True), ["norm_output=true"]),
    ("norm_before_residual", lambda c: c.update(norm_before_residual=True), ["norm_before_residual=true"]),
    ("residual_absent", lambda c: c.pop("norm_before_residual"), ["norm_before_residual=true", "absent"]),
    ("sliding", _layer(layer_types=["sliding_attention"]), ["layer_types", "sliding"]),
    ("qwen3", _layer(model_type="qwen3"), ['model_type="qwen3"', "q / k norms"]),
    ("two_layers", _layer(num_hidden_layers=2), ["num_hidden_layers=2"]),
    ("mlp_bias", _layer(mlp_bias=True), ["mlp_bias=true"]),
])
def test_heads_not_computed_exactly_are_refused_in_one_line(tmp_path, name, edit, words):
    with pytest.raises(Eagle3LoadError) as e:
        load_eagle3_head(str(_variant(tmp_path, name, edit)))
    msg = str(e.value)
    assert "\n" not in msg and "allowed:" in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("value", [True, False])
def test_flat_norm_output_is_refused_as_ambiguous(tmp_path, heads, value):
    out = tmp_path / "flat"
    shutil.copytree(heads["eagle"], out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, norm_output=value)))
    with pytest.raises(Eagle3LoadError, match=f"norm_output={json.dumps(value)}.*differ"):
        load_eagle3_head(str(out))
    load_eagle3_head(str(heads["eagle"]))                    # the same head without the key loads
