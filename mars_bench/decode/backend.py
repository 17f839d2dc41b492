"""Backends: what the decoding loop asks of a model and its KV cache, declared once (``Backend``,
``SequenceModel``).

The loop (``engine.decode``) speaks one interface, ``Backend``: a batched cache with per-row lengths
(``batch_reset``, ``batch_prefill``, ``batch_forward``, ``batch_crop``, ``batch_keep``, ``batch_select``,
``batch_lens``, ``expect``). ``models.adapter.CausalLMAdapter`` implements it natively (one forward scores
every row). ``RowByRow`` gives it to any ``SequenceModel`` (``reset``/``forward``/``crop``/``keep``, e.g.
the toy models of the Monte Carlo tests): one fork of the model per row, forwards one row after another.
Implementations subclass the Protocol they implement, and so inherit its defaults (``expect`` does
nothing; ``SequenceModel.fork`` copies the model and empties its state).
"""
from __future__ import annotations

import copy
import os
import time
from typing import Protocol, runtime_checkable

import torch


MEMORY_FRACTION = 0.9     # share of the free device memory a batch's KV caches and logits may take


class SequenceModel(Protocol):
    """One sequence and its KV cache: ``forward`` scores new tokens against the cache (raw logits
    [n, out_vocab]; ``hidden_states=True``: (logits, per-layer hidden states)), ``crop`` rolls the cache back
    to a length, ``keep(start, offsets)`` keeps the first ``start`` cached positions and those at start +
    offsets (a tree's accepted path among the fed nodes; offsets a host list, ascending)."""
    device: torch.device
    out_vocab: int
    forward_s: float          # seconds inside forwards
    cache_len: int            # cached tokens

    def reset(self) -> None: ...

    def forward(self, tokens, attention_mask=None, position_ids=None, logits: bool = True,
                hidden_states: bool = False): ...

    def crop(self, length: int) -> None: ...

    def keep(self, start: int, offsets) -> None: ...

    def expect(self, n_tokens: int) -> None:
        """Hint: most forwards will score ``n_tokens`` tokens (a CPU fast path packs its weights for that
        count). Default: nothing to prepare."""

    def fork(self):
        """A copy with its own empty state (default: a shallow copy, reset)."""
        twin = copy.copy(self)
        twin.reset()
        return twin


@runtime_checkable
class Backend(Protocol):
    """The batched interface of the decoding loop: B rows, each its own sequence in one cache.
    ``batch_prefill(row, tokens, hidden_states)`` makes a row hold a new sequence (scored alone, as at batch
    size 1); ``batch_forward(tokens, trees, hidden_states)``: row b appends its own tokens, a chain or a draft
    tree (raw logits per row); ``batch_crop(lengths)``; ``batch_keep(indices)`` (a tree's accepted path of the
    last forward); ``batch_select(rows)`` (finished rows leave)."""
    device: torch.device
    out_vocab: int
    forward_s: float

    @property
    def batch_lens(self) -> list[int]: ...

    def batch_reset(self, rows: int) -> None: ...

    def batch_prefill(self, row: int, tokens, hidden_states: bool = False): ...

    def batch_forward(self, tokens, trees=None, hidden_states: bool = False): ...

    def batch_crop(self, lengths) -> None: ...

    def batch_keep(self, keep) -> None: ...

    def batch_select(self, rows) -> None: ...

    def expect(self, n_tokens: int) -> None:
        """Hint: most forwards will score ``n_tokens`` tokens per row. Default: nothing to prepare."""


def as_backend(model) -> Backend | None:
    """``model`` itself when it is a ``Backend``, else ``RowByRow(model)`` over a ``SequenceModel``; None
    stays None."""
    if model is None or isinstance(model, Backend):
        return model
    return RowByRow(model)


def tree_inputs(tree, base: int, device, model=None) -> dict:
    """``forward`` keywords scoring a draft tree's tokens after ``base`` cached ones on a single sequence:
    a 4-D additive mask (committed prefix, ancestors, itself) and position ids base + depth."""
    from mars_bench.decode.tree.mask import additive_mask, ancestors

    anc = ancestors(tree.parents, device, tree.max_depth)
    allowed = torch.cat([torch.ones(len(tree.tokens), base, dtype=torch.bool, device=device), anc], 1)
    return {"attention_mask": additive_mask(allowed, model),
            "position_ids": (base + torch.tensor(tree.depths, device=device))[None]}


