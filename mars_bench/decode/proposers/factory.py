"""The one place that maps a ``Method`` to its proposer (``ar`` has none). A new way of drafting is a module
of this package implementing ``base.Proposer`` plus one branch here."""
from __future__ import annotations

from .chain import LMChain
from .lookup import PromptLookup
from .tree import TreeProposer


def make_proposer(method, draft, cfg, tree=None):
    """The proposer of ``method`` (None for ar); ``draft``: the draft model or EAGLE-3 drafter."""
    if method.name == "ar":
        return None
    if method.name == "sd":
        return LMChain(draft, method.k, method.p_min, cfg)
    if method.name == "lookup":
        return PromptLookup(method.k, **method.options)
    return TreeProposer(draft, tree, method, cfg)
