"""Chain decoding: ``ar`` (the baseline) and ``sd`` (a chain of drafts verified by any rule).

Cache convention: between steps both caches hold every committed token except the newest one, which
is fed at the start of the next forward. So every target forward is one verification step, and
tau = new tokens / target forwards (accepted drafts + 1 bonus/correction token per step).
"""
from __future__ import annotations

import time

import torch

from . import sampling
from .rules import Rule, verify_chain
from .types import DecodeConfig, DecodeResult, Method, Stopper


def draft_chain(draft, seq: list[int], k: int, cfg: DecodeConfig, gen, p_min: float = 0.0):
    """Up to k drafts d_i ~ q_draft(. | seq, d_<i) (argmax when greedy); (drafts, q rows or None).

    Adaptive length (``p_min`` > 0; llama.cpp's server and transformers' assisted generation ship it):
    stop proposing once the draft's top-1 probability (softmax of its raw logits) falls below p_min,
    always proposing at least one. Which drafts are proposed never depends on the target, so every
    rule's guarantees (``exact`` lossless) hold for any length.
    """
    greedy = cfg.temperature == 0.0
    feed, drafts, q_rows = seq[draft.cache_len:], [], []
    for _ in range(k):
        z_d = draft.forward(feed)[-1]
        if greedy:
            d = int(z_d.argmax(-1))
        else:
            q = sampling.warp(z_d, cfg.temperature, cfg.top_p)
            d = int(sampling.sample(q, gen))
            q_rows.append(q)
        drafts.append(d)
        feed = [d]
        if p_min > 0 and len(drafts) < k and float(torch.softmax(z_d.float(), -1).max()) < p_min:
            break
    return drafts, (torch.stack(q_rows) if q_rows else None)


def speculative_step(target, draft, seq: list[int], k: int, rule: Rule, cfg: DecodeConfig,
                     gen: torch.Generator | None, p_min: float = 0.0, **settings):
    """One draft-then-verify step over the committed sequence ``seq``; returns (new tokens, verdict).

    Draft:  d_1..d_m ~ q_draft, m <= k (``draft_chain``)
    Target: one forward over [seq[-1], d_1..d_m] gives raw logits z_0..z_m, where z_i scores d_{i+1}
            and z_m the token after d_m.
    Verify: n = first i where the rule rejects d_{i+1} (m if none); commit d_1..d_n and one more
            token: argmax z_n (greedy), a draw from norm(max(0, p_target_n - q_draft_n)) on
            rejection, or from p_target_m after m accepts (the bonus token). ``exact`` is lossless
            (Leviathan et al. 2023); ``mars`` also accepts the target's top-2 when z2/z1 > theta.
    Caches: both are rolled back to seq + d_1..d_n (the newest token is fed next step).
    """
    drafts, q = draft_chain(draft, seq, k, cfg, gen, p_min)
    z_t = target.forward([seq[-1]] + drafts)
    v = verify_chain(rule, torch.tensor(drafts, dtype=torch.long, device=z_t.device), z_t, q,
                     cfg.temperature, cfg.top_p, gen, **settings)
    target.crop(len(seq) + v.n_accepted)
    draft.crop(min(draft.cache_len, len(seq) + v.n_accepted))
    return drafts[: v.n_accepted] + [v.next_token], v, len(drafts)


def generate_chain(target, draft, tokenizer, prompt: list[int], method: Method, cfg: DecodeConfig,
                   rule: Rule | None, settings: dict, gen) -> DecodeResult:
    """Decode one prompt with ``ar`` (rule None) or ``sd`` + a rule; the stop conditions of every method."""
    spec = method.speculative
    stopper, res = Stopper(tokenizer, cfg), DecodeResult()
    models = [target, draft] if spec else [target]
    expect(target, method.k + 1 if spec else 1)   # CPU fast path: pack for the usual row count
    if spec:
        expect(draft, 1)
    t_before = [m.forward_s for m in models]
    t0 = time.perf_counter()
    for m in models:                    # prefill everything but the last prompt token
        m.reset()
        if len(prompt) > 1:
            m.forward(prompt[:-1], logits=False)
    res.prefill_s = time.perf_counter() - t0
    seq, new, stop = list(prompt), res.tokens, None
    while stop is None:
        start = len(new)
        if spec:
            k = cfg.draft_len(method.k, len(new))   # exact: never draft past the budget; after_step: whole k
            committed, v, m = speculative_step(target, draft, seq, k, rule, cfg, gen, method.p_min, **settings)
            res.proposed.append(m)
            res.accepted.append(v.n_accepted)
            record_verdict(res, v, start, committed, v.n_accepted < m)
        else:
            z = target.forward([seq[-1]])[-1]
            committed = [sampling.next_token(z, cfg.temperature, cfg.top_p, gen)]
        res.steps += 1
        new.extend(committed)
        seq.extend(committed)
        stop = stopper.cut(new, start)
    return finish(res, stop, t0, target, draft if spec else None, t_before)


def finish(res: DecodeResult, stop, t0: float, target, draft, t_before) -> DecodeResult:
    """Cut the output at the stop point; record wall time and time inside each model's forwards."""
    del res.tokens[stop[0]:]
    res.stop_reason = stop[1]
    res.wall_s = time.perf_counter() - t0
    res.target_s = target.forward_s - t_before[0]
    res.draft_s = draft.forward_s - t_before[1] if draft is not None else 0.0
    return res


def expect(model, n_tokens: int | None) -> None:
    if model is not None and hasattr(model, "expect"):        # stand-in adapters in tests may not implement the hint
        model.expect(n_tokens)


def record_verdict(res: DecodeResult, v, start: int, committed, rejected_end: bool) -> None:
    """Per verified draft of the committed path (chain or tree): z1, z2, outcome (A standard, R lenient,
    X when the path ended in a rejection) and one entry per lenient acceptance: which rule and clause
    accepted which draft, with the logits it used."""
    res.z1.extend(v.z1)
    res.z2.extend(v.z2)
    res.outcome += "".join("A" if c is None else "R" for c in v.clause) + ("X" if rejected_end else "")
    for i, c in enumerate(v.clause):
        if c is not None:
            res.relaxed.append({"pos": start + i, "depth": i + 1, "draft": committed[i], "rule": v.rule,
                                "clause": c, "top1": v.top1[i], "top2": v.top2[i],
                                "z1": v.z1[i], "z2": v.z2[i]})
