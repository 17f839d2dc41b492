"""A ``Method``'s proposer, as its drafting scheme declares it (``decode.drafting``; ``ar`` has none)."""
from __future__ import annotations

from mars_bench.decode.drafting import scheme_of


def make_proposer(method, draft, cfg, tree=None):
    """The proposer of ``method`` (None for a scheme without one: ar); ``draft``: the drafter its scheme declares
    (the draft model, or a head such as the EAGLE-3 drafter)."""
    proposer = scheme_of(method.name).proposer
    return None if proposer is None else proposer.make(method, draft, cfg, tree)
