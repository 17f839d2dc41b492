"""The rule registry on hand-made tensors: settings validation, modes, each rule's boundaries and ties,
and monotonicity (a looser knob never accepts fewer drafts) on random logits with a fixed seed.

Boundaries are built from exactly representable numbers (binary fractions) so "exactly at the
threshold" really is equality in float32; where a boundary is an irrational function of the inputs
(entropies) it is computed independently here in float64 and probed on both sides.
"""
import math

import pytest
import torch

from mars_bench.decode import rules, sampling
from mars_bench.decode.rules import RULES, get_rule

LOSSY = [n for n, r in RULES.items() if not r.lossless]


def test_registry_holds_every_rule_of_issue_13():
    assert {"exact", "mars", "mars_prob", "topk_delta", "typical", "threshold", "fly"} <= set(RULES)
    assert [n for n, r in RULES.items() if r.lossless] == ["exact"]
    for r in RULES.values():
        assert r.doc and r.strict and r.clauses and set(r.modes) <= set(rules.MODES)


# ---------------------------------------------------------------- settings validation

def bad_values(knob):
    """Values outside the knob's declared range, derived from the declaration itself."""
    if knob.choices:
        return ["bogus", 1]
    out = ["abc", True, float("nan")]
    if knob.low is not None:
        out.append(knob.low - 1)
        if knob.open_low:
            out.append(knob.low)
    if knob.high is not None:
        out.append(knob.high + 1)
        if knob.open_high:
            out.append(knob.high)
    if knob.integer:
        out += [(knob.low or 0) + 1.5, float("inf"), "inf"]   # int(inf) overflows: must still be one line
    return out


KNOBS = [(r.name, k) for r in RULES.values() for k in r.knobs]


@pytest.mark.parametrize("rule,knob", KNOBS, ids=[f"{r}.{k.name}" for r, k in KNOBS])
def test_out_of_range_knob_is_a_one_line_error_naming_rule_knob_value_and_range(rule, knob):
    r = get_rule(rule)
    for bad in bad_values(knob):
        with pytest.raises(ValueError) as e:
            r.settings({knob.name: bad})
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"rule.{knob.name}={bad!r}"), msg
        if knob.choices:
            assert all(c in msg for c in knob.choices), msg
        else:
            for bound, open_, brackets in ((knob.low, knob.open_low, "[("), (knob.high, knob.open_high, "])")):
                if bound is not None:
                    assert f"{bound:g}" in msg, msg
                    assert brackets[1 if open_ else 0] in msg, msg
            assert ("integer" in msg) == knob.integer, msg


@pytest.mark.parametrize("rule,knob", KNOBS, ids=[f"{r}.{k.name}" for r, k in KNOBS])
def test_closed_bounds_and_the_default_are_accepted(rule, knob):
    r = get_rule(rule)
    good = list(knob.choices) if knob.choices else [knob.default]
    if not knob.choices:
        good += [b for b, o in ((knob.low, knob.open_low), (knob.high, knob.open_high)) if b is not None and not o]
    for v in good:
        s = r.settings({knob.name: v})
        assert s[knob.name] == v and set(s) == set(r.knob_map)
    if not knob.choices:   # numbers given as strings (command-line overrides) are parsed
        assert r.settings({knob.name: str(knob.default)})[knob.name] == knob.default


@pytest.mark.parametrize("name", list(RULES))
def test_unknown_knob_names_the_rules_settings(name):
    r = get_rule(name)
    with pytest.raises(ValueError) as e:
        r.settings({"no_such_knob": 1})
    msg = str(e.value)
    assert "\n" not in msg and "rule.no_such_knob" in msg and name in msg
    assert all(k in msg for k in r.knob_map) and (r.knobs or "none" in msg)


@pytest.mark.parametrize("name,scheme,temperature,mode", [("topk_delta", "chain", 1.0, "sampled"),
                                                          ("topk_delta", "tree", 0.7, "sampled"),
                                                          ("fly", "tree", 0.0, "tree"),
                                                          ("fly", "tree", 1.0, "tree")])
