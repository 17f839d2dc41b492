"""Validation of a composed config: ``validate`` runs before any model is loaded or any file written, and
raises ``ConfigError`` with a one-line message naming the first bad value and what is allowed. It resolves the
job's ``Method`` (``method_of``) to check it and returns it: the job takes that one, resolved once."""
from __future__ import annotations

import math
from typing import Any

from mars_bench.config.schema import DEVICES, DRAFT_QUANT, K_MAX, MAX_NEW_TOKENS_MAX, SEED_MAX, SOURCES, Config
from mars_bench.decode.rules import RULES
from mars_bench.decode.tree.build import TreeSpec
from mars_bench.decode.types import BUDGET_RULES, Method, method_names
from mars_bench.config.settings import method_of, tree_knobs
from mars_bench.base.errors import ConfigError
from mars_bench.stats import StatsSettings
from mars_bench.tasks.system_prompts import SYSTEM_PROMPTS


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{name}={value!r} is not a number; allowed: a finite number")   # [rel] names what is allowed
    return float(value)


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}={value!r}; allowed: an integer >= {low}")
    return value


def _one_of(name: str, value: Any, allowed) -> str:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r}; allowed: {', '.join(allowed)}")
    return value


def _known_keys(cfg: Any) -> None:
    """Keys added with Hydra's ``+`` bypass struct mode: refuse those the schema does not know."""
    from dataclasses import fields, is_dataclass

    groups = {f.name: f.default_factory for f in fields(Config) if is_dataclass(f.default_factory)}
    for f in fields(Config):
        if f.name in groups:
            allowed = [g.name for g in fields(groups[f.name]())]
            for key in cfg[f.name]:
                if key not in allowed:
                    raise ConfigError(f"unknown key {f.name}.{key}; allowed: {', '.join(allowed)}")


