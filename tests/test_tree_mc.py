"""Monte Carlo: sampled tree verification commits tokens distributed exactly as p_target.

Toy target and draft are trigram tables over a 3-token vocabulary behind a stand-in adapter that
honours the 4-D tree mask (a node's context = the last two tokens it may attend to) and ``keep``, run
through the real loop (``generate_tree``): dynamic and static trees, children by top-k (q = one-hot)
or drawn without replacement. Each run emits L tokens (several steps: accepted paths, corrections
and bonus tokens, with the caches narrowed to the path in between); the empirical joint law of the L tokens is
compared with the target's exact joint law by a chi-square test (fixed seeds: deterministic). The
negative controls show the test fails for a lossy rule and for value-dependent pruning of sampled
children. ``topk_q=draft`` (top-k children verified against the draft's probability, the MARS authors'
code) is lossy: its first token follows their law, computed by hand from their evaluate_posterior.
"""
import itertools

import pytest
import torch
from scipy.stats import binomtest, chisquare

from mars_bench.decode import rules, sampling
from mars_bench.decode.tree import build as tree_mod
from mars_bench.decode import DecodeConfig, Method
from mars_bench.decode.tree import TreeSpec
from mars_bench.decode.generate import generate as generate_tree
from mars_bench.decode.backend import SequenceModel

V, L, PROMPT = 3, 3, [1, 2]
gen0 = torch.Generator().manual_seed(0)
TARGET = torch.randn(V, V, V, generator=gen0) * 1.2
DRAFT = TARGET + torch.randn(V, V, V, generator=gen0) * 1.0   # deliberately off


class TrigramLM(SequenceModel):
    """Stands in for CausalLMAdapter: logits depend on the last two tokens a position attends to."""

    def __init__(self, table):
        self.table, self.device, self.forward_s, self.toks = table, torch.device("cpu"), 0.0, []
        self.vocab = self.out_vocab = table.shape[-1]

    @property
    def cache_len(self):
        return len(self.toks)

    def reset(self):
        self.toks = []

    def crop(self, length):
        del self.toks[length:]

    def keep(self, start, offsets):
        self.toks = self.toks[:start] + [self.toks[start + o] for o in offsets]

    def forward(self, tokens, attention_mask=None, position_ids=None, logits=True, hidden_states=False):
        c, n = len(self.toks), len(tokens)
        everything = self.toks + list(tokens)
        allowed = (torch.ones(n, c + n).tril(c).bool() if attention_mask is None
                   else attention_mask[0, 0] == 0)
        rows = []
        for i in range(n):
            ctx = [everything[j] for j in range(c + i + 1) if allowed[i, j]]
            a, b = ([0, 0] + ctx)[-2:]
            rows.append(self.table[a, b])
        self.toks = everything
        return torch.stack(rows) if logits else None


class NoText:
    def decode(self, ids, **_):
        return ""


def exact_joint(temperature, top_p, table=None):
    p = sampling.warp(TARGET if table is None else table, temperature, top_p)
    out = {}
    for seq in itertools.product(range(V), repeat=L):
        prob, ctx = 1.0, list(PROMPT)
        for t in seq:
            prob *= float(p[ctx[-2], ctx[-1], t])
            ctx.append(t)
        out[seq] = prob
    return out


def run(spec, temperature, top_p, n, rule="exact", seed0=0, tables=None):
    target, draft = (TrigramLM(t) for t in (tables or (TARGET, DRAFT)))
    cfg = DecodeConfig(max_new_tokens=L, temperature=temperature, top_p=top_p)
    counts, stats = {}, {"deep": 0, "second_child": 0}
    for i in range(n):
        res = generate_tree(target, draft, NoText(), PROMPT, Method("sd_tree", rule=rule), cfg,
                            seed=seed0 + i, tree=spec)
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
        stats["deep"] += res.accepted[0] >= 2
    return counts, stats


def pvalue(counts, n, temperature=1.0, top_p=1.0, table=None):
    joint = exact_joint(temperature, top_p, table)
    cells = [s for s in joint if joint[s] > 0]
    assert set(counts) <= set(cells)                      # nothing outside the support (top-p)
    total = sum(joint[s] for s in cells)
    return chisquare([counts.get(s, 0) for s in cells], [joint[s] / total * n for s in cells]).pvalue


STATIC = [[0], [1], [0, 0], [0, 1], [1, 0]]


