"""A decoder's decoding forwards in one C call per layer (``fused_layer_with`` in ``quant_gemm.c``): the quantized
draft's chain forwards and the CPU fast path's target forwards (verification, ar, trees).

Why: with q4 weights the embedded 0.5B draft streams 278 MB per token, ~13 ms at this machine's rate, yet
a one-token forward through transformers' modules took ~28 ms: 169 separate linear calls from Python and
~5 ms of small torch ops per step (norms, rotary, cache, SDPA for one query row, 24 layers). The bf16 1.5B target
lost 17 ms a forward that way on a Zen 3 EPYC and ~58 ms on a Zen 1 (docs/results.md). Here each layer (norm,
q/k/v, rotary, cache write, attention, o, norm, gate/up, SiLU, down, residuals) is one call, each linear layer
through its own kernel (the quantized draft's ``quant_linear``, the target's bf16 panels); the embedding
lookup, rotary angles, final norm and LM head stay in torch.

Scope: Qwen2 / Llama decoders, full attention, SiLU MLP, whose linear layers are all ``QuantLinear``
(``model.draft_quant=q4|q8``) or bf16 ``PanelLinear`` (the CPU fast path, ``model.dtype=bf16``); the adapter's
batched forwards (chains and draft trees, any batch size) and single-sequence chain forwards of up to
``models.forward.FUSED_MAX`` tokens after a prefill, with the per-layer hidden states where asked (an EAGLE-3 target:
so its verification scores exactly as ar's forwards do and greedy EAGLE-3 stays ar's tokens). Prefills and
single-sequence forwards with a mask keep the transformers path. Each token is computed from its own inputs and keys only (row-invariant
linears, attention over exactly the cache columns it may see, fixed summation order), so a row's logits do not
depend on its batch or on how many tokens a forward scores: ar's one-token forwards and a verification's k + 1
give the same logits for the same prefix, and greedy sd stays token-identical to ar. The arithmetic differs from
the transformers path in the last bits (vectorized exp, summation order); ``supports`` says why a model is not
eligible.
"""
from __future__ import annotations

import ctypes

import torch

from mars_bench.models import panel, quant

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
Ptrs = ctypes.c_void_p * len(LINEARS)


def _lib():
    lib = quant.library()
    if lib is not None and not getattr(lib, "_fused_typed", False):
        p, L, i, f = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
        lib.fused_layer_with.restype = i
        lib.fused_layer_with.argtypes = [p, L, L, p, p, p, f, p, p, L, i, i, i, f, p, p, p, p, L, p, p, p, p, i]
        lib._fused_typed = True
    return lib


