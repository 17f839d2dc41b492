"""Config schema (every default written once, here) and validation of bad input.

Hydra composes ``conf/`` on top of these dataclasses; struct mode makes unknown keys fail loudly.
``validate`` runs before any model is loaded or any file written, and raises ``ConfigError`` with a
one-line message naming the bad value and what is allowed.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field
from typing import Any, Optional

from .decode.rules import RULES
from .errors import ConfigError  # noqa: F401 (raised here; defined low so models/ can raise it)
from .models.schemes import DRAFT_QUANT_SCHEME
from .stats import StatsSettings
from .decode.tree.build import TreeSpec
from .decode.types import BUDGET_RULES, DEFAULT_K, DecodeConfig, Method, method_names, resolve, scheme_of
from .system_prompts import SYSTEM_PROMPTS

SOURCES = ("tiny", "embedded", "hf")
DEVICES = ("cpu", "cuda", "auto")
DRAFT_QUANT = ("none", "int8", "q8", "q4")
RULE_ALIASES = ("theta", "nonpositive_top1", "sampled_top1")   # method.<x> = rule.<x>, the releases before the rule axis


@dataclass
class ModelConfig:
    name: str = "tiny"              # label used in results paths and tables
    source: str = "tiny"            # tiny (random, offline) | embedded (PyPI GGUF pair) | hf (Hub id or local dir)
    target: Optional[str] = None    # hf: Hub id or local path; embedded: model name
    draft: Optional[str] = None     # same, for the draft model (null: no draft, ar only)
    dtype: str = "fp32"             # fp32 | bf16 | fp16
    device: str = "auto"            # cpu | cuda | auto (cuda when available)
    device_map: Optional[str] = None  # e.g. "auto" to shard a large target over several GPUs
    allow_offload: bool = False     # device_map: let accelerate put layers in host RAM / on disk (else refused)
    capture: str = "off"            # off | compile: torch.compile(mode="reduce-overhead") of the models' forwards
    #                                 (CUDA graphs; cuda only, unmeasured until a GPU run chooses it: issue 32)
    cache_dir: Optional[str] = None   # embedded: converted-model cache (null: $MARS_BENCH_CACHE or ~/.cache/mars-bench)
    fast_path: str = "auto"         # CPU fast path: auto (on for cpu) | on (best kernel: AVX-512 panel, else MKL) | mkl | off
    draft_quant: str = "none"       # none | int8 (fbgemm) | q8 | q4 (group-32 codes, VNNI kernel): the draft's linears
    #                                 (CPU; the target is never quantized)
    draft_vocab: int = 0            # > 0: the draft's LM head keeps the first draft_vocab ids (+ special tokens);
    #                                 the target still scores every id (0 = the full vocabulary)
    eagle3: Optional[str] = None    # EAGLE-3 head (Hub id or local dir) for method=eagle3 / eagle3_mars
    enable_thinking: Optional[bool] = None  # null = the chat template's default; true/false = passed to
    #                                         apply_chat_template (only for a template with that switch, e.g. Qwen3)
    seed: int = 0                   # tiny: weight seed
    noise: float = 0.05             # tiny: draft = target weights + noise * std


@dataclass
class MethodConfig:
    name: str = "???"               # (required) drafting scheme ar | sd | lookup | sd_tree | eagle3, or a preset (mars = sd + rule mars,
                                    # mars_tree, eagle3_mars); chosen by the defaults list of conf/config.yaml
    k: int = DEFAULT_K              # chains: most draft tokens proposed per step
    p_min: float = 0.0              # chains: adaptive draft length, stop when the draft's top-1 prob < p_min (0 = off)
    # prompt lookup (conf/method/lookup.yaml): the longest and shortest tail n-gram searched for
    max_ngram: int = 3
    min_ngram: int = 1
    # tree schemes (docs/trees_and_eagle3.md); defaults are TreeSpec's; the authors' Qwen3 scripts use 50 / 6 / 10
    depth: int = TreeSpec.depth     # expansion forwards after the root (drafts reach depth + 1)
    top_k: int = TreeSpec.top_k     # children per expanded node, and frontier width
    total_tokens: int = TreeSpec.total_tokens  # tree size including the root
    static_paths: Optional[Any] = None  # a static tree as a list of child-rank paths; null = dynamic
    children: str = TreeSpec.children   # sampled trees: topk (q = one-hot, EAGLE) | sample (without replacement)
    topk_q: str = TreeSpec.topk_q   # sampled, topk children: onehot (lossless) | draft (the MARS authors' q, lossy)
    # aliases of rule.theta / rule.nonpositive_top1 / rule.sampled_top1 (null = unset), so commands written
    # before the rule axis keep working; ignored by rules without that setting
    theta: Optional[Any] = None
    nonpositive_top1: Optional[Any] = None
    sampled_top1: Optional[Any] = None


def _rule_schema():
    """``rule``: its name and every setting any registered rule has (null = the rule's default, from
    its registration in mars_bench/decode/rules/); which ones apply is checked by ``validate``."""
    from dataclasses import make_dataclass

    names = sorted({k.name for r in RULES.values() for k in r.knobs})
    return make_dataclass("RuleConfig", [("name", Optional[str], field(default=None))]
                          + [(n, Any, field(default=None)) for n in names])


RuleConfig = _rule_schema()


@dataclass
class TaskConfig:
    name: str = "prompts"           # prompts | gsm8k | humaneval | mt_bench | wmt19_zh_en
    max_new_tokens: Optional[int] = None  # null = the protocol's budget, else the task's default


@dataclass
class ProtocolConfig:
    """Evaluation settings that differ between this harness and the authors' scripts (conf/protocol/)."""
    name: str = "ours"              # ours | authors: the conf/protocol/<name>.yaml these settings came from
    system_prompt: str = "none"     # a name in system_prompts.SYSTEM_PROMPTS (none | llama2), first in every chat
    budget: str = "exact"           # exact: cut at max_new_tokens | after_step: the authors' check after each step
    max_new_tokens: Optional[int] = None  # every task's budget (null = each task's own default)
    task_prompts: str = "ours"      # the task option `prompts` (ours | authors), for tasks that have it


