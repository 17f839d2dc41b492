"""The drafting schemes: one declaration each (``Scheme``), the only place that says what a scheme drafts with
and which proposer drafts for it. Nothing else compares a scheme's name: the runner loads what a scheme
declares (the pair's draft LM, or the head named by ``Head.key``), config validation checks that the model
config names it, ``RunSpec`` records its weights and the shape of its drafts (``tree``: tree knobs, else k),
and ``proposers.factory`` builds its ``proposer``.

A new drafting scheme = its module (a proposer in proposers/ or a drafter in drafters/), conf/method/<name>.yaml
and one entry in ``SCHEMES`` below. A head with weights of its own is named by a model config key
(``Head.key``), a field of ``config.ModelConfig``: an existing key, or one more field there.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable
from mars_bench.decode.proposers.chain import LMChain
from mars_bench.decode.proposers.lookup import PromptLookup
from mars_bench.decode.proposers.tree import TreeProposer


@dataclass(frozen=True)
class Head:
    """A drafter with weights of its own (not the pair's draft LM)."""
    key: str                                 # model.<key> names its weights (Hub id or local dir)
    loader: Callable[[str, Any], Any] | str  # (model.<key>, the target's adapter) -> the drafter the proposer gets;
                                             # or "module:function" naming it (files are read in models/, not here)
    what: str                                # what model.<key> must name, for messages

    def load(self, source: str, target) -> Any:
        fn = self.loader
        if isinstance(fn, str):
            module, _, name = fn.partition(":")
            fn = getattr(importlib.import_module(module), name)
        return fn(source, target)


@dataclass(frozen=True)
class Scheme:
    """One drafting scheme: what it drafts with and which proposer drafts."""
    name: str
    proposer: type | None            # a class with make(method, drafter, cfg, tree) (proposers/); None: no drafts (ar)
    draft_lm: bool = False           # drafts with the pair's draft model (model.draft)
    head: Head | None = None         # drafts with a head of its own (``Head``)
    tree: bool = False               # the target scores a draft tree (method.tree knobs), else a chain of k
    p_min: bool = False              # chains: reads method.p_min (adaptive draft length)
    options: tuple[str, ...] = ()    # scheme-specific method.* knobs carried in Method.options

    def __post_init__(self):
        if self.draft_lm and self.head is not None:
            raise ValueError(f"scheme {self.name!r} drafts with the draft LM and a head; allowed: one of them")
        if self.proposer is None and (self.draft_lm or self.head or self.tree or self.p_min or self.options):
            raise ValueError(f"scheme {self.name!r} has no proposer but drafting settings; allowed: a proposer")

    @property
    def speculative(self) -> bool:
        return self.proposer is not None

    @property
    def shape(self) -> str:
        """How the target scores the drafts: chain | tree (``rules.Rule.check_mode``)."""
        return "tree" if self.tree else "chain"


_EAGLE3 = Head("eagle3", "mars_bench.models.eagle3_heads:load_eagle3_drafter",
               "an EAGLE-3 head (Speculators or EAGLE / SpecForge format): Hub id or local dir")

# In this order in messages ("allowed: ...").
SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("ar", None),                                                   # the target alone: the baseline
    Scheme("sd", LMChain, draft_lm=True, p_min=True),                     # the draft LM drafts a chain of k
    Scheme("lookup", PromptLookup, options=("max_ngram", "min_ngram")),   # n-gram match in prompt + output
    Scheme("sd_tree", TreeProposer, draft_lm=True, tree=True),            # the draft LM drafts a tree
    Scheme("eagle3", TreeProposer, head=_EAGLE3, tree=True),              # an EAGLE-3 head drafts a tree
)}


def scheme_of(name: str) -> Scheme:
    """The declaration of a scheme name (presets are resolved by ``types.resolve`` first)."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"scheme={name!r}; allowed: {', '.join(SCHEMES)}") from None
