"""One adapter over Hugging Face causal LMs: all KV-cache plumbing lives here.

A single sequence (``decode.backend.SequenceModel``, what tree drafters use) is scored with ``forward``
(n new tokens against the cache, raw logits), rolled back with ``crop`` (to a committed length) and
compacted with ``keep`` (index selection, for tree drafts). Tree drafts pass a 4-D attention mask and
per-token position ids through the same ``forward``.

The decoding loop (``decode.engine``) uses a second cache, one for the whole batch, through the
``batch_*`` methods of ``decode.backend.Backend``: ``batch_reset`` (B empty rows), ``batch_prefill`` (a
row's new prompt, scored alone exactly as at batch size 1), ``batch_forward`` (each row appends its own
number of tokens), ``batch_crop`` (each row rolled back to its own length), ``batch_keep`` (a tree's
accepted path) and ``batch_select`` (drop finished rows).
Layout: the cache tensors are [B, heads, W, dim] for a common width W; ``bvalid`` [B, W] says which
columns hold a row's committed tokens (in position order), so row b's length is ``bvalid[b].sum()``;
``bcols`` keeps the same on the host (row b's valid column indices), so lengths, trims and crops never read
the device (each read is a sync on CUDA).
A forward appends n_max columns to every row: row b's n_b tokens take the first n_b of them and the
rest are padding, masked out (attention mask) and never valid. Position ids are per row (its length
+ i), so each row sees exactly its own sequence. Rolled-back and padding columns are dropped from the
end when no row uses them, and the whole cache is compacted by index selection (each row's valid
columns gathered to the front) once the width exceeds the longest row by ``COMPACT_SLACK``.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import time

import torch

from ..decode.backend import Backend, SequenceModel
from ..decode.tree.mask import ancestors

COMPACT_SLACK = 32       # batched cache: unused columns tolerated beyond the longest row before compacting
FUSED_MAX = 32           # single-sequence forwards of at most this many tokens take the fused draft path (not prefill)
PAD_ID = 0               # batched forwards: the id fed in padding slots (masked out, its logits unused)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}; allowed: fp32, bf16, fp16")
    return DTYPES[name]


class BatchCacheMixin(Backend):
    """The batched cache (see the module docstring); mixed into ``CausalLMAdapter``."""

    @torch.inference_mode()
    def batch_reset(self, rows: int) -> None:
        self.bcache = self._cache_cls(config=self.model.config)
        self.bvalid = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)
        self.bcols: list[list[int]] = [[] for _ in range(rows)]   # host copy of bvalid: each row's valid columns

    @property
    def batch_rows(self) -> int:
        return self.bvalid.shape[0]

    @property
    def batch_width(self) -> int:
        return self.bvalid.shape[1]

    @property
    def batch_lens(self) -> list[int]:
        """Committed tokens cached per row (from the host copy: no device read)."""
        return [len(c) for c in self.bcols]

    def _layers(self):
        return [layer for layer in self.bcache.layers if getattr(layer, "is_initialized", False)]

    @torch.inference_mode()
    def _widen(self, width: int) -> None:
        """Pad every row with unused columns up to ``width``."""
        extra = width - self.batch_width
        if extra <= 0:
            return
        for layer in self._layers():
            b, h, _, d = layer.keys.shape
            pad = layer.keys.new_zeros(b, h, extra, d)
            layer.keys = torch.cat([layer.keys, pad], -2)
            layer.values = torch.cat([layer.values, pad], -2)
        self.bvalid = torch.cat([self.bvalid, self.bvalid.new_zeros(self.batch_rows, extra)], 1)

    @torch.inference_mode()
    def batch_prefill(self, row: int, tokens, hidden_states: bool = False):
        """Make ``row`` hold ``tokens`` only (a new sequence). They are scored alone, on the single-sequence
        cache, as ``forward(tokens, logits=False)`` does at batch size 1, then copied into the row.
        ``hidden_states=True`` returns the forward's per-layer hidden states (None for no tokens)."""
        tokens = list(tokens)
        self.bvalid[row] = False
        self.bcols[row] = list(range(len(tokens)))
        if not tokens:
            return None
        self.reset()
        out = self.forward(tokens, logits=False, hidden_states=hidden_states)
        n = len(tokens)
        self._widen(n)
        for bl, sl in zip(self.bcache.layers, self.cache.layers):
            if not getattr(bl, "is_initialized", False):   # first row ever: shape the batch tensors after this one
                bl.lazy_initialization(sl.keys, sl.values)
                shape = (self.batch_rows, sl.keys.shape[1], self.batch_width, sl.keys.shape[3])
                bl.keys, bl.values = sl.keys.new_zeros(shape), sl.values.new_zeros(shape)
            bl.keys[row, :, :n] = sl.keys[0]
            bl.values[row, :, :n] = sl.values[0]
        self.bvalid[row, :n] = True
        self.reset()                                      # the single-sequence cache is free again
        return out[1] if hidden_states else None

    @torch.inference_mode()
    def batch_forward(self, tokens: list[list[int]], trees: list | None = None, hidden_states: bool = False):
        """Row b appends ``tokens[b]`` (any count, 0 included) to its sequence; returns per row the raw fp32
        logits [len(tokens[b]), out_vocab], each row scored as if alone (its own positions and history).

        ``trees[b]`` (None for a plain causal row): a draft tree over the row's fed tokens, with
        ``parents`` (index of each token's parent among them; -1 = the committed sequence) and ``depths``
        (position offset from the row's length). A tree token attends to the committed sequence, its
        ancestors and itself, at position length + depth (``batch_keep`` then keeps the accepted path).
        ``hidden_states=True``: also the per-layer hidden states, per row a tuple of [1, n_b, H]."""
        rows, n, counts = self.batch_rows, max((len(t) for t in tokens), default=0), [len(t) for t in tokens]
        if len(tokens) != rows:
            raise ValueError(f"batch_forward got {len(tokens)} rows; the batched cache has {rows}")
        if n == 0:
            empty = [torch.empty(0, self.out_vocab, device=self.device) for _ in tokens]
            return (empty, [None] * rows) if hidden_states else empty
        width, held = self.batch_width, self.batch_lens
        lens = torch.tensor(held, device=self.device)
        # one row, a plain chain over a gap-free cache: the causal default, exactly the single-sequence forward
        trees_or_holes = any(t is not None for t in (trees or [])) or any(h != width for h in held)
        count = torch.tensor(counts, device=self.device)
        if self.fused is not None and width and not hidden_states and not any(t is not None for t in (trees or [])):
            return self._fused_forward(tokens, width, lens, count)
        ids = _padded_ids(tokens, n, self.device)
        new_ok = torch.arange(n, device=self.device)[None] < count[:, None]                # [B, n]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        own = (causal[None] & new_ok[:, None, :]).clone()                                 # real new tokens
        offset = torch.arange(n, device=self.device)[None].expand(rows, n).clone()
        for b, tree in enumerate(trees or []):
            if tree is not None and len(tokens[b]):
                m = len(tokens[b])
                own[b, :m, :m] = ancestors(tree.parents[:m], self.device, max(tree.depths[:m]))
                offset[b, :m] = torch.tensor(tree.depths[:m], device=self.device)
        own |= torch.eye(n, dtype=torch.bool, device=self.device)[None]                  # padding sees itself: no empty row
        pos = lens[:, None] + offset
        if width == 0 or not self._layers():
            self.bcache = self._cache_cls(config=self.model.config)   # nothing cached yet: start the tensors here
        kwargs = {self._cache_kw: self.bcache, "use_cache": True, "position_ids": pos}
        if rows > 1 or trees_or_holes:
            allowed = torch.cat([self.bvalid[:, None, :].expand(rows, n, width), own], 2)    # [B, n, W + n]
            dtype = next(self.model.parameters()).dtype
            mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
            kwargs["attention_mask"] = {"full_attention": mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]}
        if hidden_states:
            kwargs["output_hidden_states"] = True
        with self._timed():
            out = self.model(input_ids=ids, **kwargs)
            z = out.logits.float()
        self._fed = (width, counts)
        self._append_cols(width, counts)
        self.bvalid = torch.cat([self.bvalid, new_ok], 1)
        z = self._widen_logits(z)
        zs = [z[b, : len(t)] for b, t in enumerate(tokens)]
        if not hidden_states:
            return zs
        return zs, [tuple(h[b:b + 1, : len(t)] for h in out.hidden_states) for b, t in enumerate(tokens)]

    def _fused_forward(self, tokens: list[list[int]], width: int, lens: torch.Tensor, count: torch.Tensor):
        """``batch_forward`` of chains through ``self.fused`` (models/fused.py): token i of row b at position
        len_b + i and cache column width + i, attending to the row's valid columns and its new ones up to i."""
        ids, rows, index, keys = [], [], [], []
        for b, t in enumerate(tokens):
            if not len(t):
                continue
            t = t.tolist() if isinstance(t, torch.Tensor) else list(t)     # the fused path runs on the CPU
            held = torch.tensor(self.bcols[b], dtype=torch.long)
            ids += t
            rows += [b] * len(t)
            index += range(len(t))
            keys += _chain_keys(held, width, len(t))
        rows_t, index_t = torch.tensor(rows, device=self.device), torch.tensor(index, device=self.device)
        with self._timed():
            z = self.fused.forward(self.bcache, torch.tensor(ids, device=self.device), lens[rows_t] + index_t, rows_t,
                                   width + index_t, *_flat(keys), width)
        counts = [len(t) for t in tokens]
        n = max(counts)
        self._fed = (width, counts)
        self._append_cols(width, counts)
        self.bvalid = torch.cat([self.bvalid, torch.arange(n, device=self.device)[None] < count[:, None]], 1)
        z = self._widen_logits(z)
        parts, at = [], 0
        for t in tokens:
            parts.append(z[at:at + len(t)])
            at += len(t)
        return parts

    @torch.inference_mode()
    def batch_keep(self, keep: list[list[int]]) -> None:
        """Of the tokens the last ``batch_forward`` fed, row b keeps only those at indices ``keep[b]``
        (ascending; a tree's accepted path); then drop columns no row uses."""
        start, counts = self._fed
        for b, (idx, n) in enumerate(zip(keep, counts)):
            drop = sorted(set(range(n)) - set(idx))
            if drop:
                self.bvalid[b, torch.tensor(drop, device=self.device) + start] = False
                cols, gone = self.bcols[b], {start + i for i in drop}
                cols[len(cols) - n:] = [c for c in cols[len(cols) - n:] if c not in gone]   # the fed ones are last
        self._trim()

    @torch.inference_mode()
    def batch_crop(self, lengths: list[int]) -> None:
        """Roll row b back to its first ``lengths[b]`` committed tokens; then drop columns no row uses."""
        for b, length in enumerate(lengths):
            cols = self.bcols[b]
            if length < len(cols):
                self.bvalid[b, torch.tensor(cols[length:], dtype=torch.long, device=self.device)] = False
                del cols[length:]
        self._trim()

    @torch.inference_mode()
    def batch_select(self, rows: list[int]) -> None:
        """Keep only these rows (by index, in this order): finished rows leave the batch."""
        index = torch.as_tensor(rows, dtype=torch.long)
        on = _per_device(index)           # device_map over several GPUs: each layer's index on its own device
        for layer in self._layers():
            layer.keys = layer.keys.index_select(0, on(layer.keys.device))
            layer.values = layer.values.index_select(0, on(layer.values.device))
        self.bvalid = self.bvalid.index_select(0, on(self.bvalid.device))
        self.bcols = [self.bcols[b] for b in rows]
        self._trim()

    @torch.inference_mode()
    def _trim(self) -> None:
        end = max((c[-1] + 1 for c in self.bcols if c), default=0)
        if end < self.batch_width:
            for layer in self._layers():
                layer.keys, layer.values = layer.keys[:, :, :end], layer.values[:, :, :end]
            self.bvalid = self.bvalid[:, :end]
        if self.batch_width > max(self.batch_lens, default=0) + COMPACT_SLACK:
            self.batch_compact()

    @torch.inference_mode()
    def batch_compact(self) -> None:
        """Gather each row's valid columns to the front (index selection): width = the longest row."""
        held = self.batch_lens
        lens, width = torch.tensor(held, dtype=torch.long, device=self.device), max(held, default=0)
        # stable sort puts valid columns first, in position order; padding columns follow
        order = torch.sort((~self.bvalid).to(torch.int8), dim=1, stable=True).indices[:, :width]
        on = _per_device(order)
        for layer in self._layers():
            idx = on(layer.keys.device)[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx.to(layer.values.device))
        self.bvalid = torch.arange(width, device=self.device)[None] < lens[:, None]
        self.bcols = [list(range(h)) for h in held]

    def _append_cols(self, width: int, counts: list[int]) -> None:
        for cols, c in zip(self.bcols, counts):
            cols.extend(range(width, width + c))

    def cached_columns(self, tokens: int) -> int:
        """Columns a batch row's cache may take for ``tokens`` committed ones (``decode.backend.check_memory``):
        compaction only past COMPACT_SLACK unused columns, and each layer's buffer has spare columns."""
        from .kvcache import capacity

        return capacity(tokens + COMPACT_SLACK)

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


