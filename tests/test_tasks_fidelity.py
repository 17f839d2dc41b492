"""Fidelity against ar outputs: identical tokens, first divergence, chrF to the ar text."""
import pytest
import sacrebleu

from mars_bench.tasks.fidelity import aggregate_fidelity, fidelity


def test_identical():
    assert fidelity([1, 2, 3], [1, 2, 3], "abc", "abc") == {"identical": True, "first_divergence": None,
                                                            "chrf_to_ar": 100.0}


def test_divergence_index_and_prefix():
    assert fidelity([1, 2, 9, 4], [1, 2, 3, 4], "a", "b")["first_divergence"] == 2
    assert fidelity([5], [6], "x", "y")["first_divergence"] == 0
    assert fidelity([1, 2], [1, 2, 3], "a b", "a b c")["first_divergence"] == 2     # a prefix: diverges at its end
    assert fidelity([], [1], "", "x")["first_divergence"] == 0
    assert fidelity([1, 2], [1, 2], "same", "same")["identical"] is True


def test_chrf_is_sacrebleu_sentence_chrf():
    hyp, ref = "The cat sat on a mat today.", "The cat sat on the mat."
    f = fidelity([1], [2], hyp, ref)
    assert f["chrf_to_ar"] == pytest.approx(sacrebleu.sentence_chrf(hyp, [ref]).score)
    assert not f["identical"]


def test_aggregate():
    items = [fidelity([1, 2], [1, 2], "a", "a"), fidelity([1, 3], [1, 2], "ab", "ac"),
             fidelity([4], [1], "xyz", "abc"), fidelity([1, 2, 3, 5], [1, 2, 3, 4], "q", "r")]
    agg = aggregate_fidelity(items)
    assert agg["pct_identical"] == 25.0
    assert agg["median_first_divergence"] == 1        # divergent only: [1, 0, 3]
    assert agg["mean_chrf_to_ar"] == pytest.approx(sum(i["chrf_to_ar"] for i in items) / 4)
    assert agg["n"] == 4
    none_div = aggregate_fidelity([fidelity([1], [1], "a", "a")] * 3)
    assert none_div["pct_identical"] == 100.0 and none_div["median_first_divergence"] is None
    assert aggregate_fidelity([])["pct_identical"] is None
