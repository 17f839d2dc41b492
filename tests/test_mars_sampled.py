"""MARS in sampled decoding (issue 16) and the lossy rules' Monte Carlo negative controls (issue 13).

1. The three audit cases on hand-made tensors: a top-1 draft accepted only by ``sampled_top1=always``
   is lenient (clause top1); a top-2 draft the standard test accepts anyway is NOT lenient; outside
   the nucleus ``refuse`` rejects what ``allow`` accepts.
2. Monte Carlo through ``verify_chain`` (drafts drawn from q_draft, the rule's own uniforms): the
   per-position acceptance probability, split into standard / top2_margin / top1, equals
       P(accept) = sum_d q(d) [1 if a MARS clause holds for d else min(1, p(d)/q(d))].
3. A tiny-pair run at T = 1: the audit's counts re-derived from fresh forwards.
4. Every lossy rule, at a loose setting, fails the chi-square losslessness test of
   test_sampling_mc (and passes it at its sampled strict setting, where it has one).
"""
import pytest
import torch
from scipy.stats import binomtest, chisquare

from mars_bench.decode import DecodeConfig, Method, generate, rules, sampling
from mars_bench.decode.engine import _audit
from mars_bench.decode.proposers.base import Proposal
from mars_bench.decode.rules import get_rule
from mars_bench.decode.types import DecodeResult

from .test_sampling_mc import DRAFT, TARGET, BigramLM, NoText, exact_joint

# a toy position over V = 4: p_target and q_draft chosen so that both MARS clauses change decisions
P = torch.tensor([0.45, 0.35, 0.15, 0.05])   # target: top-1 = 0, top-2 = 1
Q = torch.tensor([0.50, 0.40, 0.02, 0.08])   # the draft over-proposes tokens 0, 1 and 3
Z = torch.log(P) + 3.0                        # raw logits with z1 = 2.20 > 0, r = z2/z1 = 0.886
R = float((torch.log(P[1]) + 3) / (torch.log(P[0]) + 3))


def one(x):
    return torch.tensor([x])


# ---------------------------------------------------------------- 1. the three cases of issue 16

def test_top1_accepted_only_by_sampled_top1_always_is_lenient_and_counted():
    u = one(0.95)                                # standard: 0.95 * 0.5 = 0.475 >= p(0) = 0.45 -> reject
    assert not rules.exact(one(0), Z[None], P[None], Q[None], u).accept.item()
    v = rules.mars(one(0), Z[None], P[None], Q[None], u, theta=0.95)      # r = 0.886: no margin
    assert v.accept.item() and not v.standard.item() and v.relaxed.item()
    assert rules.mars.clauses[v.clause.item() - 1] == "top1"
    assert not rules.mars(one(0), Z[None], P[None], Q[None], u, theta=0.95, sampled_top1="margin").accept.item()
    # the chain audit records it as a lenient acceptance (what n_relaxed counts)
    res = DecodeResult()
    cv = rules.ChainVerdict(2, ["top1"], [3.0], [2.0], [0], [1], "mars", n_accepted=1)
    _audit(res, Proposal([0]), cv, [0, 2])
    assert res.outcome == "R" and [e["clause"] for e in res.relaxed] == ["top1"]


def test_verify_chain_labels_a_top1_acceptance_lenient_only_when_the_standard_test_would_reject():
    z = torch.stack([Z, Z])
    seen = {None: 0, "top1": 0}
    for seed in range(400):
        g = torch.Generator().manual_seed(seed)
        u = float(torch.rand(1, generator=torch.Generator().manual_seed(seed)))   # verify_chain's first draw
        cv = rules.verify_chain(rules.mars, one(0), z, Q[None], 1.0, 1.0, g, theta=0.95)
        assert cv.n_accepted == 1
        assert cv.clause[0] == (None if u * 0.5 < 0.45 else "top1"), (seed, u)
        seen[cv.clause[0]] += 1
    assert min(seen.values()) > 0


