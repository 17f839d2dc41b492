"""One adapter over Hugging Face causal LMs: all KV-cache plumbing lives here.

A single sequence (``decode.backend.SequenceModel``, what tree drafters use) is scored with ``forward``
(n new tokens against the cache, raw logits), rolled back with ``crop`` (to a committed length) and
narrowed with ``keep(start, offsets)`` (a tree's accepted path: its columns moved down in place, the prefix
untouched). Tree drafts pass a 4-D attention mask and per-token position ids through the same ``forward``.

The decoding loop (``decode.engine``) uses a second cache, one for the whole batch, through the
``batch_*`` methods of ``decode.backend.Backend``: ``batch_reset`` (B empty rows), ``batch_prefill`` (a
row's new prompt, scored alone exactly as at batch size 1), ``batch_forward`` (each row appends its own
number of tokens), ``batch_crop`` (each row rolled back to its own length), ``batch_keep`` (a tree's
accepted path) and ``batch_select`` (drop finished rows).
Layout (``models.kvcache.RowCache``): every layer keeps a preallocated buffer [B, heads, capacity, dim]; row b
holds its committed tokens at columns 0 .. len_b - 1, the lengths kept on the host (``blens``: no device read,
each would be a sync on CUDA). A forward writes row b's n new tokens (padded to the longest feed) at ITS
columns len_b .. len_b + n - 1, at positions len_b + i, and the layers show max(len_b) + n columns; the
attention mask, built on the device from the lengths, lets row b see its columns below len_b and its own new
tokens (causal, or a draft tree's ancestors), never another row's columns. So a crop only lowers len_b (the
columns above are overwritten by the next write), a tree's accepted path moves within the row's tail (a few
columns), and nothing is ever gathered to compact the cache. Rows leaving the batch keep the buffer: the
rows behind a gap move down into it (the one copy, of those rows only) and the layers show fewer rows.

Fixed shapes (``fixed_shape``, set where ``model.capture`` is on): a batched forward's cache views and mask
span ``fixed_columns(max(len_b) + n)`` columns (a power of two, at least ``FIXED_MIN``) instead of exactly
max(len_b) + n, every row masked by its length as above, and rows that left the batch are still fed (nothing);
a single sequence's forwards of a few tokens (a tree draft's expansions) likewise write at the cache's width
and attend over ``fixed_columns`` columns (its cache a one-row ``RowCache``). The forwards of a decode then
take a few shapes (rows x fed tokens x a width that changes O(log length) times), not one per token, so each
can be captured once (CUDA graphs) and replayed; prefills stay as they are. The masked columns add attention
work, never weight reads.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import time

import torch

from mars_bench.decode.backend import Backend, SequenceModel
from mars_bench.decode.tree.mask import additive, ancestors

FIXED_MIN = 256          # fixed shapes: the narrowest cache view a batched forward attends over
FUSED_MAX = 32           # single-sequence forwards of at most this many tokens take the fused path (not prefill)
PAD_ID = 0               # batched forwards: the id fed in padding slots (masked out, its logits unused)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}; allowed: fp32, bf16, fp16")
    return DTYPES[name]


def fixed_columns(columns: int) -> int:
    """Columns a fixed-shape forward's cache views span to hold ``columns``: the next power of two, at least
    ``FIXED_MIN``."""
    return max(FIXED_MIN, 1 << (columns - 1).bit_length())


class BatchCacheMixin(Backend):
    """The batched cache (see the module docstring); mixed into ``CausalLMAdapter``."""

    @torch.inference_mode()
    def batch_reset(self, rows: int) -> None:
        from mars_bench.models.kvcache import RowCache

        self.bcache = RowCache(config=self.model.config)
        self.blens: list[int] = [0] * rows       # committed tokens per row: its columns 0 .. len - 1
        self._fed: tuple[list[int], list[int]] = ([0] * rows, [0] * rows)   # the last forward: lengths before, counts
        self.fixed_rows = rows                   # fixed shapes: rows every batched forward feeds

    @property
    def batch_rows(self) -> int:
        return len(self.blens)

    @property
    def batch_width(self) -> int:
        """Columns the cache tensors show between forwards: the longest row."""
        return max(self.blens, default=0)

    @property
    def batch_lens(self) -> list[int]:
        """Committed tokens cached per row (from the host copy: no device read)."""
        return list(self.blens)

    def _layers(self):
        return [layer for layer in self.bcache.layers if layer.is_initialized]

    def _show(self) -> None:
        for layer in self._layers():
            layer.show(self.batch_width)

    @torch.inference_mode()
    def batch_prefill(self, row: int, tokens, hidden_states: bool = False):
        """Make ``row`` hold ``tokens`` only (a new sequence). They are scored alone, on the single-sequence
        cache, as ``forward(tokens, logits=False)`` does at batch size 1, then copied into the row's columns
        0 .. n - 1. ``hidden_states=True`` returns the forward's per-layer hidden states (None for no tokens)."""
        if not 0 <= row < self.batch_rows:
            raise ValueError(f"batch_prefill row={row}; the batched cache has rows 0..{self.batch_rows - 1}")
        tokens = list(tokens)
        n = self.blens[row] = len(tokens)
        if not tokens:
            self._show()
            return None
        self.reset()
        out = self.forward(tokens, logits=False, hidden_states=hidden_states)
        rows = self.batch_rows
        for bl, sl in zip(self.bcache.layers, self.cache.layers):
            k, v = sl.keys, sl.values
            bl.hold(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1), self.batch_width)
            bl._kbuf[row, :, :n] = k[0]
            bl._vbuf[row, :, :n] = v[0]
        self._show()
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
        held, width = list(self.blens), self.batch_width
        self._fed = (held, counts)
        self.blens = [h + c for h, c in zip(held, counts)]
        if self.fused is not None and width and not hidden_states:
            return self._fused_forward(tokens, held, trees)
        tree_rows = any(t is not None for t in (trees or []))
        fed = tokens
        if self.fixed_shape and rows < self.fixed_rows:   # rows that left feed nothing: the row count stays fixed
            extra = self.fixed_rows - rows
            fed, held, counts = list(tokens) + [[]] * extra, held + [0] * extra, counts + [0] * extra
            trees, rows = (None if trees is None else list(trees) + [None] * extra), self.fixed_rows
        lens = torch.tensor(held, device=self.device)
        ids = _padded_ids(fed, n, self.device)
        count = torch.tensor(counts, device=self.device)
        new_ok = torch.arange(n, device=self.device)[None] < count[:, None]                # [B, n]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        own = (causal[None] & new_ok[:, None, :]).clone()                                 # real new tokens
        offset = torch.arange(n, device=self.device)[None].expand(rows, n).clone()
        for b, tree in enumerate(trees or []):
            if tree is not None and len(fed[b]):
                m = len(fed[b])
                own[b, :m, :m] = ancestors(tree.parents[:m], self.device, max(tree.depths[:m]))
                offset[b, :m] = torch.tensor(tree.depths[:m], device=self.device)
        own |= torch.eye(n, dtype=torch.bool, device=self.device)[None]                  # padding sees itself: no empty row
        at = lens[:, None] + torch.arange(n, device=self.device)[None]                     # [B, n]: each row's own columns
        view = fixed_columns(width + n) if self.fixed_shape else width + n                 # columns the layers show
        layers = self._layers() if self.fixed_shape else []     # eager: the layers already show the live rows
        held = bool(layers) and len(layers) == len(self.bcache.layers)
        for layer in layers:
            layer.rows = rows                      # the left rows' slots too
            if held:                               # room made before the forward: nothing in it to trace but writes
                layer.reserve(rows, view)
        self.bcache.aim(at, view, held)
        kwargs = {self._cache_kw: self.bcache, "use_cache": True, "position_ids": lens[:, None] + offset}
        if rows > 1 or tree_rows or self.fixed_shape:   # one chain row: the causal default, as a single sequence
            allowed = _row_mask(own, lens, view)                                           # [B, n, view]
            kwargs["attention_mask"] = {"full_attention": additive(allowed, self.model)[:, None]}
        if hidden_states:
            kwargs["output_hidden_states"] = True
        try:
            with self._timed():
                out = self.step_model(input_ids=ids, **kwargs)
                z = out.logits.float()
        finally:
            self.bcache.aim(None)
            for layer in layers:
                layer.rows = self.batch_rows
        self._show()
        z = self._widen_logits(z)
        zs = [z[b, : len(t)] for b, t in enumerate(tokens)]
        if not hidden_states:
            return zs
        return zs, [tuple(h[b:b + 1, : len(t)] for h in out.hidden_states) for b, t in enumerate(tokens)]

    def _fused_forward(self, tokens: list[list[int]], held: list[int], trees: list | None):
        """``batch_forward`` through ``self.fused`` (models/fused.py): token i of row b at cache column len_b + i;
        a chain's at position len_b + i attending to the row's columns 0 .. len_b + i, a tree's at position
        len_b + depth_i attending to the row's ``len_b`` committed columns, its ancestors and itself."""
        ids, rows, cols, pos, keys = [], [], [], [], []
        for b, t in enumerate(tokens):
            if not len(t):
                continue
            t = t.tolist() if isinstance(t, torch.Tensor) else list(t)     # the fused path runs on the CPU
            tree = trees[b] if trees else None
            ids += t
            rows += [b] * len(t)
            cols += range(held[b], held[b] + len(t))
            if tree is None:
                pos += range(held[b], held[b] + len(t))
                keys += _chain_keys(held[b], len(t))
            else:
                pos += [held[b] + d for d in tree.depths[:len(t)]]
                keys += _tree_keys(held[b], tree.parents[:len(t)])
        ids, pos, rows, cols = (torch.tensor(x, device=self.device) for x in (ids, pos, rows, cols))
        with self._timed():
            z = self.fused.forward(self.bcache, ids, pos, rows, cols, *_flat(keys), self.batch_rows, max(self.blens))
        self._show()
        z = self._widen_logits(z)
        parts, at = [], 0
        for t in tokens:
            parts.append(z[at:at + len(t)])
            at += len(t)
        return parts

    @torch.inference_mode()
    def batch_keep(self, keep: list[list[int]]) -> None:
        """Of the tokens the last ``batch_forward`` fed, row b keeps only those at indices ``keep[b]``
        (ascending; a tree's accepted path): they move down to the row's columns len_b, len_b + 1, ... (only
        the ones whose place changes; the row's committed columns are untouched)."""
        held, counts = self._fed
        if len(keep) != self.batch_rows:
            raise ValueError(f"batch_keep got {len(keep)} rows; the batched cache has {self.batch_rows}")
        moved = [[], [], []]                      # row, source column, destination column
        for b, (idx, start, n) in enumerate(zip(keep, held, counts)):
            idx = list(idx)
            if any(not 0 <= i < n for i in idx) or idx != sorted(set(idx)):
                raise ValueError(f"batch_keep row {b}: indices {idx}; allowed: ascending, among the {n} fed")
            for k, i in enumerate(idx):
                if i != k:
                    moved[0].append(b)
                    moved[1].append(start + i)
                    moved[2].append(start + k)
            self.blens[b] = start + len(idx)
        if moved[0]:
            on = _per_device(torch.tensor(moved, dtype=torch.long))
            for layer in self._layers():
                layer.move(*on(layer.keys.device))
        self._show()

    @torch.inference_mode()
    def batch_crop(self, lengths: list[int]) -> None:
        """Roll row b back to its first ``lengths[b]`` committed tokens (its columns above are free)."""
        self.blens = [min(h, length) for h, length in zip(self.blens, lengths)]
        self._show()

    @torch.inference_mode()
    def batch_select(self, rows: list[int]) -> None:
        """Keep only these rows (by index, in this order): finished rows leave the batch. The buffers stay;
        a kept row whose slot changes is copied into its new slot (its committed columns only: the one copy),
        and the layers show the first len(rows) rows."""
        moved = [(i, r) for i, r in enumerate(rows) if i != r]
        if moved:
            dst, src = (torch.tensor(x, dtype=torch.long) for x in zip(*moved))
            width = max(self.blens[r] for _, r in moved)
            on_src, on_dst = _per_device(src), _per_device(dst)
            for layer in self._layers():
                layer.move_rows(on_src(layer.keys.device), on_dst(layer.keys.device), width)
        self.blens = [self.blens[r] for r in rows]
        self._fed = tuple([x[r] for r in rows] for x in self._fed)
        for layer in self._layers():
            layer.rows = len(rows)
        self._show()

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