@dataclass
class LoggerConfig:
    name: str = "none"              # none | wandb
    project: str = "mars-bench"     # wandb project
    mode: str = "offline"           # wandb mode: offline (default, no network) | online


@dataclass
class StudyConfig:
    """Study mode (conf/experiment/study_*.yaml; docs/reproduce.md): the methods of ``interleave`` in two phases.
    Quality (every sample, batched at ``batch_size``; greedy lossless methods are not decoded, their tokens are
    ar's) and timed (batch size 1, interleaved, the first samples until every speedup's 95% CI is within
    +-``timed_ci`` of its value, at least ``timed_min`` and at most ``timed_max`` samples)."""
    batch_size: int = 0             # quality phase batch size; 0 = no study (a plain run)
    timed_ci: float = 0.05          # target half-width of each speedup's CI, relative to the speedup
    timed_min: int = 8              # samples timed before the first look at the CIs
    timed_max: Optional[int] = None  # most samples timed (null: every sample of the run)


@dataclass
class EngineConfig:
    """What decodes a job's samples (conf/engine/): native (this package's loop) | vllm (vLLM's offline LLM,
    mars_bench/engines/vllm.py, docs/vllm.md). The vllm settings are vLLM's own, passed to ``LLM``."""
    name: str = "native"            # native | one of engines/ (conf/engine/*.yaml): vllm
    version: Optional[str] = None   # vllm: the installed vLLM's version, filled by engines.validate
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: Optional[str] = None   # mp | ray | null (vLLM's choice)
    gpu_memory_utilization: float = 0.9
    max_num_seqs: Optional[int] = None   # requests in flight at once; null = batch_size
    max_model_len: Optional[int] = None   # null = the model's own context length (CPU: at most 4096)
    enforce_eager: bool = True      # no CUDA graphs / torch.compile (CPU: required here)
    kv_cache_gib: float = 1.0       # CPU: VLLM_CPU_KVCACHE_SPACE (GiB of KV cache)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    rule: Any = field(default_factory=RuleConfig)   # conf/rule/<name>.yaml; null name = the method's own rule
    task: TaskConfig = field(default_factory=TaskConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)   # conf/protocol/<name>.yaml
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0                   # per-sample generator seed = seed * 1000003 + sample index
    limit: Optional[int] = None     # first N samples (null = all)
    subset: Optional[str] = None    # a task's named subset, e.g. 'paper'
    max_new_tokens: Optional[int] = None  # overrides the task's default, the same for every method
    temperature: float = 0.0        # 0 = greedy
    top_p: float = 1.0              # nucleus filtering when sampling, in (0, 1]
    data_dir: Optional[str] = None  # [rel] benchmark data; null: ../shared/data beside the checkout if present, else
    #                                 the user cache, filled from the public sources (tasks/data.py); env MARS_BENCH_DATA_DIR wins
    batch_size: int = 1             # chains (ar, sd + any rule): sequences decoded at once, refilled as each ends (docs/batching.md)
    results_dir: str = "results"    # where runs are written
    progress: bool = True           # progress bars
    stats: Any = field(default_factory=lambda: asdict(StatsSettings()))  # intervals and tests: defaults in stats.py
    interleave: Any = field(default_factory=list)  # methods decoded interleaved: a list of override lists (conf/compare/)
    study: StudyConfig = field(default_factory=StudyConfig)   # quality batched + speed timed at B = 1 (off by default)
    engine: EngineConfig = field(default_factory=EngineConfig)   # conf/engine/: native | vllm


