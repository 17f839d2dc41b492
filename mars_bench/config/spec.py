"""A job's ``RunSpec`` from its composed config: the one place a config becomes the spec that names its run
directory (``store.spec``)."""
from __future__ import annotations

import hashlib

from mars_bench.base.errors import ConfigError
from mars_bench.config.settings import draft_quant_of, method_of
from mars_bench.models.identity import IdentityError, pair_identity
from mars_bench.store.spec import RunSpec


def run_spec(cfg, max_new: int, method, draft_quant, task_prompts: str = "ours") -> RunSpec:
    """``method`` / ``draft_quant``: the job's ``method_of(cfg)`` / ``draft_quant_of(cfg, method)``, resolved once by
    the caller; ``task_prompts``: the task's ``prompts`` option as the runner applied it (ours for tasks without
    it). The model identity (``models.identity.pair_identity``) is computed here, before any weight loads."""
    m = method
    s = m.scheme                # what it drafts with and the shape of its drafts (decode.drafting)
    tree = None
    if s.tree:
        paths = m.tree.get("static_paths")
        tree = (f"paths{hashlib.sha1(str([list(p) for p in paths]).encode()).hexdigest()[:8]}" if paths is not None
                else f"d{m.tree['depth']}-w{m.tree['top_k']}-t{m.tree['total_tokens']}")
    quant = draft_quant
    engine = cfg.engine        # its name checked (engines.validate), its version filled there
    try:   # the weights the engine runs (an engine may run the tiny pair in a shape of its own: engine.tiny_shape)
        model, draft_model = pair_identity(cfg.model, uses_draft=s.draft_lm, head=s.head.key if s.head else None,
                                           engine=engine.name, tiny_shape=engine.get("tiny_shape"))
    except IdentityError as e:
        raise ConfigError(str(e)) from None
    return RunSpec(scheme=m.name, rule=m.rule if m.speculative else "exact", temperature=float(cfg.temperature),
                   top_p=float(cfg.top_p), max_new_tokens=int(max_new), seed=int(cfg.seed),
                   k=m.k if not s.tree and s.speculative else None, tree=tree,
                   sample_children=s.tree and m.tree.get("children") == "sample" and cfg.temperature > 0,
                   topk_q=m.tree.get("topk_q", "onehot") if s.tree and cfg.temperature > 0 else "onehot",
                   settings=dict(m.rule_kwargs) if m.speculative else {},
                   p_min=m.p_min if s.p_min else 0.0, draft_quant=None if quant in (None, "none") else quant,
                   draft_vocab=int(cfg.model.get("draft_vocab", 0) or 0) if quant is not None else 0,
                   batch_size=int(cfg.get("batch_size", 1) or 1), system_prompt=cfg.protocol.system_prompt,
                   budget=cfg.protocol.budget, enable_thinking=cfg.model.enable_thinking, task_prompts=task_prompts,
                   options=dict(m.options), model=model,
                   draft_model=draft_model if m.speculative else None, engine=engine.name,
                   engine_version=engine.version, serve=bool(engine.get("serve") or False))


def spec_of(cfg, max_new: int, task_prompts: str = "ours") -> RunSpec:
    """The spec of one config that no job holds yet (tests, tools): its method and draft quantization resolved
    here, once, then ``run_spec``."""
    method = method_of(cfg)
    return run_spec(cfg, max_new, method, draft_quant_of(cfg, method), task_prompts)
