"""Loading a (target, draft, tokenizer) pair from a model config; loaded pairs are reused in-process."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from mars_bench.models.adapter import CausalLMAdapter, resolve_dtype

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
    chat_kwargs: dict = field(default_factory=dict)   # extra apply_chat_template arguments (chat_template_kwargs)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The token ids of a chat, ending with the assistant's generation prompt."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False,
                                                  **self.chat_kwargs)


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


def chat_template_kwargs(tokenizer, enable_thinking: bool | None, name: str) -> dict:
    """Extra apply_chat_template arguments for ``model.enable_thinking`` (null: none, the template's default).
    A template that never reads ``enable_thinking`` would ignore it silently: bad input, one line."""
    if enable_thinking is None:
        return {}
    from mars_bench.base.errors import ConfigError

    template = tokenizer.chat_template
    text = " ".join(template.values()) if isinstance(template, dict) else (template or "")
    if "enable_thinking" not in text:
        raise ConfigError(f"model.enable_thinking={str(enable_thinking).lower()}: the chat template of {name} has "
                          "no enable_thinking switch; allowed for this model: null")
    return {"enable_thinking": bool(enable_thinking)}


def _paths(mcfg) -> tuple[str, str | None]:
    if mcfg.source == "embedded":
        from mars_bench.models.embedded import ensure_model

        cache = mcfg.cache_dir
        stored = "bf16" if mcfg.dtype == "bf16" else "fp32"   # the cache holds fp32 and bf16 copies
        target = str(ensure_model(mcfg.target, cache, stored))
        draft = str(ensure_model(mcfg.draft, cache, stored)) if mcfg.draft else None
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
    """The (target, draft, tokenizer) of a model config; loaded once per process and reused."""
    key = repr(sorted(dict(mcfg).items())) + _weights_key(mcfg)   # weights rewritten in place: another pair
    device, dtype = resolve_device(mcfg.device), resolve_dtype(mcfg.dtype)
    pair = _LOADED.get(key)
    if pair is None:
        if mcfg.source == "tiny":
            from mars_bench.models.tiny import tiny_pair, tiny_tokenizer

            chat = chat_template_kwargs(tiny_tokenizer(), mcfg.get("enable_thinking"), "tiny")   # before any weights
            target, _, tok = tiny_pair(seed=mcfg.seed, noise=mcfg.noise, dtype=dtype)
            t_path = d_path = "tiny"
        else:
            from transformers import AutoModelForCausalLM

            tok, t_path, d_path = load_tokenizers(mcfg)
            chat = chat_template_kwargs(tok, mcfg.get("enable_thinking"), t_path)   # before any weights
            kw = {"dtype": dtype, **({"device_map": mcfg.device_map} if mcfg.device_map else {})}
            log.info("loading target %s", t_path)
            target = AutoModelForCausalLM.from_pretrained(t_path, **kw)
            check_offload(target, mcfg.get("allow_offload", False))
        target = _prepare(target if mcfg.device_map else target.to(device), mcfg, device)
        adapter = capture(CausalLMAdapter(target, name=t_path), mcfg.get("capture", "off"), device)
        if _fast_path_on(mcfg, device):
            _fuse(adapter, "target")
        pair = _LOADED[key] = Pair(adapter, None, tok, t_path, d_path or "", chat)
    if need_draft and pair.draft is None and pair.draft_path:   # e.g. an ar job ran first
        pair.draft = load_draft(mcfg, pair)[0]
    return pair


def check_offload(model, allowed: bool) -> None:
    """A device_map that put layers in host RAM or on disk times PCIe, not the GPU: refused (one line) unless
    ``model.allow_offload``."""
    placed = getattr(model, "hf_device_map", None) or {}
    off = [name for name, where in placed.items() if str(where) in ("cpu", "disk")]
    if off and not allowed:
        from mars_bench.base.errors import ConfigError

        raise ConfigError(f"model.device_map offloaded {len(off)} modules to host RAM / disk (first: {off[0]} on "
                          f"{placed[off[0]]}): the model does not fit the GPUs; allowed: fewer or smaller models, more "
                          "GPUs, or model.allow_offload=true (timings then measure the offload)")


def _weights_key(mcfg) -> str:
    """The identities of the weights a config names (``identity.weights_identity``; cached per file and mtime)."""
    from mars_bench.models.identity import weights_identity

    if mcfg.source != "hf":   # tiny: a function of the config; embedded: pinned files
        return ""
    return "|".join(str(weights_identity("hf", ref)) for ref in (mcfg.target, mcfg.draft))


def load_draft(mcfg, pair: Pair) -> tuple[CausalLMAdapter, str]:
    """The draft of ``mcfg`` over ``pair``'s target and tokenizer (``model.draft_vocab``, then
    ``model.draft_quant``, then the fast path), and the quantization scheme that runs. A benchmark calls it
    with several draft settings beside one loaded target."""
    device, dtype = resolve_device(mcfg.device), resolve_dtype(mcfg.dtype)
    if mcfg.source == "tiny":
        from mars_bench.models.tiny import tiny_pair

        draft = tiny_pair(seed=mcfg.seed, noise=mcfg.noise, dtype=dtype)[1]
    else:
        from transformers import AutoModelForCausalLM

        log.info("loading draft %s", pair.draft_path)
        draft = AutoModelForCausalLM.from_pretrained(pair.draft_path, dtype=dtype)
    draft = draft.to(device)
    keep = None
    if mcfg.get("draft_vocab"):
        keep = draft_vocab_ids(pair.tokenizer, mcfg.draft_vocab, pair.target.vocab)
        trim_head(draft, keep)
    scheme = _quantize_draft(mcfg.draft_quant)
    if scheme == "int8":
        from mars_bench.models.fastpath import quantize_int8

        draft = quantize_int8(draft)   # a cheaper proposer; the target decides, so sd stays lossless
    elif scheme in ("q4", "q8"):
        from mars_bench.models.quant import quantize_model

        draft = quantize_model(draft, scheme)
    from mars_bench.models.schemes import DRAFT_QUANT_SCHEME

    adapter = capture(CausalLMAdapter(_prepare(draft, mcfg, device), out_vocab=pair.target.vocab, name=pair.draft_path,
                                      vocab_ids=keep), mcfg.get("capture", "off"), device)
    if scheme in ("q4", "q8"):
        _fuse(adapter, "draft")
    return adapter, DRAFT_QUANT_SCHEME[scheme]


def _fuse(adapter, role: str) -> None:
    """``adapter``'s decoding forwards in one C call per layer (models/fused.py) where its model qualifies; else
    one logged line saying why not."""
    from mars_bench.models import fused

    why = fused.supports(adapter.model)
    if why is None:
        adapter.fused = fused.FusedDecoder(adapter.model)
    else:
        log.info("%s forwards through transformers' modules: %s", role, why)


def _quantize_draft(scheme: str) -> str:
    """The draft quantization that will run (``quant.runs_as``), with one logged line where it falls back."""
    from mars_bench.models import quant

    runs = quant.runs_as(scheme)
    if runs != scheme:
        log.warning("model.draft_quant=%s unavailable (%s): the draft runs %s (fbgemm)", scheme, quant.unavailable(), runs)
    return runs


def draft_vocab_ids(tokenizer, size: int, width: int) -> torch.Tensor:
    """The ids a trimmed draft head scores: the first ``size`` ids (byte-level BPE numbers its tokens in merge
    order, so the lowest ids are the most frequent pieces of the tokenizer's training text) and every special
    or added token (EOS among them), ascending, all below ``width`` (the target's vocabulary)."""
    if size >= width:
        from mars_bench.base.errors import ConfigError

        raise ConfigError(f"model.draft_vocab={size}; allowed: 0 or 256 .. {width - 1} (the target has {width} ids)")
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    ids = sorted(set(range(size)) | {i for i in special if i < width})
    return torch.tensor(ids, dtype=torch.long)


def trim_head(model, ids: torch.Tensor) -> None:
    """Replace ``model``'s LM head by one holding only the rows ``ids`` (a copy: a tied embedding is untouched)."""
    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.in_features, len(ids), bias=head.bias is not None, dtype=head.weight.dtype,
                          device=head.weight.device)
    with torch.no_grad():
        new.weight.copy_(head.weight[ids])
        if head.bias is not None:
            new.bias.copy_(head.bias[ids])
    new.requires_grad_(False)
    model.set_output_embeddings(new)


CAPTURE = ("off", "compile")


def _prepare(model, mcfg, device: torch.device):
    if _fast_path_on(mcfg, device):
        from mars_bench.models.fastpath import enable_fast_path

        return enable_fast_path(model, kernel="mkl" if mcfg.fast_path == "mkl" else "auto")
    return model


def capture(adapter, how: str, device: torch.device):
    """``model.capture``: off (eager), or compile = the adapter's decoding forwards (chain and tree drafts,
    verification) through ``torch.compile(mode="reduce-overhead")``, CUDA graphs replaying a forward's
    kernels with one launch. Static shapes: the adapter then feeds those forwards a few fixed shapes (rows x fed
    tokens x a power-of-two cache width, ``CausalLMAdapter.fixed_shape``), so each is compiled and recorded
    once; a tree draft's expansions too; prefills (a new length each) stay eager. CUDA only: on a CPU it is
    refused in one line (the CPU path has its own kernels)."""
    from mars_bench.base.errors import ConfigError

    if how not in CAPTURE:
        raise ConfigError(f"model.capture={how!r}; allowed: {', '.join(CAPTURE)}")
    if how == "off":
        return adapter
    if device.type != "cuda":
        raise ConfigError(f"model.capture={how} on {device.type}; allowed there: off (capture is for CUDA)")
    adapter.set_fixed_shape(True)
    # a graph per shape, the target's and the draft's model class often one code object: room for all of them
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    adapter.step_model = torch.compile(adapter.model, mode="reduce-overhead", dynamic=False)
    return adapter


def _fast_path_on(mcfg, device: torch.device) -> bool:
    if mcfg.fast_path in ("on", "mkl"):
        return True
    return mcfg.fast_path == "auto" and device.type == "cpu" and mcfg.source != "tiny"


def eos_ids(target_model, tokenizer) -> list[int]:
    """The ids that end generation: the tokenizer's EOS and every EOS of the target's generation config."""
    gen = getattr(getattr(target_model, "generation_config", None), "eos_token_id", None)
    ids = {tokenizer.eos_token_id} | set(gen if isinstance(gen, (list, tuple)) else [gen])
    return sorted(i for i in ids if i is not None)