def validate(cfg: Any) -> Method:
    """Check every user-facing value; raise ConfigError naming the first bad one. Returns the config's ``Method``
    (``method_of(cfg)``, resolved here once), which the job and the engine's checks take."""
    _known_keys(cfg)
    m = cfg.method
    _one_of("method.name", m.name, method_names())
    method = method_of(cfg)          # scheme, rule and its settings (ValueError -> ConfigError inside)
    _int_at_least("method.k", m.k, 1)
    p_min = _number("method.p_min", m.p_min)
    if not 0.0 <= p_min < 1.0:
        raise ConfigError(f"method.p_min={m.p_min!r}; allowed: a number in [0, 1) (0 = fixed k)")
    if method.speculative:
        try:
            RULES[method.rule].check_mode(method.scheme.shape, _number("temperature", cfg.temperature))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if method.scheme.tree:
        try:
            TreeSpec(**tree_knobs(m))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    head = method.scheme.head
    if head is not None and not cfg.model[head.key]:
        raise ConfigError(f"method.name={m.name} needs model.{head.key} ({head.what})")
    _one_of("model.source", cfg.model.source, SOURCES)
    _one_of("model.device", cfg.model.device, DEVICES)
    _one_of("model.dtype", cfg.model.dtype, ("fp32", "bf16", "fp16"))
    _one_of("model.fast_path", cfg.model.fast_path, ("auto", "on", "mkl", "off"))
    _one_of("model.draft_quant", cfg.model.draft_quant, DRAFT_QUANT)
    dv = cfg.model.get("draft_vocab", 0)
    if isinstance(dv, bool) or not isinstance(dv, int) or (dv != 0 and dv < 256):
        raise ConfigError(f"model.draft_vocab={dv!r}; allowed: 0 (the full vocabulary) or an integer >= 256")
    if cfg.model.draft_quant != "none" and cfg.model.device == "cuda":
        raise ConfigError(f"model.draft_quant={cfg.model.draft_quant!r} runs on CPU only; allowed with "
                          "model.device=cuda: none")
    if method.scheme.draft_lm and cfg.model.source != "tiny" and not cfg.model.draft:
        raise ConfigError(f"method.name={m.name!r} needs model.draft; this model config has none")
    if cfg.limit is not None:
        _int_at_least("limit", cfg.limit, 1)
    # the budget's sources (decode_settings.max_new_tokens_of picks one), each checked here once, both bounds
    for name, value in (("max_new_tokens", cfg.max_new_tokens), ("task.max_new_tokens", cfg.task.max_new_tokens),
                        ("protocol.max_new_tokens", cfg.protocol.max_new_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_NEW_TOKENS_MAX):
            raise ConfigError(f"{name}={value!r}; allowed: an integer in [1, {MAX_NEW_TOKENS_MAX}] or null")
    if _number("temperature", cfg.temperature) < 0:
        raise ConfigError(f"temperature={cfg.temperature!r}; allowed: a number >= 0 (0 = greedy)")
    top_p = _number("top_p", cfg.top_p)
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p={cfg.top_p!r}; allowed: a number in (0, 1]")
    _one_of("logger.name", cfg.logger.name, ("none", "wandb"))
    validate_protocol(cfg)
    _int_at_least("batch_size", cfg.get("batch_size", 1), 1)
    validate_study(cfg)
    if {"max_ngram", "min_ngram"} <= set(method.options):   # prompt lookup's n-gram range
        _int_at_least("method.min_ngram", m.min_ngram, 1)
        _int_at_least("method.max_ngram", m.max_ngram, int(m.min_ngram))
    try:
        StatsSettings.from_cfg(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    validate_run_settings(cfg)   # ranges the types do not bound (defined at the bottom)
    # engine.name and what the engine can run: engines.validate, after this (the engines are conf/engine/*.yaml)
    return method


def validate_study(cfg: Any) -> None:
    """study.*: off at batch_size 0; on, it needs ``interleave`` (the methods) and batch_size 1 (the timed phase)."""
    st = cfg.get("study")
    if st is None or st.batch_size == 0:
        return
    _int_at_least("study.batch_size", st.batch_size, 2)
    if not cfg.get("interleave"):
        raise ConfigError("study.batch_size is set but interleave is empty; allowed: a study with methods to compare "
                          "(e.g. +compare=methods or an experiment's interleave list)")
    if int(cfg.get("batch_size", 1) or 1) != 1:
        raise ConfigError(f"batch_size={cfg.batch_size!r} with study.batch_size set; allowed: 1 (the study times "
                          "at batch size 1 and decodes quality at study.batch_size)")
    width = _number("study.timed_ci", st.timed_ci)
    if not 0.0 < width < 1.0:
        raise ConfigError(f"study.timed_ci={st.timed_ci!r}; allowed: a number in (0, 1), e.g. 0.05 for +-5%")
    _int_at_least("study.timed_min", st.timed_min, 2)
    if st.timed_max is not None:
        _int_at_least("study.timed_max", st.timed_max, int(st.timed_min))


def validate_protocol(cfg: Any) -> None:
    """``protocol.*``; ConfigError naming the first bad one (model.enable_thinking: checked against the chat
    template when the tokenizer loads, models.pairs.chat_template_kwargs)."""
    from mars_bench.tasks.base import PROMPT_SOURCES

    p = cfg.protocol
    _one_of("protocol.system_prompt", p.system_prompt, tuple(SYSTEM_PROMPTS))
    _one_of("protocol.budget", p.budget, BUDGET_RULES)
    _one_of("protocol.task_prompts", p.task_prompts, PROMPT_SOURCES)


def _path_setting(name: str, value: Any, nullable: bool, expand: bool) -> None:
    import os
    from pathlib import Path

    if value is None and nullable:
        return
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise ConfigError(f"{name}={value!r}; allowed: a non-empty path" + (" or null" if nullable else ""))
    try:
        os.fsencode(value)
    except UnicodeError:
        raise ConfigError(f"{name}={value!r}; allowed: a path this file system can encode") from None
    p = Path(value)
    if expand:   # data_dir expands ~ (tasks/data.py); results_dir is taken literally (run.py)
        try:
            p = p.expanduser()
        except RuntimeError:
            raise ConfigError(f"{name}={value!r}: ~user names no known user; allowed: an existing user's "
                              "~ or a plain path") from None
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{name}={value!r}: {p} exists and is not a folder; allowed: a folder path")


def validate_run_settings(cfg: Any) -> None:
    """Ranges of seed, budgets, k, temperature, top_p, task and paths; ConfigError naming the first bad one."""
    from mars_bench.tasks import TASKS

    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed <= SEED_MAX:
        raise ConfigError(f"seed={cfg.seed!r}; allowed: an integer in [0, {SEED_MAX}]")
    if cfg.method.k > K_MAX:
        raise ConfigError(f"method.k={cfg.method.k!r}; allowed: an integer in [1, {K_MAX}]")
    for name in ("temperature", "top_p"):
        if not math.isfinite(_number(name, cfg[name])):
            raise ConfigError(f"{name}={cfg[name]!r}; allowed: a finite number")
    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name={cfg.task.name!r}; allowed: {', '.join(sorted(TASKS))}")
    if cfg.subset is not None and (not isinstance(cfg.subset, str) or not cfg.subset.strip()):
        raise ConfigError(f"subset={cfg.subset!r}; allowed: null or a subset name of the task")
    _path_setting("results_dir", cfg.results_dir, nullable=False, expand=False)
    _path_setting("data_dir", cfg.data_dir, nullable=True, expand=True)
