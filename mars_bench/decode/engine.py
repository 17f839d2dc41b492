"""The decoding loop: every method, every batch size, one loop.

    proposer  how drafts are made (proposers/: LM chain, LM or EAGLE-3 tree, prompt lookup; None = ar)
    rule      how drafts are verified (rules.RULES: exact, mars, ...), on chains and trees alike
    target    the model that decides, behind the batched cache interface (backend.py)

Each row of the batch is one request (a prompt and its seed); batch size 1 is a batch of one. Cache
convention: between steps the target's cache holds every committed token of a row except the newest,
which is fed first in the next forward, so every target forward is one verification step and
tau = new tokens / target forwards (accepted drafts + 1 per step). One step, per row b:

  Draft:   the proposer proposes d_1..d_m (a chain) or a tree of m nodes below the root seq_b[-1],
           capped by the budget rule (``DecodeConfig.draft_len``)
  Target:  ONE batched forward; row b scores [seq_b[-1], d_1..d_m] (a tree: with a tree mask and
           position ids length + depth) -> raw logits z_0..z_m
  Verify:  the rule on row b's logits with row b's own generator (rules.verify_chain: n = first
           rejected position, commit d_1..d_n + a correction / bonus token; tree.verify: the accepted
           path + one token). ``exact`` is lossless (Leviathan et al. 2023; SpecInfer for trees);
           ``mars`` also accepts the target's top-2 when z2/z1 > theta.
  Caches:  row b keeps seq_b + the accepted drafts (crop for chains, ``batch_keep`` for trees) in the
           target and in the proposer; ragged rows commit different counts.
ar is the step with no drafts: commit argmax z_0 (greedy) or a draw from p_target.

Stop and refill: a row stops on EOS, a stop string or the budget (``Stopper``, identical for every
method); ``on_done`` is called at once and may return a follow-up request (the sample's next turn);
else the next queued request takes the slot (prefilled alone, as at batch size 1); with the queue
empty the row leaves. Greedy outputs are token-identical at every batch size (tested); sampled ones
are the same for the same seed up to the float rounding of a batched GEMM.

Timing: a step's wall time is shared equally by its rows and a row's prefill is its own, so the
``wall_s`` of all results sums to the loop's wall time; ``span_s`` (admission to finish) is NOT a
latency of the request alone.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from mars_bench.decode import sampling
from mars_bench.decode.backend import as_backend
from mars_bench.decode.proposers.factory import make_proposer
from mars_bench.decode.rules import get_rule, verify_chain
from mars_bench.decode.tree.verify import verify_greedy, verify_sampled
from mars_bench.decode.types import DecodeConfig, DecodeResult, Method, Stopper


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
        if not req.prompt:
            raise ValueError("empty prompt: at least one token is needed")
        self.req, self.seq, self.stopper = req, list(req.prompt), Stopper(tokenizer, cfg)
        self.res = BatchResult(batch_size=batch_size)
        self.gen = torch.Generator(device=device).manual_seed(req.seed) if cfg.temperature > 0 else None
        self.t_in = time.perf_counter()


class Batch:
    """Rows in flight and what decodes them: the target backend, the proposer, the rule and its settings.
    ``admit`` puts a request in a slot, ``step`` runs one draft-verify-commit step over every row,
    ``select`` keeps some rows; ``decode`` drives it (and tests drive it step by step)."""

    def __init__(self, target, draft, tokenizer, method: Method, cfg: DecodeConfig, batch_size: int, tree=None,
                 rule=None):
        self.rule = (rule or get_rule(method.rule)) if method.speculative else None
        self.settings = self.rule.settings(method.rule_kwargs) if self.rule else {}
        if self.rule:        # before any model is touched
            self.rule.check_mode(method.scheme.shape, cfg.temperature)
        self.proposer = make_proposer(method, draft, cfg, tree)
        self.target, self.tokenizer, self.cfg, self.batch_size = as_backend(target), tokenizer, cfg, batch_size
        self.hidden = bool(self.proposer and self.proposer.needs_hidden)
        self.target.expect(batch_size * (self.proposer.rows_hint if self.proposer else 1))   # the usual row count
        self.target.batch_reset(batch_size)
        if self.proposer:
            self.proposer.reset(batch_size)
        self.rows: list[_Row] = []
        self.last: list = []

    def admit(self, req: Request, slot: int) -> _Row:
        """``req`` takes ``slot`` (== len(rows) to add one): its prompt but the last token is prefilled
        alone, as at batch size 1."""
        row = _Row(req, self.tokenizer, self.cfg, self.target.device, self.batch_size)
        if self.hidden:
            hidden = self.target.batch_prefill(slot, req.prompt[:-1], hidden_states=True)
        else:
            hidden = self.target.batch_prefill(slot, req.prompt[:-1])
        if self.proposer:
            self.proposer.start(slot, req.prompt, hidden)
        row.res.prefill_s = time.perf_counter() - row.t_in
        row.res.wall_s = row.res.prefill_s          # the other rows wait for it: its own share
        if slot == len(self.rows):
            self.rows.append(row)
        else:
            self.rows[slot] = row
        return row

    def select(self, keep: list[int]) -> None:
        """Keep rows ``keep`` (indices, in order): finished rows leave the batch."""
        self.target.batch_select(keep)
        if self.proposer:
            self.proposer.select(keep)
        self.rows = [self.rows[b] for b in keep]

    def step(self) -> list[list[int]]:
        """One step for every row; appends each row's committed tokens to its sequence and result
        (wall and forward time shared equally) and returns them."""
        rows, p = self.rows, self.proposer
        t0, fwd0 = time.perf_counter(), (self.target.forward_s, p.forward_s if p else 0.0)
        committed = self._commit_step()
        share = (time.perf_counter() - t0) / len(rows)
        t_s = (self.target.forward_s - fwd0[0]) / len(rows)
        d_s = ((p.forward_s if p else 0.0) - fwd0[1]) / len(rows)
        for r, new in zip(rows, committed):
            r.res.steps += 1
            r.res.tokens.extend(new)
            r.seq.extend(new)
            r.res.wall_s += share
            r.res.target_s += t_s
            r.res.draft_s += d_s
        return committed

    def _commit_step(self) -> list[list[int]]:
        rows, target, proposer, cfg = self.rows, self.target, self.proposer, self.cfg
        if proposer is None:
            z = target.batch_forward([[r.seq[-1]] for r in rows])
            return [[sampling.next_token(z[b][-1], cfg.temperature, cfg.top_p, r.gen)] for b, r in enumerate(rows)]
        props = proposer.propose(rows, [cfg.draft_len(proposer.most, len(r.res.tokens)) for r in rows])
        trees = [p.tree for p in props] if proposer.kind == "tree" else None
        feeds = [_feed(r.seq[-1], p.tokens, target.device) for r, p in zip(rows, props)]
        out = target.batch_forward(feeds, trees, self.hidden) if trees or self.hidden else target.batch_forward(feeds)
        z, hs = out if self.hidden else (out, None)
        verdicts, committed = [], []
        for b, (r, p) in enumerate(zip(rows, props)):
            v, new = _verify(self.rule, p, z[b], cfg, r.gen, self.settings)
            _audit(r.res, p, v, new)
            verdicts.append(v)
            committed.append(new)
        if trees is None:
            target.batch_crop([len(r.seq) + v.n_accepted for r, v in zip(rows, verdicts)])
        else:
            target.batch_keep([[0] + v.path for v in verdicts])
        proposer.commit(rows, props, verdicts, committed, hs)
        self.last = list(zip(props, verdicts))     # the step's proposals and verdicts, per row (inspection)
        return committed


def decode(target, draft, tokenizer, requests: Iterable[Request], method: Method, cfg: DecodeConfig,
           batch_size: int, on_done: Callable[[Request, BatchResult], Request | None], tree=None,
           rule=None) -> None:
    """Decode every request with at most ``batch_size`` in flight (see the module docstring).
    ``draft``: the draft model (sd, sd_tree) or EAGLE-3 drafter (eagle3); ``tree``: a TreeSpec
    overriding ``method.tree``; ``rule``: a ``Rule`` object used instead of the registered
    ``method.rule`` (an instrumented or unregistered rule; its settings still come from the method)."""
    batch = Batch(target, draft, tokenizer, method, cfg, batch_size, tree, rule)
    queue = iter(requests)
    for slot in range(batch_size):
        req = next(queue, None)
        if req is None:
            break
        batch.admit(req, slot)
    batch.select(list(range(len(batch.rows))))
    while batch.rows:
        starts = [len(r.res.tokens) for r in batch.rows]
        batch.step()
        keep = list(range(len(batch.rows)))
        for b, (r, start) in enumerate(zip(list(batch.rows), starts)):
            stop = r.stopper.cut(r.res.tokens, start)
            if stop is None:
                continue
            del r.res.tokens[stop[0]:]
            r.res.stop_reason = stop[1]
            r.res.span_s = time.perf_counter() - r.t_in
            nxt = on_done(r.req, r.res)
            nxt = nxt if nxt is not None else next(queue, None)
            if nxt is None:
                keep.remove(b)
            else:
                batch.admit(nxt, b)
        if len(keep) < len(batch.rows):
            batch.select(keep)


def _verify(rule, p, z: torch.Tensor, cfg: DecodeConfig, gen, settings: dict):
    """(verdict, committed tokens) of one row's proposal against its logits."""
    if p.tree is None:
        d = torch.as_tensor(p.tokens, dtype=torch.long).to(z.device)
        v = verify_chain(rule, d, z, p.q, cfg.temperature, cfg.top_p, gen, **settings)
        return v, v.accepted_tokens + [v.next_token]
    if cfg.temperature == 0.0:
        v = verify_greedy(rule, p.tree, z, **settings)
    else:
        v = verify_sampled(rule, p.tree, z, cfg.temperature, cfg.top_p, gen, **settings)
    return v, [p.tree.tokens[j] for j in v.path] + [v.next_token]


