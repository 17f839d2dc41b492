"""Fused forwards (models/fused.py, ``fused_layer_with`` in quant_gemm.c) on the tiny pair. q4 / q8 drafts: logits
agree with the same quantized draft run through transformers' modules, a row's logits are bit-identical alone or
beside other rows (any token counts and lengths), greedy sd and mars theta = 1 stay token-identical to Hugging Face
greedy, mars theta = 0.9 gives the same tokens at any batch size. The bf16 target on the CPU fast path (panels):
chain and tree logits agree with the modules path, greedy sd, sd_tree and mars theta = 1 are token-identical to its
fused ar, at any batch size. The loader turns the path on exactly for the models it covers."""
import pytest
import torch

from mars_bench.decode import DecodeConfig, Method
from mars_bench.decode.generate import Request, generate, generate_batch
from mars_bench.models import fused, quant
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.tiny import tiny_pair

from .conftest import EOS, MAX_NEW
from .kernels import family_params, use_family

pytestmark = pytest.mark.skipif(not quant.available(), reason=f"quantized kernel unavailable: {quant.unavailable()}")


@pytest.fixture(autouse=True, params=family_params())
def family(request, monkeypatch):
    """Every test in each kernel family this CPU runs (VNNI and AVX2 on an AVX512-VNNI machine)."""
    use_family(monkeypatch, request.param)
    return request.param


def drafts(scheme="q4"):
    """(target adapter, draft adapter through transformers' modules, the same draft fused)."""
    target, draft, _ = tiny_pair()
    quant.quantize_model(draft, scheme)
    t = CausalLMAdapter(target)
    plain = CausalLMAdapter(draft, out_vocab=t.vocab)
    fast = plain.fork()
    fast.fused = fused.FusedDecoder(draft)
    return t, plain, fast


def prefill(adapters, prompts):
    for a in adapters:
        a.batch_reset(len(prompts))
        for row, p in enumerate(prompts):
            a.batch_prefill(row, p)


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_fused_logits_agree_with_the_modules_path(scheme):
    _, plain, fast = drafts(scheme)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (30, 17, 9)]
    prefill((plain, fast), prompts)
    calls, inner = [], fast.fused.forward
    fast.fused.forward = lambda *a: calls.append(1) or inner(*a)
    for step in range(8):
        feed = [torch.randint(0, 256, (m,), generator=g).tolist() for m in ((step % 3), 1, 1 + step % 2)]
        for x, y in zip(plain.batch_forward(feed), fast.batch_forward(feed)):
            assert x.shape == y.shape
            torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4)
        lens = [n - (step % 2) for n in plain.batch_lens]
        for a in (plain, fast):
            a.batch_crop(lens)
        assert plain.batch_lens == fast.batch_lens and plain.batch_width == fast.batch_width
    assert len(calls) == 8 and fast.forward_s > 0


def test_a_rows_logits_do_not_depend_on_its_batch():
    _, _, fast = drafts()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 256, (25,), generator=g).tolist()
    other = torch.randint(0, 256, (40,), generator=g).tolist()
    alone = fast.fork()
    prefill((alone,), [prompt])
    want = [alone.batch_forward([[7]])[0], alone.batch_forward([[8, 9]])[0]]
    prefill((fast,), [other, prompt])
    fast.batch_forward([[1, 2, 3], []])            # row 1 feeds nothing: the cache grows past its length
    fast.batch_crop([41, 25])
    got = [fast.batch_forward([[4, 5], [7]])[1], fast.batch_forward([[6], [8, 9]])[1]]
    for w, x in zip(want, got):
        assert torch.equal(w, x)


def test_single_sequence_forwards_take_the_same_path():
    _, plain, fast = drafts()
    g = torch.Generator().manual_seed(2)
    prompt, more = torch.randint(0, 256, (20,), generator=g).tolist(), torch.randint(0, 256, (4,), generator=g).tolist()
    batched = fast.fork()
    prefill((batched,), [prompt])
    for a in (plain, fast):
        a.reset()
        a.forward(prompt, logits=False)
    for feed in ([more[0]], more[1:]):
        want = batched.batch_forward([feed])[0]
        assert torch.equal(fast.forward(feed), want)
        torch.testing.assert_close(plain.forward(feed), want, atol=1e-4, rtol=1e-4)
    assert fast.cache_len == plain.cache_len == 24


