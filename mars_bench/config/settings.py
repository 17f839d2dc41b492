"""What a config means to the decoding core: its ``Method`` (scheme, rule and the rule's full settings), the
``DecodeConfig`` of a job, the budget and the draft quantization that runs. Bad settings raise ``ConfigError``
(one line naming the value and what is allowed)."""
from __future__ import annotations

from typing import Any, Optional

from mars_bench.config.schema import RULE_ALIASES
from mars_bench.decode.rules import RULES
from mars_bench.decode.types import DecodeConfig, Method, resolve, scheme_of
from mars_bench.base.errors import ConfigError
from mars_bench.models.schemes import DRAFT_QUANT_SCHEME
from mars_bench.store.spec import RunSpec


def rule_settings(cfg: Any, rule_name: str) -> dict:
    """The rule's settings from ``rule.*`` (and the ``method.*`` aliases), defaults filled in, checked."""
    rule = RULES[rule_name]
    given = {n: v for n, v in cfg.rule.items() if n != "name" and v is not None}
    if rule.lossless:   # the lossless references have no settings: rule.* set for a sweep's lossy rules is ignored
        given = {}
    for n in RULE_ALIASES:
        v = cfg.method[n]
        if v is None or n not in rule.knob_map:
            continue
        try:
            v = rule.knob_map[n].check(v, "method")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if n in given and given[n] != v:
            raise ConfigError(f"method.{n}={v!r} and rule.{n}={given[n]!r} disagree; set rule.{n} only")
        given[n] = v
    try:
        return rule.settings(given)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def draft_quant_of(cfg: Any, method: Method) -> Optional[str]:
    """The draft quantization that runs, for methods that draft with the pair's draft model; None for the others.
    q4 / q8 where their kernel cannot run (no AVX512-VNNI, no compiler) run int8, and say so here. ``method``: the
    job's ``method_of(cfg)``, resolved once by the caller."""
    if not method.scheme.draft_lm:
        return None
    from mars_bench.models.quant import runs_as

    return DRAFT_QUANT_SCHEME[runs_as(cfg.model.draft_quant)]


def tree_knobs(m: Any) -> dict:
    paths = None if m.static_paths is None else [list(p) for p in m.static_paths]
    return {"depth": m.depth, "top_k": m.top_k, "total_tokens": m.total_tokens,
            "static_paths": paths, "children": m.children, "topk_q": m.topk_q}


def method_of(cfg: Any) -> Method:
    """The decoding core's ``Method`` for a config: scheme, rule and its full settings."""
    m = cfg.method
    if cfg.rule.name is not None and cfg.rule.name not in RULES:
        raise ConfigError(f"rule={cfg.rule.name!r}; allowed: {', '.join(RULES)}")
    try:
        scheme, rule = resolve(m.name, cfg.rule.name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    declared = scheme_of(scheme)
    settings = rule_settings(cfg, rule) if declared.speculative else {}
    options = {name: m[name] for name in declared.options}
    return Method(name=scheme, k=int(m.k), rule=rule, rule_kwargs=settings, p_min=float(m.p_min),
                  tree=tree_knobs(m) if declared.tree else {}, options=options)


def max_new_tokens_of(cfg: Any, task_default: int) -> int:
    """The budget: ``max_new_tokens``, else ``task.max_new_tokens``, else the protocol's, else the task's own."""
    return cfg.max_new_tokens or cfg.task.max_new_tokens or cfg.protocol.max_new_tokens or task_default


def decode_config(spec: RunSpec, max_new_tokens: int, eos_ids, stop_strings) -> DecodeConfig:
    """A job's ``DecodeConfig`` from its ``RunSpec`` (temperature, top-p, budget rule as the spec resolved them),
    its budget ``max_new_tokens`` (the spec's, or a warm-up's shorter one) and the loaded model's stops."""
    return DecodeConfig(max_new_tokens=max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
                        eos_ids=tuple(eos_ids), stop_strings=tuple(stop_strings), budget=spec.budget)