class CausalLMAdapter(BatchCacheMixin, SequenceModel):
    """Wraps a ``transformers`` causal LM with its own KV cache (batch size 1), and a second, batched
    cache with per-row lengths for the decoding loop (the ``batch_*`` methods of ``decode.backend.Backend``).

    ``out_vocab``: width of the returned logits. A draft whose embedding matrix is padded to a
    different size than the target's is mapped onto the target's vocabulary: extra columns dropped,
    missing ones filled with -inf (the tokenizers were checked equal over the shared ids).
    ``vocab_ids``: a draft whose LM head scores only these ids (``model.draft_vocab``, ascending; the
    head's row i is id ``vocab_ids[i]``): its logits are scattered into ``out_vocab`` columns, the others -inf.
    """

    def __init__(self, model, out_vocab: int | None = None, name: str = "", vocab_ids: torch.Tensor | None = None):
        from .kvcache import GrowingCache

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
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache = None
        self.bcache, self.bvalid = None, None   # batched cache and its [B, W] valid-column mask
        self.bcols: list[list[int]] = []         # bvalid on the host: each row's valid columns, ascending
        self.fused = None         # a models.fused.FusedDraft: batched chain forwards in one C call per layer
        self.forward_s = 0.0      # accumulated wall seconds inside forward()
        self.n_forwards = 0
        self.rows = None          # tokens most forwards will score (a hint for the CPU fast path)
        self.packing = True       # False: ignore the hint (the plain path, for side-by-side benchmarks)
        self.reset()

    def fork(self) -> "CausalLMAdapter":
        """Another adapter over the same weights with its own (empty) caches: one per sequence where a
        drafter keeps per-sequence state (tree drafting at batch size > 1)."""
        twin = copy.copy(self)
        twin.bcache, twin.bvalid, twin.bcols, twin.forward_s, twin.n_forwards = None, None, [], 0.0, 0
        twin.reset()
        return twin

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
        on = _per_device(index)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, on(layer.keys.device))
            layer.values = layer.values.index_select(-2, on(layer.values.device))

    def expect(self, n_tokens: int) -> None:
        """Hint: most forwards will score ``n_tokens`` tokens (k + 1 when verifying, 1 when drafting)."""
        n_tokens = n_tokens if self.packing else None
        if n_tokens != self.rows:
            from .fastpath import set_rows

            set_rows(self.model, n_tokens)
            self.rows = n_tokens

    # -- scoring -----------------------------------------------------------------------------
    def _widen_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Raw logits of this model's LM head -> [..., out_vocab] over the target's ids."""
        if self.vocab_ids is not None:
            return _scatter_vocab(z, self.vocab_ids, self.out_vocab)
        return _map_vocab(z, self.out_vocab) if self.out_vocab != self.vocab else z

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def _timed(self):
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
        n, width = ids.shape[1], self.cache_len
        if (self.fused is not None and logits and not hidden_states and attention_mask is None and position_ids is None
                and width and 0 < n <= FUSED_MAX):
            at = torch.arange(n, device=self.device)
            keys = _chain_keys(torch.arange(width), width, n)
            with self._timed():
                z = self.fused.forward(self.cache, ids[0], width + at, torch.zeros_like(at), width + at, *_flat(keys),
                                       width)
            return self._widen_logits(z)
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if attention_mask is not None:
            kwargs["attention_mask"] = {"full_attention": attention_mask}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(self.device)
        if not logits:
            kwargs["logits_to_keep"] = 1
        if hidden_states:
            kwargs["output_hidden_states"] = True
        with self._timed():
            out = self.model(input_ids=ids, **kwargs)
            z = out.logits[0].float() if logits else None
        if z is not None:
            z = self._widen_logits(z)
        return (z, out.hidden_states) if hidden_states else z


def _padded_ids(tokens: list, n: int, device) -> torch.Tensor:
    """[B, n] ids: row b's tokens (a list of ints or a LongTensor already on a device) then PAD_ID."""
    if not any(isinstance(t, torch.Tensor) for t in tokens):
        return torch.tensor([list(t) + [PAD_ID] * (n - len(t)) for t in tokens], dtype=torch.long, device=device)
    rows = [torch.as_tensor(t, dtype=torch.long).to(device) for t in tokens]
    return torch.stack([torch.nn.functional.pad(r, (0, n - len(r)), value=PAD_ID) for r in rows])


