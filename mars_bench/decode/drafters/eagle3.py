"""EAGLE-3 draft heads (Li et al. 2025): the head's math and the drafter that drafts trees with it.

One internal layout (``models/eagle3_heads.py`` maps every shipped format onto it and reads the files; this
module reads none). H = hidden_size, T = target_hidden_size (default H), d = head_dim, Vd = draft_vocab_size,
V = vocab_size:
  fc.weight                                  [H, 3T]     fuses three target hidden states
  midlayer.hidden_norm.weight                [H]         RMSNorm of the fused / own feature
  midlayer.input_layernorm.weight            [H]         RMSNorm of the token embedding
  midlayer.self_attn.{q,k,v}_proj.weight     [heads*d | kv_heads*d, 2H]   input [embedding ; feature]
  midlayer.self_attn.o_proj.weight           [H, heads*d]   (optional q/k/v/o biases)
  midlayer.post_attention_layernorm.weight   [H]
  midlayer.mlp.{gate,up}_proj.weight         [I, H];  midlayer.mlp.down_proj.weight [H, I]
  norm.weight [H];  lm_head.weight [Vd, H];  d2t [Vd] int64 (target id = draft id + d2t[draft id]);
  t2d [V] bool (target ids present in the draft vocabulary); ``fc_norm.{0,1,2}.weight`` [T] when ``fc_norm``.
Config: Llama decoder fields plus ``draft_vocab_size``, ``target_hidden_size``, ``fc_norm`` and
``feature_ids``: the three ``hidden_states`` indices of transformers' ``output_hidden_states`` (the inputs of
decoder layers i; default (2, L//2, L-3) as in EAGLE), each below L (transformers' index L is final-normed).

The math, one draft layer (x: token embedding, f: feature; fused f = fc(concat of the three target features)):
  a = [input_layernorm(x) ; hidden_norm(f)];  h = f + o_proj(attention(q, k, v of a, rotary, causal / tree mask))
  out = h + mlp(post_attention_layernorm(h));  logits over the draft vocabulary = lm_head(norm(out))
and a child node's f is its parent's raw ``out`` (not normed, no fc).

Decoding (cache convention of the loops): the head's entry at position t pairs the target feature of
token t with the embedding of token t+1 and predicts token t+2. After each verification the target's
features for the root and the accepted path are paired with the next committed tokens and fed at the
next ``root`` call; tree nodes are fed with the head's OWN output feature of their parent (no fc),
with a tree mask, and are dropped from the head's cache after verification.
"""
from __future__ import annotations

import copy
import time

import torch
from torch import nn

from mars_bench.decode.tree.mask import SlotTree


class Eagle3LoadError(ValueError):
    """A bad or unsupported EAGLE-3 head; the message is one line naming the key or setting and what is allowed."""


