"""Every rule on the tiny pair: token-identical to transformers ``generate(do_sample=False)`` at its
strict setting (chains k = 1, 4, 8 and a dynamic tree), and, at a loose setting, every verdict of the
audit re-derived from fresh forwards.

Re-derivation (``expected``): an independent float64 re-implementation of each rule's clauses,
written from the rule's docstring/source, is applied to the logits of a FRESH plain transformers
forward over the step's prefix + drafts (no KV cache) and, in sampled decoding, to the uniforms the
rule was really given (a spy copy of the rule records them; a uniform is randomness, not a model
output) and a fresh draft forward for q_draft. It must reproduce, step by step, the number of
accepted drafts, the outcome string (A standard / R lenient / X rejected) and every ``relaxed``
entry (position, clause, draft, top-1/top-2, z1/z2), so each lenient acceptance is shown to hold on
fresh logits AND to be one the standard test (greedy: argmax; sampled: u q_draft(d) < p_target(d))
would have rejected.
"""
import dataclasses

import pytest
import torch

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.decode.rules import get_rule
from mars_bench.decode.tree import TreeSpec

from .conftest import EOS, MAX_NEW

INF = float("inf")
DYNAMIC = TreeSpec(depth=3, top_k=3, total_tokens=12)

# strict settings, from each rule's docstring, at their loosest other knobs (exact and mars at theta = 1
# are checked in test_decoding/test_tree); typical and threshold are exact in greedy decoding whatever
# their knobs, so they run at their loosest values
STRICT = [("mars_prob", {"theta": 1.0}), ("topk_delta", {"top_k": 1, "delta": 1.0}),
          ("typical", {"epsilon": 0.0, "alpha": 0.0}), ("threshold", {"single": 2 ** -10, "acc": 2 ** -10}),
          ("fly", {"entropy": INF, "window": 1})]

def ids_of(cases):
    return [f"{n}-" + ",".join(f"{k}={v:g}" if not isinstance(v, str) else f"{k}={v}" for k, v in s.items())
            for n, s, *_ in cases]


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("name,settings", STRICT, ids=ids_of(STRICT))
def test_strict_setting_matches_hf_generate_chain(tiny, prompt_ids, hf_reference, name, settings, k):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    m = Method("sd", k=k, rule=name, rule_kwargs=settings)
    rejected = 0
    assert len(prompt_ids) >= 20
    for ids, ref in zip(prompt_ids, hf_reference):
        res = generate(target, draft, tok, ids, m, cfg)
        assert res.tokens == ref, tok.decode(ids)
        assert not res.relaxed and "R" not in res.outcome
        rejected += res.outcome.count("X")
    assert rejected > 0          # the draft disagrees sometimes: the rules really had to reject


TREE_STRICT = [(n, s) for n, s in STRICT if "tree" in get_rule(n).modes]


@pytest.mark.parametrize("name,settings", TREE_STRICT, ids=ids_of(TREE_STRICT))
def test_strict_setting_matches_hf_generate_dynamic_tree(tiny, prompt_ids, hf_reference, name, settings):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    m = Method("sd_tree", rule=name, rule_kwargs=settings)
    rejected = 0
    for ids, ref in zip(prompt_ids, hf_reference):
        res = generate(target, draft, tok, ids, m, cfg, tree=DYNAMIC)
        assert res.tokens == ref, tok.decode(ids)
        assert not res.relaxed
        rejected += res.outcome.count("X")
    assert rejected > 0


# ---------------------------------------------------------------- the independent re-derivation

def fresh_logits(model, seq, width):
    """Raw logits of a plain transformers forward over ``seq`` (no cache), float64, [len(seq), width]."""
    with torch.inference_mode():
        z = model(torch.tensor([seq])).logits[0].double()
    if z.shape[-1] >= width:
        return z[:, :width]
    return torch.cat([z, torch.full((z.shape[0], width - z.shape[-1]), -INF, dtype=z.dtype)], -1)


def warp64(z, temperature, top_p):
    """softmax(z / T) with nucleus filtering (the smallest most-likely set reaching top_p), float64."""
    p = torch.softmax(z / temperature, -1)
    if top_p < 1:
        sp, order = torch.sort(p, dim=-1, descending=True, stable=True)
        keep = (sp.cumsum(-1) - sp) < top_p
        p = torch.zeros_like(p).scatter(-1, order, sp * keep)
        p = p / p.sum(-1, keepdim=True)
    return p


