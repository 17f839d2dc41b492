"""EAGLE-3 heads as shipped, read from a directory or a Hub id and mapped onto the one internal layout
(``decode/drafters/eagle3.py``) in ONE place: ``to_internal``.

Formats (told apart by ``speculators_config`` in config.json):
- **Speculators** (vLLM's; what ``vllm serve --speculative-config '{"method": "eagle3"}'`` loads): nested
  config (``transformer_layer_config`` = the draft layer's Llama config, ``draft_vocab_size``,
  ``eagle_aux_hidden_state_layer_ids`` = vLLM's ids: the input of target layer i = transformers'
  ``hidden_states[i]``; the norm switches), weights ``layers.0.*``, ``fc``, ``norm``, ``lm_head``, ``d2t`` /
  ``t2d`` and a copy of the target's ``embed_tokens``.
- **EAGLE / SpecForge** (SGLang's): flat Llama config with ``draft_vocab_size`` and optional
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang's ids: the OUTPUT of target layer i, so
  ``hidden_states[i + 1]``; vLLM reads the same key without the + 1), weights ``midlayer.*``.

Refused, in one line naming the setting (the head would run, but not as its trainer computed it): a norm
before fc (``norm_before_fc``), the normed output fed back (Speculators ``norm_output: true``), the residual
taken after ``hidden_norm`` (``norm_before_residual``, which vLLM assumes true when a Speculators config omits
it), a sliding-window or second draft layer, a Qwen3 draft layer (q / k norms), MLP biases, and a flat config's
``norm_output`` (its meaning differs between the formats).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from mars_bench.decode.drafters.eagle3 import Eagle3Drafter, Eagle3Head, Eagle3LoadError

SPECULATORS, EAGLE = "speculators", "eagle"
SPECULATORS_TYPE = "eagle3"   # Speculators' ``speculators_model_type`` of these heads (its own name, not a scheme)


def read_dir(source: str) -> Path:
    """A local directory, or a Hub id downloaded with ``huggingface_hub`` (config and weights only)."""
    if os.path.isdir(source):
        return Path(source)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=["config.json", "*.safetensors", "*.bin"]))
    except Exception as e:   # noqa: BLE001  (no network, no such repo, ...)
        raise Eagle3LoadError(f"EAGLE-3 head {source!r}: not a local directory and not downloadable "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def read_state(path: Path) -> dict:
    if (path / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").exists():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise Eagle3LoadError(f"EAGLE-3 head {str(path)!r}: no model.safetensors or pytorch_model.bin")


def format_of(config: dict) -> str:
    return SPECULATORS if "speculators_config" in config or "transformer_layer_config" in config else EAGLE


def _refuse(where: str, key: str, value, allowed: str):
    raise Eagle3LoadError(f"EAGLE-3 head {where}: {key}={json.dumps(value)} is not computed exactly here; "
                          f"allowed: {allowed}")


def _check_layer(where: str, layer: dict) -> None:
    """The draft decoder layer: one Llama layer with full attention."""
    if layer.get("model_type", "llama") != "llama":
        _refuse(where, "model_type", layer.get("model_type"), '"llama" (a Qwen3 draft layer has q / k norms)')
    if int(layer.get("num_hidden_layers", 1)) != 1:
        _refuse(where, "num_hidden_layers", layer.get("num_hidden_layers"), "1 (one draft layer)")
    if "sliding_attention" in (layer.get("layer_types") or []) or layer.get("use_sliding_window"):
        _refuse(where, "layer_types", layer.get("layer_types"), '["full_attention"] (no sliding window)')
    if layer.get("mlp_bias"):
        _refuse(where, "mlp_bias", True, "false")


def to_internal(config: dict, state: dict, where: str) -> tuple[dict, dict, torch.Tensor | None]:
    """(internal config, internal state dict, the head's own embed_tokens or None) of a head in either format."""
    state = dict(state)
    emb = state.pop("embed_tokens.weight", None)
    if format_of(config) == SPECULATORS:
        kind = config.get("speculators_model_type", SPECULATORS_TYPE)
        if kind != SPECULATORS_TYPE:
            _refuse(where, "speculators_model_type", kind, json.dumps(SPECULATORS_TYPE))
        for key, vllm_default in (("norm_before_fc", False), ("norm_output", False), ("norm_before_residual", True)):
            if config.get(key, vllm_default):
                _refuse(where, key, config.get(key, vllm_default), "false" + (
                    " (vLLM takes an absent norm_before_residual as true)" if key == "norm_before_residual" else ""))
        layer = dict(config.get("transformer_layer_config") or {})
        _check_layer(where, layer)
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        internal = dict(layer, draft_vocab_size=config.get("draft_vocab_size"),
                        target_hidden_size=config.get("target_hidden_size"), fc_norm=bool(config.get("fc_norm")),
                        feature_ids=None if ids is None else [int(i) for i in ids])
        for k in ("verifier_norm.weight", "verifier_lm_head.weight"):
            state.pop(k, None)
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        return internal, state, emb
    for key in ("norm_output", "norm_before_residual", "norm_before_fc"):
        if key in config and (key == "norm_output" or config[key]):
            _refuse(where, key, config[key], "the key absent (in a flat config its meaning differs between formats: "
                    "'no final norm' to some, 'normed output fed back' to Speculators / vLLM)"
                    if key == "norm_output" else "false")
    _check_layer(where, config)
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    internal = {k: v for k, v in config.items() if k != "eagle_config"}
    internal["feature_ids"] = None if ids is None else [int(i) + 1 for i in ids]
    return internal, state, emb


def _check_and_load(head: Eagle3Head, sd: dict, where: str) -> None:
    """Strict key / shape check (optional: q/k/v/o biases), then the weights into ``head``."""
    want = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    optional = {f"midlayer.self_attn.{p}_proj.bias": (want[f"midlayer.self_attn.{p}_proj.weight"][0],)
                for p in ("q", "k", "v", "o")}
    for key, shape in want.items():
        if key not in sd:
            raise Eagle3LoadError(f"EAGLE-3 head {where}: missing key {key!r} (expected shape {list(shape)})")
    for key, t in sd.items():
        shape = want.get(key, optional.get(key))
        if shape is None:
            raise Eagle3LoadError(f"EAGLE-3 head {where}: unexpected key {key!r} {list(t.shape)} "
                                  "(expected fc, midlayer.* / layers.0.*, norm, lm_head, d2t, t2d, embed_tokens)")
        if tuple(t.shape) != shape:
            raise Eagle3LoadError(f"EAGLE-3 head {where}: key {key!r} has shape {list(t.shape)}; "
                                  f"expected {list(shape)}")
    for p in ("q", "k", "v", "o"):
        b = sd.pop(f"midlayer.self_attn.{p}_proj.bias", None)
        if b is not None:
            lin = getattr(head.midlayer.self_attn, f"{p}_proj")
            lin.bias = nn.Parameter(b.detach().clone().to(lin.weight.dtype))
    head.load_state_dict(sd)
    ids = torch.arange(head.draft_vocab) + head.d2t
    if head.draft_vocab and (int(ids.min()) < 0 or int(ids.max()) >= head.vocab):
        bad = int(((ids < 0) | (ids >= head.vocab)).nonzero()[0])
        raise Eagle3LoadError(f"EAGLE-3 head {where}: d2t maps draft id {bad} to target id {int(ids[bad])}; "
                              f"expected ids in [0, {head.vocab})")


def load_eagle3_head(source: str, dtype=torch.float32, device="cpu") -> tuple[Eagle3Head, torch.Tensor | None]:
    """(head, its own embed_tokens weight or None) from a directory or Hub id, in either format."""
    path = read_dir(str(source))
    where = repr(str(path))
    if not (path / "config.json").exists():
        raise Eagle3LoadError(f"EAGLE-3 head {where}: no config.json")
    config, sd, emb = to_internal(json.loads((path / "config.json").read_text()), read_state(path), where)
    head = Eagle3Head(config)
    if emb is not None and tuple(emb.shape) != (head.vocab, head.cfg.hidden_size):
        raise Eagle3LoadError(f"EAGLE-3 head {where}: key 'embed_tokens.weight' has shape {list(emb.shape)}; "
                              f"expected {[head.vocab, head.cfg.hidden_size]}")
    _check_and_load(head, {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, where)
    return head.to(device=device, dtype=dtype).eval(), (None if emb is None else emb.to(device, dtype))


def load_eagle3_drafter(source: str, target, dtype=None) -> Eagle3Drafter:
    """An ``Eagle3Drafter`` for ``target`` (CausalLMAdapter) from a head directory or Hub id."""
    dtype = dtype or next(target.model.parameters()).dtype
    head, emb = load_eagle3_head(source, dtype=dtype, device=target.device)
    return Eagle3Drafter(head, target, emb)


def speculators_to_eagle(src: str | Path, out: str | Path) -> Path:
    """A Speculators head rewritten in the EAGLE / SpecForge layout (flat config, ``midlayer.*``, SGLang's
    feature ids = vLLM's - 1, ``embed_tokens`` kept): the same head for loaders that read only that format."""
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    if format_of(config) != SPECULATORS:
        raise Eagle3LoadError(f"EAGLE-3 head {str(src)!r}: not in the Speculators format (no speculators_config)")
    internal, sd, emb = to_internal(config, read_state(src), repr(str(src)))
    ids = internal.pop("feature_ids")
    flat = dict(internal, architectures=["LlamaForCausalLMEagle3"])
    if ids is not None:
        if min(ids) < 1:
            raise Eagle3LoadError(f"EAGLE-3 head {str(src)!r}: feature id 0 (the embeddings) has no SGLang id")
        flat["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}
    if not flat.get("fc_norm"):
        flat.pop("fc_norm", None)
    if emb is not None:
        sd["embed_tokens.weight"] = emb
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(flat, indent=2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"))
    return out
