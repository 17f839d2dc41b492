"""WMT19 zh-en: the two sets, translation clean-up, and corpus BLEU/chrF exactly as sacrebleu computes them."""
import json
from pathlib import Path

import pytest
import sacrebleu

from mars_bench.tasks import DataError, get_task
from mars_bench.tasks import data as D
from mars_bench.tasks.wmt19 import AUTHORS_PAIRS_SHA256, clean_translation, corpus_scores, pairs_sha256

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
    assert agg["bleu_raw"] == pytest.approx(agg["bleu"]) and agg["chrf_raw"] == pytest.approx(agg["chrf"])
    assert set(agg) == {"bleu", "chrf", "bleu_raw", "chrf_raw", "sacrebleu_signature", "n"}
    assert set(t.metric_directions) == {"bleu", "chrf", "bleu_raw", "chrf_raw"}


# ---- the two sets: the authors' newstest2018 100 (paper) and newstest2019 ---------------------------------------
def _authors_pairs():
    text = (_data_dir() / "mars_release/wmt19/question.jsonl").read_text(encoding="utf-8")
    rows = sorted((json.loads(x) for x in text.splitlines()), key=lambda r: r["question_id"])
    prefix = "Translate the following Chinese text to English.\n\n"
    return [{"zh": r["turns"][0][len(prefix):], "en": r["reference"][0]} for r in rows]


def test_paper_subset_is_the_authors_newstest2018():
    t = get_task("wmt19_zh_en")
    assert t.version >= 2
    paper = t.load(_data_dir(), subset="paper")
    assert len(paper) == 100
    assert paper[0].turns[0].endswith("上周，古装剧《美人私房菜》临时停播，意外引发了关于国产剧收视率造假的热烈讨论。")
    assert [(s.meta["source"], s.reference) for s in paper] == [(p["zh"], p["en"]) for p in _authors_pairs()]
    assert t.data_files == ["mars_release/wmt19/question.jsonl"]
    assert t.data_sha256(_data_dir()) == {"mars_release/wmt19/question.jsonl":
                                          "d80f77d68ad8e306c547cd47d5fb55f5ad4067ac2512aff46a84602f20dc34a6"}
    first100 = t.load(_data_dir(), subset="newstest2019_100")
    assert t.data_files == ["wmt19_zh_en/src.zh", "wmt19_zh_en/ref.en"]
    assert len(first100) == 100 and first100[0].meta["source"] == "张光军被任命为广东省副省长。"
    assert not {s.meta["source"] for s in paper} & {s.meta["source"] for s in t.load(_data_dir())}   # no overlap
    assert len(t.load(_data_dir(), subset="newstest2019")) == 2000
    assert len({s.id for s in paper} | {s.id for s in first100}) == 200


def test_pairs_sha256_recorded_from_the_authors_file():
    assert pairs_sha256(_authors_pairs()) == AUTHORS_PAIRS_SHA256


@pytest.fixture
def offline_user(tmp_path, monkeypatch):
    """No local copy of the authors' file and no internet: the Hugging Face copy is the only source."""
    monkeypatch.delenv("MARS_BENCH_DATA_DIR", raising=False)
    monkeypatch.setenv("MARS_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "SIBLING_DATA", tmp_path / "no-shared-here")   # our own constant
    t = get_task("wmt19_zh_en")
    t.download = _offline
    return t


def _offline(url):
    raise ConnectionError("offline")


def test_hugging_face_second_source(offline_user):
    rows = _authors_pairs() + [{"zh": "多余", "en": "extra"}]     # the split goes on; only the first 100 count
    offline_user.hf_load = lambda: rows
    samples = offline_user.load(None, subset="paper")
    assert [(s.meta["source"], s.reference) for s in samples] == [(r["zh"], r["en"]) for r in rows[:100]]
    assert samples[0].turns[0] == "Translate the following Chinese text to English.\n\n" + rows[0]["zh"]


def test_hugging_face_rows_checked_by_sha256(offline_user):
    rows = _authors_pairs()
    rows[7] = {"zh": rows[7]["zh"], "en": rows[7]["en"] + " "}
    offline_user.hf_load = lambda: rows
    with pytest.raises(DataError) as e:
        offline_user.load(None, subset="paper")
    msg = str(e.value)
    assert "\n" not in msg and AUTHORS_PAIRS_SHA256 in msg and "validation" in msg


def test_without_datasets_the_error_is_one_line(offline_user):
    def no_datasets():
        raise ImportError("No module named 'datasets'")

    offline_user.hf_load = no_datasets
    with pytest.raises(DataError) as e:
        offline_user.load(None, subset="paper")
    msg = str(e.value)
    assert "\n" not in msg and "offline" in msg and "'hf' extra" in msg


def test_raw_and_cleaned_scores_side_by_side():
    t = get_task("wmt19_zh_en")
    samples = t.load(_data_dir(), subset="paper", limit=5)
    outputs = [[f"Here is the translation:\n\n{s.reference}"] for s in samples]
    scored = [t.score(s, o) for s, o in zip(samples, outputs)]
    assert [r["hypothesis_raw"] for r in scored] == [o[0] for o in outputs]
    assert [r["hypothesis"] for r in scored] == [s.reference for s in samples]
    agg = t.aggregate(samples, scored, outputs)
    refs = [s.reference for s in samples]
    assert agg["bleu"] == pytest.approx(100.0)
    assert agg["bleu_raw"] == pytest.approx(sacrebleu.corpus_bleu([o[0] for o in outputs], [refs]).score)
    assert agg["chrf_raw"] == pytest.approx(sacrebleu.corpus_chrf([o[0] for o in outputs], [refs]).score)
    assert agg["bleu_raw"] < agg["bleu"]