def top12(z):
    t1 = z.argmax(-1)
    rest = z.clone()
    rest[torch.arange(len(z)), t1] = -INF
    t2 = rest.argmax(-1)
    at = lambda t: z[torch.arange(len(z)), t]  # noqa: E731
    return t1, t2, at(t1), at(t2)


def expected(name, s, d, z, p=None, q=None, u=None):
    """(accept[k], clause name or None per position) of rule ``name`` re-derived in float64."""
    k, ar = len(d), torch.arange(len(d))
    greedy = p is None
    t1, t2, z1, z2 = top12(z)
    std = (d == t1) if greedy else (u.double() * q[ar, d] < p[ar, d])
    none = [None] * k
    inside = torch.ones(k, dtype=torch.bool) if greedy else p[ar, d] > 0
    if name == "exact" or (greedy and name in ("typical", "threshold")):
        return std, none
    if name in ("mars", "mars_prob"):
        if name == "mars":
            r = (z2 / (z1 + 1e-10) if s["nonpositive_top1"] == "ratio"
                 else torch.where(z1 > 0, z2 / z1, torch.full_like(z1, -INF)))
        else:
            pp = torch.softmax(z, -1) if greedy else p
            v = pp.topk(2, -1).values
            r = v[:, 1] / v[:, 0]
        margin = r > s["theta"]
        ok2 = (d == t2) & margin
        ok1 = (d == t1) & (margin | (not greedy and s["sampled_top1"] == "always"))
        if s["outside_nucleus"] == "refuse":
            ok1, ok2 = ok1 & inside, ok2 & inside
        acc = std | ok1 | ok2
        return acc, [None if std[i] or not acc[i] else ("top2_margin" if ok2[i] else "top1") for i in range(k)]
    if name == "topk_delta":
        pp = torch.softmax(z, -1)
        order = torch.argsort(z, dim=-1, descending=True, stable=True)[:, : s["top_k"]]
        ok = (order == d[:, None]).any(-1) & (pp[ar, d] >= pp[ar, t1] - s["delta"] - 1e-7)
        acc = std | ok
    elif name == "typical":
        h = -(p * torch.log(p + 1e-5)).sum(-1)
        acc = p[ar, d] > torch.clamp(s["alpha"] * torch.exp(-h), max=s["epsilon"])
    elif name == "threshold":
        by_acc = u.double() * q[ar, d] < p[ar, d] / s["acc"]
        acc = std | by_acc | (p[ar, d] >= s["single"])
        return acc, [None if std[i] or not acc[i] else ("acc" if by_acc[i] else "single") for i in range(k)]
    elif name == "fly":
        w = s["window"]
        loose = torch.tensor([i < k - w and not std[i] and bool(std[i + 1:i + w].all()) for i in range(k)],
                             dtype=torch.bool)
        if s["entropy"] > 0.01:
            lp = torch.log_softmax(z, -1).topk(3, -1).values
            loose &= -(lp.exp() * lp).sum(-1) >= s["entropy"]
        acc = std | loose
    else:
        raise AssertionError(f"no re-derivation for rule {name}")
    clause = get_rule(name).clauses[0]
    return acc, [clause if acc[i] and not std[i] else None for i in range(k)]


def spy(rule):
    """A copy of ``rule`` that records the drafts, uniforms and q_draft of every call (not registered)."""
    calls = []

    def fn(draft, z, p_target, q_draft, u, standard, **s):
        calls.append((draft.clone(), None if u is None else u.clone(), None if q_draft is None else q_draft.clone()))
        return rule.fn(draft, z, p_target, q_draft, u, standard, **s)
    return dataclasses.replace(rule, fn=fn), calls