class Eagle3Head(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

        keep = {k: v for k, v in config.items()
                if k not in ("architectures", "torch_dtype", "dtype", "model_type", "feature_ids", "fc_norm")}
        self.cfg = c = LlamaConfig(**keep)
        H, eps = c.hidden_size, c.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.target_hidden = int(config.get("target_hidden_size") or H)
        self.vocab, self.draft_vocab = c.vocab_size, int(config.get("draft_vocab_size") or c.vocab_size)
        self.fc = nn.Linear(3 * self.target_hidden, H, bias=False)
        self.fc_norm = (nn.ModuleList([LlamaRMSNorm(self.target_hidden, eps=eps) for _ in range(3)])
                        if config.get("fc_norm") else None)
        self.midlayer = nn.Module()
        m = self.midlayer
        m.hidden_norm, m.input_layernorm = LlamaRMSNorm(H, eps=eps), LlamaRMSNorm(H, eps=eps)
        m.post_attention_layernorm = LlamaRMSNorm(H, eps=eps)
        m.self_attn = nn.Module()
        a = m.self_attn
        a.q_proj = nn.Linear(2 * H, self.heads * self.head_dim, bias=False)
        a.k_proj = nn.Linear(2 * H, self.kv_heads * self.head_dim, bias=False)
        a.v_proj = nn.Linear(2 * H, self.kv_heads * self.head_dim, bias=False)
        a.o_proj = nn.Linear(self.heads * self.head_dim, H, bias=False)
        m.mlp = LlamaMLP(c)
        self.norm = LlamaRMSNorm(H, eps=eps)
        self.lm_head = nn.Linear(H, self.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(self.vocab, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(c)
        self._inv_freq = self.rotary.inv_freq.detach().clone()    # fp32, on the host: not a buffer (see _apply)
        ids = config.get("feature_ids")
        self.layer_ids = None if ids is None else [int(i) for i in ids]

    def _apply(self, fn, recurse=True):
        """``to(dtype=bf16)`` and the like cast every floating buffer; the rotary frequencies stay fp32 (a bf16
        ``inv_freq`` moves the angle of position 1000 by up to ~1 rad), on the device the others moved to."""
        super()._apply(fn, recurse)
        r = self.rotary
        r.inv_freq = self._inv_freq.to(r.inv_freq.device)
        r.original_inv_freq = self._inv_freq.to(r.inv_freq.device)
        return self

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        if self.fc_norm is not None:
            feats = torch.cat([n(x) for n, x in zip(self.fc_norm, feats.chunk(3, -1))], -1)
        return self.fc(feats)

    def layer(self, emb, hidden, pos, cache, allowed):
        """emb, hidden [n, H] -> output feature [n, H]; appends this call's keys/values to ``cache``."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        m, a, n = self.midlayer, self.midlayer.self_attn, emb.shape[0]
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(hidden)], -1)
        q = a.q_proj(x).view(1, n, self.heads, self.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(v, pos[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        cache[0] = k if cache[0] is None else torch.cat([cache[0], k], 2)
        cache[1] = v if cache[1] is None else torch.cat([cache[1], v], 2)
        rep = self.heads // self.kv_heads
        kk, vv = cache[0].repeat_interleave(rep, 1), cache[1].repeat_interleave(rep, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=allowed[None, None])
        h = hidden + a.o_proj(o.transpose(1, 2).reshape(n, -1))
        return h + m.mlp(m.post_attention_layernorm(h))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))


def feature_layers(n_layers: int, override: list[int] | None = None) -> list[int]:
    """hidden_states indices of the three fused features: (2, L//2, L-3) as in EAGLE, or ``override``."""
    ids = list(override) if override is not None else [2, n_layers // 2, n_layers - 3]
    if len(ids) != 3 or min(ids) < 0 or max(ids) >= n_layers:
        raise Eagle3LoadError(f"EAGLE-3 feature layers {ids} for a {n_layers}-layer target; expected 3 hidden_states "
                              f"indices in [0, {n_layers - 1}] (index {n_layers} is final-normed in transformers; "
                              "set the head's feature layer ids)")
    return ids


class Eagle3Drafter:
    """Drafts trees with an EAGLE-3 head on top of ``target`` (a CausalLMAdapter), one per sequence (``fork``), for ``proposers.tree``."""
    needs_hidden = True

    def __init__(self, head: Eagle3Head, target, own_embedding: torch.Tensor | None = None):
        self.head, self.target, self.device = head, target, target.device
        # the head's own embed_tokens when it carries one (as vLLM and Speculators run it: a Speculators head holds
        # the target's rows, saved in its dtype), else the target's
        emb = target.model.get_input_embeddings().weight if own_embedding is None else own_embedding
        H, L = head.cfg.hidden_size, target.model.config.num_hidden_layers
        if emb.shape[1] != H:
            raise Eagle3LoadError(f"EAGLE-3 head hidden_size {H} != target embedding width {emb.shape[1]} "
                                  "and the checkpoint has no embed_tokens.weight")
        if head.vocab != target.out_vocab:
            raise Eagle3LoadError(f"EAGLE-3 head vocab_size {head.vocab} != the target's vocabulary {target.out_vocab}")
        self.embed = emb
        self.layer_ids = feature_layers(L, head.layer_ids)
        self.vocab = target.out_vocab
        self.map = (torch.arange(head.draft_vocab) + head.d2t.cpu()).to(self.device)
        self.forward_s, self.n_forwards = 0.0, 0
        self.prefill([0], None)

    def _feats(self, hidden, rows=None) -> torch.Tensor:
        f = torch.cat([hidden[i][0].to(self.device) for i in self.layer_ids], -1)   # device_map: any GPU
        return f if rows is None else f[torch.as_tensor(rows, device=f.device)]

    def _run(self, tokens, hidden, pos, allowed):
        t0 = time.perf_counter()
        emb = self.embed[torch.as_tensor(tokens, device=self.embed.device)].to(self.device)
        out = self.head.layer(emb, hidden, pos, self.cache, allowed)
        z = self.head.logits(out).float()
        full = torch.full((z.shape[0], self.vocab), float("-inf"), device=self.device)
        full[:, self.map] = z
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.forward_s += time.perf_counter() - t0
        self.n_forwards += 1
        return out, full

    def expect(self, n_tokens: int) -> None:
        """Hint of the nodes an expansion feeds: nothing to prepare for the head."""

    def fork(self) -> "Eagle3Drafter":
        """The same head with its own (empty) state: one per sequence of a batch."""
        twin = copy.copy(self)
        twin.forward_s, twin.n_forwards = 0.0, 0
        twin.prefill([0], None)
        return twin

    @property
    def cache_len(self) -> int:
        return 0 if self.cache[0] is None else self.cache[0].shape[2]

    @torch.inference_mode()
    def prefill(self, prompt: list[int], hidden=None) -> None:
        self.cache, self.outs, self._slots, self.root_out = [None, None], [], None, None
        self.pending = (list(prompt[1:]), self._feats(hidden)) if hidden is not None else ([], None)

    @torch.inference_mode()
    def root(self, seq: list[int]):
        tokens, feats = self.pending
        if not tokens:
            return None
        n, base = len(tokens), self.cache_len
        pos = torch.arange(base, base + n, device=self.device)
        allowed = torch.ones(n, base + n, dtype=torch.bool, device=self.device).tril(base)
        fused = self.head.fuse(feats.to(self.head.fc.weight.dtype))
        out, z = self._run(tokens, fused, pos, allowed)
        self.pending, self.root_out, self.outs = ([], None), out[-1], []
        self._slots = SlotTree(self.cache_len, base + n - 1, self.device)
        return z[-1]

    @torch.inference_mode()
    def expand(self, tokens, parent_slots) -> torch.Tensor:
        """Tokens and parent slots: lists, or LongTensors left on the device."""
        allowed, pos = self._slots.add(parent_slots)
        slots = torch.as_tensor(parent_slots, dtype=torch.long).to(self.device)
        hidden = torch.stack([self.root_out, *self.outs]).index_select(0, slots + 1)   # slot -1: the root's output
        out, z = self._run(tokens, hidden, pos, allowed)
        self.outs.extend(out)
        return z

    @torch.inference_mode()
    def commit(self, tree, path: list[int], committed: list[int], hidden=None) -> None:
        if self._slots is not None:
            self.cache = [None if c is None else c[:, :, : self._slots.base] for c in self.cache]
            self._slots, self.outs = None, []
        feats = self._feats(hidden, [0] + path)
        old_t, old_f = self.pending
        self.pending = (old_t + list(committed), feats if old_f is None else torch.cat([old_f, feats]))
