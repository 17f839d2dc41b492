"""The verification-rule interface, the registry, and chain verification.

A rule is a small pure function over tensors, registered once (``register``) with its settings
(defaults and allowed ranges), whether it is lossless, the modes it is defined for and how its
settings appear in a run directory's name. Rules are defined only here: the runner, run specs, summaries,
the report and the W&B logger read their settings, lossless flag and names from ``RULES``. The report also
names ``mars`` itself, as the paper's rule: its default theta (``report.frames.DEFAULT_THETA``, read from the
registration), its colour and its place first among the lossy rules.

Inputs of a rule function, for k draft positions over a vocabulary of size V:
  draft     LongTensor[k]      the draft tokens
  z         Tensor[k, V]       the target's RAW logits at those positions (before temperature)
  p_target  Tensor[k, V]|None  target distribution after temperature/top-p (None = greedy)
  q_draft   Tensor[k, V]|None  distribution each draft was drawn from (None = greedy)
  u         Tensor[k]|None     uniforms in [0, 1) (None = greedy)
  standard  BoolTensor[k]      the standard (lossless) decision with the same inputs and uniforms:
                               greedy draft == argmax z; sampled u * q_draft[d] < p_target[d]
  **settings                   the rule's knobs, defaults filled in
It returns ``(accept, clause)``: BoolTensor[k], and LongTensor[k] naming, where a draft is accepted
that the standard test alone would have rejected, which of the rule's ``clauses`` accepted it
(1-based; 0 elsewhere). Rules see the whole chain at once, so block-level rules (``fly``) need no
special case in the loop; rules defined for trees are called on the nodes of a tree batched, each
judged on its parent's row, so they must be position-wise (``modes`` says which).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mars_bench.decode import sampling

MODES = ("greedy", "sampled", "chain", "tree")


@dataclass
class Verdict:
    accept: torch.Tensor      # BoolTensor[k]
    standard: torch.Tensor    # BoolTensor[k]: the standard test alone, same inputs and uniforms
    clause: torch.Tensor      # LongTensor[k]: 1-based clause of a lenient acceptance, else 0
    skipped: torch.Tensor | None = None   # BoolTensor[k]: rejected untested (p_target stays as it was)

    @property
    def relaxed(self) -> torch.Tensor:
        """Accepted only because of the rule (the standard test alone would have rejected)."""
        return self.accept & ~self.standard


@dataclass(frozen=True)
class Knob:
    """One setting of a rule: default, allowed values, and how it appears in a run tag."""
    name: str
    default: Any
    doc: str
    low: float | None = None          # numbers: bounds (``open_low``/``open_high`` exclude them)
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    integer: bool = False
    choices: tuple[str, ...] = ()     # a switch: one of these strings
    tag: str = ""                     # numbers: tag prefix (th -> th0.9); switches: value shown unless default
    sampled_only: bool = False        # no effect when greedy: left out of greedy run tags
    nucleus_only: bool = False        # no effect unless sampling with top_p < 1: left out of the tag otherwise
    show_default: bool = False        # switches: in the tag even at the default (a default that changed once)

    def allowed(self) -> str:
        if self.choices:
            return ", ".join(self.choices)
        kind = "an integer" if self.integer else "a number"
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"{kind} in {'(' if self.open_low else '['}{lo}, {hi}{')' if self.open_high else ']'}"

    def check(self, value: Any, where: str) -> Any:
        bad = ValueError(f"{where}.{self.name}={value!r}; allowed: {self.allowed()}")
        if self.choices:
            if value not in self.choices:
                raise bad
            return value
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise bad
        if self.integer:
            if math.isinf(value) or value != int(value):   # int(inf) would raise OverflowError
                raise bad
            value = int(value)
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            raise bad
        if self.high is not None and (value > self.high or (self.open_high and value == self.high)):
            raise bad
        return value if self.integer else float(value)


@dataclass(frozen=True)
class Rule:
    name: str
    fn: Callable
    lossless: bool
    doc: str                                   # one line: the rule and its source
    knobs: tuple[Knob, ...] = ()
    modes: frozenset = frozenset(MODES)
    clauses: tuple[str, ...] = ()              # names of the lenient clauses (audit counts)
    strict: str = "always"                     # when it is exactly `exact` (also in the docstring)
    sweep: str | None = None                   # the knob a rules sweep varies (one figure line per rule)
    correction: str = "residual"               # sampled, after a rejection: residual | target
    knob_map: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "knob_map", {k.name: k for k in self.knobs})
        if not self.clauses:      # a lenient acceptance always has a name in the audit
            object.__setattr__(self, "clauses", ("lenient",))

    @property
    def defaults(self) -> dict:
        return {k.name: k.default for k in self.knobs}

    def settings(self, given: dict | None = None, where: str = "rule") -> dict:
        """Every knob, defaults filled in, each checked; an unknown knob is a one-line ValueError."""
        given = dict(given or {})
        unknown = [n for n in given if n not in self.knob_map]
        if unknown:
            allowed = ", ".join(self.knob_map) or "none"
            raise ValueError(f"{where}.{unknown[0]} is not a setting of rule {self.name}; allowed: {allowed}")
        return {n: k.check(given.get(n, k.default), where) for n, k in self.knob_map.items()}

    def check_mode(self, scheme_kind: str, temperature: float) -> None:
        """``scheme_kind`` chain | tree; a one-line ValueError where the rule is not defined."""
        mode = "greedy" if temperature == 0 else "sampled"
        for m in (scheme_kind, mode):
            if m not in self.modes:
                ok = ", ".join(x for x in MODES if x in self.modes)
                raise ValueError(f"rule={self.name} is not defined for {m} decoding; it is defined for: {ok}")

    def tag_parts(self, settings: dict, temperature: float, top_p: float) -> list[str]:
        """How the settings appear in a run directory's name (``tags.RunSpec.label``)."""
        out = []
        for k in self.knobs:
            v = settings[k.name]
            if (k.sampled_only and temperature == 0) or (k.nucleus_only and (temperature == 0 or top_p >= 1)):
                continue
            if k.choices:
                if v != k.default or k.show_default:
                    out.append(f"{k.tag}{v}")
            else:
                out.append(f"{k.tag}{v:g}")
        return out

    def __call__(self, draft, z, p_target=None, q_draft=None, u=None, p_standard=None, **settings) -> Verdict:
        """The rule's verdict on k drafts (see the module docstring); missing settings take defaults.
        ``p_standard``: the distribution of the standard test when it is not p_target (a later sibling
        in a sampled tree is tested against the residual; the rule's clauses read the target's own)."""
        s = {**self.defaults, **settings}
        if q_draft is not None:           # the draft may sit on another device than the target's logits
            q_draft = q_draft.to(z.device)
        std = standard(draft, z, p_target if p_standard is None else p_standard, q_draft, u)
        out = self.fn(draft, z, p_target, q_draft, u, std, **s)
        accept, clause = out[:2]
        skipped = out[2] if len(out) > 2 else torch.zeros_like(accept)
        lenient = accept & ~std
        clause = torch.where(lenient, clause.clamp(1, len(self.clauses)), torch.zeros_like(clause))
        return Verdict(accept, std, clause, skipped & ~accept)


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.name in RULES:
        raise ValueError(f"rule {rule.name!r} is registered twice")
    RULES[rule.name] = rule
    return rule