def rederive_chain(tiny, ids, name, s, k, temperature, top_p, seed, claim=None):
    """Decode ``ids`` with a spy of rule ``name`` at settings ``s``; re-derive every step from fresh
    forwards (at ``claim``, default ``s``) and compare with the audit. Returns (DecodeResult, counts
    {standard, <clause>: n} of accepted drafts)."""
    target, draft, tok = tiny
    rule, calls = spy(get_rule(name))
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, temperature=temperature, top_p=top_p, eos_ids=(EOS,))
    res = generate(target, draft, tok, ids, Method("sd", k=k, rule=name, rule_kwargs=dict(s)), cfg, seed=seed, rule=rule)
    s = rule.settings(s if claim is None else claim)
    V = target.out_vocab
    outcome, relaxed, counts, start, c = "", [], {"standard": 0}, 0, 0
    for step, (m, n) in enumerate(zip(res.proposed, res.accepted)):
        if m:
            d, u, q_seen = calls[c]
            c += 1
            assert len(d) == m
            seq = ids + res.tokens[:start] + d.tolist()
            z = fresh_logits(target.model, seq, V)[len(ids) + start - 1:-1]
            p = q = None
            if temperature > 0:
                p = warp64(z, temperature, top_p)
                q = warp64(fresh_logits(draft.model, seq, V)[len(ids) + start - 1:-1], temperature, top_p)
                torch.testing.assert_close(q_seen.double(), q, atol=1e-4, rtol=0)   # same drafts, same q_draft
            acc, clause = expected(name, s, d, z, p, q, u)
            n_exp = int((~acc).nonzero()[0]) if (~acc).any() else m
            assert n == n_exp, (step, acc.tolist(), n)
            t1, t2, z1, z2 = top12(z)
            for i in range(n):
                outcome += "A" if clause[i] is None else "R"
                if clause[i] is None:
                    counts["standard"] += 1
                else:
                    counts[clause[i]] = counts.get(clause[i], 0) + 1
                    relaxed.append({"pos": start + i, "depth": i + 1, "draft": int(d[i]), "rule": name,
                                    "clause": clause[i], "top1": int(t1[i]), "top2": int(t2[i]),
                                    "z1": float(z1[i]), "z2": float(z2[i])})
            outcome += "X" if n < m else ""
        start += n + 1
    assert c == len(calls) and outcome == res.outcome
    assert len(relaxed) == len(res.relaxed)
    for e, f in zip(res.relaxed, relaxed):
        assert {x: e[x] for x in e if x not in ("z1", "z2")} == {x: f[x] for x in f if x not in ("z1", "z2")}
        assert abs(e["z1"] - f["z1"]) < 1e-3 and abs(e["z2"] - f["z2"]) < 1e-3
        if e["pos"] < len(res.tokens):
            assert res.tokens[e["pos"]] == e["draft"]
    return res, counts


LOOSE_GREEDY = [("mars", {"theta": 0.5}), ("mars", {"theta": 0.7, "nonpositive_top1": "ratio"}),
                ("mars_prob", {"theta": 0.3}), ("topk_delta", {"top_k": 5, "delta": 0.3}),
                ("fly", {"window": 3, "entropy": 0.0}), ("fly", {"window": 2, "entropy": 0.3})]
PROMPTS_AUDIT = 8     # prompts per case in the greedy re-derivations (each decodes up to MAX_NEW tokens)
PROMPTS_SAMPLED = 16  # sampled: lenient acceptances are rarer (the tiny pair rarely rejects at T = 1)


@pytest.mark.parametrize("k", [4, 8])
@pytest.mark.parametrize("name,settings", LOOSE_GREEDY, ids=ids_of(LOOSE_GREEDY))
def test_greedy_chain_audit_rederived_from_fresh_forwards(tiny, prompt_ids, name, settings, k):
    lenient = 0
    for ids in prompt_ids[:PROMPTS_AUDIT]:
        res, counts = rederive_chain(tiny, ids, name, settings, k, 0.0, 1.0, 0)
        lenient += len(res.relaxed)
    assert lenient > 0           # the loose setting really relaxed something: the checks ran


LOOSE_SAMPLED = [("mars", {"theta": 0.6}, 1.0), ("mars", {"theta": 0.6, "sampled_top1": "margin"}, 1.0),
                 ("mars", {"theta": 0.6}, 0.95), ("mars", {"theta": 0.6, "outside_nucleus": "allow"}, 0.95),
                 ("mars_prob", {"theta": 0.3}, 1.0), ("typical", {}, 1.0), ("typical", {"epsilon": 0.3}, 0.9),
                 ("threshold", {"single": 0.3, "acc": 0.5}, 1.0), ("fly", {"window": 2, "entropy": 0.0}, 1.0)]


@pytest.mark.parametrize("name,settings,top_p", LOOSE_SAMPLED, ids=[f"{i}-{c[0]}" for i, c in
                                                                    enumerate(LOOSE_SAMPLED)])
def test_sampled_chain_audit_rederived_from_fresh_forwards(tiny, prompt_ids, name, settings, top_p):
    lenient = 0
    for i, ids in enumerate(prompt_ids[:PROMPTS_SAMPLED]):
        res, counts = rederive_chain(tiny, ids, name, settings, 4, 1.0, top_p, seed=100 + i)
        lenient += len(res.relaxed)
    assert lenient > 0


