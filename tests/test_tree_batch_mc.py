"""Monte Carlo at batch size 4: sampled tree verification in the batched loop (``generate_batch``: ragged accepted
paths, each row's cache narrowed to its own path, finished rows refilled, one generator per request) commits tokens
distributed exactly as p_target.

The trigram target and draft of tests/test_tree_mc.py (single-sequence stand-ins honouring the 4-D tree mask),
behind the batched interface (``backend.RowByRow``), the way the study's quality phase decodes sampled trees
(study_trees_t1: children drawn from q_draft, recursive rejection sampling). Each request emits L tokens over
several steps; their empirical joint law is compared with the target's exact joint by a chi-square test (fixed
seeds: deterministic). The negative control: the authors' ``topk_q=draft`` fails the same test in the same loop.
"""
import pytest

from mars_bench.decode import DecodeConfig, Method
from mars_bench.decode.generate import Request, generate_batch
from mars_bench.decode.tree import TreeSpec

from .test_tree_mc import DRAFT, L, PROMPT, STATIC, TARGET, NoText, TrigramLM, pvalue

BATCH = 4


def run_batched(spec, n, temperature=1.0, top_p=1.0, seed0=50_000):
    cfg = DecodeConfig(max_new_tokens=L, temperature=temperature, top_p=top_p)
    counts, deep, steps = {}, 0, []

    def done(req, res):
        nonlocal deep
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
        deep += res.accepted[0] >= 2
        steps.append(len(res.accepted))

    generate_batch(TrigramLM(TARGET), TrigramLM(DRAFT), NoText(),
                   (Request(list(PROMPT), seed=seed0 + i, key=i) for i in range(n)),
                   Method("sd_tree"), cfg, BATCH, done, tree=spec)
    assert sum(counts.values()) == n
    return counts, deep, steps


@pytest.mark.parametrize("spec,temperature,top_p,n", [
    (TreeSpec(depth=1, top_k=2, total_tokens=4, children="sample"), 1.0, 1.0, 3000),
    (TreeSpec(static_paths=STATIC, children="sample"), 1.0, 1.0, 2500),
    (TreeSpec(static_paths=STATIC, children="sample"), 0.7, 0.9, 2500),
], ids=["dynamic-sample", "static-sample", "static-sample-T0.7-p0.9"])
def test_batched_sampled_tree_commits_p_target(spec, temperature, top_p, n):
    counts, deep, steps = run_batched(spec, n, temperature, top_p)
    assert pvalue(counts, n, temperature, top_p) > 1e-3
    assert deep > n * 0.05                              # depth-2 paths were accepted
    assert len(set(steps)) > 1                          # rows took different numbers of steps: ragged batches


def test_batched_chi_square_detects_the_authors_draft_q():
    """Negative control: top-k children verified against q_draft (lossy) fail the same test in the batched loop."""
    counts, _, _ = run_batched(TreeSpec(depth=1, top_k=2, total_tokens=5, topk_q="draft"), 1500)
    assert pvalue(counts, 1500) < 1e-6
