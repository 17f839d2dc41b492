"""Turning raw logits into the distributions p_target / q_draft, and drawing from them.

Every random draw takes an explicit ``torch.Generator`` so a sample is reproducible from its seed.
"""
from __future__ import annotations

import torch


def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities over the last dim: softmax(logits / temperature), then nucleus (top-p) filtering.

    Top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (the token that
    crosses the threshold is kept), then renormalises. ``temperature`` must be > 0 here: greedy
    decoding never asks for probabilities.
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p
        sorted_p = sorted_p.masked_fill(mass_before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of ``probs`` (shape [..., V]) -> LongTensor of shape [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])


def sample_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token id per row of ``probs`` (shape [..., V]), each row drawn from its own distribution by inverting
    its CDF (float64 sums) at its own uniform ``u`` in [0, 1) (shape [...]); a zero-probability token is never
    drawn. Nothing is read to the host (``torch.multinomial`` checks its input there: a sync on CUDA)."""
    cdf = probs.double().cumsum(-1)
    at = (u.double() * cdf[..., -1])[..., None]
    return torch.searchsorted(cdf, at, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def residual(p_target: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p_target - q_draft)); falls back to p_target when the two are equal."""
    res = (p_target - q_draft).clamp_min(0.0)
    total = res.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, res / total.clamp_min(1e-30), p_target)


def next_token(logits: torch.Tensor, temperature: float, top_p: float,
               generator: torch.Generator | None) -> int:
    """The target's own choice from one row of logits: argmax when greedy, else a draw from p_target."""
    if temperature == 0.0:
        return int(logits.argmax(-1))
    return int(sample(warp(logits, temperature, top_p), generator))