def register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)


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


def validate(cfg: Any) -> None:
    """Check every user-facing value; raise ConfigError naming the first bad one."""
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
    for name in ("max_new_tokens", "limit"):
        if cfg[name] is not None:
            _int_at_least(name, cfg[name], 1)
    if cfg.task.max_new_tokens is not None:
        _int_at_least("task.max_new_tokens", cfg.task.max_new_tokens, 1)
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


def draft_quant_of(cfg: Any) -> Optional[str]:
    """The draft quantization that runs, for methods that draft with the pair's draft model; None for the others.
    q4 / q8 where their kernel cannot run (no AVX512-VNNI, no compiler) run int8, and say so here."""
    if not method_of(cfg).scheme.draft_lm:
        return None
    from .models.quant import runs_as

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


def validate_protocol(cfg: Any) -> None:
    """``protocol.*``; ConfigError naming the first bad one (model.enable_thinking: checked against the chat
    template when the tokenizer loads, models.pairs.chat_template_kwargs)."""
    from .tasks.base import PROMPT_SOURCES

    p = cfg.protocol
    _one_of("protocol.system_prompt", p.system_prompt, tuple(SYSTEM_PROMPTS))
    _one_of("protocol.budget", p.budget, BUDGET_RULES)
    _one_of("protocol.task_prompts", p.task_prompts, PROMPT_SOURCES)
    if p.max_new_tokens is not None:
        _int_at_least("protocol.max_new_tokens", p.max_new_tokens, 1)


def max_new_tokens_of(cfg: Any, task_default: int) -> int:
    """The budget: ``max_new_tokens``, else ``task.max_new_tokens``, else the protocol's, else the task's own."""
    return cfg.max_new_tokens or cfg.task.max_new_tokens or cfg.protocol.max_new_tokens or task_default


def decode_config(cfg: Any, max_new_tokens: int, eos_ids, stop_strings) -> DecodeConfig:
    return DecodeConfig(max_new_tokens=max_new_tokens, temperature=float(cfg.temperature),
                        top_p=float(cfg.top_p), eos_ids=tuple(eos_ids), stop_strings=tuple(stop_strings),
                        budget=cfg.protocol.budget)


