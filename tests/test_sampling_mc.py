"""Monte Carlo: sampled `exact` verification commits tokens distributed exactly as p_target.

Toy target and draft are bigram tables over a 3-token vocabulary, run through the real decode loop
(``generate``) via a stand-in adapter. Each run emits k + 1 tokens, so one step can accept all k drafts
and add the bonus token; the empirical joint distribution of the k + 1 tokens is compared with the
target's exact joint distribution by a chi-square test (fixed seeds: deterministic).
"""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from mars_bench.decode import sampling
from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.decode.backend import SequenceModel

V = 3


class BigramLM(SequenceModel):
    """Stands in for CausalLMAdapter: logits depend on the previous token only."""

    def __init__(self, table):
        self.table, self.device, self.forward_s, self.cache_len = table, torch.device("cpu"), 0.0, 0
        self.vocab = self.out_vocab = table.shape[1]

    def reset(self):
        self.cache_len = 0

    def crop(self, length):
        self.cache_len = min(self.cache_len, length)

    def forward(self, tokens, logits=True, **_):
        self.cache_len += len(tokens)
        return self.table[torch.as_tensor(tokens)] if logits else None


class NoText:
    def decode(self, ids, **_):
        return ""


TARGET = torch.tensor([[1.5, 0.2, -1.0], [0.1, 0.9, 0.3], [-0.5, 0.4, 1.2]])
DRAFT = torch.tensor([[0.3, 1.1, -0.2], [1.0, -0.4, 0.6], [0.2, 0.2, 0.0]])   # deliberately off


def exact_joint(length, temperature, top_p, prev=0):
    p = sampling.warp(TARGET, temperature, top_p)
    out = {}
    for seq in itertools.product(range(V), repeat=length):
        prob, last = 1.0, prev
        for t in seq:
            prob *= float(p[last, t])
            last = t
        out[seq] = prob
    return out


@pytest.mark.parametrize("k,temperature,top_p,n", [(1, 1.0, 1.0, 4000), (2, 1.0, 1.0, 6000),
                                                   (3, 1.0, 1.0, 8000), (4, 1.0, 1.0, 12000),
                                                   (3, 0.7, 0.9, 6000)])
def test_committed_tokens_follow_p_target(k, temperature, top_p, n):
    target, draft = BigramLM(TARGET), BigramLM(DRAFT)
    cfg = DecodeConfig(max_new_tokens=k + 1, temperature=temperature, top_p=top_p)
    method = Method("sd", k=k, rule="exact")
    counts, bonus_steps = {}, 0
    for i in range(n):
        res = generate(target, draft, NoText(), [0], method, cfg, seed=1000 * k + i)
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
        bonus_steps += res.accepted[0] == k
    joint = exact_joint(k + 1, temperature, top_p)
    cells = [s for s in joint if joint[s] > 0]
    assert set(counts) <= set(cells)                      # nothing outside the support (top-p)
    observed = [counts.get(s, 0) for s in cells]
    total = sum(joint[s] for s in cells)
    expected = [joint[s] / total * n for s in cells]
    stat = chisquare(observed, expected)
    assert stat.pvalue > 1e-3, stat
    assert bonus_steps > n * 0.05                          # the all-accepted + bonus path ran


def test_chi_square_detects_a_wrong_rule():
    """The same test fails for a lossy rule (accept everything): the check has teeth."""
    from mars_bench.decode import rules

    target, draft = BigramLM(TARGET), BigramLM(DRAFT)
    cfg = DecodeConfig(max_new_tokens=3, temperature=1.0)
    rules.register(rules.Rule("_accept_all", lambda d, z, p, q, u, std: (torch.ones_like(std), torch.ones_like(d)),
                               lossless=False, doc="negative control: accept every draft"))
    try:
        counts = {}
        for i in range(3000):
            res = generate(target, draft, NoText(), [0], Method("sd", k=2, rule="_accept_all"), cfg, seed=i)
            counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
    finally:
        del rules.RULES["_accept_all"]
    joint = exact_joint(3, 1.0, 1.0)
    stat = chisquare([counts.get(s, 0) for s in joint], [joint[s] / sum(joint.values()) * 3000 for s in joint])
    assert stat.pvalue < 1e-6
