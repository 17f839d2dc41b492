"""Greedy losslessness against transformers' own generate, stop conditions, and the KV cache."""
import pytest
import torch

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.decode.engine import Batch, Request

from .conftest import EOS, MAX_NEW



def test_reference_is_nontrivial(hf_reference):
    assert len(hf_reference) >= 20
    assert any(len(r) == MAX_NEW for r in hf_reference) and any(r[-1] == EOS for r in hf_reference)


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_sd_and_mars_theta1_match_hf_generate(tiny, prompt_ids, hf_reference, k):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    methods = [Method("sd", k=k, rule="exact"),
               Method("mars", k=k, rule="mars", rule_kwargs={"theta": 1.0, "nonpositive_top1": "strict"})]
    rejected = 0
    for ids, ref in zip(prompt_ids, hf_reference):
        for m in methods:
            res = generate(target, draft, tok, ids, m, cfg)
            assert res.tokens == ref, (m, tok.decode(ids))
            assert not res.relaxed
            rejected += res.outcome.count("X")
    assert rejected > 0   # the draft really disagrees sometimes: the reject path ran


@pytest.mark.parametrize("p_min", [0.3, 0.75])
def test_adaptive_draft_length_is_lossless_and_stops_early(tiny, prompt_ids, hf_reference, p_min):
    """method.p_min: the draft stops proposing once its top-1 probability < p_min (within k). Greedy sd
    stays token-identical to HF generate, and some steps really propose fewer than k drafts."""
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    short = full = 0
    for ids, ref in zip(prompt_ids, hf_reference):
        res = generate(target, draft, tok, ids, Method("sd", k=6, p_min=p_min), cfg)
        assert res.tokens == ref
        budget = [min(6, MAX_NEW - n - 1) for n in _emitted_before(res)]
        short += sum(p < b for p, b in zip(res.proposed, budget))
        full += sum(p == b for p, b in zip(res.proposed, budget))
        assert all(1 <= p <= b for p, b in zip(res.proposed, budget) if b >= 1)
    assert short > 0 and full > 0


def _emitted_before(res) -> list[int]:
    """Tokens emitted before each step (accepted drafts + 1 per step)."""
    out, n = [], 0
    for a in res.accepted:
        out.append(n)
        n += a + 1
    return out


def test_ar_matches_hf_generate(tiny, prompt_ids, hf_reference):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    for ids, ref in zip(prompt_ids, hf_reference):
        res = generate(target, None, tok, ids, Method("ar"), cfg)
        assert res.tokens == ref and res.tau == 1.0 and res.steps == len(ref)


def test_max_new_tokens_never_exceeded_and_stop_strings_identical(tiny, prompt_ids):
    target, draft, tok = tiny
    for max_new in (1, 2, 5, 13):
        cfg = DecodeConfig(max_new_tokens=max_new)
        for ids in prompt_ids[:6]:
            outs = [generate(target, draft, tok, ids, m, cfg).tokens for m in
                    (Method("ar"), Method("sd", k=8), Method("mars", k=3, rule="mars", rule_kwargs={"theta": 0.5}))]
            assert all(len(o) <= max_new for o in outs)
            assert outs[0] == outs[1]
    # a stop string that the greedy output really contains, cut at the same token by every method
    ref = generate(target, None, tok, prompt_ids[0], Method("ar"), DecodeConfig(max_new_tokens=40)).tokens
    pos = next(i for i in range(8, len(ref)) if ref[i] < 94 and ref[i] not in ref[:i])
    stop = tok.decode([ref[pos]])   # a printable byte first emitted at token ``pos``
    cfg = DecodeConfig(max_new_tokens=40, stop_strings=(stop,))
    outs = [generate(target, draft, tok, prompt_ids[0], m, cfg) for m in (Method("ar"), Method("sd", k=5))]
    assert outs[0].tokens == outs[1].tokens and outs[0].stop_reason == "stop_string"
    assert outs[0].tokens == ref[: pos + 1]


def test_sampled_decoding_is_seeded(tiny, prompt_ids):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=20, temperature=0.8, top_p=0.9)
    m = Method("mars", k=4, rule="mars", rule_kwargs={"theta": 0.9})
    a = generate(target, draft, tok, prompt_ids[3], m, cfg, seed=7).tokens
    b = generate(target, draft, tok, prompt_ids[3], m, cfg, seed=7).tokens
    c = generate(target, draft, tok, prompt_ids[3], m, cfg, seed=8).tokens
    assert a == b and a != c


def test_cache_after_rejections_matches_fresh_forward(tiny, prompt_ids):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=200)
    batch = Batch(target, draft, tok, Method("sd", k=6), cfg, 1)
    row = batch.admit(Request(list(prompt_ids[2])), 0)
    rejections = 0
    for _ in range(12):
        batch.step()
        rejections += row.res.accepted[-1] < 6
        seq = row.seq
        assert target.batch_lens == [len(seq) - 1] and draft.batch_lens[0] <= len(seq) - 1
    assert rejections > 0
    cached = target.batch_forward([[seq[-1]]])[0][-1]
    with torch.inference_mode():
        fresh = target.model(torch.tensor([seq])).logits[0, -1].float()
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)
    catch_up = seq[draft.batch_lens[0]:]
    cached_d = draft.batch_forward([catch_up])[0][-1]
    with torch.inference_mode():
        fresh_d = draft.model(torch.tensor([seq])).logits[0, -1, : target.vocab].float()
    torch.testing.assert_close(cached_d, fresh_d, atol=1e-4, rtol=1e-4)


def test_keep_narrows_the_cache_to_a_path(tiny, prompt_ids):
    target = tiny[0]
    seq = prompt_ids[1]
    target.reset()
    target.forward(seq + [5, 6, 7])          # extra branch tokens appended
    target.keep(len(seq) - 1, [2])           # drop seq[-1], 5; keep 6
    assert target.cache_len == len(seq)
