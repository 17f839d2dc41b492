"""Loading a (target, draft, tokenizer) pair from a model config; loaded pairs are reused in-process."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from .adapter import CausalLMAdapter, resolve_dtype

log = logging.getLogger(__name__)
_LOADED: dict[str, "Pair"] = {}


class TokenizerMismatch(ValueError):
    """The draft's tokenizer differs from the target's."""


@dataclass
class Pair:
    target: CausalLMAdapter
    draft: CausalLMAdapter | None
    tokenizer: Any
    target_path: str = ""
    draft_path: str = ""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device='cuda' but no CUDA device is available; allowed here: cpu, auto")
    return torch.device(name)


def check_tokenizers(target_tok, draft_tok) -> None:
    """Speculative decoding needs identical token ids; embedding sizes may differ (padding)."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv == dv:
        return
    diff = sorted(set(tv.items()) ^ set(dv.items()), key=lambda kv: kv[1])
    tok, _ = diff[0]
    raise TokenizerMismatch(
        f"draft tokenizer differs from the target's ({len(tv)} vs {len(dv)} tokens; e.g. {tok!r}: "
        f"target id {tv.get(tok)}, draft id {dv.get(tok)}); allowed: a draft with the target's tokenizer")


def _paths(mcfg) -> tuple[str, str | None]:
    if mcfg.source == "embedded":
        from .embedded import ensure_model

        cache = mcfg.cache_dir
        target = str(ensure_model(mcfg.target, cache))
        draft = str(ensure_model(mcfg.draft, cache)) if mcfg.draft else None
        return target, draft
    return mcfg.target, mcfg.draft


def load_tokenizers(mcfg):
    """(target tokenizer, draft paths); checks the draft tokenizer before any model is loaded."""
    from transformers import AutoTokenizer

    target_path, draft_path = _paths(mcfg)
    tok = AutoTokenizer.from_pretrained(target_path)
    if draft_path:
        check_tokenizers(tok, AutoTokenizer.from_pretrained(draft_path))
    return tok, target_path, draft_path


def load_pair(mcfg, need_draft: bool = True) -> Pair:
    key = repr(sorted(dict(mcfg).items())) + f"|draft={need_draft}"
    if key in _LOADED:
        return _LOADED[key]
    device = resolve_device(mcfg.device)
    dtype = resolve_dtype(mcfg.dtype)
    if mcfg.source == "tiny":
        from .tiny import tiny_pair

        target, draft, tok = tiny_pair(seed=mcfg.seed, noise=mcfg.noise, dtype=dtype)
        t_path = d_path = "tiny"
    else:
        from transformers import AutoModelForCausalLM

        tok, t_path, d_path = load_tokenizers(mcfg)
        kw = {"dtype": dtype}
        if mcfg.device_map:
            kw["device_map"] = mcfg.device_map
        log.info("loading target %s", t_path)
        target = AutoModelForCausalLM.from_pretrained(t_path, **kw)
        draft = None
        if need_draft and d_path:
            log.info("loading draft %s", d_path)
            draft = AutoModelForCausalLM.from_pretrained(d_path, dtype=dtype)
    if not mcfg.device_map:
        target = target.to(device)
    draft = draft.to(device) if (need_draft and draft is not None) else None
    if _fast_path_on(mcfg, device):
        from .fastpath import enable_fast_path

        target, draft = enable_fast_path(target), (enable_fast_path(draft) if draft is not None else None)
    t = CausalLMAdapter(target, name=t_path)
    d = CausalLMAdapter(draft, out_vocab=t.vocab, name=d_path) if draft is not None else None
    pair = Pair(t, d, tok, t_path, d_path or "")
    _LOADED[key] = pair
    return pair


def _fast_path_on(mcfg, device: torch.device) -> bool:
    if mcfg.fast_path == "on":
        return True
    if mcfg.fast_path == "off" or device.type != "cpu" or mcfg.source == "tiny":
        return False
    try:
        from . import fastpath  # noqa: F401  (present once the CPU fast path lands)
    except ImportError:
        return False
    return True