def _per_device(index: torch.Tensor):
    """``on(device)``: ``index`` on that device, copied once per device (a sharded model's layers live on several)."""
    copies = {index.device: index}

    def on(device: torch.device) -> torch.Tensor:
        if device not in copies:
            copies[device] = index.to(device)
        return copies[device]
    return on


def _chain_keys(held: torch.Tensor, width: int, n: int) -> list[torch.Tensor]:
    """Cache columns each of a row's n new chain tokens attends to: the row's ``held`` columns, then the new
    columns width .. width + i (token i and the ones before it)."""
    return [torch.cat([held, torch.arange(width, width + i + 1)]) for i in range(n)]


def _flat(keys: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(all key columns, offsets [M + 1]) for ``FusedDraft.forward``."""
    off = torch.zeros(len(keys) + 1, dtype=torch.long)
    off[1:] = torch.tensor([len(k) for k in keys]).cumsum(0)
    return torch.cat(keys), off


def _scatter_vocab(z: torch.Tensor, ids: torch.Tensor, width: int) -> torch.Tensor:
    out = torch.full((*z.shape[:-1], width), float("-inf"), device=z.device)
    out[..., ids] = z
    return out


def _map_vocab(z: torch.Tensor, width: int) -> torch.Tensor:
    if z.shape[-1] >= width:
        return z[..., :width]
    pad = torch.full((*z.shape[:-1], width - z.shape[-1]), float("-inf"), device=z.device)
    return torch.cat([z, pad], dim=-1)

