"""The proposer interface (which scheme uses which proposer: ``decode.drafting``).

A proposer keeps per-row drafting state beside the target's batched cache (row b = one sequence):
  start(row, prompt, hidden)       a new sequence takes slot ``row`` (prefill; ``hidden``: the target's
                                   hidden states of the prompt when ``needs_hidden``)
  propose(rows, most) -> [Proposal]  drafts for every row; ``most[b]`` caps a chain's length or a tree's
                                   depth (the budget rule, ``DecodeConfig.draft_len``)
  commit(rows, proposals, verdicts, committed, hidden)   keep what the target accepted
  select(keep)                     rows leave the batch (indices kept, in order)
and reports ``forward_s`` (seconds inside its own forwards); ``make(method, drafter, cfg, tree)`` builds one for
a ``Method`` (``drafter``: the draft LM or head its scheme declares, else None). ``kind`` says how the target scores its
proposals: ``chain`` (causal, verified by ``rules.verify_chain``) or ``tree`` (tree mask, verified by
``tree.verify``). ``q`` is None for point-mass drafts (greedy LM drafts, top-k tree children, prompt
lookup): the rule then tests the draft token itself, as vLLM's ``draft_probs=None``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Proposal:
    tokens: list[int] | torch.Tensor   # drafts in feed order (a chain d_1..d_m, a LongTensor on the draft's
                                       # device when an LM drafted it; a tree: nodes 1..N, BFS)
    q: torch.Tensor | None = None      # chain: q_draft rows [m, V] the drafts were drawn from; None: point masses
    tree: object = None                # tree proposals: the DraftTree (node 0 = the root, seq[-1])


class Proposer(Protocol):
    kind: str                          # chain | tree
    needs_hidden: bool
    most: int                          # a chain's k / a tree's deepest level
    rows_hint: int                     # tokens one target forward scores per row (CPU fast-path hint)
    forward_s: float

    @classmethod
    def make(cls, method, drafter, cfg, tree=None) -> "Proposer": ...
    def reset(self, batch_size: int) -> None: ...
    def start(self, row: int, prompt: list[int], hidden=None) -> None: ...
    def propose(self, rows, most: list[int]) -> list[Proposal]: ...
    def commit(self, rows, proposals, verdicts, committed, hidden=None) -> None: ...
    def select(self, keep: list[int]) -> None: ...