def test_single_sequence_tree_forwards_run_fused():
    """A drafter's tree expansion (a single sequence's nodes with their mask and positions) takes the fused path:
    logits bit-identical to the same tree fed as a batch of one (``tree_keys``), with a boolean or an additive
    mask, within 1e-4 of the modules path under the same mask; a mask of the wrong width is refused in one line."""
    from mars_bench.decode.tree import DraftTree, additive_mask
    from mars_bench.models.forward.fused import mask_keys

    _, plain, fast = drafts()
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 256, (20,), generator=g).tolist()
    tree = DraftTree([5, 7, 8, 9, 11, 12], [-1, 0, 0, 1, 2, 4], [0, 1, 1, 2, 2, 3], [-1] * 6)
    batched = fast.fork()
    prefill((batched,), [prompt[:-1]])
    want = batched.batch_forward([list(tree.tokens)], [tree])[0]
    allowed = torch.cat([torch.ones(6, 19, dtype=torch.bool), tree.ancestors()], 1)
    pos = (19 + torch.tensor(tree.depths))[None]
    calls, inner = [], fast.fused.forward
    fast.fused.forward = lambda *a: calls.append(1) or inner(*a)
    for mask in (allowed[None, None], additive_mask(allowed, plain.model)):
        for a in (plain, fast):
            a.reset()
            a.forward(prompt[:-1], logits=False)
        assert torch.equal(fast.forward(tree.tokens, attention_mask=mask, position_ids=pos), want)
        torch.testing.assert_close(plain.forward(tree.tokens, attention_mask=mask, position_ids=pos), want,
                                   atol=1e-4, rtol=1e-4)
        assert fast.cache_len == plain.cache_len == 25
    assert len(calls) == 2
    with pytest.raises(ValueError, match="attention_mask spans 24 columns; allowed: the cache's and the new tokens' "
                                         "25"):
        mask_keys(allowed[:, 1:], 25)


def test_a_fused_drafters_trees_equal_the_modules_drafters(prompt_ids):
    """Tree drafting through ``LMDrafter`` on the fused draft: every expansion one fused call, and greedy sd_tree /
    mars_tree give the tokens the modules draft gives (sd_tree: ar's, whichever draft)."""
    t, plain, fast = drafts()
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    spec = {"depth": 3, "top_k": 2, "total_tokens": 8}
    calls, inner = [], fast.fused.forward
    fast.fused.forward = lambda *a: calls.append(1) or inner(*a)
    for ids in prompt_ids[:4]:
        for m in (Method("sd_tree", rule="exact", tree=spec),
                  Method("mars_tree", rule="mars", rule_kwargs={"theta": 0.9}, tree=spec)):
            assert generate(t, fast, None, ids, m, cfg).tokens == generate(t, plain, None, ids, m, cfg).tokens
    assert len(calls) > 4 * 2 * 3


def test_greedy_sd_and_mars_theta_1_stay_lossless(prompt_ids, hf_reference):
    t, _, fast = drafts()
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    calls = fast.n_forwards
    for ids, ref in zip(prompt_ids, hf_reference):
        assert generate(t, fast, None, ids, Method("sd", k=4), cfg).tokens == ref
        assert generate(t, fast, None, ids, Method("mars", k=4, rule="mars", rule_kwargs={"theta": 1.0}),
                        cfg).tokens == ref
    assert fast.n_forwards > calls


def test_mars_tokens_do_not_depend_on_batch_size(prompt_ids):
    t, _, fast = drafts()
    method, cfg = Method("mars", k=4, rule="mars", rule_kwargs={"theta": 0.9}), DecodeConfig(max_new_tokens=MAX_NEW,
                                                                                             eos_ids=(EOS,))
    alone = [generate(t, fast, None, ids, method, cfg).tokens for ids in prompt_ids[:6]]
    got = {}
    generate_batch(t, fast, None, [Request(ids, key=i) for i, ids in enumerate(prompt_ids[:6])], method, cfg, 3,
                   lambda req, res: got.__setitem__(req.key, res.tokens))
    assert [got[i] for i in range(6)] == alone


def test_supports_names_what_it_does_not_cover():
    _, draft, _ = tiny_pair()
    assert "q_proj is a Linear (fused forwards take QuantLinear" in fused.supports(draft)
    quant.quantize_model(draft, "q4")
    assert fused.supports(draft) is None
    draft.model.embed_tokens.to(torch.bfloat16)
    assert "fused forwards take fp32" in fused.supports(draft)
    draft.config.model_type = "gemma"
    assert "'gemma'" in fused.supports(draft)
    with pytest.raises(ValueError, match="fused forwards unavailable: model type 'gemma'"):
        fused.FusedDecoder(draft)
    from mars_bench.models.fastpath import enable_fast_path

    assert "q_proj holds fp32 panels" in fused.supports(enable_fast_path(tiny_pair()[0]))   # they follow packing


