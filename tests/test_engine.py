"""The one decoding loop: draft trees batched (token-identical to batch size 1), prompt lookup as a
drafter with every rule (greedy: transformers' generate; sampled: Monte Carlo against p_target), and
single-sequence models behind the batched interface (``backend.RowByRow``)."""
import pytest
import torch
from scipy.stats import chisquare

from mars_bench.decode import DecodeConfig, Method, generate, generate_batch
from mars_bench.decode.backend import RowByRow, as_backend
from mars_bench.decode.engine import Request
from mars_bench.decode.tree import TreeSpec

from .conftest import EOS, MAX_NEW
from .test_rules_audit import STRICT, ids_of
from .test_sampling_mc import TARGET as TARGET_MC
from .test_sampling_mc import BigramLM, NoText, exact_joint

TREES = {"dynamic": TreeSpec(depth=3, top_k=3, total_tokens=12),
         "static": TreeSpec(static_paths=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])}


def batched(tiny, prompts, method, cfg, batch_size, tree=None, seeds=None):
    target, draft, tok = tiny
    got = {}
    reqs = [Request(list(p), seed=0 if seeds is None else seeds[i], key=i) for i, p in enumerate(prompts)]
    generate_batch(target, draft, tok, reqs, method, cfg, batch_size, lambda r, res: got.__setitem__(r.key, res),
                   tree=tree)
    assert sorted(got) == list(range(len(prompts)))
    return got


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("method", [Method("sd_tree"), Method("mars_tree", rule_kwargs={"theta": 0.9})],
                         ids=["sd_tree", "mars_tree"])
def test_greedy_trees_batched_equal_batch1(tiny, prompt_ids, hf_reference, shape, method):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    alone = [generate(target, draft, tok, ids, method, cfg, tree=TREES[shape]) for ids in prompt_ids]
    if method.rule == "exact":
        assert [r.tokens for r in alone] == hf_reference
    for b in (2, 3, 8):
        got = batched(tiny, prompt_ids, method, cfg, b, tree=TREES[shape])
        for i, ref in enumerate(alone):
            assert got[i].tokens == ref.tokens and got[i].accepted == ref.accepted, (b, i)
            assert got[i].outcome == ref.outcome and got[i].depth_proposed == ref.depth_proposed


@pytest.mark.parametrize("children", ["topk", "sample"])
def test_sampled_trees_batched_give_the_batch1_tokens_per_seed(tiny, prompt_ids, children):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=16, temperature=1.0, top_p=0.9)
    spec = TreeSpec(depth=2, top_k=3, total_tokens=8, children=children)
    method = Method("mars_tree", rule_kwargs={"theta": 0.8})
    prompts = prompt_ids[:9]
    got = batched(tiny, prompts, method, cfg, 3, tree=spec, seeds=list(range(100, 109)))
    for i, ids in enumerate(prompts):
        assert got[i].tokens == generate(target, draft, tok, ids, method, cfg, seed=100 + i, tree=spec).tokens


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_lookup_matches_hf_generate(tiny, prompt_ids, hf_reference, k):
    target, _, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    proposed = accepted = 0
    for ids, ref in zip(prompt_ids, hf_reference):
        res = generate(target, None, tok, ids, Method("lookup", k=k), cfg)
        assert res.tokens == ref
        proposed, accepted = proposed + sum(res.proposed), accepted + sum(res.accepted)
    assert proposed > 0 and 0 < accepted < proposed       # it drafted, and the target had to reject some


@pytest.mark.parametrize("name,settings", STRICT + [("mars", {"theta": 1.0, "nonpositive_top1": "strict"})],
                         ids=ids_of(STRICT) + ["mars-theta=1"])
def test_lookup_with_every_rule_at_its_strict_setting_is_lossless(tiny, prompt_ids, hf_reference, name, settings):
    target, _, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    m = Method("lookup", k=4, rule=name, rule_kwargs=settings)
    for ids, ref in zip(prompt_ids, hf_reference):
        res = generate(target, None, tok, ids, m, cfg)
        assert res.tokens == ref and not res.relaxed


def test_lookup_batched_equals_batch1_and_mars_relaxes(tiny, prompt_ids):
    target, _, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    m = Method("lookup", k=4, rule="mars", rule_kwargs={"theta": 0.5}, options={"max_ngram": 2, "min_ngram": 1})
    got = batched(tiny, prompt_ids, m, cfg, 4)
    for i, ids in enumerate(prompt_ids):
        assert got[i].tokens == generate(target, None, tok, ids, m, cfg).tokens
    assert sum(len(r.relaxed) for r in got.values()) > 0


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_lookup_follows_p_target(temperature, top_p):
    """Prompt-lookup drafts are point masses (q = None): rule exact must commit tokens distributed as
    p_target. The prompt repeats itself, so a draft is proposed at every step."""
    prompt, length, n = [0, 1, 2, 0, 1], 3, 6000
    cfg = DecodeConfig(max_new_tokens=length, temperature=temperature, top_p=top_p)
    counts, drafted = {}, 0
    for i in range(n):
        res = generate(BigramLM(TARGET_MC), None, NoText(), prompt, Method("lookup", k=2), cfg, seed=i)
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
        drafted += sum(res.proposed) > 0
    joint = exact_joint(length, temperature, top_p, prev=1)
    cells = [s for s in joint if joint[s] > 0]
    total = sum(joint[s] for s in cells)
    assert set(counts) <= set(cells) and drafted == n
    assert chisquare([counts.get(s, 0) for s in cells], [joint[s] / total * n for s in cells]).pvalue > 1e-3


def test_row_by_row_wraps_single_sequence_models_only(tiny):
    target = tiny[0]
    assert as_backend(target) is target and as_backend(None) is None
    wrapped = as_backend(BigramLM(TARGET_MC))
    assert isinstance(wrapped, RowByRow)
    wrapped.batch_reset(2)
    wrapped.batch_prefill(0, [0, 1])
    wrapped.batch_prefill(1, [2])
    z = wrapped.batch_forward([[1, 2], []])
    assert wrapped.batch_lens == [4, 1] and z[0].shape == (2, 3) and z[1].shape == (0, 3)
    torch.testing.assert_close(z[0], TARGET_MC[torch.tensor([1, 2])])

