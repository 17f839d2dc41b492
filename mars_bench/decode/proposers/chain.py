"""A small LM drafts a chain of up to k tokens per row, all rows in one draft forward per depth.

d_i ~ q_draft(. | seq, d_<i) (argmax when greedy). Adaptive length (``p_min`` > 0; llama.cpp's server and
transformers' assisted generation ship it): a row stops proposing once the draft's top-1 probability
(softmax of its raw logits) falls below p_min, always proposing at least one. Which drafts are proposed
never depends on the target, so every rule's guarantees (``exact`` lossless) hold for any length.
Cache convention: the draft cache holds the committed sequence but its newest token; after
verification it is rolled back to seq + the accepted drafts.
"""
from __future__ import annotations

import torch

from mars_bench.decode import sampling
from mars_bench.decode.backend import as_backend
from mars_bench.decode.proposers.base import Proposal


class LMChain:
    kind, needs_hidden = "chain", False

    def __init__(self, draft, k: int, p_min: float, cfg):
        if draft is None:
            raise ValueError("method sd needs a draft model")
        self.draft, self.most, self.p_min, self.cfg = as_backend(draft), k, p_min, cfg
        self.rows_hint = k + 1

    @classmethod
    def make(cls, method, drafter, cfg, tree=None) -> "LMChain":
        return cls(drafter, method.k, method.p_min, cfg)

    @property
    def forward_s(self) -> float:
        return self.draft.forward_s

    def reset(self, batch_size: int) -> None:
        self.draft.expect(batch_size)
        self.draft.batch_reset(batch_size)

    def start(self, row: int, prompt: list[int], hidden=None) -> None:
        self.draft.batch_prefill(row, prompt[:-1])

    def propose(self, rows, most: list[int]) -> list[Proposal]:
        """Drafts stay on the draft's device (each fed back as a tensor): no host read unless ``p_min`` > 0."""
        greedy = self.cfg.temperature == 0.0
        lens = self.draft.batch_lens
        feed = [r.seq[lens[b]:] for b, r in enumerate(rows)]
        drafts, q_rows = [[] for _ in rows], [[] for _ in rows]
        live = [k > 0 for k in most]
        while any(live):
            z = self.draft.batch_forward([f if on else [] for f, on in zip(feed, live)])
            for b, r in enumerate(rows):
                if not live[b]:
                    continue
                z_d = z[b][-1]
                if greedy:
                    d = z_d.argmax(-1, keepdim=True)
                else:
                    q = sampling.warp(z_d, self.cfg.temperature, self.cfg.top_p)
                    d = sampling.sample(q, r.gen).reshape(1)
                    q_rows[b].append(q)
                drafts[b].append(d)
                feed[b] = d
                if len(drafts[b]) >= most[b] or (self.p_min > 0 and float(torch.softmax(z_d.float(), -1).max()) < self.p_min):
                    live[b] = False
        return [Proposal(torch.cat(d) if d else [], torch.stack(q) if q else None) for d, q in zip(drafts, q_rows)]

    def commit(self, rows, proposals, verdicts, committed, hidden=None) -> None:
        lens = self.draft.batch_lens
        self.draft.batch_crop([min(lens[b], len(r.seq) + v.n_accepted) for b, (r, v) in enumerate(zip(rows, verdicts))])

    def select(self, keep: list[int]) -> None:
        self.draft.batch_select(keep)