@pytest.mark.parametrize("spec,temperature,top_p,n", [
    (TreeSpec(depth=1, top_k=2, total_tokens=5, children="topk"), 1.0, 1.0, 3000),
    (TreeSpec(depth=1, top_k=2, total_tokens=4, children="sample"), 1.0, 1.0, 3000),
    (TreeSpec(static_paths=STATIC, children="topk"), 0.7, 0.9, 2500),
    (TreeSpec(static_paths=STATIC, children="sample"), 1.0, 1.0, 2500),
], ids=["dynamic-topk", "dynamic-sample", "static-topk-T0.7-p0.9", "static-sample"])
def test_sampled_tree_commits_p_target(spec, temperature, top_p, n):
    counts, stats = run(spec, temperature, top_p, n)
    assert pvalue(counts, n, temperature, top_p) > 1e-3
    assert stats["deep"] > n * 0.05                       # depth-2 paths were accepted


def test_chi_square_detects_a_lossy_rule():
    """Negative control: the same test fails for a lossy rule (accept the first child always)."""
    rules.register(rules.Rule("_accept_all", lambda d, z, p, q, u, std: (torch.ones_like(std), torch.ones_like(d)),
                               lossless=False, doc="negative control: accept every draft"))
    try:
        counts, _ = run(TreeSpec(depth=1, top_k=2, total_tokens=5), 1.0, 1.0, 1500, rule="_accept_all")
    finally:
        del rules.RULES["_accept_all"]
    assert pvalue(counts, 1500) < 1e-6


def test_draft_q_for_topk_children_is_detected_as_lossy():
    """``topk_q=draft`` (the MARS authors' non-relaxed tree test) on the generic tables: the same
    chi-square that passes for onehot fails."""
    counts, _ = run(TreeSpec(depth=1, top_k=2, total_tokens=5, topk_q="draft"), 1.0, 1.0, 1500)
    assert pvalue(counts, 1500) < 1e-6


# The authors' non-relaxed path on a root with two top-k children. At the prompt the draft is
# q = (.8, .15, .05), so the children are 0 then 1, and the target is p = (.1, .1, .8) from raw logits
# (2, 2, 2 + ln 8), all positive with r = z2/z1 ~ .49, so no margin clause fires and mars = exact here.
AUTHORS_DRAFT = DRAFT.clone()
AUTHORS_DRAFT[1, 2] = torch.tensor([0.8, 0.15, 0.05]).log()
AUTHORS_TARGET = TARGET.clone()
AUTHORS_TARGET[1, 2] = torch.tensor([2.0, 2.0, 2.0 + torch.log(torch.tensor(8.0)).item()])
AUTHORS_SPEC = dict(depth=0, top_k=2, total_tokens=3)


def authors_first_token(p_target: list[float], children: list[int], q_child: list[float]) -> list[float]:
    """The first committed token's law under the authors' evaluate_posterior (sampling branch, no
    relaxation): for each child in order accept with min(1, px / qx); on rejection set
    gtp[x] = max(0, px - qx) and renormalise; no child accepted -> a draw from gtp."""
    law, alive, gtp = [0.0] * len(p_target), 1.0, list(p_target)
    for x, qx in zip(children, q_child):
        acp = min(1.0, gtp[x] / max(qx, 1e-10))
        law[x] += alive * acp
        alive *= 1.0 - acp
        gtp[x] = max(0.0, gtp[x] - qx)
        gtp = [g / sum(gtp) for g in gtp]
    return [a + alive * g for a, g in zip(law, gtp)]


@pytest.mark.parametrize("rule", ["exact", "mars"])
@pytest.mark.parametrize("topk_q", ["onehot", "draft"])
def test_topk_q_first_token_law(rule, topk_q):
    """onehot: the first token follows p_target; draft: it follows the authors' law computed by hand
    from their code, far from p_target (.125 / .648 / .227 vs .1 / .1 / .8), for every tree rule."""
    n = 1200
    target, draft = TrigramLM(AUTHORS_TARGET), TrigramLM(AUTHORS_DRAFT)
    cfg = DecodeConfig(max_new_tokens=2, temperature=1.0, top_p=1.0)
    spec = TreeSpec(**AUTHORS_SPEC, topk_q=topk_q)
    first = [0] * V
    for i in range(n):
        res = generate_tree(target, draft, NoText(), PROMPT, Method("sd_tree", rule=rule), cfg, seed=i, tree=spec)
        first[res.tokens[0]] += 1
    p = [0.1, 0.1, 0.8]
    authors = authors_first_token(p, [0, 1], [0.8, 0.15])
    expect, other = (p, authors) if topk_q == "onehot" else (authors, p)
    assert chisquare(first, [e * n for e in expect]).pvalue > 1e-3
    assert chisquare(first, [o * n for o in other]).pvalue < 1e-12


