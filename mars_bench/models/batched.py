"""The adapter's batched cache: the ``batch_*`` methods of ``decode.backend.Backend`` the decoding loop
(``decode.engine``) uses, one cache for the whole batch.

``batch_reset`` (B empty rows), ``batch_prefill`` (a row's new prompt, scored alone exactly as at batch size 1),
``batch_forward`` (each row appends its own number of tokens; the scoring runs on the path ``models.forward.choose``
picks), ``batch_crop`` (each row rolled back to its own length), ``batch_keep`` (a tree's accepted path) and
``batch_select`` (drop finished rows).
Layout (``models.kvcache.RowCache``): every layer keeps a preallocated buffer [B, heads, capacity, dim]; row b
holds its committed tokens at columns 0 .. len_b - 1, the lengths kept on the host (``blens``: no device read,
each would be a sync on CUDA). A forward writes row b's n new tokens at ITS columns len_b .. len_b + n - 1 and
lets the row see only its own columns (``models.forward.eager``). So a crop only lowers len_b (the columns above
are overwritten by the next write), a tree's accepted path moves within the row's tail (a few columns), and
nothing is ever gathered to compact the cache. Rows leaving the batch keep the buffer: the rows behind a gap move
down into it (the one copy, of those rows only) and the layers show fewer rows.
"""
from __future__ import annotations

import torch

from mars_bench.decode.backend import Backend
from mars_bench.models.forward import choose


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

    def batch_layers(self) -> list:
        """The batched cache's layers that hold tensors."""
        return [layer for layer in self.bcache.layers if layer.is_initialized]

    def show_batch(self) -> None:
        """Every held layer shows the batch's width (``batch_width``)."""
        for layer in self.batch_layers():
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
            self.show_batch()
            return None
        self.reset()
        out = self.forward(tokens, logits=False, hidden_states=hidden_states)
        rows = self.batch_rows
        for bl, sl in zip(self.bcache.layers, self.cache.layers):
            k, v = sl.keys, sl.values
            bl.hold(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1), self.batch_width)
            bl._kbuf[row, :, :n] = k[0]
            bl._vbuf[row, :, :n] = v[0]
        self.show_batch()
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
        rows, n = self.batch_rows, max((len(t) for t in tokens), default=0)
        if len(tokens) != rows:
            raise ValueError(f"batch_forward got {len(tokens)} rows; the batched cache has {rows}")
        if n == 0:
            empty = [torch.empty(0, self.out_vocab, device=self.device) for _ in tokens]
            return (empty, [None] * rows) if hidden_states else empty
        held, counts = list(self.blens), [len(t) for t in tokens]
        path = choose(self, self.batch_width, n, batched=True, hidden_states=hidden_states)
        self._fed = (held, counts)
        self.blens = [h + c for h, c in zip(held, counts)]
        return path.batch_forward(self, tokens, held, trees, hidden_states)

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
            on = per_device(torch.tensor(moved, dtype=torch.long))
            for layer in self.batch_layers():
                layer.move(*on(layer.keys.device))
        self.show_batch()

    @torch.inference_mode()
    def batch_crop(self, lengths: list[int]) -> None:
        """Roll row b back to its first ``lengths[b]`` committed tokens (its columns above are free)."""
        self.blens = [min(h, length) for h, length in zip(self.blens, lengths)]
        self.show_batch()

    @torch.inference_mode()
    def batch_select(self, rows: list[int]) -> None:
        """Keep only these rows (by index, in this order): finished rows leave the batch. The buffers stay;
        a kept row whose slot changes is copied into its new slot (its committed columns only: the one copy),
        and the layers show the first len(rows) rows."""
        moved = [(i, r) for i, r in enumerate(rows) if i != r]
        if moved:
            dst, src = (torch.tensor(x, dtype=torch.long) for x in zip(*moved))
            width = max(self.blens[r] for _, r in moved)
            on_src, on_dst = per_device(src), per_device(dst)
            for layer in self.batch_layers():
                layer.move_rows(on_src(layer.keys.device), on_dst(layer.keys.device), width)
        self.blens = [self.blens[r] for r in rows]
        self._fed = tuple([x[r] for r in rows] for x in self._fed)
        for layer in self.batch_layers():
            layer.rows = len(rows)
        self.show_batch()


def per_device(index: torch.Tensor):
    """``on(device)``: ``index`` on that device, copied once per device (a sharded model's layers live on several)."""
    copies = {index.device: index}

    def on(device: torch.device) -> torch.Tensor:
        if device not in copies:
            copies[device] = index.to(device)
        return copies[device]
    return on
