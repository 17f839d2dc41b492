"""Prompt lookup drafting: hand-made cases, NgramIndex == lookup after every extend, and the same drafts
as transformers' PromptLookupCandidateGenerator on random sequences with repeats."""
from __future__ import annotations

import random

import pytest
import torch

from mars_bench.decode.proposers.prompt_lookup import NgramIndex, lookup


def both(seq, k, **kw):
    """lookup(...) after checking the incremental index agrees."""
    out = lookup(seq, k, **kw)
    assert NgramIndex(seq, **kw).propose(k) == out
    return out


@pytest.mark.parametrize("prefer", ["first", "last"])
def test_no_match_and_short_sequences(prefer):
    for seq in ([], [4], [4, 5], [1, 2, 3, 4]):
        assert both(seq, 4, prefer=prefer) == []


def test_match_near_end_is_clipped_and_may_overlap_the_suffix():
    assert both([5, 1, 1], 4) == [1]                       # n=1 match at i=1: only seq[2] follows
    assert both([1, 1, 1], 4, prefer="last") == [1]        # n=2 match at i=0 overlaps the suffix
    assert both([7, 8, 9, 7], 4) == [8, 9, 7]              # never past the end, suffix token included


def test_longest_ngram_wins_over_an_earlier_shorter_one():
    seq = [2, 3, 5, 1, 2, 3, 6, 0, 1, 2, 3]
    assert both(seq, 4) == [6, 0, 1, 2]                    # trigram [1,2,3] at i=3
    assert both(seq, 4, max_ngram=2) == [5, 1, 2, 3]       # bigram [2,3] first at i=0
    assert both([9, 1, 2, 1], 4, min_ngram=2) == []        # only a unigram recurs
    assert both([9, 1, 2, 1], 4) == [2, 1]


def test_k_limit_and_first_vs_last():
    assert both([1, 2, 3, 4, 5, 6, 1], 2) == [2, 3]
    assert both([1, 2, 3, 4, 5, 6, 1], 10) == [2, 3, 4, 5, 6, 1]
    seq = [1, 2, 9, 1, 2, 8, 1, 2]
    assert both(seq, 4) == [9, 1, 2, 8]                    # first: i=0
    assert both(seq, 4, prefer="last") == [8, 1, 2]        # last: i=3


@pytest.mark.parametrize("call, name", [
    (lambda: lookup([1, 2], 0), "k=0"), (lambda: lookup([1, 2], 2.0), "k=2.0"),
    (lambda: lookup([1, 2], True), "k=True"), (lambda: lookup([1, 2], 3, min_ngram=0), "min_ngram=0"),
    (lambda: lookup([1, 2], 3, max_ngram=1, min_ngram=2), "max_ngram=1"),
    (lambda: lookup([1, 2], 3, prefer="middle"), "prefer='middle'"),
    (lambda: NgramIndex([1], max_ngram=0), "max_ngram=0"), (lambda: NgramIndex([1]).propose(-1), "k=-1"),
])
def test_bad_arguments(call, name):
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(name) and "allowed" in msg


def _random_seqs(n, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        vocab = rng.choice([2, 3, 5, 8])                   # small vocabularies: many repeats
        yield [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))], rng.randint(1, 6), rng.randint(1, 4)


def test_index_matches_lookup_after_every_extend():
    rng = random.Random(1)
    for seq, k, max_ngram in _random_seqs(200):
        for prefer in ("first", "last"):
            min_ngram = rng.randint(1, max_ngram)
            ix, i = NgramIndex(max_ngram=max_ngram, min_ngram=min_ngram, prefer=prefer), 0
            while i <= len(seq):
                step = rng.randint(0, 4)
                ix.extend(seq[i:i + step])
                i += step
                assert ix.propose(k) == lookup(ix.tokens, k, max_ngram, min_ngram, prefer)
            assert ix.tokens == seq


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=8), k=st.integers(1, 6),
       ngrams=st.tuples(st.integers(1, 4), st.integers(1, 4)).map(sorted), prefer=st.sampled_from(["first", "last"]))
def test_index_property(chunks, k, ngrams, prefer):
    lo, hi = ngrams
    ix, seq = NgramIndex(max_ngram=hi, min_ngram=lo, prefer=prefer), []
    for c in chunks:
        ix.extend(c)
        seq += c
        assert ix.propose(k) == lookup(seq, k, hi, lo, prefer)


def test_same_candidates_as_transformers():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    hits = differ = 0
    for seq, k, max_ngram in _random_seqs(400, seed=2):
        gen = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=max_ngram,
                                             max_length=len(seq) + k + 10)
        if not seq:
            continue                                       # transformers needs at least one token
        cand, _ = gen.get_candidates(torch.tensor([seq]))
        ref = cand[0, len(seq):].tolist()
        assert both(seq, k, max_ngram=max_ngram) == ref, (seq, k, max_ngram)
        hits += bool(ref)
        differ += lookup(seq, k, max_ngram, prefer="last") != ref
    assert hits > 200 and differ > 50                      # the cases exercise matches, and first != last