def test_top2_draft_the_standard_test_accepts_anyway_is_not_lenient():
    p = torch.tensor([0.45, 0.40, 0.10, 0.05])
    q = torch.tensor([0.40, 0.16, 0.40, 0.04])   # p/q = 2.5 at the top-2
    z = torch.log(p) + 3.0
    for u in (0.0, 0.5, 0.99):
        v = rules.mars(one(1), z[None], p[None], q[None], one(u), theta=0.5)   # margin holds (r ~ 0.96)
        assert v.accept.item() and v.standard.item() and not v.relaxed.item() and v.clause.item() == 0


@pytest.mark.parametrize("name", ["mars", "mars_prob"])
def test_outside_the_nucleus_refuse_rejects_and_allow_accepts(name):
    rule = get_rule(name)
    z = torch.tensor([[3.0, 2.9, 0.0, -1.0]])    # r = 0.967 (mars); p2/p1 = 0.905 before filtering
    p = sampling.warp(z, 1.0, 0.3)               # top-p 0.3 keeps the top-1 only: [1, 0, 0, 0]
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    q = torch.tensor([[0.1, 0.8, 0.05, 0.05]])
    u = one(0.0)                                  # the most lenient uniform: standard needs p(d) > 0
    theta = 0.9 if name == "mars" else 0.0 + 2 ** -20
    if name == "mars_prob":   # r on p_target (after top-p) is 0: its margin can never hold there
        assert not rule(one(1), z, p, q, u, theta=theta, outside_nucleus="allow").accept.item()
        return
    assert not rule(one(1), z, p, q, u, theta=theta).accept.item()              # default: refuse
    v = rule(one(1), z, p, q, u, theta=theta, outside_nucleus="allow")   # unfiltered top-2 (the authors' filtered
    # logits give z2 = -inf here: r = -inf, no relaxation, the standard test rejects, as refuse does)
    assert v.accept.item() and v.relaxed.item() and rule.clauses[v.clause.item() - 1] == "top2_margin"
    assert rule.knob_map["outside_nucleus"].default == "refuse"


# ---------------------------------------------------------------- 2. Monte Carlo acceptance probability

def analytic(theta, sampled_top1):
    """(P(standard accept), P(accepted only by top2_margin), P(accepted only by top1)) at the toy position."""
    margin = R > theta
    std = float(torch.minimum(Q, P).sum())            # sum_d q(d) min(1, p(d)/q(d))
    lenient = (Q - P).clamp_min(0)                    # sum_d q(d) (1 - min(1, p/q)) for d in a clause
    top2 = float(lenient[1]) if margin else 0.0
    top1 = float(lenient[0]) if (sampled_top1 == "always" or margin) else 0.0
    return std, top2, top1


def committed_law(theta, sampled_top1) -> torch.Tensor:
    """The law of the first committed token at the toy position: q_draft(t) a(t) + P(reject) residual(t), with
    a = 1 where a clause holds, else min(1, p_target / q_draft)."""
    margin = float(Z[1]) / float(Z[0]) > theta
    a = torch.minimum(torch.ones(4), P / Q)
    if margin:
        a[1] = 1.0
    if sampled_top1 == "always" or margin:
        a[0] = 1.0
    acc = Q * a
    residual = (P - Q).clamp_min(0)
    return (acc + (1 - acc.sum()) * residual / residual.sum()).double()


N_MC = 20000


@pytest.mark.parametrize("theta,sampled_top1", [(0.8, "always"), (0.8, "margin"), (0.95, "always"), (0.95, "margin")])
def test_acceptance_probability_matches_the_analytic_one(theta, sampled_top1):
    z = torch.stack([Z, Z])
    g = torch.Generator().manual_seed(2026)
    counts = {None: 0, "top2_margin": 0, "top1": 0, "rejected": 0}
    for _ in range(N_MC):
        d = sampling.sample(Q, g)
        cv = rules.verify_chain(rules.mars, d[None], z, Q[None], 1.0, 1.0, g, theta=theta, sampled_top1=sampled_top1)
        counts[cv.clause[0] if cv.n_accepted else "rejected"] += 1
    std, top2, top1 = analytic(theta, sampled_top1)
    for key, prob in ((None, std), ("top2_margin", top2), ("top1", top1), ("rejected", 1 - std - top2 - top1)):
        if prob == 0:
            assert counts[key] == 0, key
        else:
            assert binomtest(counts[key], N_MC, prob).pvalue > 1e-3, (key, counts[key] / N_MC, prob)
    accepted = N_MC - counts["rejected"]
    assert binomtest(accepted, N_MC, std + top2 + top1).pvalue > 1e-3
    # the lossless rule on the same draws would accept with probability std only: MARS is measurably above
    assert binomtest(accepted, N_MC, std).pvalue < 1e-6 or top1 + top2 == 0


