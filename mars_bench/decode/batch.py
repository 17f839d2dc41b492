"""Batched chain decoding: ``ar`` and ``sd`` with any chain rule, B sequences at once, continuous refill.

Each row of the batch is one request (a prompt and its seed) decoded exactly as ``chain.generate_chain``
decodes it alone: the same drafts, the same verification (``rules.verify_chain`` on the row's own
logits), the same random draws from the row's own ``torch.Generator`` in the same order, the same
stop conditions. Only the model forwards are shared: one draft forward per draft depth and one target
forward per step score every row at once, each row appending its own number of tokens to one batched
KV cache (``CausalLMAdapter.batch_*``: per-row lengths, masks, position ids, compaction). So greedy
output is token-identical to batch size 1, and sampled output is the same for the same seed (up to the
float rounding of a batched GEMM, which no test here has seen change a token).

Ragged acceptance: row b commits its own n_b + 1 tokens per step and its caches are rolled back to
its own length. Continuous refill: when a row stops (EOS, stop string, budget), ``on_done`` is called
at once (so its record can be written) and may return a follow-up request (the sample's next turn);
else the next queued request takes the slot; with the queue empty the row leaves the batch.

Timing: a step's wall time is shared equally by the rows in it, and a row's prefill is its own, so the
``wall_s`` of all results sums to the wall time of the whole loop and tokens / sum(wall_s) is the run's
throughput; ``span_s`` (admission to finish) is NOT a latency of the request alone.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from . import sampling
from .chain import expect, record_verdict
from .rules import Rule, verify_chain
from .types import DecodeConfig, DecodeResult, Method, Stopper

MEMORY_FRACTION = 0.9     # share of the free device memory a batch's KV caches and logits may take


@dataclass
class Request:
    prompt: list[int]
    seed: int = 0
    key: Any = None           # the caller's handle (sample, turn), passed back to on_done


@dataclass
class BatchResult(DecodeResult):
    span_s: float = 0.0       # admission to finish, shared with the other rows: not a latency
    batch_size: int = 1       # the batch size of the run (rows in flight at most)


class _Row:
    """One request in flight: its committed sequence, result, stop conditions and generator."""

    def __init__(self, req: Request, tokenizer, cfg: DecodeConfig, device, batch_size: int):
        self.req, self.seq, self.stopper = req, list(req.prompt), Stopper(tokenizer, cfg)
        self.res = BatchResult(batch_size=batch_size)
        self.gen = torch.Generator(device=device).manual_seed(req.seed) if cfg.temperature > 0 else None
        self.t_in = time.perf_counter()


def generate_batch(target, draft, tokenizer, requests: Iterable[Request], method: Method, cfg: DecodeConfig,
                   batch_size: int, on_done: Callable[[Request, BatchResult], Request | None],
                   rule: Rule | None = None, settings: dict | None = None) -> None:
    """Decode every request with at most ``batch_size`` in flight (see the module docstring)."""
    if method.name not in ("ar", "sd"):
        raise ValueError(f"batched decoding is for chains (ar, sd); method={method.name} runs at batch size 1")
    spec, settings = method.speculative, settings or {}
    if spec and rule is None:
        from .rules import get_rule

        rule = get_rule(method.rule)
        settings = rule.settings(method.rule_kwargs)
    if rule is not None:
        rule.check_mode("chain", cfg.temperature)
    models = [target, draft] if spec else [target]
    queue = iter(requests)
    expect(target, batch_size * (method.k + 1 if spec else 1))   # CPU fast path: the usual row count
    if spec:
        expect(draft, batch_size)
    rows: list[_Row] = []
    for m in models:
        m.batch_reset(batch_size)
    for slot in range(batch_size):
        req = next(queue, None)
        if req is None:
            break
        rows.append(_admit(req, slot, models, tokenizer, cfg, batch_size))
    for m in models:
        m.batch_select(list(range(len(rows))))
    while rows:
        t0, fwd0 = time.perf_counter(), [m.forward_s for m in models]
        if spec:
            committed = _speculative_step(target, draft, rows, method, rule, cfg, settings)
        else:
            z = target.batch_forward([[r.seq[-1]] for r in rows])
            committed = [[sampling.next_token(z[b][-1], cfg.temperature, cfg.top_p, r.gen)] for b, r in enumerate(rows)]
        share, fwd = (time.perf_counter() - t0) / len(rows), [(m.forward_s - f) / len(rows) for m, f in zip(models, fwd0)]
        finished = []
        for b, (r, new) in enumerate(zip(rows, committed)):
            start = len(r.res.tokens)
            r.res.steps += 1
            r.res.tokens.extend(new)
            r.seq.extend(new)
            r.res.wall_s += share
            r.res.target_s += fwd[0]
            r.res.draft_s += fwd[1] if spec else 0.0
            stop = r.stopper.cut(r.res.tokens, start)
            if stop is not None:
                del r.res.tokens[stop[0]:]
                r.res.stop_reason = stop[1]
                finished.append(b)
        keep = list(range(len(rows)))
        for b in finished:
            r = rows[b]
            r.res.span_s = time.perf_counter() - r.t_in
            nxt = on_done(r.req, r.res)
            nxt = nxt if nxt is not None else next(queue, None)
            if nxt is None:
                keep.remove(b)
            else:
                rows[b] = _admit(nxt, b, models, tokenizer, cfg, batch_size)
        if len(keep) < len(rows):
            for m in models:
                m.batch_select(keep)
            rows = [rows[b] for b in keep]


def _admit(req: Request, slot: int, models, tokenizer, cfg: DecodeConfig, batch_size: int) -> _Row:
    """A new request takes ``slot``: prefill everything but its last prompt token, alone (as at B = 1)."""
    if not req.prompt:
        raise ValueError("empty prompt: at least one token is needed")
    row = _Row(req, tokenizer, cfg, models[0].device, batch_size)
    for m in models:
        m.batch_prefill(slot, req.prompt[:-1])
    row.res.prefill_s = time.perf_counter() - row.t_in
    row.res.wall_s = row.res.prefill_s          # the other rows wait for it: its own share
    return row


def _speculative_step(target, draft, rows: list[_Row], method: Method, rule: Rule, cfg: DecodeConfig,
                      settings: dict) -> list[list[int]]:
    """One draft-then-verify step for every row at once; returns each row's committed tokens.

    Per row b, exactly ``chain.speculative_step`` on its own sequence seq_b:
    Draft:  d_1..d_m ~ q_draft(. | seq_b), m = m_b <= k_b = min(k, budget left - 1), or k under the
            after_step budget rule (``_draft_batch``)
    Target: one batched forward; row b scores [seq_b[-1], d_1..d_m] -> raw logits z_0..z_m of its own
    Verify: ``verify_chain`` on row b's z and q with row b's generator: n_b accepted drafts, then the
            correction / bonus token. Rows commit different counts (ragged acceptance).
    Caches: row b of both caches is rolled back to seq_b + d_1..d_n (the newest token is fed next step).
    """
    ks = [cfg.draft_len(method.k, len(r.res.tokens)) for r in rows]   # exact: budget left - 1; after_step: k
    drafts, qs = _draft_batch(draft, rows, ks, cfg, method.p_min)
    z = target.batch_forward([[r.seq[-1]] + d for r, d in zip(rows, drafts)])
    out, t_len, d_len = [], [], []
    draft_lens = draft.batch_lens
    for b, r in enumerate(rows):
        d = torch.tensor(drafts[b], dtype=torch.long, device=z[b].device)
        v = verify_chain(rule, d, z[b], qs[b], cfg.temperature, cfg.top_p, r.gen, **settings)
        committed = drafts[b][: v.n_accepted] + [v.next_token]
        r.res.proposed.append(len(drafts[b]))
        r.res.accepted.append(v.n_accepted)
        record_verdict(r.res, v, len(r.res.tokens), committed, v.n_accepted < len(drafts[b]))
        t_len.append(len(r.seq) + v.n_accepted)
        d_len.append(min(draft_lens[b], len(r.seq) + v.n_accepted))
        out.append(committed)
    target.batch_crop(t_len)
    draft.batch_crop(d_len)
    return out


def _draft_batch(draft, rows: list[_Row], ks: list[int], cfg: DecodeConfig, p_min: float):
    """``chain.draft_chain`` for every row at once: one draft forward per depth, rows that are done
    (k_b reached, or p_min > 0 and the draft's top-1 probability fell below it) feed nothing."""
    greedy = cfg.temperature == 0.0
    lens = draft.batch_lens
    feed = [r.seq[lens[b]:] for b, r in enumerate(rows)]
    drafts, q_rows = [[] for _ in rows], [[] for _ in rows]
    live = [k > 0 for k in ks]
    while any(live):
        z = draft.batch_forward([f if on else [] for f, on in zip(feed, live)])
        for b, r in enumerate(rows):
            if not live[b]:
                continue
            z_d = z[b][-1]
            if greedy:
                d = int(z_d.argmax(-1))
            else:
                q = sampling.warp(z_d, cfg.temperature, cfg.top_p)
                d = int(sampling.sample(q, r.gen))
                q_rows[b].append(q)
            drafts[b].append(d)
            feed[b] = [d]
            if len(drafts[b]) >= ks[b] or (p_min > 0 and float(torch.softmax(z_d.float(), -1).max()) < p_min):
                live[b] = False
    return drafts, [torch.stack(q) if q else None for q in q_rows]


def check_memory(models, batch_size: int, tokens_per_row: int, rows_per_forward: int,
                 available: int | None = None) -> None:
    """ValueError (one line, naming the largest batch that fits) when ``batch_size`` rows of
    ``tokens_per_row`` cached tokens in every model, plus one forward's logits, exceed
    MEMORY_FRACTION of the free memory of the target's device (``available`` bytes, if given)."""
    models = [m for m in models if m is not None]
    device = models[0].device
    free = available if available is not None else free_memory(device)
    kv = sum(m.kv_bytes_per_token() for m in models) * (tokens_per_row + _slack())
    logits = 2 * rows_per_forward * max(m.out_vocab for m in models) * 4    # model output + fp32 copy
    per_row = kv + logits
    budget = int(free * MEMORY_FRACTION)
    if per_row * batch_size <= budget:
        return
    fits = budget // per_row
    gib = 2 ** 30
    raise ValueError(
        f"batch_size={batch_size} needs ~{per_row * batch_size / gib:.2f} GiB (KV cache of {tokens_per_row} tokens "
        f"and logits per row, {per_row / 2 ** 20:.1f} MiB a row) but {MEMORY_FRACTION:.0%} of the free "
        f"{device.type} memory is {budget / gib:.2f} GiB; the largest batch that fits is "
        + (f"batch_size={fits}" if fits >= 1 else "none (not even batch_size=1)"))


def _slack() -> int:
    from ..models.adapter import COMPACT_SLACK

    return COMPACT_SLACK


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
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