@pytest.mark.parametrize("scheme, on", [("q4", True), ("q8", True), ("int8", False), ("none", False)])
def test_loader_fuses_exactly_the_group_quantized_drafts(scheme, on):
    from omegaconf import OmegaConf

    from mars_bench.config import schema as C
    from mars_bench.models.pairs import load_draft, load_pair

    mcfg = OmegaConf.merge(OmegaConf.structured(C.ModelConfig), {"source": "tiny", "draft_quant": scheme})
    pair = load_pair(mcfg)
    draft, _ = load_draft(mcfg, pair)
    assert (draft.fused is not None) == on


def targets():
    """(the bf16 tiny target on the CPU fast path through transformers' modules, the same target fused, the fp32
    tiny draft)."""
    from mars_bench.models.fastpath import enable_fast_path

    target, draft, _ = tiny_pair(dtype=torch.bfloat16)
    enable_fast_path(target)
    plain = CausalLMAdapter(target)
    fast = plain.fork()
    fast.fused = fused.FusedDecoder(target)
    return plain, fast, CausalLMAdapter(draft, out_vocab=plain.vocab)


def test_fused_target_chain_and_tree_logits_agree_with_the_modules_path():
    """Kernels taking fp32 inputs (avx2, neon without BFDOT): the two paths agree to 1e-4. Kernels rounding their
    inputs to bf16 (AVX512_BF16, AMX, BFDOT) turn a last-bit difference upstream (the C rotary, norm and SiLU
    against torch's) into a whole bf16 step of one input, so there each path is held to an fp32 reference (the
    same bf16 weights in fp32 through transformers' modules, no rounding): the fused logits may be no further
    from it than 1.5x the modules path's own distance. Measured on an AVX512_BF16 EPYC: modules path 1.9e-2 to
    4.8e-2 from the reference, fused 1.9e-2 to 4.8e-2; the two paths 1.4e-2 apart on one step of the 6 (0 on the
    rest); a wrong key set or position is off by whole units."""
    from mars_bench.decode.tree import DraftTree
    from mars_bench.models.tiny import tiny_pair

    plain, fast, _ = targets()
    rounds = plain.model.model.layers[0].self_attn.q_proj.bf16_inputs
    ref = CausalLMAdapter(tiny_pair(dtype=torch.bfloat16)[0].float())
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (21, 12, 33)]
    prefill((plain, fast, ref), prompts)
    tree = DraftTree([5, 7, 8, 9, 11, 12], [-1, 0, 0, 1, 2, 4], [0, 1, 1, 2, 2, 3], [-1] * 6)
    calls, inner = [], fast.fused.forward
    fast.fused.forward = lambda *a: calls.append(1) or inner(*a)
    for step in range(6):
        feed = [torch.randint(0, 256, (m,), generator=g).tolist() for m in (1 + step % 3, 0 if step == 2 else 1, 5)]
        trees = [None, None, None]
        if step % 2:
            feed[2], trees[2] = list(tree.tokens), tree
        got = fast.batch_forward(feed, trees)
        for x, y, z in zip(plain.batch_forward(feed, trees), got, ref.batch_forward(feed, trees)):
            assert x.shape == y.shape == z.shape
            if not rounds:
                torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4)
            elif x.numel():
                fused_err, modules_err = (y - z).abs().max(), (x - z).abs().max()
                assert fused_err <= 1.5 * modules_err + 1e-4, (step, fused_err, modules_err)
        if step % 2:
            for a in (plain, fast, ref):
                a.batch_keep([list(range(len(feed[0]))), list(range(len(feed[1]))), [0, 2, 4]])   # a path: 0 -> 2 -> 4
    assert len(calls) == 6


