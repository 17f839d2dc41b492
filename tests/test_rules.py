"""MARS and exact rules on hand-made logits."""
import pytest
import torch

from mars_bench.decode import rules


def z_of(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def greedy(rule, draft, z, **kw):
    return rule(torch.tensor(draft), z, **kw)


def test_top1_always_accepted_greedy_and_sampled():
    z = z_of([5.0, 1.0, 0.5], [-1.0, -3.0, -2.0], [2.0, 2.0, 1.0])
    v = greedy(rules.mars, [0, 0, 0], z, theta=0.99)
    assert v.accept.tolist() == [True, True, True] and not v.relaxed.any()
    p = torch.softmax(z, -1)
    q = torch.full_like(p, 1 / 3)
    q[:, 0] = 0.98  # a draft far more confident than the target: exact would often reject
    v = rules.mars(torch.tensor([0, 0, 0]), z, p, q, torch.full((3,), 0.999), theta=0.99)
    assert v.accept.all()
    assert not rules.exact(torch.tensor([0, 0, 0]), z, p, q, torch.full((3,), 0.999)).accept.all()


@pytest.mark.parametrize("theta", [0.5, 0.8, 0.9, 0.95, 0.999])
def test_top2_accepted_iff_ratio_above_theta(theta):
    z2s = torch.linspace(0.05, 10.0, 200)
    z = torch.stack([torch.full_like(z2s, 10.0), z2s, torch.zeros_like(z2s)], dim=1)
    v = rules.mars(torch.ones(200, dtype=torch.long), z, theta=theta)
    expect = (z2s / 10.0) > theta
    assert torch.equal(v.accept, expect) and torch.equal(v.relaxed, expect)
    assert expect.any() and (~expect).any()


def test_top3_never_accepted_greedy():
    z = z_of([10.0, 9.99, 9.98, 0.0])
    for theta in (0.1, 0.5, 0.9, 1.0):
        v = greedy(rules.mars, [2], z, theta=theta)
        assert not v.accept.any()


def test_nonpositive_top1_switches():
    z = z_of([-1.0, -1.05, -9.0], [0.0, -0.5, -2.0])
    # strict: never relaxes where z1 <= 0
    v = greedy(rules.mars, [1, 1], z, theta=0.5, nonpositive_top1="strict")
    assert v.accept.tolist() == [False, False]
    # ratio (authors' code): z2 / (z1 + 1e-10) >= 1 for z2 <= z1 < 0, so it relaxes even at theta = 1
    v = greedy(rules.mars, [1], z[:1], theta=1.0, nonpositive_top1="ratio")
    assert v.accept.tolist() == [True] and v.relaxed.tolist() == [True]
    # z1 == 0 exactly: ratio gives z2/1e-10 -> -inf-ish, never relaxes either
    v = greedy(rules.mars, [1], z[1:], theta=0.5, nonpositive_top1="ratio")
    assert v.accept.tolist() == [False]
    with pytest.raises(ValueError, match="nonpositive_top1='bad'"):
        greedy(rules.mars, [1], z[:1], nonpositive_top1="bad")


def test_ties():
    z = z_of([3.0, 3.0, 1.0])
    # top-1 is the first maximal index (as argmax / greedy decoding); the tied one is top-2, r = 1
    z1, z2, t1, t2 = rules.top2(z)
    assert (t1.item(), t2.item(), z1.item(), z2.item()) == (0, 1, 3.0, 3.0)
    assert greedy(rules.mars, [1], z, theta=0.99).accept.item()
    assert not greedy(rules.mars, [1], z, theta=1.0).accept.item()   # r = 1 is not > 1
    assert not greedy(rules.exact, [1], z).accept.item()


def test_theta_one_never_relaxes_strict():
    torch.manual_seed(0)
    z = torch.randn(500, 50) * 3
    _, _, _, t2 = rules.top2(z)
    v = rules.mars(t2, z, theta=1.0, nonpositive_top1="strict")
    assert not v.accept.any() and not v.relaxed.any()


def test_sampled_top1_margin_variant():
    z = z_of([5.0, 1.0, 0.5])          # r = 0.2 <= theta: no margin
    p = torch.softmax(z, -1)
    q = torch.tensor([[0.999, 0.0005, 0.0005]])
    u = torch.tensor([0.9999])
    assert rules.mars(torch.tensor([0]), z, p, q, u, theta=0.9, sampled_top1="always").accept.item()
    # margin variant leaves it to the rejection test: u * q = 0.9989 > p[0] ~ 0.97 -> reject
    assert not rules.mars(torch.tensor([0]), z, p, q, u, theta=0.9, sampled_top1="margin").accept.item()


def test_exact_sampling_accept_probability():
    z = z_of([0.0, 0.0])
    p = torch.tensor([[0.3, 0.7]])
    q = torch.tensor([[0.6, 0.4]])
    d = torch.tensor([0])
    assert rules.exact(d, z, p, q, torch.tensor([0.49])).accept.item()      # 0.49 < 0.3/0.6
    assert not rules.exact(d, z, p, q, torch.tensor([0.51])).accept.item()


def test_unknown_rule():
    with pytest.raises(ValueError, match="unknown verification rule .nope.; allowed: exact, fly, mars"):
        rules.get_rule("nope")


def test_verify_chain_greedy_correction_and_bonus():
    z = z_of([1.0, 5.0, 0.0], [4.0, 0.0, 1.0], [0.0, 0.0, 9.0])
    v = rules.verify_chain(rules.exact, torch.tensor([1, 0]), z, None, 0.0, 1.0, None)
    assert (v.n_accepted, v.next_token) == (2, 2)       # all accepted + bonus argmax of last row
    v = rules.verify_chain(rules.exact, torch.tensor([1, 2]), z, None, 0.0, 1.0, None)
    assert (v.n_accepted, v.next_token) == (1, 0)       # rejected at 1, correction = argmax
