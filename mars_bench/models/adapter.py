"""One adapter over Hugging Face causal LMs (``CausalLMAdapter``): all KV-cache plumbing lives here and in
``models.batched``; the forwards themselves run on one of the paths of ``models.forward`` (eager, fused, fixed
shapes), the one ``models.forward.choose`` picks.

A single sequence (``decode.backend.SequenceModel``, what tree drafters use) is scored with ``forward``
(n new tokens against the cache, raw logits), rolled back with ``crop`` (to a committed length) and
narrowed with ``keep(start, offsets)`` (a tree's accepted path: its columns moved down in place, the prefix
untouched). Tree drafts pass a 4-D attention mask and per-token position ids through the same ``forward``.
The decoding loop uses a second cache, one for the whole batch, through the ``batch_*`` methods of
``decode.backend.Backend`` (``models.batched``: its layout). Both count every forward and its seconds
(``timed``) and map a draft's logits onto the target's vocabulary (``widen_logits``).
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import time

import torch

from mars_bench.decode.backend import SequenceModel
from mars_bench.models.batched import BatchCacheMixin, per_device
from mars_bench.models.forward import choose
from mars_bench.models.forward.fixed import fixed_columns

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}; allowed: fp32, bf16, fp16")
    return DTYPES[name]


class CausalLMAdapter(BatchCacheMixin, SequenceModel):
    """Wraps a ``transformers`` causal LM with its own KV cache (batch size 1), and a second, batched
    cache with per-row lengths for the decoding loop (the ``batch_*`` methods of ``decode.backend.Backend``).

    ``out_vocab``: width of the returned logits. A draft whose embedding matrix is padded to a
    different size than the target's is mapped onto the target's vocabulary: extra columns dropped,
    missing ones filled with -inf (the tokenizers were checked equal over the shared ids).
    ``vocab_ids``: a draft whose LM head scores only these ids (``model.draft_vocab``, ascending; the
    head's row i is id ``vocab_ids[i]``): its logits are scattered into ``out_vocab`` columns, the others -inf.
    ``fixed_shape``: decoding forwards over cache views of a few fixed widths (``models.forward.fixed``).
    """

    def __init__(self, model, out_vocab: int | None = None, name: str = "", vocab_ids: torch.Tensor | None = None,
                 fixed_shape: bool = False):
        from mars_bench.models.kvcache import GrowingCache

        self.model = model.eval()
        self.name = name
        self.device = next(model.parameters()).device
        self.vocab = model.get_output_embeddings().out_features
        self.out_vocab = out_vocab or self.vocab
        self.vocab_ids = None if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long, device=self.device)
        if self.vocab_ids is not None and len(self.vocab_ids) != self.vocab:
            raise ValueError(f"vocab_ids has {len(self.vocab_ids)} ids for an LM head of {self.vocab} rows")
        self._cache_cls = GrowingCache
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache = None
        self.bcache = None                      # the batched cache (a RowCache)
        self.blens: list[int] = []              # its rows' lengths, on the host
        self.fused = None         # a models.fused.FusedDecoder: the fused path's one C call per layer
        self.forward_s = 0.0      # accumulated wall seconds inside forward()
        self.n_forwards = 0
        self.rows = None          # tokens most forwards will score (a hint for the CPU fast path)
        self.packing = True       # False: ignore the hint (the plain path, for side-by-side benchmarks)
        self.fixed_shape = fixed_shape
        self.step_model = self.model   # what decoding forwards call (models.pairs.capture: a compiled model)
        self.reset()

    def fork(self) -> "CausalLMAdapter":
        """Another adapter over the same weights with its own (empty) caches: one per sequence where a
        drafter keeps per-sequence state (tree drafting at batch size > 1)."""
        twin = copy.copy(self)
        twin.bcache, twin.blens, twin.forward_s, twin.n_forwards = None, [], 0.0, 0
        twin.reset()
        return twin

    # -- cache -------------------------------------------------------------------------------
    def reset(self) -> None:
        from mars_bench.models.kvcache import RowCache

        self.cache = (RowCache if self.fixed_shape else self._cache_cls)(config=self.model.config)

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Drop cached positions >= ``length``."""
        extra = self.cache_len - length
        if extra > 0:
            self.cache.crop(-extra)   # transformers 5.x: a negative count = tokens to remove

    @torch.inference_mode()
    def keep(self, start: int, offsets) -> None:
        """Keep the first ``start`` cached positions, then those at start + ``offsets`` (ascending; a tree's
        accepted path among the fed nodes), in that order. A layer owning its buffer moves only the kept columns
        whose place changes, in place (the prefix is untouched); any other layer is index-selected."""
        from mars_bench.models.kvcache import GrowingLayer

        offsets, length = list(offsets), self.cache_len
        if not 0 <= start <= length or offsets != sorted(set(offsets)) or any(not 0 <= o < length - start
                                                                              for o in offsets):
            raise ValueError(f"keep(start={start}, offsets={offsets}) on {length} cached positions; allowed: "
                             f"0 <= start <= {length}, offsets ascending, each in 0..{length - start - 1}")
        moved = [(start + o, start + k) for k, o in enumerate(offsets) if o != k]
        moves = per_device(torch.tensor([[0] * len(moved), [s for s, _ in moved], [d for _, d in moved]],
                                        dtype=torch.long)) if moved else None
        kept = None
        for layer in self.cache.layers:
            if not layer.is_initialized:
                continue
            if isinstance(layer, GrowingLayer) and layer.owns():
                if moves is not None:
                    layer.move(*moves(layer.keys.device))
                layer.show(start + len(offsets))
                continue
            if kept is None:
                kept = per_device(torch.tensor(list(range(start)) + [start + o for o in offsets], dtype=torch.long))
            layer.keys = layer.keys.index_select(-2, kept(layer.keys.device))
            layer.values = layer.values.index_select(-2, kept(layer.values.device))

    def set_fixed_shape(self, on: bool) -> None:
        """Fixed-shape forwards (``models.forward.fixed``) on or off; the single-sequence cache starts empty."""
        self.fixed_shape = on
        self.reset()

    def expect(self, n_tokens: int) -> None:
        """Hint: most forwards will score ``n_tokens`` tokens (k + 1 when verifying, 1 when drafting)."""
        n_tokens = n_tokens if self.packing else None
        if n_tokens != self.rows:
            from mars_bench.models.fastpath import set_rows

            set_rows(self.model, n_tokens)
            self.rows = n_tokens

    # -- scoring -----------------------------------------------------------------------------
    def widen_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Raw logits of this model's LM head -> [..., out_vocab] over the target's ids."""
        if self.vocab_ids is not None:
            return _scatter_vocab(z, self.vocab_ids, self.out_vocab)
        return _map_vocab(z, self.out_vocab) if self.out_vocab != self.vocab else z

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def timed(self):
        """Count one forward and its wall seconds (the device synchronized at both ends)."""
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        self.forward_s += time.perf_counter() - t0
        self.n_forwards += 1

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
        path = choose(self, self.cache_len, ids.shape[1], batched=False, hidden_states=hidden_states, logits=logits)
        return path.forward(self, ids, attention_mask, position_ids, logits, hidden_states)

    # -- memory ------------------------------------------------------------------------------
    def cached_columns(self, tokens: int) -> int:
        """Columns a batch row's cache may take for ``tokens`` cached ones (``decode.backend.check_memory``; a
        step's fed tokens included): the buffer's capacity, spare columns and all (no compaction slack: a row's
        tokens always take its first columns); with fixed shapes, the capacity of the widest view."""
        from mars_bench.models.kvcache import capacity

        return capacity(fixed_columns(tokens) if self.fixed_shape else tokens)

    def kv_bytes_by_device(self) -> dict:
        """{device: KV-cache bytes one cached token takes in the decoder layers placed there} (several devices
        when a device_map shards the model; layers found as ``model.model.layers``, else all on ``device``)."""
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        if layers is None or not len(layers):
            return {self.device: self.kv_bytes_per_token()}
        per_layer = self.kv_bytes_per_token() // len(layers)
        out: dict = {}
        for layer in layers:
            dev = next(layer.parameters()).device
            out[dev] = out.get(dev, 0) + per_layer
        return out

    @property
    def logits_device(self) -> torch.device:
        """Where the raw logits come out: the LM head's device (the last GPU of a sharded model). A CPU fast-path
        head may hold its weight as panels only (no ``weight``): any tensor of it says where it is."""
        head = self.model.get_output_embeddings()
        t = next(iter(head.parameters()), None)
        t = t if t is not None else next(iter(head.buffers()), None)
        return t.device if t is not None else self.device

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one cached token takes (every layer, keys and values), from the model config."""
        c = self.model.config
        c = getattr(c, "text_config", c)
        heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        size = next(self.model.parameters()).element_size()
        return 2 * c.num_hidden_layers * heads * head_dim * size


def _scatter_vocab(z: torch.Tensor, ids: torch.Tensor, width: int) -> torch.Tensor:
    out = torch.full((*z.shape[:-1], width), float("-inf"), device=z.device)
    out[..., ids] = z
    return out


def _map_vocab(z: torch.Tensor, width: int) -> torch.Tensor:
    if z.shape[-1] >= width:
        return z[..., :width]
    pad = torch.full((*z.shape[:-1], width - z.shape[-1]), float("-inf"), device=z.device)
    return torch.cat([z, pad], dim=-1)