def test_fused_target_tokens_do_not_depend_on_how_many_tokens_a_forward_scores(prompt_ids):
    """ar feeds one token a forward, sd and mars k + 1, sd_tree a tree: with every forward fused, greedy sd, sd_tree
    and mars theta = 1 give fused ar's tokens, alone and at batch size 3."""
    from mars_bench.decode.tree import TreeSpec

    _, fast, draft = targets()
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    calls, inner = [], fast.fused.forward
    fast.fused.forward = lambda *a: calls.append(a[1].numel()) or inner(*a)
    spec = TreeSpec(depth=3, top_k=2, total_tokens=8)
    mars1 = {"theta": 1.0}
    want = [generate(fast, None, None, ids, Method("ar"), cfg).tokens for ids in prompt_ids[:6]]
    for ids, ref in zip(prompt_ids[:6], want):
        assert generate(fast, draft, None, ids, Method("sd", k=4), cfg).tokens == ref
        assert generate(fast, draft, None, ids, Method("mars", k=4, rule="mars", rule_kwargs=mars1), cfg).tokens == ref
        assert generate(fast, draft, None, ids, Method("sd_tree"), cfg, tree=spec).tokens == ref
    got = {}
    generate_batch(fast, draft, None, [Request(ids, key=i) for i, ids in enumerate(prompt_ids[:6])],
                   Method("sd", k=4), cfg, 3, lambda req, res: got.__setitem__(req.key, res.tokens))
    assert [got[i] for i in range(6)] == want
    assert 1 in calls and max(calls) >= 8           # one-token forwards and trees or batches both ran fused


@pytest.mark.parametrize("fast_path, on", [("on", True), ("off", False)])
def test_loader_fuses_the_fast_path_target(fast_path, on):
    from omegaconf import OmegaConf

    from mars_bench.config import schema as C
    from mars_bench.models.pairs import load_pair

    mcfg = OmegaConf.merge(OmegaConf.structured(C.ModelConfig),
                           {"source": "tiny", "dtype": "bf16", "fast_path": fast_path, "draft": None})
    pair = load_pair(mcfg, need_draft=False)
    assert (pair.target.fused is not None) == on


def test_eagle3_target_forwards_run_fused_and_stay_ars_tokens(prompt_ids, tmp_path):
    """An EAGLE-3 target's forwards also return hidden states (the head's features): they run fused like ar's, the
    hidden states equal the modules path's (transformers' layout: embeddings, each layer's output, the last one
    after the final norm), and greedy EAGLE-3, chain and tree, exact and mars theta = 1, gives fused ar's tokens.
    Before, hidden-state forwards took the modules path, whose bf16 rounding differs from the fused one in the last
    bits: the embedded pair's greedy EAGLE-3 left ar's tokens at near-ties on 3 of 17 samples (docs/results.md)."""
    from pathlib import Path

    from transformers import Qwen2ForCausalLM

    from mars_bench.decode.tree import TreeSpec
    from mars_bench.models.eagle3_heads import load_eagle3_drafter
    from mars_bench.models.fastpath import enable_fast_path
    from mars_bench.models.tiny import tiny_tokenizer
    from mars_bench.run.eagle3_recipe import tiny_target

    model = Qwen2ForCausalLM.from_pretrained(tiny_target(tmp_path / "target"), dtype=torch.bfloat16).eval()
    enable_fast_path(model)
    plain = CausalLMAdapter(model)
    fast = plain.fork()
    fast.fused = fused.FusedDecoder(model)
    rounds = model.model.layers[0].self_attn.q_proj.bf16_inputs
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 17)]
    prefill((plain, fast), prompts)
    feed = [[3, 4, 5], [6]]
    (zp, hp), (zf, hf) = plain.batch_forward(feed, hidden_states=True), fast.batch_forward(feed, hidden_states=True)
    for b in range(2):
        assert len(hp[b]) == len(hf[b]) == model.config.num_hidden_layers + 1
        for x, y in zip(hp[b], hf[b]):
            assert x.shape == y.shape == (1, len(feed[b]), model.config.hidden_size)
            tol = 3e-2 * x.abs().max().item() if rounds else 1e-4
            torch.testing.assert_close(y.float(), x.float(), atol=tol, rtol=0)
    calls, inner = [], fast.fused.forward
    fast.fused.forward = lambda *a: calls.append(a[-1]) or inner(*a)
    drafter = load_eagle3_drafter(str(Path(__file__).parent / "fixtures" / "eagle3_tiny"), fast)
    tok = tiny_tokenizer()
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    accepted = 0
    for ids in prompt_ids[:4]:
        ref = generate(fast, None, None, ids, Method("ar"), cfg).tokens
        for spec in (TreeSpec(depth=3, top_k=4, total_tokens=16), TreeSpec(depth=3, top_k=1, total_tokens=5)):
            exact = generate(fast, drafter, tok, ids, Method("eagle3", rule="exact"), cfg, tree=spec)
            mars = generate(fast, drafter, tok, ids, Method("eagle3_mars", rule="mars", rule_kwargs={"theta": 1.0}),
                            cfg, tree=spec)
            assert exact.tokens == ref and mars.tokens == ref, (spec, tok.decode(ids))
            accepted += sum(exact.accepted)
    assert accepted > 0
    assert True in calls      # the verifications asked for hidden states, and ran fused
