"""Verification rules: every module of this package registers its rule(s) on import (``base.register``).

Adding a rule = a module here (the pure function + one ``register`` call), ``conf/rule/<name>.yaml``
and a test (docs/adding_a_rule.md). Import ``RULES`` / ``get_rule`` from here.
"""
from __future__ import annotations

import importlib
import pkgutil

from mars_bench.decode.rules.base import (MODES, RULES, ChainVerdict, Knob, Rule, Verdict, get_rule, in_support, register,  # noqa: F401
                   standard, top2, verify_chain)

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _m != "base":
        importlib.import_module(f"{__name__}.{_m}")

from mars_bench.decode.rules.exact import exact  # noqa: E402,F401  (the lossless reference, used by name in tests)
from mars_bench.decode.rules.mars import NONPOSITIVE_TOP1, SAMPLED_TOP1, margin_ratio, mars, mars_prob  # noqa: E402,F401