def _feed(last: int, drafts, device):
    """What the target scores for a row: its newest token, then the drafts (a list, or a tensor left on the device)."""
    if isinstance(drafts, torch.Tensor):
        return torch.cat([torch.tensor([last], dtype=torch.long, device=device), drafts.to(device)])
    return [last] + drafts


def _audit(res: DecodeResult, p, v, committed) -> None:
    """Per step: drafts proposed and accepted (trees: nodes, path length, deepest draft), then per
    verified draft of the committed path z1, z2, outcome (A standard, R lenient, X when the path ended
    in a rejection) and one entry per lenient acceptance: which rule and clause accepted which draft,
    with the logits it used."""
    start = len(res.tokens)
    if p.tree is None:
        res.proposed.append(len(p.tokens))
        res.accepted.append(v.n_accepted)
        rejected_end = v.n_accepted < len(p.tokens)
    else:
        res.proposed.append(p.tree.size)
        res.accepted.append(len(v.path))
        res.depth_proposed.append(p.tree.max_depth)
        rejected_end = v.rejected_end
    res.z1.extend(v.z1)
    res.z2.extend(v.z2)
    res.outcome += "".join("A" if c is None else "R" for c in v.clause) + ("X" if rejected_end else "")
    for i, c in enumerate(v.clause):
        if c is not None:
            res.relaxed.append({"pos": start + i, "depth": i + 1, "draft": committed[i], "rule": v.rule,
                                "clause": c, "top1": v.top1[i], "top2": v.top2[i],
                                "z1": v.z1[i], "z2": v.z2[i]})

