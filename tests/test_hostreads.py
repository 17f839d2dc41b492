"""Host reads per decoding step (each is a device sync on CUDA), counted on CPU with ``decode.hostreads``
around the tiny pair: 4 prompts x 64 new tokens, as issue 32 measured them (26.6 per sd step, 39.1 per tree
step before). Counts are deterministic, so they are bounded here; the tokens stay the lossless ones."""
import pytest
import torch

from mars_bench.decode import DecodeConfig, Method, generate, generate_batch
from mars_bench.decode.engine import Request
from mars_bench.decode.hostreads import HostReads
from mars_bench.decode.tree import TreeSpec

N_PROMPTS, MAX_NEW = 4, 64
TREE = TreeSpec(depth=3, top_k=3, total_tokens=12)


def test_counter_counts_each_kind_of_read():
    x = torch.tensor([1.0, 2.0])
    with HostReads(where=True) as r:
        bool(x[0]), int(x[0]), float(x[0]), x[0].item(), x.tolist(), x.numpy(), [1, 2, 3][x.long()[1]]
        x.nonzero()
        y = x * 2 + 1                       # device work: no read
    assert dict(r.counts) == {"__bool__": 1, "__int__": 1, "__float__": 1, "item": 1, "tolist": 1, "numpy": 1,
                              "__index__": 1}
    assert r.total == 7 and r.shape_syncs["nonzero"] == 1 and y.shape == (2,)
    assert all(site.startswith("test_hostreads.py:") for site in r.sites)


def _decode(tiny, prompt_ids, method, tree=None, temperature=0.0):
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, temperature=temperature)
    with HostReads() as reads:
        res = [generate(target, draft, tok, ids, method, cfg, seed=i, tree=tree)
               for i, ids in enumerate(prompt_ids[:N_PROMPTS])]
    return res, reads.total / sum(r.steps for r in res)


@pytest.fixture(scope="module")
def ar_tokens(tiny, prompt_ids):
    res, per_step = _decode(tiny, prompt_ids, Method("ar"))
    assert per_step == 1.0                  # the token itself
    return [r.tokens for r in res]


@pytest.mark.parametrize("method", [Method("sd", k=4), Method("mars", k=4, rule_kwargs={"theta": 1.0})])
def test_chain_step_reads_the_host_once(tiny, prompt_ids, ar_tokens, method):
    res, per_step = _decode(tiny, prompt_ids, method)
    assert [r.tokens for r in res] == ar_tokens
    assert per_step <= 1.0 and sum(r.steps for r in res) < N_PROMPTS * MAX_NEW / 2


def test_sampled_chain_step_reads_the_host_once(tiny, prompt_ids):
    res, per_step = _decode(tiny, prompt_ids, Method("mars", k=4), temperature=1.0)
    assert per_step <= 1.0 and all(len(r.tokens) == MAX_NEW for r in res)


def test_greedy_tree_step_reads_once_to_build_and_once_to_verify(tiny, prompt_ids, ar_tokens):
    res, per_step = _decode(tiny, prompt_ids, Method("sd_tree"), tree=TREE)
    assert [r.tokens for r in res] == ar_tokens
    assert per_step <= 2 and sum(r.steps for r in res) < N_PROMPTS * MAX_NEW / 2


@pytest.mark.parametrize("method", [Method("sd_tree"), Method("mars_tree", rule="mars", rule_kwargs={"theta": 0.6})])
def test_sampled_tree_step_reads_once_to_build_and_once_to_verify(tiny, prompt_ids, method):
    """Every node's tests (their residual chains included) and fallback draw are computed on the device and read
    once with the audit's top-2; the walk then reads nothing (3.9 per mars_tree step with a read per node)."""
    target, draft, tok = tiny
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, temperature=1.0)
    with HostReads() as reads:
        res = [generate(target, draft, tok, ids, method, cfg, seed=i, tree=TREE)
               for i, ids in enumerate(prompt_ids[:N_PROMPTS])]
    steps, accepted = sum(r.steps for r in res), sum(sum(r.accepted) for r in res)
    assert accepted > 0 and all(len(r.tokens) == MAX_NEW for r in res)
    assert reads.total <= 2 * steps


def test_batched_chain_reads_once_per_row(tiny, prompt_ids):
    target, draft, tok = tiny
    got, steps = {}, []
    reqs = [Request(list(ids), key=i) for i, ids in enumerate(prompt_ids[:N_PROMPTS])]
    with HostReads() as reads:
        generate_batch(target, draft, tok, reqs, Method("sd", k=4), DecodeConfig(max_new_tokens=MAX_NEW), 4,
                       lambda r, res: got.__setitem__(r.key, res))
    row_steps = sum(r.steps for r in got.values())
    assert len(got) == N_PROMPTS and reads.total <= row_steps