def test_rules_refuse_undefined_modes_in_one_line(name, scheme, temperature, mode):
    r = get_rule(name)
    with pytest.raises(ValueError) as e:
        r.check_mode(scheme, temperature)
    msg = str(e.value)
    assert "\n" not in msg and f"rule={name}" in msg and f"not defined for {mode}" in msg
    assert all(m in msg.split("defined for:")[1] for m in r.modes)


def test_generate_refuses_undefined_modes_before_decoding():
    from mars_bench.decode import DecodeConfig, Method, generate

    class Boom:   # any forward would be a bug: the mode check comes first
        device = torch.device("cpu")

        def __getattr__(self, name):
            raise AssertionError(f"model used before the mode check: {name}")

    for method, temperature in ((Method("sd", rule="topk_delta"), 1.0), (Method("sd_tree", rule="fly"), 0.0)):
        with pytest.raises(ValueError, match=f"rule={method.rule} is not defined for"):
            generate(Boom(), Boom(), None, [1], method, DecodeConfig(max_new_tokens=8, temperature=temperature))


@pytest.mark.parametrize("name", list(RULES))
def test_defined_modes_pass_the_check(name):
    r = get_rule(name)
    for scheme in ("chain", "tree"):
        for t in (0.0, 1.0):
            ok = scheme in r.modes and ("greedy" if t == 0 else "sampled") in r.modes
            if ok:
                r.check_mode(scheme, t)
            else:
                with pytest.raises(ValueError):
                    r.check_mode(scheme, t)


# ---------------------------------------------------------------- boundaries and ties, per rule

