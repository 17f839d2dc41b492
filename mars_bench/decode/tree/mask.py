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
    return additive(allowed, model)[None, None]


def additive(allowed: torch.Tensor, model) -> torch.Tensor:
    """Additive float mask (0 / finfo.min) of ``allowed``'s shape in the model's dtype (fp32 without a model)."""
    dtype = next(model.parameters()).dtype if model is not None else torch.float32
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)


def ancestors(parents: list[int], device, depth: int | None = None) -> torch.Tensor:
    """Bool [m, m] built on ``device``: entry (i, j) is True when j is i or an ancestor of i (``parents`` index
    earlier nodes; -1 = none): ``depth`` steps (the deepest node's number of ancestors, default m), each marking
    the ancestors one level further up with one gather; nothing is read back."""
    m = len(parents)
    idx = torch.arange(m, device=device)
    par = torch.tensor(parents, dtype=torch.long, device=device)
    parent = torch.where(par >= 0, par, idx)        # a root points at itself
    anc, up = torch.eye(m, dtype=torch.bool, device=device), parent
    for _ in range(m if depth is None else depth):
        anc[idx, up] = True
        up = parent[up]
    return anc


class SlotTree:
    """Bookkeeping for tree nodes appended to a drafter's cache after ``base`` committed entries; the masks and
    positions are built on the device (the node-to-slot ancestor matrix lives there)."""

    def __init__(self, base: int, root_pos: int, device):
        self.base, self.root_pos, self.device = base, root_pos, device
        self.anc = torch.zeros(0, 0, dtype=torch.bool, device=device)     # [slots, slots]: j is i or above i

    def add(self, parent_slots):
        """Allowed [n, base + slots] (bool) and position ids [n] for n new nodes (``parent_slots``: a list, or a
        LongTensor left on the device; -1 = the root)."""
        old, n = self.anc.shape[0], len(parent_slots)
        ps = torch.as_tensor(parent_slots, dtype=torch.long).to(self.device)
        rows = torch.zeros(n, old + n, dtype=torch.bool, device=self.device)
        if old:
            rows[:, :old] = self.anc[ps.clamp(min=0)] & (ps >= 0)[:, None]
        rows[:, old:] = torch.eye(n, dtype=torch.bool, device=self.device)
        grown = torch.zeros(old + n, old + n, dtype=torch.bool, device=self.device)
        grown[:old, :old] = self.anc
        grown[old:] = rows
        self.anc = grown
        allowed = torch.cat([torch.ones(n, self.base, dtype=torch.bool, device=self.device), rows], 1)
        return allowed, self.root_pos + rows.sum(1)
