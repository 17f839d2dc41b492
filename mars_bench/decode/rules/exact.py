"""``exact``: standard verification (lossless). greedy: accept iff draft == argmax z; sampling:
accept iff u q_draft[d] < p_target[d] (Leviathan et al. 2023, Chen et al. 2023)."""
from __future__ import annotations

from mars_bench.decode.rules.base import Rule, none_lenient, register


def _exact(draft, z, p_target, q_draft, u, standard):
    return standard, none_lenient(standard)


exact = register(Rule("exact", _exact, lossless=True, doc="standard verification (lossless)"))
