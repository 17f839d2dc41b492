"""Monte Carlo: one sampled tree step (``verify_sampled``) against its exact law, computed here independently.

A fixed tree over V = 4 (BFS order; node: token, children in rank order):
    0 root            children 1, 2
    1 (depth 1)       children 3, 4, 5     <- the first child rejected, a later one accepted at depth 2,
    2 (depth 1)       child 6                 or all rejected: the fallback draw at depth 1
    4 (depth 2)       children 7, 8        <- all rejected: the fallback at depth 2
    3, 5, 6, 7, 8     leaves (the bonus token is drawn from p_target there)
The exact law of a step's outcome (accepted path, next token) is the sequential recursion of tree.verify,
written out below in plain floats for each way a child is verified: top-k children with q = one-hot,
top-k with ``topk_q = draft`` (q = q_draft(c) e_c) and children drawn without replacement (q_i = q without
the earlier siblings). The empirical law of many steps is compared with it by a chi-square test (fixed
seed: deterministic); the negative control shows the test fails when the residual is forgotten.
"""
import math

import pytest
import torch
from scipy.stats import chisquare

from mars_bench.decode import rules, sampling
from mars_bench.decode.tree import DraftTree
from mars_bench.decode.tree.verify import verify_sampled

V, T, N = 4, 0.8, 4000
TOKENS = [0, 1, 2, 0, 3, 2, 1, 1, 0]
PARENTS = [-1, 0, 0, 1, 1, 1, 2, 4, 4]
DEPTHS = [0, 1, 1, 2, 2, 2, 2, 3, 3]
P_TARGET = [[.30, .30, .20, .20], [.15, .25, .20, .40], [.25, .25, .25, .25], [.10, .20, .30, .40],
            [.20, .15, .35, .30], [.40, .30, .20, .10], [.25, .25, .40, .10], [.10, .60, .20, .10],
            [.30, .30, .30, .10]]
Z = torch.tensor(P_TARGET).log() * T             # raw logits: softmax(Z / T) = P_TARGET
Q_DRAFT_OF_TOKEN = [1.0, .5, .3, .4, .6, .8, .6, .5, .3]          # topk_q = draft: q_draft(node's token | parent)
Q_SAMPLED = {0: [.1, .4, .3, .2], 1: [.4, .1, .2, .3], 2: [.2, .5, .2, .1], 4: [.3, .2, .1, .4]}
MODES = {"topk": ("topk", "onehot"), "topk_q=draft": ("topk", "draft"), "sample": ("sample", "onehot")}


def make_tree(mode: str) -> DraftTree:
    kind, topk_q = MODES[mode]
    q = {node: torch.tensor(row) for node, row in Q_SAMPLED.items()} if kind == "sample" else {}
    return DraftTree(list(TOKENS), list(PARENTS), list(DEPTHS), [-1] * len(TOKENS), kind, q=q,
                     logq=[math.log(x) for x in Q_DRAFT_OF_TOKEN], topk_q=topk_q)


def q_of(mode: str, node: int, rank: int, kids: list[int]) -> list[float]:
    """The q the rank-th child of ``node`` is tested against, from the definitions (not from the tree)."""
    kind, topk_q = MODES[mode]
    c = kids[rank]
    if kind == "topk":
        mass = 1.0 if topk_q == "onehot" else max(Q_DRAFT_OF_TOKEN[c], 1e-10)
        return [mass if x == TOKENS[c] else 0.0 for x in range(V)]
    gone = {TOKENS[s] for s in kids[:rank]}
    row = [0.0 if x in gone else Q_SAMPLED[node][x] for x in range(V)]
    return [x / sum(row) for x in row]


def exact_law(mode: str) -> dict:
    """P(path, next token): at a node p <- softmax(z / T); each child in rank order accepted with probability
    min(1, p(c) / q_i(c)), else p <- norm(max(0, p - q_i)); nothing accepted -> the next token ~ p."""
    kids_of = [[j for j in range(len(TOKENS)) if PARENTS[j] == node] for node in range(len(TOKENS))]
    law = {}

    def visit(node, path, reach):
        w = [math.exp(float(x) / T) for x in Z[node]]
        p = [x / sum(w) for x in w]
        for rank, c in enumerate(kids_of[node]):
            q = q_of(mode, node, rank, kids_of[node])
            x = TOKENS[c]
            acc = min(1.0, p[x] / q[x])
            visit(c, path + (c,), reach * acc)
            reach *= 1.0 - acc
            res = [max(0.0, a - b) for a, b in zip(p, q)]
            p = [r / sum(res) for r in res] if sum(res) > 0 else p
        for y in range(V):
            law[(path, y)] = law.get((path, y), 0.0) + reach * p[y]

    visit(0, (), 1.0)
    return law


