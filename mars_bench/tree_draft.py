"""Drafters for tree decoding, and the 4-D tree attention mask they and the target share.

A drafter implements ``prefill(prompt, hidden)``, ``root(seq) -> logits [V] | None`` (feed what the
drafter has not seen of the committed sequence; logits for the root's children),
``expand(tokens, parent_slots) -> logits [n, V]`` (feed n tree nodes in ONE forward, each seeing the
committed prefix, its fed ancestors and itself; node i gets the next slot, parent slot -1 = root) and
``commit(tree, path, committed, hidden)`` (keep only the accepted path). ``LMDrafter`` wraps a small
causal LM behind a ``CausalLMAdapter``; ``eagle3.Eagle3Drafter`` is an EAGLE-3 head.
"""
from __future__ import annotations

import torch


def additive_mask(allowed: torch.Tensor, model) -> torch.Tensor:
    """[1, 1, n, S] additive float mask (0 / finfo.min) in the model's dtype, from a bool ``allowed``.

    transformers 5.x takes a 4-D mask through ``attention_mask={"full_attention": mask}`` unchanged;
    the eager kernel ADDS it to the scores (a bool mask would be silently wrong there), sdpa accepts
    either. An additive mask in the model's dtype is right for both; flash kernels take no 4-D mask.
    """
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    if impl.startswith("flash") or "flex" in impl:
        raise ValueError(f"tree attention needs a 4-D mask; attn_implementation={impl!r}; allowed: sdpa, eager")
    dtype = next(model.parameters()).dtype if model is not None else torch.float32
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


class SlotTree:
    """Bookkeeping for tree nodes appended to a drafter's cache after ``base`` committed entries."""

    def __init__(self, base: int, root_pos: int, device):
        self.base, self.root_pos, self.device = base, root_pos, device
        self.anc: list[list[int]] = []

    def add(self, parent_slots: list[int]):
        """Allowed [n, base + slots] (bool) and position ids [n] for n new nodes."""
        old, n = len(self.anc), len(parent_slots)
        for ps in parent_slots:
            self.anc.append((self.anc[ps] if ps >= 0 else []) + [len(self.anc)])
        allowed = torch.zeros(n, self.base + old + n, dtype=torch.bool)
        allowed[:, : self.base] = True
        for i in range(n):
            allowed[i, [self.base + s for s in self.anc[old + i]]] = True
        pos = torch.tensor([self.root_pos + len(self.anc[old + i]) for i in range(n)])
        return allowed.to(self.device), pos.to(self.device)


class LMDrafter:
    """Tree drafting with a small causal LM behind a ``CausalLMAdapter`` (its cache holds committed
    tokens, then the fed tree nodes; ``commit`` keeps the accepted ones by index selection)."""
    needs_hidden = False

    def __init__(self, lm):
        self.lm, self._slots = lm, None

    @property
    def forward_s(self) -> float:
        return self.lm.forward_s

    def prefill(self, prompt: list[int], hidden=None) -> None:
        self.lm.reset()
        self._slots = None
        if len(prompt) > 1:
            self.lm.forward(prompt[:-1], logits=False)

    def root(self, seq: list[int]):
        z = self.lm.forward(seq[self.lm.cache_len:])[-1]
        self._slots = SlotTree(self.lm.cache_len, len(seq) - 1, self.lm.device)
        return z

    def expand(self, tokens: list[int], parent_slots: list[int]) -> torch.Tensor:
        allowed, pos = self._slots.add(parent_slots)
        return self.lm.forward(tokens, attention_mask=additive_mask(allowed, getattr(self.lm, "model", None)),
                               position_ids=pos[None])

    def commit(self, tree, path: list[int], committed: list[int], hidden=None) -> None:
        if self._slots is None:
            return
        fed = [self._slots.base + tree.slots[j] for j in path if tree.slots[j] >= 0]
        self.lm.keep(torch.cat([torch.arange(self._slots.base), torch.tensor(fed, dtype=torch.long)]))
        self._slots = None


def as_drafter(draft):
    return draft if hasattr(draft, "expand") else LMDrafter(draft)