def get_rule(name: str) -> Rule:
    if name not in RULES:
        raise ValueError(f"unknown verification rule {name!r}; allowed: {', '.join(RULES)}")
    return RULES[name]


def standard(draft, z, p_target=None, q_draft=None, u=None) -> torch.Tensor:
    """The lossless decision. greedy: draft == argmax z. sampling: accept with probability
    min(1, p_target[d] / q_draft[d]) (Leviathan et al. 2023; Chen et al. 2023), i.e. u q_draft[d] < p_target[d]."""
    if p_target is None:
        return draft == z.argmax(-1)
    pd = p_target.gather(-1, draft[..., None]).squeeze(-1)
    qd = q_draft.gather(-1, draft[..., None]).squeeze(-1)
    return u * qd < pd


def none_lenient(accept: torch.Tensor) -> torch.Tensor:
    return torch.zeros(accept.shape, dtype=torch.long, device=accept.device)


def top2(z: torch.Tensor):
    """(z1, z2, top1, top2) of each row; top1 = argmax (the same tie-break as greedy decoding)."""
    top1 = z.argmax(-1)
    z1 = z.gather(-1, top1[..., None]).squeeze(-1)
    rest = z.scatter(-1, top1[..., None], float("-inf"))
    second = rest.argmax(-1)
    z2 = rest.gather(-1, second[..., None]).squeeze(-1)
    return z1, z2, top1, second