# ---------------------------------------------------------------- 3. a tiny run at T = 1, re-derived

def test_tiny_run_audit_counts_rederived_from_fresh_forwards(tiny, prompt_ids):
    from .test_rules_audit import rederive_chain

    total = {"standard": 0, "top2_margin": 0, "top1": 0}
    n_acc = n_rel = 0
    for i, ids in enumerate(prompt_ids):
        res, counts = rederive_chain(tiny, ids, "mars", {"theta": 0.6}, 4, 1.0, 1.0, seed=100 + i)
        for key, n in counts.items():
            total[key] += n
        n_acc += sum(res.accepted)
        n_rel += len(res.relaxed)
    # the runner's counts: n_exact = accepted - relaxed, n_relaxed = relaxed entries, n_by_clause per clause
    assert n_acc - n_rel == total["standard"] and n_rel == total["top2_margin"] + total["top1"]
    assert total["top1"] > 0 and total["top2_margin"] > 0, total   # both clauses really fired
    print(f"tiny T=1 mars theta=0.6 k=4, {len(prompt_ids)} prompts: {total}")


# ---------------------------------------------------------------- 4. negative controls (and strict positives)

def chi2_pvalue(rule, settings, k, n):
    """p-value of the chi-square test of the k + 1 committed tokens against the target's exact joint law."""
    target, draft = BigramLM(TARGET), BigramLM(DRAFT)
    cfg = DecodeConfig(max_new_tokens=k + 1, temperature=1.0)
    m = Method("sd", k=k, rule=rule, rule_kwargs=settings)
    counts = {}
    for i in range(n):
        res = generate(target, draft, NoText(), [0], m, cfg, seed=50_000 + i)
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
    joint = exact_joint(k + 1, 1.0, 1.0)
    total = sum(joint.values())
    return chisquare([counts.get(s, 0) for s in joint], [joint[s] / total * n for s in joint]).pvalue


# loose settings on the toy tables (TARGET rows: r = z2/z1 = 0.13, 0.33, 0.33; p2/p1 >= 0.27)
NEGATIVE = [("mars", {"theta": 0.1}, 2),
            ("mars_prob", {"theta": 0.2}, 2), ("typical", {}, 2), ("threshold", {"single": 0.3, "acc": 0.3}, 2),
            ("fly", {"window": 2, "entropy": 0.0}, 3)]
STRICT_SAMPLED = [("mars", {"theta": 1.0, "sampled_top1": "margin"}, 2),
                  ("mars_prob", {"theta": 1.0, "sampled_top1": "margin"}, 2), ("threshold", {}, 2),
                  ("fly", {"window": 2, "entropy": float("inf")}, 3)]
N_CHI2 = 3000


def test_every_lossy_rule_has_a_negative_control():
    sampled_lossy = {n for n, r in rules.RULES.items() if not r.lossless and "sampled" in r.modes}
    assert sampled_lossy <= {n for n, _, _ in NEGATIVE}


@pytest.mark.parametrize("name,settings,k", NEGATIVE, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(NEGATIVE)])
def test_chi_square_detects_each_lossy_rule(name, settings, k):
    assert chi2_pvalue(name, settings, k, N_CHI2) < 1e-6


@pytest.mark.parametrize("name,settings,k", STRICT_SAMPLED, ids=[n for n, _, _ in STRICT_SAMPLED])
def test_strict_sampled_setting_passes_the_same_test(name, settings, k):
    assert chi2_pvalue(name, settings, k, N_CHI2) > 1e-3
