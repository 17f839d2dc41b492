"""Prompt lookup as a proposer: per row an n-gram index over prompt + output (``prompt_lookup``), no model.

Drafts are point masses (q = None): with rule ``exact`` the output is the target's own (greedy) or follows
p_target (sampled). A step without a match proposes nothing and is one plain target forward.
"""
from __future__ import annotations

from mars_bench.decode.proposers.base import Proposal
from mars_bench.decode.proposers.prompt_lookup import NgramIndex


class PromptLookup:
    kind, needs_hidden, forward_s = "chain", False, 0.0

    def __init__(self, k: int, max_ngram: int = 3, min_ngram: int = 1):
        NgramIndex(max_ngram=max_ngram, min_ngram=min_ngram)   # validates the knobs
        self.most, self.rows_hint, self.ngram = k, k + 1, (max_ngram, min_ngram)
        self.index: list[NgramIndex] = []

    @classmethod
    def make(cls, method, drafter, cfg, tree=None) -> "PromptLookup":
        return cls(method.k, **method.options)

    def reset(self, batch_size: int) -> None:
        self.index = [None] * batch_size

    def start(self, row: int, prompt: list[int], hidden=None) -> None:
        self.index[row] = NgramIndex(prompt, max_ngram=self.ngram[0], min_ngram=self.ngram[1])

    def propose(self, rows, most: list[int]) -> list[Proposal]:
        return [Proposal(self.index[b].propose(k) if k > 0 else []) for b, k in enumerate(most)]

    def commit(self, rows, proposals, verdicts, committed, hidden=None) -> None:
        for b, c in enumerate(committed):
            self.index[b].extend(c)

    def select(self, keep: list[int]) -> None:
        self.index = [self.index[b] for b in keep]
