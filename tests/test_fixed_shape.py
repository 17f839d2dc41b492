"""Fixed-shape forwards, what ``model.capture`` needs (issue 32): with ``fixed_shape`` the adapter's decoding
forwards (batched: chain drafts, verification; single sequences: a tree draft's expansions) attend over cache
views of a power-of-two width, the rows that left a batch still fed, so a whole decode takes a handful of
shapes (each captured once on CUDA) instead of one per token, and the tokens are the eager path's. Runs on the
CPU (tiny pair, fp32): the shapes the target and draft models receive are recorded with a forward pre-hook; a
``torch.compile`` with a counting backend shows that dynamo traces the fixed-shape forwards once per shape, not
once per width; inductor (slow tier) compiles them to the eager tokens."""
import pytest
import torch

from mars_bench.decode import DecodeConfig, Method
from mars_bench.decode.generate import Request, generate_batch
from mars_bench.decode.tree import TreeSpec
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.forward.fixed import FIXED_MIN, fixed_columns
from mars_bench.models.kvcache import capacity

from .conftest import EOS, MAX_NEW

TREE = TreeSpec(depth=3, top_k=3, total_tokens=12)
PROMPTS = (0, 5, 3, 7)                 # ragged lengths; at batch 3 a slot is refilled and rows leave at the end


def pair(tiny, fixed: bool):
    target, draft, tok = tiny
    return (CausalLMAdapter(target.model, fixed_shape=fixed),
            CausalLMAdapter(draft.model, out_vocab=target.vocab, fixed_shape=fixed), tok)


class Shapes:
    """Forward pre-hook recording (input_ids shape, columns the mask spans or None) of every forward of a model
    but prefills (``logits_to_keep``: the prompt, scored without logits)."""

    def __init__(self, adapter):
        self.seen, self.handles = [], [adapter.model.register_forward_pre_hook(self.hook, with_kwargs=True)]

    def hook(self, module, args, kwargs):
        if "logits_to_keep" in kwargs:
            return
        mask = kwargs.get("attention_mask")
        cols = mask["full_attention"].shape[-1] if isinstance(mask, dict) else None
        self.seen.append((tuple(kwargs["input_ids"].shape), cols))

    def close(self):
        for h in self.handles:
            h.remove()


def decode(tiny, prompt_ids, fixed, method, tree=None, max_new=MAX_NEW, batch=3):
    target, draft, tok = pair(tiny, fixed)
    cfg = DecodeConfig(max_new_tokens=max_new, eos_ids=(EOS,))
    out = {}
    shapes = [Shapes(target), Shapes(draft)]
    try:
        generate_batch(target, draft, tok, [Request(prompt=prompt_ids[i], key=i) for i in PROMPTS], method, cfg,
                       batch, lambda req, res: out.__setitem__(req.key, res.tokens), tree=tree)
    finally:
        for s in shapes:
            s.close()
    return [out[i] for i in PROMPTS], shapes[0].seen + shapes[1].seen


def test_fixed_columns_are_powers_of_two_from_the_minimum(tiny):
    assert [fixed_columns(c) for c in (1, FIXED_MIN, FIXED_MIN + 1, 1000, 1024, 1025)] == \
        [FIXED_MIN, FIXED_MIN, 2 * FIXED_MIN, 1024, 1024, 2048]
    # check_memory's columns per row: the buffer that holds the widest view
    assert pair(tiny, True)[0].cached_columns(300) == capacity(512) > pair(tiny, False)[0].cached_columns(300)


@pytest.mark.parametrize("method, tree", [(Method("sd", k=4), None), (Method("mars", k=4), None),
                                          (Method("sd_tree"), TREE)])
def test_fixed_shapes_give_the_eager_tokens_in_a_few_shapes(tiny, prompt_ids, method, tree):
    """Every forward but prefills, the target's and the draft's: chain verification and drafting on the batched
    cache, a tree's expansions on the drafter's single-sequence forks."""
    eager, eager_shapes = decode(tiny, prompt_ids, False, method, tree)
    fixed, fixed_shapes = decode(tiny, prompt_ids, True, method, tree)
    assert fixed == eager
    assert all(cols is not None and cols >= FIXED_MIN and cols & (cols - 1) == 0 for _, cols in fixed_shapes)
    assert {ids[0] for ids, _ in fixed_shapes} == ({3} if tree is None else {1, 3})   # the batch's rows throughout
    # the eager path's widths grow with every step; the fixed path's stay within a few (rows x fed x width)
    assert len(set(fixed_shapes)) <= 6 < len(set(eager_shapes)), (sorted(set(fixed_shapes)), len(set(eager_shapes)))