def supports(model) -> str | None:
    """None when ``model`` can run fused forwards, else why not (one line)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ("qwen2", "llama"):
        return f"model type {getattr(cfg, 'model_type', None)!r} (fused forwards cover qwen2, llama)"
    if _lib() is None:
        return f"quantized kernel unavailable: {quant.unavailable()}"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return "MLP is not a bias-free SiLU-gated MLP"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])) or getattr(cfg, "use_sliding_window", False):
        return "sliding-window layers"
    inner = getattr(model, "model", None)
    if inner is None:
        return "no decoder stack (model.model)"
    for layer in inner.layers:
        for name in LINEARS:
            m = getattr(layer.self_attn if name[0] in "qkvo" else layer.mlp, name, None)
            if not isinstance(m, (quant.QuantLinear, panel.PanelLinear)):
                return (f"{name} is a {type(m).__name__} (fused forwards take QuantLinear layers, model.draft_quant="
                        "q4|q8, or PanelLinear layers, the CPU fast path)")
            if isinstance(m, panel.PanelLinear) and not m.bf16:
                return (f"{name} holds fp32 panels (fused forwards take bf16 ones, model.dtype=bf16: fp32 panels "
                        "follow adapter.packing, the plain path beside the packed one)")
            if m.n_pad != m.out_features:
                return f"{name} has {m.out_features} outputs, padded to {m.n_pad} (fused forwards take whole panels)"
    if inner.embed_tokens.weight.dtype != torch.float32:
        return f"the model runs {inner.embed_tokens.weight.dtype} outside its linear layers (fused forwards take fp32)"
    if inner.layers[0].self_attn.head_dim % 16:
        return "head_dim is not a multiple of 16"
    if cfg.hidden_size % 32 or cfg.intermediate_size % 32:
        return "hidden or intermediate size not a multiple of 32"
    return None


class FusedDecoder:
    """Decoding forwards of a decoder whose linear layers are kernels' panels (``supports(model)`` is None)
    against a ``GrowingCache`` or ``RowCache`` (models/kvcache.py)."""

    def __init__(self, model):
        why = supports(model)
        if why is not None:
            raise ValueError(f"fused forwards unavailable: {why}")
        self.lib, self.model, cfg, inner = _lib(), model, model.config, model.model
        attn0 = inner.layers[0].self_attn
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.scale = attn0.head_dim, float(attn0.scaling)
        self.eps, self.hidden, self.ffn = float(cfg.rms_norm_eps), cfg.hidden_size, cfg.intermediate_size
        self.layers = []
        for layer in inner.layers:
            mods = [getattr(layer.self_attn if n[0] in "qkvo" else layer.mlp, n) for n in LINEARS]
            norms = [layer.input_layernorm.weight.detach().float().contiguous(),
                     layer.post_attention_layernorm.weight.detach().float().contiguous()]
            self.layers.append((norms, Ptrs(*[m.address for m in mods]), Ptrs(*[m.panels.data_ptr() for m in mods]),
                                Ptrs(*[None if m.bias is None else m.bias.data_ptr() for m in mods]), mods))

    @torch.inference_mode()
    def forward(self, cache, ids: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                keys: torch.Tensor, key_off: torch.Tensor, batch: int, width: int, hidden_states: bool = False):
        """Raw logits [M, vocab] of M new tokens: token m at position ``pos[m]`` of row ``rows[m]`` (of the
        cache's ``batch`` rows), its keys and values written to cache column ``cols[m]`` (< ``width``), and
        attending to the columns ``keys[key_off[m]:key_off[m + 1]]`` (its own included). The cache layers then
        show ``width`` columns (``GrowingLayer.hold`` / ``show``: the buffer grows only past its capacity);
        columns no token writes keep what they held (zeros or a dropped token's finite values, never attended
        by a row that does not hold them). ``hidden_states``: (logits, hidden states) with transformers' layout,
        [M, hidden] each: the embeddings, every layer's output, the last one after the final norm."""
        inner, m = self.model.model, ids.numel()
        x = inner.embed_tokens(ids).float().reshape(m, self.hidden).contiguous()
        cos, sin = inner.rotary_emb(x[None], pos[None])
        cos, sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        rows_i, cols_i = rows.to(torch.int32).contiguous(), cols.to(torch.int32).contiguous()
        keys_i, off_i = keys.to(torch.int32).contiguous(), key_off.to(torch.int32).contiguous()
        threads = torch.get_num_threads()
        like = x.new_empty(batch, self.kv_heads, 0, self.head_dim)
        hs = [x.clone()] if hidden_states else None
        for layer, ((ln1, ln2), fn, w, b, _) in zip(cache.layers, self.layers):
            layer.hold(like, like, width)
            rc = self.lib.fused_layer_with(fn, m, self.hidden, x.data_ptr(), ln1.data_ptr(), ln2.data_ptr(), self.eps,
                                           w, b, self.ffn, self.heads, self.kv_heads, self.head_dim, self.scale,
                                           cos.data_ptr(), sin.data_ptr(), layer._kbuf.data_ptr(), layer._vbuf.data_ptr(),
                                           layer._kbuf.shape[2], rows_i.data_ptr(), cols_i.data_ptr(), keys_i.data_ptr(),
                                           off_i.data_ptr(), threads)
            if rc != 0:
                raise MemoryError(f"fused layer failed (code {rc}) for {m} tokens")
            layer.show(width)
            if hs is not None:
                hs.append(x.clone())
        normed = inner.norm(x)
        z = self.model.lm_head(normed).float()
        if hs is None:
            return z
        hs[-1] = normed
        return z, tuple(hs)
