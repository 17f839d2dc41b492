"""Monte Carlo at batch size 4: sampled `exact` verification in the batched loop (ragged acceptance,
continuous refill, one generator per request) commits tokens distributed exactly as p_target.

The toy bigram target and draft of tests/test_sampling_mc.py, behind a stand-in for the adapter's
batched cache; each request emits k + 1 tokens; the joint distribution of those tokens over all
requests is compared with the target's exact joint by a chi-square test (fixed seeds: deterministic).
"""
import pytest
import torch
from scipy.stats import chisquare

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.decode.generate import Request, generate_batch
from mars_bench.decode.backend import Backend

from .test_sampling_mc import DRAFT, TARGET, BigramLM, NoText, exact_joint


class BatchedBigramLM(BigramLM, Backend):
    """BigramLM with the ``batch_*`` methods: one token list per row; logits depend on the previous token."""

    def batch_reset(self, rows):
        self.rows = [[] for _ in range(rows)]

    def batch_prefill(self, row, tokens):
        self.rows[row] = list(tokens)

    @property
    def batch_lens(self):
        return [len(r) for r in self.rows]

    def batch_forward(self, tokens):
        assert len(tokens) == len(self.rows)
        for r, t in zip(self.rows, tokens):
            r.extend(t)
        return [self.table[torch.as_tensor(t, dtype=torch.long)] for t in tokens]

    def batch_crop(self, lengths):
        for r, n in zip(self.rows, lengths):
            del r[n:]

    def batch_select(self, rows):
        self.rows = [self.rows[b] for b in rows]


@pytest.mark.parametrize("k,temperature,top_p,n", [(2, 1.0, 1.0, 6000), (4, 1.0, 1.0, 12000), (3, 0.7, 0.9, 6000)])
def test_batched_committed_tokens_follow_p_target(k, temperature, top_p, n):
    target, draft = BatchedBigramLM(TARGET), BatchedBigramLM(DRAFT)
    cfg = DecodeConfig(max_new_tokens=k + 1, temperature=temperature, top_p=top_p)
    method = Method("sd", k=k, rule="exact")
    counts, bonus = {}, 0

    def done(req, res):
        nonlocal bonus
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
        bonus += res.accepted[0] == k
        return None

    generate_batch(target, draft, NoText(), (Request([0], seed=1000 * k + i) for i in range(n)), method, cfg, 4, done)
    assert sum(counts.values()) == n
    joint = exact_joint(k + 1, temperature, top_p)
    cells = [s for s in joint if joint[s] > 0]
    assert set(counts) <= set(cells)
    total = sum(joint[s] for s in cells)
    stat = chisquare([counts.get(s, 0) for s in cells], [joint[s] / total * n for s in cells])
    assert stat.pvalue > 1e-3, stat
    assert bonus > n * 0.05


def test_batched_stand_in_gives_the_batch1_tokens_per_seed():
    """Ragged steps (two-token prompts and one-token prompts mixed) leave each request's draws its own."""
    cfg = DecodeConfig(max_new_tokens=9, temperature=1.0)
    method = Method("sd", k=3)
    prompts = [[0], [1, 2], [2], [0, 1, 2]] * 10
    got = {}
    generate_batch(BatchedBigramLM(TARGET), BatchedBigramLM(DRAFT), NoText(),
                   [Request(p, seed=i, key=i) for i, p in enumerate(prompts)], method, cfg, 4,
                   lambda r, res: got.__setitem__(r.key, res.tokens))
    for i, p in enumerate(prompts):
        assert got[i] == generate(BigramLM(TARGET), BigramLM(DRAFT), NoText(), p, method, cfg, seed=i).tokens