def t(*x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def rejecting(p):
    """q_draft and u with which the standard test rejects any draft d with p_target[d] < 1:
    q_draft = one-hot(d) (q = 1 there) and u = 1 - 2^-10 >= p_target[d]."""
    return lambda d: (torch.nn.functional.one_hot(d, p.shape[-1]).float(), torch.full(d.shape, 1 - 2 ** -10))


def test_mars_theta_exactly_at_r():
    z = t([8.0, 6.0, 0.0])                       # r = 6/8 = 0.75 exactly in binary
    d = torch.tensor([1])
    assert not rules.mars(d, z, theta=0.75).accept.item()        # r > theta is strict
    v = rules.mars(d, z, theta=0.75 - 2 ** -20)
    assert v.accept.item() and v.relaxed.item() and rules.mars.clauses[v.clause.item() - 1] == "top2_margin"
    assert not rules.mars(torch.tensor([2]), z, theta=0.01).accept.item()   # top-3 never


def test_mars_prob_theta_exactly_at_p2_over_p1():
    p = t([0.5, 0.375, 0.125])                   # r = 0.75 exactly
    z = torch.log(p)
    d = torch.tensor([1])
    q, u = rejecting(p)(d)
    assert not rules.mars_prob(d, z, p, q, u, theta=0.75).accept.item()
    v = rules.mars_prob(d, z, p, q, u, theta=0.75 - 2 ** -20)
    assert v.accept.item() and v.relaxed.item() and v.clause.item() == 1
    # greedy: r = softmax(z) ratio = exp(z2 - z1); z2 - z1 = log 0.75 -> r ~ 0.75 up to rounding
    r = math.exp(math.log(0.375) - math.log(0.5))
    assert rules.mars_prob(d, z, theta=r - 1e-4).accept.item()
    assert not rules.mars_prob(d, z, theta=r + 1e-4).accept.item()


def test_topk_delta_delta_exactly_at_the_gap_and_top_k_boundary():
    td = get_rule("topk_delta")
    z = t([2.0, 1.6, 1.5, -3.0])
    p = torch.softmax(z, -1)
    gap = float(p[0, 0] - p[0, 1])                     # p0, p1 within a factor 2: the subtraction is exact
    d = torch.tensor([1])
    v = td(d, z, top_k=2, delta=gap)       # p(d) >= p(top1) - delta: equality accepts
    assert v.accept.item() and v.relaxed.item()
    assert not td(d, z, top_k=2, delta=math.nextafter(gap, 0) - 1e-7).accept.item()
    d2 = torch.tensor([2])                        # rank 3: needs top_k >= 3
    assert td(d2, z, top_k=3, delta=1.0).accept.item()
    assert not td(d2, z, top_k=2, delta=1.0).accept.item()
    assert td(torch.tensor([0]), z, top_k=1, delta=0.0).accept.item()   # the top-1 always
    assert not td(torch.tensor([3]), z, top_k=4, delta=float(p[0, 0] - p[0, 3]) * 0.999).accept.item()


def test_topk_delta_ties_follow_greedy_at_top_k_1():
    td = get_rule("topk_delta")
    z = t([3.0, 3.0, 1.0], [1.0, 3.0, 3.0])
    am = z.argmax(-1)
    other = torch.tensor([1, 2])                 # tied with the argmax, not chosen by greedy
    assert am.tolist() == [0, 1]
    assert not td(other, z, top_k=1, delta=1.0).accept.any()           # strict: = exact
    assert td(am, z, top_k=1, delta=0.0).accept.all()
    assert td(other, z, top_k=2, delta=0.0).accept.all()    # TensorRT-LLM: a tie is within delta = 0


def test_typical_epsilon_and_alpha_thresholds():
    typ = get_rule("typical")
    p = t([0.5, 0.25, 0.25])
    z = torch.log(p)
    d = torch.tensor([1])
    q = t([0.01, 0.98, 0.01])              # standard test: u q(d) < p(d) for u < 0.255
    u = torch.tensor([0.9])
    h = -sum(x * math.log(x + 1e-5) for x in (0.5, 0.25, 0.25))     # Medusa's entropy, float64
    # epsilon binds (alpha exp(-H) = exp(-H) ~ 0.354 > 0.25): accept iff 0.25 > epsilon
    assert not typ(d, z, p, q, u, epsilon=0.25, alpha=1.0).accept.item()
    v = typ(d, z, p, q, u, epsilon=0.25 - 2 ** -20, alpha=1.0)
    assert v.accept.item() and v.relaxed.item() and v.clause.item() == 1
    # alpha binds (epsilon = 1): accept iff 0.25 > alpha exp(-H)
    a0 = 0.25 / math.exp(-h)
    assert typ(d, z, p, q, u, epsilon=1.0, alpha=a0 * (1 - 1e-4)).accept.item()
    assert not typ(d, z, p, q, u, epsilon=1.0, alpha=a0 * (1 + 1e-4)).accept.item()
    # it replaces the rejection test: a draft the standard test accepts can be rejected
    v = typ(d, z, p, q, torch.tensor([0.1]), epsilon=0.3, alpha=1.0)
    assert v.standard.item() and not v.accept.item()
    # greedy: exactly the argmax, whatever the knobs
    zz = t([1.0, 0.9, 0.8])
    assert not typ(torch.tensor([1]), zz, epsilon=0.0, alpha=0.0).accept.item()
    assert typ(torch.tensor([0]), zz, epsilon=1.0, alpha=1.0).accept.item()


def test_threshold_single_and_acc_boundaries():
    th = get_rule("threshold")
    p = t([0.5, 0.25, 0.25])
    z = torch.log(p)
    q = t([1.0, 0.0, 0.0])                 # point-mass draft (SGLang)
    d0 = torch.tensor([0])
    u_hi = torch.tensor([0.75])                  # standard test: 0.75 * 1 < 0.5 fails
    assert th(d0, z, p, q, u_hi, single=0.5, acc=1.0).accept.item()            # p >= single: equality
    v = th(d0, z, p, q, u_hi, single=0.5, acc=1.0)
    assert v.relaxed.item() and th.clauses[v.clause.item() - 1] == "single"
    assert not th(d0, z, p, q, u_hi, single=0.5 + 2 ** -20, acc=1.0).accept.item()
    u = torch.tensor([0.625])                    # acc clause: 0.625 < 0.5 / acc  iff  acc < 0.8
    assert not th(d0, z, p, q, u, single=1.0, acc=0.8).accept.item()          # strict <
    v = th(d0, z, p, q, u, single=1.0, acc=0.8 - 2 ** -20)
    assert v.accept.item() and th.clauses[v.clause.item() - 1] == "acc"
    assert not th(d0, z, p, q, u, single=1.0, acc=1.0).accept.item()          # strict setting = exact
    zz = t([1.0, 0.9, 0.8])                # greedy ignores both thresholds
    assert not th(torch.tensor([1]), zz, single=2 ** -20, acc=2 ** -20).accept.item()


def fly_chain(k, mismatch, confident=()):
    """Greedy logits for a k-chain whose drafts are token 0 everywhere; the target's argmax is 0 except
    at ``mismatch`` positions (argmax 1). Rows in ``confident`` put almost all mass on their argmax."""
    z = torch.tensor([[2.0, 1.0, 0.5, 0.0]]).repeat(k, 1)
    for i in mismatch:
        z[i] = torch.tensor([1.0, 2.0, 0.5, 0.0])
    for i in confident:
        z[i] = torch.tensor([0.0, 12.0, -2.0, -3.0]) if i in mismatch else torch.tensor([12.0, 0.0, -2.0, -3.0])
    return torch.zeros(k, dtype=torch.long), z


def top3_entropy(row):
    p = torch.softmax(row.double(), -1).topk(3).values
    return float(-(p * p.log()).sum())


@pytest.mark.parametrize("k,window", [(8, 3), (8, 1), (6, 6), (4, 6), (8, 8), (9, 2)])
def test_fly_window_positions_and_strict_tail(k, window):
    fly = get_rule("fly")
    for i in range(k):
        d, z = fly_chain(k, [i])
        v = fly(d, z, window=window, entropy=0.0)
        expect_loose = i < k - window            # FLy: the last `window` positions stay strict
        assert v.accept.tolist() == [j != i or expect_loose for j in range(k)], (i, v.accept)
        assert v.relaxed.tolist() == [j == i and expect_loose for j in range(k)]
    # a second mismatch inside the window blocks the first (matches judged before loosening)
    if window >= 2 and k - window >= 2:
        d, z = fly_chain(k, [0, 1])
        v = fly(d, z, window=window, entropy=0.0)
        assert v.accept.tolist()[:2] == [False, 1 < k - window]


def test_fly_entropy_gate():
    fly = get_rule("fly")
    d, z = fly_chain(8, [1])
    h = top3_entropy(z[1])
    assert fly(d, z, window=3, entropy=h * (1 - 1e-4)).accept[1]       # entropy >= threshold: loosened
    assert not fly(d, z, window=3, entropy=h * (1 + 1e-4)).accept[1]
    assert not fly(d, z, window=3, entropy=float("inf")).accept[1]     # strict setting
    d, z = fly_chain(8, [1], confident=[1])                            # a confident target there
    h = top3_entropy(z[1])
    assert h < 0.01
    assert fly(d, z, window=3, entropy=0.01).accept[1]                 # <= 0.01: FLy's gate is off
    assert not fly(d, z, window=3, entropy=0.02).accept[1]


def test_mars_ties_and_exact_ties():
    z = t([3.0, 3.0, 1.0])[None]
    assert rules.mars(torch.tensor([1]), z, theta=0.99).relaxed.item()     # tied top-2: r = 1 > 0.99
    assert not rules.mars(torch.tensor([1]), z, theta=1.0).accept.item()
    assert not rules.exact(torch.tensor([1]), z).accept.item()             # greedy: argmax's tie-break
    assert rules.exact(torch.tensor([0]), z).accept.item()


# ---------------------------------------------------------------- monotonicity

N_CASES = 3000


def random_case(seed, k=1):
    """N_CASES positions of random logits over V = 12 (several scales, some z1 <= 0), drafts that are
    the target's top-1/2/3 or random, p_target at T = 1 with top-p 0.9, a random q_draft, uniforms."""
    g = torch.Generator().manual_seed(seed)
    V = 12
    scale = torch.tensor([0.3, 1.0, 3.0])[torch.randint(0, 3, (N_CASES, 1), generator=g)]
    z = torch.randn(N_CASES, V, generator=g) * scale + torch.randn(N_CASES, 1, generator=g)
    order = z.argsort(-1, descending=True)
    pick = torch.randint(0, 4, (N_CASES,), generator=g)
    d = torch.where(pick < 3, order.gather(-1, pick.clamp(max=2)[:, None])[:, 0],
                    torch.randint(0, V, (N_CASES,), generator=g))
    p = sampling.warp(z, 1.0, 0.9)
    q = torch.softmax(z + torch.randn(N_CASES, V, generator=g) * 1.5, -1)
    u = torch.rand(N_CASES, generator=g)
    return d, z, p, q, u


MONOTONE = [   # (rule, knob varied, values from strict-ish to loose, fixed settings, modes)
    ("mars", "theta", [1.0, 0.95, 0.8, 0.5, 0.2, 0.01], {"nonpositive_top1": "strict"}, ("greedy", "sampled")),
    ("mars", "theta", [1.0, 0.95, 0.8, 0.5, 0.2, 0.01], {"nonpositive_top1": "ratio", "sampled_top1": "margin"},
     ("greedy", "sampled")),
    ("mars_prob", "theta", [1.0, 0.9, 0.6, 0.3, 0.01], {}, ("greedy", "sampled")),
    ("mars_prob", "theta", [1.0, 0.9, 0.6, 0.3, 0.01], {"sampled_top1": "margin", "outside_nucleus": "allow"},
     ("sampled",)),
    ("topk_delta", "top_k", [1, 2, 3, 5, 10, 12], {"delta": 0.3}, ("greedy",)),
    ("topk_delta", "delta", [0.0, 0.05, 0.2, 0.6, 1.0], {"top_k": 5}, ("greedy",)),
    ("typical", "epsilon", [1.0, 0.5, 0.3, 0.09, 0.01, 0.0], {"alpha": 0.3}, ("sampled",)),
    ("typical", "alpha", [1.0, 0.5, 0.3, 0.1, 0.0], {"epsilon": 0.2}, ("sampled",)),
    ("threshold", "single", [1.0, 0.8, 0.5, 0.2, 0.05], {"acc": 1.0}, ("sampled",)),
    ("threshold", "acc", [1.0, 0.8, 0.5, 0.2, 0.05], {"single": 0.6}, ("sampled",)),
]


@pytest.mark.parametrize("name,knob,values,fixed,modes", MONOTONE,
                         ids=[f"{m[0]}.{m[1]}-{i}" for i, m in enumerate(MONOTONE)])
def test_a_looser_knob_never_accepts_fewer(name, knob, values, fixed, modes):
    r = get_rule(name)
    d, z, p, q, u = random_case(hash((name, knob)) % 1000)
    for mode in modes:
        args = (d, z) if mode == "greedy" else (d, z, p, q, u)
        prev, counts = None, []
        for val in values:
            acc = r(*args, **{**fixed, knob: val}).accept
            if prev is not None:
                assert not (prev & ~acc).any(), (mode, knob, val)   # elementwise superset
            prev = acc
            counts.append(int(acc.sum()))
        assert counts[-1] > counts[0], (mode, counts)             # the knob really loosens here


def test_fly_lower_entropy_never_accepts_fewer():
    fly = get_rule("fly")
    g = torch.Generator().manual_seed(5)
    values = [float("inf"), 2.0, 1.0, 0.6, 0.3, 0.1, 0.02, 0.01, 0.0]
    counts = [0] * len(values)
    for c in range(300):
        k = 8
        z = torch.randn(k, 6, generator=g) * (0.5 + 2 * torch.rand(1, generator=g))
        match = torch.rand(k, generator=g) < 0.8
        am = z.argmax(-1)
        d = torch.where(match, am, (am + 1 + torch.randint(0, 5, (k,), generator=g)) % 6)
        p, q = torch.softmax(z, -1), torch.softmax(z * 0.5, -1)
        u = torch.rand(k, generator=g)
        for args in ((d, z), (d, z, p, q, u)):
            prev = None
            for i, e in enumerate(values):
                acc = fly(*args, window=3, entropy=e).accept
                if prev is not None:
                    assert not (prev & ~acc).any(), (c, e)
                prev = acc
                counts[i] += int(acc.sum())
    assert counts[-1] > counts[0]
