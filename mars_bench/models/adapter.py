"""One adapter over Hugging Face causal LMs: all KV-cache plumbing lives here.

The decoding loops only ever call ``forward`` (score n new tokens against the cache, get raw
logits), ``crop`` (roll the cache back to a committed length) and ``keep`` (compact the cache by
index selection, for tree drafts). Tree drafts pass a 4-D attention mask and per-token position ids
through the same ``forward``.
"""
from __future__ import annotations

import inspect
import time

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}; allowed: fp32, bf16, fp16")
    return DTYPES[name]


class CausalLMAdapter:
    """Wraps a ``transformers`` causal LM with its own KV cache (batch size 1).

    ``out_vocab``: width of the returned logits. A draft whose embedding matrix is padded to a
    different size than the target's is mapped onto the target's vocabulary: extra columns dropped,
    missing ones filled with -inf (the tokenizers were checked equal over the shared ids).
    """

    def __init__(self, model, out_vocab: int | None = None, name: str = ""):
        from transformers import DynamicCache

        self.model = model.eval()
        self.name = name
        self.device = next(model.parameters()).device
        self.vocab = model.get_output_embeddings().out_features
        self.out_vocab = out_vocab or self.vocab
        self._cache_cls = DynamicCache
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache = None
        self.forward_s = 0.0      # accumulated wall seconds inside forward()
        self.n_forwards = 0
        self.rows = None          # tokens most forwards will score (a hint for the CPU fast path)
        self.packing = True       # False: ignore the hint (the plain path, for side-by-side benchmarks)
        self.reset()

    # -- cache -------------------------------------------------------------------------------
    def reset(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Drop cached positions >= ``length``."""
        extra = self.cache_len - length
        if extra > 0:
            self.cache.crop(-extra)   # transformers 5.x: a negative count = tokens to remove

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the cached positions in ``index`` (ascending), in that order."""
        index = index.to(self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)

    def expect(self, n_tokens: int) -> None:
        """Hint: most forwards will score ``n_tokens`` tokens (k + 1 when verifying, 1 when drafting)."""
        n_tokens = n_tokens if self.packing else None
        if n_tokens != self.rows:
            from .fastpath import set_rows

            set_rows(self.model, n_tokens)
            self.rows = n_tokens

    # -- scoring -----------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def forward(self, tokens, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits: bool = True,
                hidden_states: bool = False):
        """Append ``tokens`` (n ids) to the cache; return raw fp32 logits [n, out_vocab].

        ``logits=False`` skips the LM head (prefill). ``hidden_states=True`` also returns the tuple of
        per-layer hidden states (EAGLE-style drafters). A tree forward passes a 4-D additive or
        boolean ``attention_mask`` over [cache + n] and ``position_ids`` [1, n].
        """
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).reshape(1, -1)
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if attention_mask is not None:
            kwargs["attention_mask"] = {"full_attention": attention_mask}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(self.device)
        if not logits:
            kwargs["logits_to_keep"] = 1
        if hidden_states:
            kwargs["output_hidden_states"] = True
        self._sync()
        t0 = time.perf_counter()
        out = self.model(input_ids=ids, **kwargs)
        z = out.logits[0].float() if logits else None
        self._sync()
        self.forward_s += time.perf_counter() - t0
        self.n_forwards += 1
        if z is not None and self.out_vocab != self.vocab:
            z = _map_vocab(z, self.out_vocab)
        return (z, out.hidden_states) if hidden_states else z


def _map_vocab(z: torch.Tensor, width: int) -> torch.Tensor:
    if z.shape[-1] >= width:
        return z[..., :width]
    pad = torch.full((*z.shape[:-1], width - z.shape[-1]), float("-inf"), device=z.device)
    return torch.cat([z, pad], dim=-1)