def test_the_buffers_a_fixed_shape_forward_writes_are_static_addresses(tiny, prompt_ids):
    """A captured forward writes the KV buffers in place: CUDA graphs allow that only for static addresses."""
    target, draft, tok = pair(tiny, True)
    generate_batch(target, draft, tok, [Request(prompt=prompt_ids[0], key=0)], Method("sd", k=4),
                   DecodeConfig(max_new_tokens=8, eos_ids=(EOS,)), 1, lambda req, res: None)
    for a in (target, draft):
        bufs = [b for layer in a.bcache.layers for b in (layer._kbuf, layer._vbuf)]
        assert bufs and all(getattr(b, "_dynamo_static_input_type", None) == "unguarded" for b in bufs)


def test_a_longer_decode_adds_no_shape(tiny, prompt_ids):
    _, short = decode(tiny, prompt_ids, True, Method("sd", k=4), max_new=MAX_NEW)
    _, long = decode(tiny, prompt_ids, True, Method("sd", k=4), max_new=3 * MAX_NEW)
    assert set(long) == set(short)


@pytest.mark.parametrize("method, tree", [(Method("sd", k=4), None), (Method("sd_tree"), TREE)])
def test_dynamo_traces_the_fixed_shape_forwards_a_bounded_number_of_times(tiny, prompt_ids, method, tree):
    """torch.compile over the target's and the draft's decoding forwards (as ``models.pairs.capture`` does; a
    counting backend: no code generated) records one graph per shape, with no graph break: the count does not
    grow with the decode's length. The eager path's shapes exceed dynamo's recompile limit."""
    from torch._dynamo.testing import CompileCounter

    counts = {}
    for fixed, max_new in ((True, MAX_NEW), (True, 2 * MAX_NEW), (False, MAX_NEW)):
        target, draft, tok = pair(tiny, fixed)
        torch._dynamo.reset()
        counter = CompileCounter()
        for a in (target, draft):
            a.step_model = torch.compile(a.model, backend=counter, dynamic=False)
        try:
            generate_batch(target, draft, tok, [Request(prompt=prompt_ids[i], key=i) for i in PROMPTS[:2]],
                           method, DecodeConfig(max_new_tokens=max_new, eos_ids=(EOS,)), 2,
                           lambda req, res: None, tree=tree)
        finally:
            torch._dynamo.reset()
        counts[fixed, max_new] = counter.frame_count
    print("dynamo frames (fixed, max_new):", counts)
    assert counts[True, MAX_NEW] == counts[True, 2 * MAX_NEW] <= 6, counts      # one per shape, no break
    assert counts[False, MAX_NEW] > counts[True, MAX_NEW], counts


@pytest.mark.slow
@pytest.mark.parametrize("method, tree", [(Method("sd", k=4), None), (Method("sd_tree"), TREE)])
def test_inductor_compiles_the_fixed_shape_forwards_to_the_eager_tokens(tiny, prompt_ids, method, tree):
    """The real compiler (inductor's CPU code generation, ~1.5 min a method here; CUDA graphs need a GPU) over the
    target's and the draft's decoding forwards: the eager path's tokens, and a second decode reuses the code."""
    eager, _ = decode(tiny, prompt_ids, False, method, tree)
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 64          # as models.pairs.capture does
    try:
        for _ in range(2):
            target, draft, tok = pair(tiny, True)
            for a in (target, draft):
                a.step_model = torch.compile(a.model, dynamic=False)
            out = {}
            generate_batch(target, draft, tok, [Request(prompt=prompt_ids[i], key=i) for i in PROMPTS], method,
                           DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,)), 3,
                           lambda req, res: out.__setitem__(req.key, res.tokens), tree=tree)
            assert [out[i] for i in PROMPTS] == eager
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.reset()
