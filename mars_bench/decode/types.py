"""The decoding core's value types: what to decode (``Method``), how (``DecodeConfig``), what came
out (``DecodeResult``: its tokens and ``DecodeStats``), and the stop conditions every method shares (``Stopper``).

Two axes (docs/adding_a_rule.md): the drafting scheme (``Method.name``, a name declared in
``drafting.SCHEMES``: ar, sd, lookup, sd_tree, eagle3) and the verification rule (``Method.rule``, any
name registered in ``rules.RULES``). The presets of the first releases name a (scheme, rule) pair:
mars = sd + mars, mars_tree = sd_tree + mars, eagle3_mars = eagle3 + mars; they are accepted wherever a
scheme is and resolved here, once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mars_bench.decode.drafting import SCHEMES, Scheme, scheme_of

PRESETS = {"mars": ("sd", "mars"), "mars_tree": ("sd_tree", "mars"), "eagle3_mars": ("eagle3", "mars")}
DEFAULT_K = 4                          # chains: most drafts per step (the schema's default too)
# How max_new_tokens ends a decode: exact = cut at the budget (drafts are shortened to fit it);
# after_step = the authors' rule (5SSjw/MARS ea_model.eagenerate / naivegenerate: `if new_token >
# max_new_tokens: break` after each step): whole steps are committed, drafts are never shortened, and
# decoding stops after the first step that takes the output past the budget, so a step may end up to
# (its committed tokens: longest draft + 1) past it; ar, one token a step, ends at max_new_tokens + 1.
BUDGET_RULES = ("exact", "after_step")


def method_names() -> tuple[str, ...]:
    """What `method=` accepts (conf/method/<name>.yaml): every declared scheme, then the presets."""
    return tuple(SCHEMES) + tuple(PRESETS)


def resolve(name: str, rule: str | None) -> tuple[str, str]:
    """(scheme, rule) of a method name and an optional explicit rule; ValueError on a clash."""
    if name in PRESETS:
        scheme, preset_rule = PRESETS[name]
        if rule not in (None, preset_rule):
            raise ValueError(f"method={name} with rule={rule}: method={name} is the preset method={scheme} "
                             f"rule={preset_rule}; allowed: method={scheme} rule={rule}")
        return scheme, preset_rule
    if name not in SCHEMES:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(method_names())}")
    return name, ("exact" if rule is None else rule)


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int             # hard cap on emitted tokens, for every method (the runner passes the
    #                                 RunSpec's budget; no default of its own)
    temperature: float = 0.0        # 0 = greedy
    top_p: float = 1.0              # nucleus filtering of p_target and q_draft (sampling only)
    eos_ids: tuple[int, ...] = ()   # stop after emitting any of these (kept in the output)
    stop_strings: tuple[str, ...] = ()  # stop after the token that completes one (kept)
    budget: str = "exact"           # how max_new_tokens ends a decode: a name in BUDGET_RULES

    def __post_init__(self):
        if self.budget not in BUDGET_RULES:
            raise ValueError(f"budget={self.budget!r}; allowed: {', '.join(BUDGET_RULES)}")

    def draft_len(self, most: int, emitted: int) -> int:
        """How many of ``most`` drafts (a chain's k, a tree's depth) a step may propose after ``emitted``
        tokens: capped at budget left - 1 (the step's own target token) under ``exact``; all of them under
        ``after_step``."""
        if self.budget == "after_step":
            return most
        return max(0, min(most, self.max_new_tokens - emitted - 1))


@dataclass(frozen=True)
class Method:
    """A drafting scheme with a verification rule. Defaults of the user-facing knobs live in
    ``config.py`` (schema) and ``rules.RULES`` (rule settings); these are for direct API use."""
    name: str                       # drafting scheme (or a preset name, resolved on construction)
    k: int = DEFAULT_K              # chains: most draft tokens proposed per step
    rule: str | None = None         # verification rule (rules.RULES); None = the scheme's / preset's own
    rule_kwargs: dict = field(default_factory=dict)  # the rule's settings (missing ones: its defaults)
    tree: dict = field(default_factory=dict)         # tree schemes: depth, top_k, total_tokens, static_paths, children
    p_min: float = 0.0              # chains: stop drafting early when the draft's top-1 prob < p_min (0 = fixed k)
    options: dict = field(default_factory=dict)      # scheme-specific knobs (Scheme.options), e.g. lookup's max_ngram

    def __post_init__(self):
        scheme, rule = resolve(self.name, self.rule)
        object.__setattr__(self, "name", scheme)
        object.__setattr__(self, "rule", rule)

    @property
    def scheme(self) -> Scheme:
        """The declaration of this method's drafting scheme (``drafting.SCHEMES``)."""
        return scheme_of(self.name)

    @property
    def speculative(self) -> bool:
        return self.scheme.speculative


@dataclass
class DecodeStats:
    """What a decode measured beside its tokens: why it stopped, per-step drafts and acceptances, timings. A turn's
    sample record holds these fields under the same names (declared here only)."""
    stop_reason: str = ""
    steps: int = 0                  # target verification forwards (prefill excluded)
    proposed: list[int] = field(default_factory=list)   # per step: drafts proposed
    accepted: list[int] = field(default_factory=list)   # per step: drafts accepted
    relaxed: list[dict] = field(default_factory=list)   # one entry per lenient acceptance (rules.Verdict)
    z1: list[float] = field(default_factory=list)       # per verified draft position
    z2: list[float] = field(default_factory=list)
    outcome: str = ""               # per verified draft position: A standard, R lenient, X rejected
    depth_proposed: list[int] = field(default_factory=list)   # trees: deepest draft per step
    prefill_s: float = 0.0
    wall_s: float = 0.0
    target_s: float = 0.0
    draft_s: float = 0.0


@dataclass
class DecodeResult(DecodeStats):
    """A decode's output tokens and its ``DecodeStats``."""
    tokens: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0


class Stopper:
    """Identical stop conditions for every method: EOS ids, stop strings, max_new_tokens (cut at it, or
    after the step that passes it: ``DecodeConfig.budget``)."""

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
        if self.cfg.budget == "exact" and len(new) >= self.cfg.max_new_tokens:
            return self.cfg.max_new_tokens, "max_new_tokens"
        if self.cfg.budget == "after_step" and len(new) > self.cfg.max_new_tokens:
            return len(new), "max_new_tokens"
        return None

    def _hit(self, ids) -> bool:
        text = self.tok.decode(ids, skip_special_tokens=True)
        return any(s in text for s in self.cfg.stop_strings)
