"""Config schema: every default written once, here, and the constants that bound its values.

Hydra composes ``conf/`` on top of these dataclasses; struct mode makes unknown keys fail loudly. The checks of a
composed config are validation.py's, overrides checked before Hydra composes overrides.py's, and what a config
means to the decoding core (its ``Method``, ``DecodeConfig``) decode_settings.py's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from mars_bench.decode.rules import RULES
from mars_bench.stats import StatsSettings
from mars_bench.store.spec import NATIVE
from mars_bench.decode.tree.build import TreeSpec
from mars_bench.decode.types import DEFAULT_K

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
    name: str = "prompts"           # a task of mars_bench/tasks/ (tasks.TASKS: one module + tasks/specs/<name>/ each)
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


def engine_default() -> dict:
    """engine: the native loop. Another engine's YAML (conf/engine/<name>.yaml) names it and declares its own
    settings beside ``name``; the engine's package checks them (``engines.<name>.check``). ``version`` is filled by
    ``engines.validate`` for an engine other than this package."""
    return {"name": NATIVE, "version": None}


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
    engine: Any = field(default_factory=engine_default)   # conf/engine/<name>.yaml: native | vllm | llamacpp


def register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)


# ---- [rel] run settings the schema's types do not bound (validation.validate_run_settings checks them) ----
SEED_MAX = 2**32 - 1            # seeds in [0, 2^32): per-sample seeds (seed * 1000003 + ...) stay in torch's range
MAX_NEW_TOKENS_MAX = 1 << 20    # a budget beyond any model's context is a typo, not a run
K_MAX = 64                      # draft tokens per step; the CPU fast path packs k + 1 rows