def sampled(mode: str, n: int = N) -> dict:
    tree, gen, counts = make_tree(mode), torch.Generator().manual_seed(0), {}
    for _ in range(n):
        v = verify_sampled(rules.get_rule("exact"), tree, Z, T, 1.0, gen)
        key = (tuple(v.path), v.next_token)
        counts[key] = counts.get(key, 0) + 1
    return counts


def pvalue(counts: dict, law: dict, n: int = N) -> float:
    if any(law.get(k, 0.0) == 0 for k in counts):       # an outcome the exact law rules out
        return 0.0
    groups = [[k] for k in sorted((k for k in law if law[k] * n >= 5), key=law.get)]
    rest = [k for k in law if law[k] * n < 5]         # pooled; into the smallest cell when still under 5
    if sum(law[k] for k in rest) * n >= 5:
        groups.append(rest)
    else:
        groups[0].extend(rest)
    obs = [sum(counts.get(k, 0) for k in g) for g in groups]
    exp = [sum(law[k] for k in g) * n for g in groups]
    return chisquare(obs, exp).pvalue


def law_mass(law: dict, path: tuple) -> float:
    return sum(pr for (p, _), pr in law.items() if p == path)


def test_the_exact_law_of_onehot_children_is_p_target():
    """Self-check of the law above: with one-hot q the first committed token follows p_target(root) and, after
    node 1 (token 1, the root's only way to commit token 1), the second follows p_target(node 1)."""
    law = exact_law("topk")
    assert abs(sum(law.values()) - 1.0) < 1e-12
    first = [sum(pr for (path, y), pr in law.items() if (TOKENS[path[0]] if path else y) == x) for x in range(V)]
    assert max(abs(a - b) for a, b in zip(first, P_TARGET[0])) < 1e-6
    via1 = {k: pr for k, pr in law.items() if k[0][:1] == (1,)}
    second = [sum(pr for (path, y), pr in via1.items() if (TOKENS[path[1]] if len(path) > 1 else y) == x)
              for x in range(V)]
    assert max(abs(a / sum(second) - b) for a, b in zip(second, P_TARGET[1])) < 1e-6


@pytest.mark.parametrize("mode", list(MODES))
def test_sampled_step_follows_the_sequential_law(mode):
    law = exact_law(mode)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    # the cases this test exists for carry real mass: a later child accepted at depth 2 after earlier
    # rejections, and the fallback draw after every child was rejected at depth 1 and at depth 2
    later = sum(pr for (path, _), pr in law.items() if path[:2] in ((1, 4), (1, 5)))
    assert later > 0.05 and law_mass(law, (1,)) > 0.02 and law_mass(law, (1, 4)) > 0.02
    counts = sampled(mode)
    assert pvalue(counts, law) > 1e-3


def test_chi_square_detects_a_forgotten_residual(monkeypatch):
    """Negative control: later siblings and the fallback tested against p_target itself (no residual)."""
    monkeypatch.setattr(sampling, "residual", lambda p_target, q_draft: p_target)
    assert pvalue(sampled("topk", 2000), exact_law("topk"), 2000) < 1e-6


def test_sample_rows_draws_each_row_from_its_own_distribution():
    """The fallback draws: row i by its own uniform; zero-probability tokens never, whatever the uniform."""
    probs = torch.tensor([[0.0, .5, 0.0, .5], [.2, 0.0, .8, 0.0], [0.0, 0.0, 0.0, 1.0]])
    edges = torch.tensor([0.0, 1.0 - 2 ** -24])
    for u in edges:
        assert all(probs[r, int(t)] > 0 for r, t in enumerate(sampling.sample_rows(probs, u.repeat(3))))
    n, gen = 3000, torch.Generator().manual_seed(0)
    draws = sampling.sample_rows(probs[:2].repeat(n, 1), torch.rand(2 * n, generator=gen)).reshape(n, 2)
    for r in range(2):
        got = [int((draws[:, r] == x).sum()) for x in range(V)]
        keep = [x for x in range(V) if probs[r, x] > 0]
        assert sum(got[x] for x in keep) == n
        assert chisquare([got[x] for x in keep], [float(probs[r, x]) * n for x in keep]).pvalue > 1e-3