class RowByRow(Backend):
    """The batched interface over a ``SequenceModel``: a fork per row, scored one by one."""

    def __init__(self, model):
        self.model, self.rows, self.forward_s = model, [], 0.0
        self.device, self.out_vocab = model.device, model.out_vocab
        self._fed: list[tuple[int, int]] = []

    def expect(self, n_tokens: int) -> None:
        self.model.expect(n_tokens)

    def batch_reset(self, rows: int) -> None:
        self.rows = [self.model.fork() for _ in range(rows)]

    @property
    def batch_lens(self) -> list[int]:
        return [r.cache_len for r in self.rows]

    def batch_prefill(self, row: int, tokens, hidden_states: bool = False):
        m = self.rows[row] = self.model.fork()
        if not len(tokens):
            return None
        out = self._timed(m, list(tokens), logits=False, hidden_states=hidden_states)
        return out[1] if hidden_states else None

    def batch_forward(self, tokens, trees=None, hidden_states: bool = False):
        zs, hs, self._fed = [], [], []
        for b, (m, t) in enumerate(zip(self.rows, tokens)):
            tree = trees[b] if trees else None
            self._fed.append((m.cache_len, len(t)))
            if not len(t):
                zs.append(torch.empty(0, self.out_vocab, device=self.device))
                hs.append(None)
                continue
            kw = tree_inputs(tree, m.cache_len, self.device, getattr(m, "model", None)) if tree is not None else {}
            t = t.tolist() if isinstance(t, torch.Tensor) else list(t)    # single-sequence models take ids
            out = self._timed(m, t, hidden_states=hidden_states, **kw)
            z, h = out if hidden_states else (out, None)
            zs.append(z)
            hs.append(h)
        return (zs, hs) if hidden_states else zs

    def batch_crop(self, lengths) -> None:
        for m, n in zip(self.rows, lengths):
            m.crop(n)

    def batch_keep(self, keep) -> None:
        for m, (start, _), idx in zip(self.rows, self._fed, keep):
            m.keep(start, idx)

    def batch_select(self, rows) -> None:
        self.rows = [self.rows[b] for b in rows]

    def _timed(self, m, tokens, **kw):
        t0 = time.perf_counter()
        out = m.forward(tokens, **kw)
        self.forward_s += time.perf_counter() - t0
        return out


def check_memory(models, batch_size: int, tokens_per_row: int, rows_per_forward: int,
                 available: int | dict | None = None) -> None:
    """ValueError (one line, naming the device and the largest batch that fits) when a batch does not fit in
    MEMORY_FRACTION of the free memory of every device it uses: per device, ``batch_size`` rows of
    ``tokens_per_row`` cached tokens in the layers each model keeps there (``kv_bytes_by_device``), grown as
    the cache grows (each model's ``cached_columns``: its buffer's spare columns), plus one
    more row while a prompt's prefill cache is copied into the batch, plus one forward's logits (model output
    and fp32 copy) on the logits' device. ``available``: free bytes (one number for every device, or
    {device: bytes})."""
    cols = max(m.cached_columns(tokens_per_row) for m in models if m is not None)
    gib = 2 ** 30
    for dev, (per_row, once) in memory_need(models, tokens_per_row, rows_per_forward).items():
        free = available.get(dev, 0) if isinstance(available, dict) else available
        free = free if free is not None else free_memory(dev)
        budget = int(free * MEMORY_FRACTION)
        if per_row * batch_size + once <= budget:
            continue
        fits = (budget - once) // per_row if per_row else 0
        raise ValueError(
            f"batch_size={batch_size} needs ~{(per_row * batch_size + once) / gib:.2f} GiB on {dev} (KV cache of "
            f"{tokens_per_row} tokens grown to {cols} columns, logits, a prefill copy: {per_row / 2 ** 20:.1f} MiB "
            f"a row) but {MEMORY_FRACTION:.0%} of its free memory is {budget / gib:.2f} GiB; the largest batch that "
            "fits is " + (f"batch_size={fits}" if fits >= 1 else "none (not even batch_size=1)"))


def memory_need(models, tokens_per_row: int, rows_per_forward: int) -> dict:
    """{device: (bytes per batch row, bytes once)} of ``check_memory``: KV of the layers each model keeps on the
    device over its ``cached_columns(tokens_per_row)`` columns per row, one forward's logits (a row's) on the
    logits' device, and once a row's cache again (the prefill copy)."""
    models = [m for m in models if m is not None]
    need: dict = {}
    for m in models:
        cols = m.cached_columns(tokens_per_row)
        for dev, per_token in m.kv_bytes_by_device().items():
            row = per_token * cols
            per_row, once = need.get(dev, (0, 0))
            need[dev] = (per_row + row, once + row)
    logits = 2 * rows_per_forward * max(m.out_vocab for m in models) * 4     # model output + fp32 copy
    dev = models[0].logits_device
    per_row, once = need.get(dev, (0, 0))
    need[dev] = (per_row + logits, once)
    return need


def free_memory(device: torch.device) -> int:
    """Free bytes on ``device``: CUDA's free memory, else the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
