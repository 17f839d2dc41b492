"""WMT19 zh-en: translation clean-up and corpus BLEU/chrF exactly as sacrebleu computes them."""
from pathlib import Path

import pytest
import sacrebleu

from mars_bench.tasks import get_task
from mars_bench.tasks.wmt19 import clean_translation, corpus_scores

from .conftest import data_dir as _data_dir

ROOT = Path(__file__).resolve().parent.parent




T = "Zhang Guangjun was appointed Vice Governor of Guangdong Province."


@pytest.mark.parametrize("raw", [
    T, f"  {T}\n", f"Translation: {T}", f"English: {T}", f"English translation: {T}", f"**Translation:** {T}",
    f"Here is the translation:\n\n{T}", f"Here's the English translation:\n{T}",
    f"Sure! Here is the translation of the text:\n\n{T}", f"Sure, here's the translation: {T}",
    f"Here is the translation.\n{T}", f'"{T}"', f"\u201c{T}\u201d", f"Translation:\n\"{T}\"",
    f"{T}\n\nNote: \"Vice Governor\" is the usual rendering of \u526f\u7701\u957f.",
    f"Translation: {T}\n\n(Note: names are romanised in pinyin.)",
])
def test_clean_translation_strips_preambles_quotes_notes(raw):
    assert clean_translation(raw) == T


@pytest.mark.parametrize("raw,expected", [
    ('"Yes," he said, "we will."', '"Yes," he said, "we will."'),    # inner quotes: not a wrapper
    ("Line one\nline two", "Line one line two"),                      # lines joined
    ("The translation of this word is hard.", "The translation of this word is hard."),
    ("Notes were exchanged.\n\nMore text.", "Notes were exchanged. More text."),   # first paragraph never cut
    ("", ""),
])
def test_clean_translation_leaves_real_content(raw, expected):
    assert clean_translation(raw) == expected


def test_quotes_kept_when_the_source_is_a_quotation():
    q = '"The contrast in this election cannot be clearer."'
    assert clean_translation(q, "\u201c这场选举的对比不可能更明确了 。 \u201d") == q
    assert clean_translation(f"Translation: {q}", "\u201c\u4f60\u597d\u201d") == q
    assert clean_translation(q, "这场选举的对比不可能更明确了。") == q[1:-1]


def test_corpus_scores_equal_sacrebleu_direct():
    refs = ["The cat sat on the mat.", "It is raining today in Beijing.", "He bought three apples."]
    hyps = ["The cat sat on a mat.", "Today it rains in Beijing.", "He bought 3 apples."]
    out = corpus_scores(hyps, refs)
    assert out["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert out["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    bleu = sacrebleu.metrics.BLEU()
    bleu.corpus_score(hyps, [refs])
    assert bleu.get_signature().format() in out["sacrebleu_signature"]
    assert "tok:13a" in out["sacrebleu_signature"] and "nc:6" in out["sacrebleu_signature"]
    assert f"version:{sacrebleu.__version__}" in out["sacrebleu_signature"]


def test_task_score_and_aggregate_on_real_data():
    t = get_task("wmt19_zh_en")
    samples = t.load(_data_dir(), subset="paper")
    assert len(samples) == 100
    outputs = [[f"Translation: {s.reference}"] for s in samples]
    scored = [t.score(s, o) for s, o in zip(samples, outputs)]
    assert scored[0]["hypothesis"] == samples[0].reference and scored[0]["chrf_sentence"] == pytest.approx(100.0)
    agg = t.aggregate(samples, scored, outputs)
    assert agg["bleu"] == pytest.approx(100.0) and agg["chrf"] == pytest.approx(100.0) and agg["n"] == 100
    # a degraded system: the task's numbers equal sacrebleu's on the same cleaned hypotheses
    outputs = [[" ".join(s.reference.split()[: max(1, len(s.reference.split()) // 2)])] for s in samples]
    scored = [t.score(s, o) for s, o in zip(samples, outputs)]
    agg = t.aggregate(samples, scored, outputs)
    hyps, refs = [o[0] for o in outputs], [s.reference for s in samples]
    assert agg["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert agg["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert set(agg) == {"bleu", "chrf", "sacrebleu_signature", "n"}
    assert set(t.metric_directions) == {"bleu", "chrf"}
