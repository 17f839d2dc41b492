"""Which forward path an adapter's forward takes (``models.forward.choose``, the one place that picks): the fused
path for a single sequence's scored forwards after a prefill (chains, and a draft tree's nodes under their mask) and
for batches, fixed shapes for the rest of the decoding forwards where they are on, the eager path for everything else
(prefills among them). The paths' outputs are tested against each other in test_fused.py and test_fixed_shape.py."""
from types import SimpleNamespace

import pytest

from mars_bench.models.forward import EAGER, FIXED, FUSED, FUSED_MAX, choose


def adapter(fused: bool = False, fixed: bool = False):
    """What ``choose`` reads of an adapter: its fused decoder (or None) and its fixed-shape switch."""
    return SimpleNamespace(fused=object() if fused else None, fixed_shape=fixed)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("width, n, hidden, logits", [(0, 7, False, True), (12, 1, False, True),
                                                      (12, 3, True, False), (12, FUSED_MAX + 1, False, True)])
def test_an_adapter_with_neither_switch_runs_every_forward_eager(batched, width, n, hidden, logits):
    assert choose(adapter(), width, n, batched=batched, hidden_states=hidden, logits=logits) is EAGER


def test_the_fused_path_takes_scored_forwards_after_a_prefill_and_batches_with_or_without_hidden_states():
    a = adapter(fused=True)
    assert choose(a, 12, 1, batched=False) is FUSED
    assert choose(a, 12, FUSED_MAX, batched=False) is FUSED
    assert choose(a, 12, FUSED_MAX + 1, batched=False) is EAGER        # too many tokens for one fused call
    assert choose(a, 0, 5, batched=False) is EAGER                     # a prefill
    assert choose(a, 12, 3, batched=False) is FUSED                    # a draft tree's nodes under their mask too
    assert choose(a, 12, 3, batched=False, logits=False) is EAGER      # no logits: a prefill's
    assert choose(a, 12, 3, batched=False, hidden_states=True) is FUSED     # an EAGLE-3 target's verification
    assert choose(a, 12, FUSED_MAX + 1, batched=True) is FUSED         # a batch: any count, trees included
    assert choose(a, 12, 3, batched=True, hidden_states=True) is FUSED
    assert choose(a, 0, 5, batched=False, hidden_states=True) is EAGER      # a prefill's features
    assert choose(a, 0, 3, batched=True) is EAGER                      # every row empty


def test_fixed_shapes_take_every_batched_forward_and_short_single_sequence_ones():
    a = adapter(fixed=True)
    assert choose(a, 0, 3, batched=True) is FIXED
    assert choose(a, 12, 3, batched=True, hidden_states=True) is FIXED
    assert choose(a, 12, FUSED_MAX, batched=False, hidden_states=True, logits=False) is FIXED
    assert choose(a, 0, 3, batched=False) is EAGER                     # a prefill
    assert choose(a, 12, FUSED_MAX + 1, batched=False) is EAGER


def test_the_fused_path_comes_before_fixed_shapes():
    a = adapter(fused=True, fixed=True)
    assert choose(a, 12, 3, batched=False) is FUSED
    assert choose(a, 12, 3, batched=True) is FUSED
    assert choose(a, 12, 3, batched=False, hidden_states=True) is FUSED
    assert choose(a, 12, 3, batched=True, hidden_states=True) is FUSED
    assert choose(a, 12, 3, batched=False, hidden_states=True, logits=False) is FIXED  # no logits
