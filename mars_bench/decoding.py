"""Decoding loops: ``ar`` (the baseline) and chains of drafts verified by a rule (``sd``, ``mars``).

The decoding core knows nothing of tasks, files or Hydra: token ids in, ``DecodeResult`` out.
Cache convention: between steps both caches hold every committed token except the newest one, which
is fed at the start of the next forward. So every target forward is one verification step, and
tau = new tokens / target forwards (accepted drafts + 1 bonus/correction token per step).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from . import rules, sampling
from .models.adapter import CausalLMAdapter

CHAIN_METHODS = ("ar", "sd", "mars")
TREE_METHODS = ("sd_tree", "mars_tree", "eagle3", "eagle3_mars")   # mars_bench/tree_loop.py
METHODS = CHAIN_METHODS + TREE_METHODS


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 128       # hard cap on emitted tokens, for every method
    temperature: float = 0.0        # 0 = greedy
    top_p: float = 1.0              # nucleus filtering of p_target and q_draft (sampling only)
    eos_ids: tuple[int, ...] = ()   # stop after emitting any of these (kept in the output)
    stop_strings: tuple[str, ...] = ()  # stop after the token that completes one (kept)


@dataclass(frozen=True)
class Method:
    name: str = "ar"                # ar | sd | mars
    k: int = 4                      # draft tokens proposed per step
    rule: str = "exact"             # verification rule (rules.RULES)
    rule_kwargs: dict = field(default_factory=dict)  # theta, nonpositive_top1, sampled_top1
    tree: dict = field(default_factory=dict)         # tree methods: depth, top_k, total_tokens, static_paths, children


@dataclass
class DecodeResult:
    tokens: list[int] = field(default_factory=list)
    stop_reason: str = ""
    steps: int = 0                  # target verification forwards (prefill excluded)
    proposed: list[int] = field(default_factory=list)   # per step: drafts proposed
    accepted: list[int] = field(default_factory=list)   # per step: drafts accepted
    relaxed: list[dict] = field(default_factory=list)   # one entry per relaxed acceptance
    z1: list[float] = field(default_factory=list)       # per verified draft position
    z2: list[float] = field(default_factory=list)
    outcome: str = ""               # per verified draft position: A exact, R relaxed, X rejected
    prefill_s: float = 0.0
    wall_s: float = 0.0
    target_s: float = 0.0
    draft_s: float = 0.0

    @property
    def tau(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0


class Stopper:
    """Identical stop conditions for every method: EOS ids, stop strings, max_new_tokens."""

    def __init__(self, tokenizer, cfg: DecodeConfig):
        self.tok, self.cfg, self.eos = tokenizer, cfg, set(cfg.eos_ids)

    def cut(self, new: list[int], start: int):
        """(length to keep, reason) if tokens new[start:] end generation, else None."""
        for i in range(start, len(new)):
            if new[i] in self.eos:
                return self._first(new, start, i + 1, "eos")
        return self._first(new, start, len(new), None)

    def _first(self, new, start, end, reason):
        if self.cfg.stop_strings and self._hit(new[:end]):
            for i in range(start, end):
                if self._hit(new[: i + 1]):
                    return i + 1, "stop_string"
        if reason:
            return end, reason
        if len(new) >= self.cfg.max_new_tokens:
            return self.cfg.max_new_tokens, "max_new_tokens"
        return None

    def _hit(self, ids) -> bool:
        text = self.tok.decode(ids, skip_special_tokens=True)
        return any(s in text for s in self.cfg.stop_strings)


def speculative_step(target: CausalLMAdapter, draft: CausalLMAdapter, seq: list[int], k: int,
                     rule, cfg: DecodeConfig, gen: torch.Generator | None, **rule_kwargs):
    """One draft-then-verify step over the committed sequence ``seq``; returns (new tokens, verdict).

    Draft:  d_i ~ q_draft(. | seq, d_<i)  for i = 1..k   (argmax when greedy)
    Target: one forward over [seq[-1], d_1..d_k] gives raw logits z_0..z_k, where z_i scores d_{i+1}
            and z_k the token after d_k.
    Verify: n = first i where the rule rejects d_{i+1} (k if none); commit d_1..d_n and one more
            token: argmax z_n (greedy), a draw from norm(max(0, p_target_n - q_draft_n)) on
            rejection, or from p_target_k after k accepts (the bonus token). ``exact`` is lossless
            (Leviathan et al. 2023); ``mars`` also accepts the target's top-2 when z2/z1 > theta.
    Caches: both are rolled back to seq + d_1..d_n (the newest token is fed next step).
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
    z_t = target.forward([seq[-1]] + drafts)
    v = rules.verify_chain(rule, torch.tensor(drafts, dtype=torch.long, device=z_t.device), z_t,
                           torch.stack(q_rows) if q_rows else None, cfg.temperature, cfg.top_p, gen,
                           **rule_kwargs)
    target.crop(len(seq) + v.n_accepted)
    draft.crop(min(draft.cache_len, len(seq) + v.n_accepted))
    return drafts[: v.n_accepted] + [v.next_token], v


def generate(target: CausalLMAdapter, draft: CausalLMAdapter | None, tokenizer, prompt: list[int],
             method: Method, cfg: DecodeConfig, seed: int = 0) -> DecodeResult:
    """Decode one prompt with ``method``; the same stop conditions apply to every method."""
    if method.name not in METHODS:
        raise ValueError(f"unknown method {method.name!r}; allowed: {', '.join(METHODS)}")
    if method.name in TREE_METHODS:
        from .tree_loop import generate_tree   # lazy: tree_loop imports this module

        return generate_tree(target, draft, tokenizer, prompt, method, cfg, seed)
    if not prompt:
        raise ValueError("empty prompt: at least one token is needed")
    spec = method.name != "ar"
    rule = rules.get_rule(method.rule) if spec else None
    gen = None
    if cfg.temperature > 0:
        gen = torch.Generator(device=target.device).manual_seed(seed)
    stopper, res = Stopper(tokenizer, cfg), DecodeResult()
    models = [target, draft] if spec else [target]
    _expect(target, method.k + 1 if spec else 1)   # CPU fast path: pack for the usual row count
    if spec:
        _expect(draft, 1)
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
            k = min(method.k, cfg.max_new_tokens - len(new) - 1)
            committed, v = speculative_step(target, draft, seq, k, rule, cfg, gen, **method.rule_kwargs)
            _audit(res, v, k, start, committed)
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


def _expect(model, n_tokens: int | None) -> None:
    if model is not None and hasattr(model, "expect"):        # stand-in adapters in tests may not implement the hint
        model.expect(n_tokens)


def _audit(res: DecodeResult, v: rules.ChainVerdict, k: int, start: int, committed) -> None:
    res.proposed.append(k)
    res.accepted.append(v.n_accepted)
    record_verdict(res, v, start, committed, v.n_accepted < k)


def record_verdict(res: DecodeResult, v, start: int, committed, rejected_end: bool) -> None:
    """Per verified draft of the committed path (chain or tree): z1, z2, outcome (A exact, R relaxed,
    X when the path ended in a rejection) and one entry per relaxed acceptance."""
    res.z1.extend(v.z1)
    res.z2.extend(v.z2)
    res.outcome += "".join("R" if r else "A" for r in v.relaxed) + ("X" if rejected_end else "")
    for i, r in enumerate(v.relaxed):
        if r:
            res.relaxed.append({"pos": start + i, "depth": i + 1, "draft": committed[i],
                                "top1": v.top1[i], "top2": v.top2[i],
                                "z1": v.z1[i], "z2": v.z2[i]})