# At the prompt q = (.5, .3, .2) and the target is (.2, .48, .32): after a first child 0 is rejected the
# residual (0, .6, .4) equals q without 0, so the second child must be 1 or 2 in ratio 3:2. Elsewhere
# q = (.5, .5, 0), so the competing grandchild always scores log(.5 * .5): scored by its own log q,
# the second child survives pruning only when it is 1 (log .3 > log .25 > log .2).
PRUNE_DRAFT = torch.tensor([0.5, 0.5, 0.0]).log().repeat(V, V, 1)
PRUNE_DRAFT[1, 2] = torch.tensor([0.5, 0.3, 0.2]).log()
PRUNE_TARGET = TARGET.clone()
PRUNE_TARGET[1, 2] = torch.tensor([0.2, 0.48, 0.32]).log()
PRUNE_SPEC = TreeSpec(depth=1, top_k=2, total_tokens=3, children="sample")


def test_sampled_children_pruned_by_expected_score_stay_lossless():
    counts, _ = run(PRUNE_SPEC, 1.0, 1.0, 2500, tables=(PRUNE_TARGET, PRUNE_DRAFT))
    assert pvalue(counts, 2500, table=PRUNE_TARGET) > 1e-3


def test_chi_square_detects_value_dependent_pruning(monkeypatch):
    """Negative control: scoring sampled children by their own log q (so whether a draw survives
    pruning depends on its value) biases the kept children away from q_i; the test sees it."""
    pick = tree_mod._pick

    def pick_own_score(z, k, mode, cfg, gen):
        toks, _, q = pick(z, k, mode, cfg, gen)
        return toks, [float(q[t].log()) for t in toks], q

    monkeypatch.setattr(tree_mod, "_pick", pick_own_score)
    # n = 5000, twice the positive test's: the bias is small at this tree (with the children drawn by Gumbel-top-k,
    # n = 2500 gave p = 1.2e-6 for seed 0, 4e-9 for another; n = 5000 gave 4.9e-19)
    counts, _ = run(PRUNE_SPEC, 1.0, 1.0, 5000, tables=(PRUNE_TARGET, PRUNE_DRAFT))
    assert pvalue(counts, 5000, table=PRUNE_TARGET) < 1e-6


# r > theta at the prompt: raw target logits (3.0, 2.9, 2.95) -> top-1 = 0, top-2 = 2, r = .983; the
# draft's top-2 children are 1 (outside the target's top-2) then 0 (the target's top-1).
SKIP_TARGET = TARGET.clone()
SKIP_TARGET[1, 2] = torch.tensor([3.0, 2.9, 2.95])
SKIP_DRAFT = DRAFT.clone()
SKIP_DRAFT[1, 2] = torch.tensor([0.15, 0.8, 0.05]).log()


@pytest.mark.parametrize("outside_top2", ["test", "skip"])
def test_outside_top2_skip_is_the_authors_untested_child(outside_top2):
    """The authors' MARS tree path (outside_top2=skip): child 1 is outside the target's top-2 while
    r > theta, so it is rejected untested and child 0 (top-1, r > theta) is accepted outright: the first
    token is always 0. With the standard test (outside_top2=test, onehot q) child 1 is accepted with
    probability p_target(1)."""
    n = 800
    target, draft = TrigramLM(SKIP_TARGET), TrigramLM(SKIP_DRAFT)
    cfg = DecodeConfig(max_new_tokens=2, temperature=1.0, top_p=1.0)
    m = Method("mars_tree", rule_kwargs={"theta": 0.9, "sampled_top1": "margin", "outside_top2": outside_top2})
    first = [0] * V
    for i in range(n):
        res = generate_tree(target, draft, NoText(), PROMPT, m, cfg, seed=i, tree=TreeSpec(**AUTHORS_SPEC))
        first[res.tokens[0]] += 1
    if outside_top2 == "skip":
        assert first == [n, 0, 0]
    else:
        p1 = float(torch.softmax(SKIP_TARGET[1, 2], -1)[1])
        assert first[2] == 0 and binomtest(first[1], n, p1).pvalue > 1e-3