def in_support(draft: torch.Tensor, p_target: torch.Tensor | None) -> torch.Tensor:
    """True where the target could emit the draft: greedy always; sampled p_target[d] > 0 (after top-p)."""
    if p_target is None:
        return torch.ones_like(draft, dtype=torch.bool)
    return p_target.gather(-1, draft[..., None]).squeeze(-1) > 0


@dataclass
class PathVerdict:
    """What the audit records of one step's accepted path (chain or tree; ``engine._audit``)."""
    next_token: int          # correction (on rejection) or bonus (all accepted) token
    clause: list[str | None]  # per accepted position: the lenient clause that accepted it, or None
    z1: list[float]          # per verified position (accepted ones + the first rejected one)
    z2: list[float]
    top1: list[int]
    top2: list[int]
    rule: str = "exact"

    @property
    def relaxed(self) -> list[bool]:
        return [c is not None for c in self.clause]


@dataclass
class ChainVerdict(PathVerdict):
    n_accepted: int = 0      # length of the accepted draft prefix, 0..k
    accepted_tokens: list[int] = field(default_factory=list)   # the accepted drafts d_1..d_n


def verify_chain(rule: Rule, draft: torch.Tensor, logits: torch.Tensor, q_draft: torch.Tensor | None,
                 temperature: float, top_p: float, generator: torch.Generator | None,
                 **settings) -> ChainVerdict:
    """Verify a chain of k drafts against k + 1 rows of raw target logits.

    ``q_draft`` None: point-mass drafts (drafted without sampling, e.g. prompt lookup), q = one-hot.
    Row i of ``logits`` is the target's prediction for draft position i; row k predicts the token
    after the last draft. n = first position the rule rejects (k if none). On rejection at n the
    next token is argmax z_n (greedy) or a draw from norm(max(0, p_target_n - q_draft_n)) (the rule's
    ``correction`` = residual; ``target``: from p_target_n); after k accepts it is the bonus token
    from p_target_k. With rule ``exact`` this is lossless.

    Everything is decided on the logits' device; the host reads the outcome once (n, the next token, the
    drafts and the audit's top-2 of every verified row, in one packed ``tolist``): one sync per chain.
    """
    k = draft.shape[0]
    greedy = temperature == 0.0
    draft = draft.to(logits.device)
    p_target = None if greedy else sampling.warp(logits, temperature, top_p)
    if not greedy and q_draft is None:      # point-mass drafts (prompt lookup): q_draft = one-hot(draft)
        q_draft = torch.nn.functional.one_hot(draft, logits.shape[-1]).to(p_target.dtype)
    elif q_draft is not None:               # drawn on the draft's device; the target's logits may be on another
        q_draft = q_draft.to(logits.device)
    u = None if greedy else torch.rand(k, generator=generator, device=logits.device)
    if k:
        v = rule(draft, logits[:k], None if greedy else p_target[:k], q_draft, u, **settings)
        rejected = ~v.accept
        n = torch.where(rejected.any(), rejected.to(torch.int8).argmax(), k)    # first rejection, else k
        clause = v.clause
    else:
        n = torch.zeros((), dtype=torch.long, device=logits.device)
        clause = draft
    if greedy:
        nxt = logits.index_select(0, n.reshape(1)).argmax(-1)
    else:
        p_n = p_target.index_select(0, n.reshape(1))
        if k and rule.correction == "residual":
            at = n.clamp(max=k - 1).reshape(1)
            residual = (n < k) & ~v.skipped.index_select(0, at)
            p_n = torch.where(residual[:, None], sampling.residual(p_n, q_draft.index_select(0, at)), p_n)
        nxt = sampling.sample(p_n, generator)
    z1, z2, t1, t2 = top2(logits[:k])
    ints = torch.cat([n.reshape(1), nxt.reshape(1), draft, clause, t1, t2]).double()
    host = torch.cat([ints, z1.double(), z2.double()]).tolist()     # the one host read
    n, nxt = int(host[0]), int(host[1])
    drafts, clause, t1, t2, z1, z2 = (host[2 + i * k:2 + (i + 1) * k] for i in range(6))
    m = min(n + 1, k)
    return ChainVerdict(nxt, [rule.clauses[int(c) - 1] if c else None for c in clause[:n]], z1[:m], z2[:m],
                        [int(t) for t in t1[:m]], [int(t) for t in t2[:m]], rule.name, n_accepted=n,
                        accepted_tokens=[int(d) for d in drafts[:n]])