class CausalLMAdapter(BatchCacheMixin, SequenceModel):
    """Wraps a ``transformers`` causal LM with its own KV cache (batch size 1), and a second, batched
    cache with per-row lengths for the decoding loop (the ``batch_*`` methods of ``decode.backend.Backend``).

    ``out_vocab``: width of the returned logits. A draft whose embedding matrix is padded to a
    different size than the target's is mapped onto the target's vocabulary: extra columns dropped,
    missing ones filled with -inf (the tokenizers were checked equal over the shared ids).
    ``vocab_ids``: a draft whose LM head scores only these ids (``model.draft_vocab``, ascending; the
    head's row i is id ``vocab_ids[i]``): its logits are scattered into ``out_vocab`` columns, the others -inf.
    ``fixed_shape``: batched forwards over cache views of a few fixed widths (see the module docstring).
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
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache = None
        self.bcache = None                      # the batched cache (a RowCache)
        self.blens: list[int] = []              # its rows' lengths, on the host
        self.fused = None         # a models.fused.FusedDecoder: decoding forwards in one C call per layer
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
        moves = _per_device(torch.tensor([[0] * len(moved), [s for s, _ in moved], [d for _, d in moved]],
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
                kept = _per_device(torch.tensor(list(range(start)) + [start + o for o in offsets], dtype=torch.long))
            layer.keys = layer.keys.index_select(-2, kept(layer.keys.device))
            layer.values = layer.values.index_select(-2, kept(layer.values.device))

    def set_fixed_shape(self, on: bool) -> None:
        """Fixed-shape forwards on or off (see the module docstring); the single-sequence cache starts empty."""
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
            at = torch.arange(width, width + n, device=self.device)
            with self._timed():
                z = self.fused.forward(self.cache, ids[0], at, torch.zeros_like(at), at, *_flat(_chain_keys(width, n)),
                                       1, width + n)
            return self._widen_logits(z)
        if self.fixed_shape and width and n <= FUSED_MAX:
            return self._fixed_forward(ids, attention_mask, position_ids, logits, hidden_states)
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


    def _fixed_forward(self, ids, attention_mask, position_ids, logits: bool, hidden_states: bool):
        """``forward`` of a few tokens at fixed shapes (a tree draft's expansions, a chain's catch-up): the new
        tokens written at the cache's columns width .. width + n - 1 (``RowCache``, one row), the views and the
        mask spanning ``fixed_columns(width + n)`` columns, the columns above the new ones masked; then the
        views show the width + n columns held."""
        n, width = ids.shape[1], self.cache_len
        view = fixed_columns(width + n)
        if attention_mask is None:                          # causal: token i sees columns 0 .. width + i
            cols = torch.arange(width + n, device=self.device)
            attention_mask = additive(cols[None] <= width + torch.arange(n, device=self.device)[:, None],
                                       self.model)[None, None]
        pad = view - attention_mask.shape[-1]
        masked = False if attention_mask.dtype == torch.bool else torch.finfo(attention_mask.dtype).min
        mask = torch.nn.functional.pad(attention_mask, (0, pad), value=masked)
        if position_ids is None:
            position_ids = torch.arange(width, width + n, device=self.device)[None]
        layers = [layer for layer in self.cache.layers if layer.is_initialized]
        for layer in layers:
            layer.reserve(1, view)
        self.cache.aim(torch.arange(width, width + n, device=self.device)[None], view, held=True)
        kwargs = {self._cache_kw: self.cache, "use_cache": True, "attention_mask": {"full_attention": mask},
                  "position_ids": position_ids.to(self.device)}
        if not logits:
            kwargs["logits_to_keep"] = 1
        if hidden_states:
            kwargs["output_hidden_states"] = True
        try:
            with self._timed():
                out = self.step_model(input_ids=ids, **kwargs)
                z = out.logits[0].float() if logits else None
        finally:
            self.cache.aim(None)
            for layer in layers:
                layer.show(width + n)
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


def _chain_keys(length: int, n: int) -> list[torch.Tensor]:
    """Cache columns each of a row's n new chain tokens attends to: the row's ``length`` cached columns, then
    its new columns length .. length + i (token i and the ones before it)."""
    return [torch.arange(length + i + 1) for i in range(n)]


def _tree_keys(length: int, parents: list[int]) -> list[torch.Tensor]:
    """Cache columns each of a row's new tree tokens attends to: the row's ``length`` cached columns, then the
    columns length + j of its ancestors j among the new tokens (``parents``: -1 = the committed sequence) and
    its own, ascending."""
    out = []
    for i in range(len(parents)):
        path, j = [], i
        while j >= 0:
            path.append(length + j)
            j = parents[j]
        out.append(torch.cat([torch.arange(length), torch.tensor(path[::-1])]))
    return out


def _row_mask(own: torch.Tensor, lens: torch.Tensor, width: int) -> torch.Tensor:
    """Bool [B, n, width]: query i of row b sees the row's columns below ``lens[b]`` and, among its new columns
    lens[b] + j (j < n), those ``own[b, i, j]`` allows."""
    rows, n = own.shape[:2]
    rel = torch.arange(width, device=own.device)[None] - lens[:, None]                   # [B, W]: column - len_b
    new = (rel >= 0) & (rel < n)
    mine = own.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(rows, n, width))       # own[b, i, rel]
    return (rel < 0)[:, None, :] | (mine & new[:, None, :])


def _flat(keys: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(all key columns, offsets [M + 1]) for ``FusedDecoder.forward``."""
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