def rederive_tree_greedy(tiny, ids, name, s):
    """Greedy tree: every accepted path node re-checked on a fresh forward of the committed sequence:
    an A node is the argmax, an R node fails the argmax test and passes the rule's clause."""
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    res = generate(target, draft, tok, ids, Method("sd_tree", rule=name, rule_kwargs=s), cfg, tree=DYNAMIC)
    s = get_rule(name).settings(s)
    z_all = fresh_logits(target.model, ids + res.tokens, target.out_vocab)[len(ids) - 1:]
    letters, start, entries = res.outcome.replace("X", ""), 0, iter(res.relaxed)
    assert len(letters) == sum(res.accepted) and res.outcome.count("R") == len(res.relaxed)
    j = 0
    for n in res.accepted:
        for i in range(n):
            pos = start + i
            letter = letters[j]
            j += 1
            if pos >= len(res.tokens):
                continue
            z = z_all[pos][None]
            acc, clause = expected(name, s, torch.tensor([res.tokens[pos]]), z)
            assert acc[0], (pos, letter)
            assert letter == ("A" if clause[0] is None else "R"), pos
            if letter == "R":
                e = next(entries)
                t1, t2, z1, z2 = top12(z)
                assert (e["pos"], e["depth"], e["draft"], e["clause"]) == (pos, i + 1, res.tokens[pos], clause[0])
                assert (e["top1"], e["top2"]) == (int(t1), int(t2)) and abs(e["z1"] - float(z1)) < 1e-3
        start += n + 1
    return res


@pytest.mark.parametrize("name,settings", [c for c in LOOSE_GREEDY if "tree" in get_rule(c[0]).modes],
                         ids=ids_of([c for c in LOOSE_GREEDY if "tree" in get_rule(c[0]).modes]))
def test_greedy_tree_audit_rederived_from_fresh_forwards(tiny, prompt_ids, name, settings):
    lenient = 0
    for ids in prompt_ids[:PROMPTS_AUDIT]:
        lenient += len(rederive_tree_greedy(tiny, ids, name, settings).relaxed)
    assert lenient > 0


@pytest.mark.parametrize("name,settings,claim,temperature", [
    ("mars", {"theta": 0.5}, {"theta": 1.0}, 0.0),
    ("mars", {"theta": 0.6}, {"theta": 1.0, "sampled_top1": "margin"}, 1.0),
    ("threshold", {"single": 0.3, "acc": 0.5}, {"single": 1.0, "acc": 1.0}, 1.0),
    ("fly", {"window": 3, "entropy": 0.0}, {"window": 2, "entropy": 0.0}, 0.0)])
def test_the_rederivation_has_teeth(tiny, prompt_ids, name, settings, claim, temperature):
    """Re-derived at settings other than the ones decoded with, the audit no longer matches."""
    with pytest.raises(AssertionError):
        for i, ids in enumerate(prompt_ids[:PROMPTS_SAMPLED]):
            rederive_chain(tiny, ids, name, settings, 4, temperature, 1.0, 100 + i, claim=claim)


@pytest.mark.parametrize("children", ["topk", "sample"])
def test_sampled_tree_typical_relaxed_nodes_hold_on_fresh_logits(tiny, prompt_ids, children):
    """typical corrects from p_target (never the residual), so each sibling is judged on the fresh
    p_target itself: every lenient node passes p_target(d) > min(epsilon, alpha exp(-H)) there."""
    target, draft, tok = tiny
    s = get_rule("typical").settings({})
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, temperature=1.0, eos_ids=(EOS,))
    spec = TreeSpec(depth=2, top_k=3, total_tokens=10, children=children)
    n = 0
    for i, ids in enumerate(prompt_ids[:PROMPTS_AUDIT]):
        res = generate(target, draft, tok, ids, Method("sd_tree", rule="typical"), cfg, seed=i, tree=spec)
        z_all = fresh_logits(target.model, ids + res.tokens, target.out_vocab)[len(ids) - 1:]
        assert res.outcome.count("R") == len(res.relaxed)
        for e in res.relaxed:
            if e["pos"] >= len(res.tokens):
                continue
            z = z_all[e["pos"]][None]
            p = warp64(z, 1.0, 1.0)   # typical's verdict does not read u or q_draft
            acc, _ = expected("typical", s, torch.tensor([e["draft"]]), z, p, torch.ones_like(p), torch.zeros(1))
            assert acc[0] and e["clause"] == "typical" and res.tokens[e["pos"]] == e["draft"]
            n += 1
    assert n > 0
