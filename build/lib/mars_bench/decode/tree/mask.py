"""The 4-D tree attention mask that drafters and the target share, and the slot bookkeeping of tree
nodes appended to a drafter's cache."""
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