# ---- [rel] run settings the schema's types do not bound, and overrides checked before Hydra composes ---------
SEED_MAX = 2**32 - 1            # seeds in [0, 2^32): per-sample seeds (seed * 1000003 + ...) stay in torch's range
MAX_NEW_TOKENS_MAX = 1 << 20    # a budget beyond any model's context is a typo, not a run
K_MAX = 64                      # draft tokens per step; the CPU fast path packs k + 1 rows


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
    from .tasks import TASKS

    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed <= SEED_MAX:
        raise ConfigError(f"seed={cfg.seed!r}; allowed: an integer in [0, {SEED_MAX}]")
    for name, value in (("max_new_tokens", cfg.max_new_tokens), ("task.max_new_tokens", cfg.task.max_new_tokens),
                        ("protocol.max_new_tokens", cfg.protocol.max_new_tokens)):
        if value is not None and value > MAX_NEW_TOKENS_MAX:
            raise ConfigError(f"{name}={value!r}; allowed: an integer in [1, {MAX_NEW_TOKENS_MAX}] or null")
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


def _type_words(tp: Any) -> str:
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = len(args) < len(typing.get_args(tp))
    base = args[0] if optional and len(args) == 1 else tp
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(base, "a value")
    return words + (" or null" if optional else "")


def _field_types(node=None, prefix: str = "") -> dict:
    import typing
    from dataclasses import fields, is_dataclass

    out = {}
    hints = typing.get_type_hints(node or Config)
    for f in fields(node or Config):
        tp = hints[f.name]
        factory = f.default_factory if f.default_factory is not MISSING else None
        if is_dataclass(tp) or (factory is not None and is_dataclass(factory)):   # e.g. rule: RuleConfig
            out.update(_field_types(tp if is_dataclass(tp) else factory, f"{prefix}{f.name}."))
        elif factory is not None and isinstance(factory(), dict):                 # e.g. stats: a plain dict
            out.update({f"{prefix}{f.name}.{k}": Any for k in factory()})
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


def check_overrides(argv: list[str], conf_dir: str | None = None) -> None:
    """Command-line overrides that Hydra would refuse with a multi-line error (unparsable text, a value of the
    wrong type, an unknown group option) become one ConfigError line, before Hydra composes anything."""
    from pathlib import Path

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    conf = Path(conf_dir) if conf_dir else Path(__file__).resolve().parent / "conf"   # shipped in the package
    parser, types = OverridesParser.create(), _field_types()
    groups = {p.name for p in conf.iterdir() if p.is_dir()}   # config groups: the folders of conf/
    base = OmegaConf.structured(Config)
    for arg in argv:
        if arg.startswith("-") or "=" not in arg or arg.lstrip("+~").startswith("hydra"):
            continue
        try:
            o = parser.parse_overrides([arg])[0]
        except Exception as e:  # noqa: BLE001 - Hydra's grammar errors: one line
            first = " ".join(str(e).split("\n")[0].split())
            raise ConfigError(f"cannot read the override {arg!r} ({first}); allowed: key=value, with "
                              "non-ASCII or special characters inside quotes: key='value'") from None
        key = o.key_or_group
        if o.is_delete() or "/" in key:
            continue
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        if key in groups:
            options = sorted(p.stem for p in (conf / key).glob("*.yaml"))   # a group option 
            for v in values:
                if v not in options:
                    raise ConfigError(f"{key}={v!r}; allowed: {', '.join(options)}")
            continue
        if key not in types:
            if not o.is_add():
                raise ConfigError(f"unknown setting {key!r} in {arg!r}; allowed: {', '.join(sorted(types))}")
            continue
        for v in values:
            try:
                OmegaConf.update(base, key, v, merge=True)
            except OmegaConfBaseException:
                raise ConfigError(f"{key}={v!r}; allowed: {_type_words(types[key])}") from None
