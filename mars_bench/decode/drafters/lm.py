"""The LM drafter: a small causal LM drafting trees (chains use the adapter directly).

A drafter implements ``prefill(prompt, hidden)``, ``root(seq) -> logits [V] | None`` (feed what the
drafter has not seen of the committed sequence; logits for the root's children),
``expand(tokens, parent_slots) -> logits [n, V]`` (feed n tree nodes in ONE forward, each seeing the
committed prefix, its fed ancestors and itself; node i gets the next slot, parent slot -1 = root) and
``commit(tree, path, committed, hidden)`` (keep only the accepted path), ``expect(n_tokens)`` (a hint: nodes
most expansions feed) and ``fork()`` (own state, same weights). ``LMDrafter`` wraps a small
causal LM behind a ``CausalLMAdapter``; ``eagle3.Eagle3Drafter`` is an EAGLE-3 head.
"""
from __future__ import annotations

import torch

from mars_bench.decode.tree.mask import SlotTree, additive_mask


class LMDrafter:
    """Tree drafting with a small causal LM behind a ``CausalLMAdapter`` (its cache holds committed
    tokens, then the fed tree nodes; ``commit`` keeps the accepted ones, moved down in place)."""
    needs_hidden = False

    def __init__(self, lm):
        self.lm, self._slots = lm, None

    @property
    def forward_s(self) -> float:
        return self.lm.forward_s

    def fork(self) -> "LMDrafter":
        """The same drafter with its own (empty) cache: one per sequence of a batch."""
        return LMDrafter(self.lm.fork())

    def expect(self, n_tokens: int) -> None:
        """Hint: most expansions feed ``n_tokens`` nodes (the small LM's fast path packs for that count)."""
        self.lm.expect(n_tokens)

    def prefill(self, prompt: list[int], hidden=None) -> None:
        self.lm.reset()
        self._slots = None
        if len(prompt) > 1:
            self.lm.forward(prompt[:-1], logits=False)

    def root(self, seq: list[int]):
        z = self.lm.forward(seq[self.lm.cache_len:])[-1]
        self._slots = SlotTree(self.lm.cache_len, len(seq) - 1, self.lm.device)
        return z

    def expand(self, tokens, parent_slots) -> torch.Tensor:
        """Tokens and parent slots: lists, or LongTensors left on the device."""
        allowed, pos = self._slots.add(parent_slots)
        return self.lm.forward(tokens, attention_mask=additive_mask(allowed, getattr(self.lm, "model", None)),
                               position_ids=pos[None])

    def commit(self, tree, path: list[int], committed: list[int], hidden=None) -> None:
        if self._slots is None:
            return
        self.lm.keep(self._slots.base, [tree.slots[j] for j in path if tree.slots[j] >= 0])
        self._slots = None


def as_drafter(draft):
    return draft if hasattr(draft, "expand") else LMDrafter(draft)
