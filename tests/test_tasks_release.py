"""Alpaca, CNN/DM and QA from the MARS authors' files, and the pinned public copies of every mars_release file."""
import json

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from mars_bench.tasks import DataError, get_task
from mars_bench.tasks import data as D

from .conftest import data_dir as _data_dir

RELEASE = {"alpaca": "alpaca", "cnn_dm": "sum", "qa": "qa"}


def _rows(name):
    text = (_data_dir() / f"mars_release/{RELEASE[name]}/question.jsonl").read_text(encoding="utf-8")
    return sorted((json.loads(x) for x in text.splitlines()), key=lambda r: r["question_id"])


@pytest.mark.parametrize("name", sorted(RELEASE))
def test_turns_and_references_as_given(name):
    t = get_task(name)
    assert t.system_prompt is None and t.max_new_tokens == 512
    samples, rows = t.load(_data_dir()), _rows(name)
    assert len(samples) == 80 == len(t.load(_data_dir(), subset="paper"))
    assert [s.turns for s in samples] == [r["turns"] for r in rows]
    assert [s.id for s in samples] == [f"{name}/{r['question_id']}" for r in rows]
    if name != "qa":
        assert [s.reference for s in samples] == [r["reference"][0] for r in rows]
    assert t.data_sha256(_data_dir()) == {f"mars_release/{RELEASE[name]}/question.jsonl":
                                          D.PUBLIC[f"mars_release/{RELEASE[name]}/question.jsonl"].sha256}


def test_cnn_dm_rouge_equals_rouge_score():
    t = get_task("cnn_dm")
    samples = t.load(_data_dir(), limit=3)
    outputs = [[samples[0].reference], [" ".join(samples[1].reference.split()[:12])],
               ["Completely unrelated words here."]]
    scored = [t.score(s, o) for s, o in zip(samples, outputs)]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    for s, o, r in zip(samples, outputs, scored):
        ref = scorer.score(s.reference, o[0])
        assert r == {k: ref[k].fmeasure for k in ("rouge1", "rouge2", "rougeL")}
    assert scored[0]["rouge1"] == pytest.approx(1.0) and scored[2]["rouge2"] < scored[1]["rouge2"]
    agg = t.aggregate(samples, scored, outputs)
    assert agg["rougeL"] == pytest.approx(sum(r["rougeL"] for r in scored) / 3) and agg["n"] == 3
    assert set(agg) - {"n"} == set(t.metrics)


def test_alpaca_chrf_equals_sacrebleu():
    t = get_task("alpaca")
    samples = t.load(_data_dir(), limit=4)
    outputs = [[s.reference[: len(s.reference) // 2]] for s in samples]
    scored = [t.score(s, o) for s, o in zip(samples, outputs)]
    assert [r["hypothesis"] for r in scored] == [o[0] for o in outputs]
    agg = t.aggregate(samples, scored, outputs)
    want = sacrebleu.corpus_chrf([o[0] for o in outputs], [[s.reference for s in samples]]).score
    assert agg["chrf"] == pytest.approx(want) and agg["n"] == 4 and "chrF2" in agg["sacrebleu_signature"]
    assert set(agg) - {"n", "sacrebleu_signature"} == set(t.metrics)


def test_qa_has_no_quality_metric():
    t = get_task("qa")
    samples = t.load(_data_dir(), limit=5)
    assert all(s.reference is None for s in samples) and t.metrics == {}
    assert t.score(samples[0], ["an answer"]) == {}
    assert t.aggregate(samples, [{}] * 5, [["a"]] * 5) == {"n": 5}


def test_release_row_count_and_fields_checked(tmp_path):
    p = tmp_path / "mars_release/sum/question.jsonl"
    p.parent.mkdir(parents=True)
    lines = (_data_dir() / "mars_release/sum/question.jsonl").read_text().splitlines()
    p.write_text("\n".join(lines[:79]))
    with pytest.raises(DataError) as e:
        get_task("cnn_dm").load(tmp_path)
    assert str(e.value) == f"{p}: expected 80 rows, found 79"
    row = json.loads(lines[5])
    row["turns"] = []
    p.write_text("\n".join(lines[:5] + [json.dumps(row)] + lines[6:]))
    with pytest.raises(DataError) as e:
        get_task("cnn_dm").load(tmp_path)
    assert str(e.value).startswith(f"{p}:6: ") and "'turns'" in str(e.value)


# ---- pinned public copies of the authors' files ------------------------------------------------------------------
RELEASE_FILES = sorted(rel for rel in D.PUBLIC if rel.startswith("mars_release/"))


def test_every_release_file_is_pinned():
    assert len(RELEASE_FILES) == 8
    for rel in RELEASE_FILES:
        url = D.PUBLIC[rel].url
        assert url == ("https://raw.githubusercontent.com/5SSjw/MARS/8909b411bcf69ef9876acf63366d5a72de32cd49/mars/"
                       "data/" + rel.removeprefix("mars_release/"))


@pytest.mark.parametrize("rel", RELEASE_FILES)
def test_fetch_public_counts_rows_without_final_newline(tmp_path, rel):
    blob = (_data_dir() / rel).read_bytes()
    dest = tmp_path / rel
    assert D.fetch_public(rel, dest, lambda url: blob) == dest and dest.read_bytes() == blob
    if blob.endswith(b"\n"):
        return
    extra = blob + b"\n" + blob.split(b"\n")[0]                      # one row more: refused, not cached
    dest.unlink()
    with pytest.raises(DataError, match="sha256"):
        D.fetch_public(rel, dest, lambda url: extra)
    assert not dest.exists()


def test_new_user_fetches_release_files(tmp_path, monkeypatch):
    monkeypatch.delenv("MARS_BENCH_DATA_DIR", raising=False)
    monkeypatch.setenv("MARS_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "SIBLING_DATA", tmp_path / "no-shared-here")   # our own constant
    urls = {D.PUBLIC[rel].url: rel for rel in RELEASE_FILES}
    calls = []

    def serve(url):
        calls.append(url)
        return (_data_dir() / urls[url]).read_bytes()

    t = get_task("qa")
    t.download = serve
    assert len(t.load(None)) == 80 and len(calls) == 1
    assert (tmp_path / "cache/data/mars_release/qa/question.jsonl").is_file()


def test_local_copy_with_another_sha256_is_refused(tmp_path):
    p = tmp_path / "mars_release/qa/question.jsonl"
    p.parent.mkdir(parents=True)
    p.write_text((_data_dir() / "mars_release/qa/question.jsonl").read_text().replace("Who played", "Who plays", 1))
    with pytest.raises(DataError) as e:
        get_task("qa").load(tmp_path)
    want = D.PUBLIC["mars_release/qa/question.jsonl"].sha256
    assert str(e.value) == f"{p}: sha256 {D.sha256_file(p)}; allowed: {want} (the recorded copy, byte for byte)"
