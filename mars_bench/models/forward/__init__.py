"""An adapter's forward paths, one module each behind one interface (``path.ForwardPath``), and the one place that
picks one (``choose``):

- ``eager``: transformers' modules over cache views exactly as wide as the tokens held (prefills, single-sequence
  forwards without logits, and every forward that neither of the others takes);
- ``fused``: one C call per layer (``models.fused.FusedDecoder``, set as ``adapter.fused`` by the loader where the
  model qualifies): a single sequence's forwards of 1 .. FUSED_MAX tokens after a prefill, scored with logits (a
  chain, or a draft tree's nodes with their mask and positions), and batched forwards (chains and trees), with the
  per-layer hidden states where asked (an EAGLE-3 target);
- ``fixed``: fixed shapes (``adapter.fixed_shape``, what ``model.capture`` sets): batched forwards and a single
  sequence's forwards of up to FUSED_MAX tokens after a prefill, over power-of-two cache widths, so each shape is
  captured once (CUDA graphs).
The fused path comes first where both it and fixed shapes are on.
"""
from __future__ import annotations

from mars_bench.models.forward.eager import Eager
from mars_bench.models.forward.fixed import Fixed
from mars_bench.models.forward.fused import Fused
from mars_bench.models.forward.path import ForwardPath

FUSED_MAX = 32           # single-sequence forwards of at most this many tokens take the fused or fixed path
EAGER, FUSED, FIXED = Eager(), Fused(), Fixed()


def choose(a, width: int, n: int, batched: bool, hidden_states: bool = False, logits: bool = True) -> ForwardPath:
    """The path of adapter ``a``'s next forward: ``n`` new tokens (a batch: the most a row takes) after ``width``
    cached columns (a batch: its longest row); ``batched``: ``batch_forward`` (else ``forward``); ``logits``: a
    single sequence's forward scores its tokens (a chain, or tree nodes under their mask), not a prefill's."""
    if a.fused is not None and width and (batched or (logits and 0 < n <= FUSED_MAX)):
        return FUSED
    if a.fixed_shape and (batched or (width and n <= FUSED_MAX)):
        return FIXED
    return EAGER


__all__ = ["EAGER", "FIXED", "FUSED", "FUSED_MAX", "ForwardPath", "choose"]
