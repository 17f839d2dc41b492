"""Bad data files give one-line ValueErrors naming file, line and what was expected, before any generation."""
import gzip
import json
from pathlib import Path

import pytest

from mars_bench.tasks import DataError, get_task

GOOD = {"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    return path


def _error(task, data_dir) -> str:
    with pytest.raises(ValueError) as e:
        task.load(data_dir)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert isinstance(e.value, DataError)
    return msg


@pytest.fixture
def no_download(monkeypatch, tmp_path):
    """An empty user cache; a download, should one be tried, fails (there is no internet here anyway)."""
    monkeypatch.setenv("MARS_BENCH_CACHE", str(tmp_path / "user-cache"))


def _offline(url):
    raise ConnectionError("offline")


def test_bad_json_line(tmp_path, no_download):
    p = _write(tmp_path / "gsm8k" / "test.jsonl", [json.dumps(GOOD), '{"question": "x", "answer": ', json.dumps(GOOD)])
    msg = _error(get_task("gsm8k"), tmp_path)
    assert msg.startswith(f"{p}:2: ") and "JSON" in msg


def test_empty_line(tmp_path, no_download):
    p = _write(tmp_path / "gsm8k" / "test.jsonl", [json.dumps(GOOD), "", json.dumps(GOOD)])
    assert _error(get_task("gsm8k"), tmp_path).startswith(f"{p}:2: ")


def test_missing_field(tmp_path, no_download):
    p = _write(tmp_path / "gsm8k" / "test.jsonl", [json.dumps(GOOD)] * 2 + [json.dumps({"question": "q"})])
    msg = _error(get_task("gsm8k"), tmp_path)
    assert msg.startswith(f"{p}:3: ") and "'answer'" in msg and "missing" in msg


def test_wrong_field_type(tmp_path, no_download):
    p = _write(tmp_path / "gsm8k" / "test.jsonl", [json.dumps({"question": 5, "answer": "#### 1"})])
    msg = _error(get_task("gsm8k"), tmp_path)
    assert msg.startswith(f"{p}:1: ") and "'question'" in msg


def test_not_an_object(tmp_path, no_download):
    p = _write(tmp_path / "gsm8k" / "test.jsonl", [json.dumps(GOOD), "[1, 2]"])
    assert _error(get_task("gsm8k"), tmp_path).startswith(f"{p}:2: expected a JSON object")


def test_wrong_count(tmp_path, no_download):
    p = _write(tmp_path / "gsm8k" / "test.jsonl", [json.dumps(GOOD)] * 3)
    msg = _error(get_task("gsm8k"), tmp_path)
    assert msg == f"{p}: expected 1319 rows, found 3"


def test_gsm8k_answer_without_marker(tmp_path, no_download):
    rows = [json.dumps(GOOD)] * 1319
    rows[41] = json.dumps({"question": "q", "answer": "no final marker"})
    p = _write(tmp_path / "gsm8k" / "test.jsonl", rows)
    msg = _error(get_task("gsm8k"), tmp_path)
    assert msg.startswith(f"{p}:42: ") and "####" in msg


def test_missing_file_public_fallback_fails_one_line(tmp_path, no_download):
    task = get_task("gsm8k")
    task.download = _offline
    msg = _error(task, tmp_path)
    cached = tmp_path / "user-cache" / "data" / "gsm8k" / "test.jsonl"
    assert msg.startswith(f"{cached}: ") and "grade-school-math" in msg and "offline" in msg


def test_humaneval_gzip_bad_line(tmp_path, no_download):
    row = {"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
           "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
    bad = dict(row)
    del bad["entry_point"]
    p = tmp_path / "humaneval" / "HumanEval.jsonl.gz"
    p.parent.mkdir(parents=True)
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n" + json.dumps(bad) + "\n")
    msg = _error(get_task("humaneval"), tmp_path)
    assert msg.startswith(f"{p}:2: ") and "'entry_point'" in msg


def test_humaneval_not_gzip(tmp_path, no_download):
    p = tmp_path / "humaneval" / "HumanEval.jsonl.gz"
    _write(p, ["not gzip"])
    msg = _error(get_task("humaneval"), tmp_path)
    assert msg.startswith(f"{p}: ") and "cannot read" in msg


def test_wmt_empty_segment_and_count(tmp_path, no_download):
    src = _write(tmp_path / "wmt19_zh_en" / "src.zh", ["你好"] * 2000)
    ref = _write(tmp_path / "wmt19_zh_en" / "ref.en", ["hello"] * 1999)
    assert _error(get_task("wmt19_zh_en"), tmp_path) == f"{ref}: expected 2000 rows, found 1999"
    _write(ref, ["hello"] * 2000)
    lines = ["你好"] * 2000
    lines[9] = "  "
    _write(src, lines)
    msg = _error(get_task("wmt19_zh_en"), tmp_path)
    assert msg.startswith(f"{src}:10: ") and "empty" in msg


def test_wmt_not_utf8(tmp_path, no_download):
    src = tmp_path / "wmt19_zh_en" / "src.zh"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"\xff\xfe bad\n")
    _write(tmp_path / "wmt19_zh_en" / "ref.en", ["hello"])
    msg = _error(get_task("wmt19_zh_en"), tmp_path)
    assert msg.startswith(f"{src}: ") and "UTF-8" in msg


def test_mt_bench_bad_turns(tmp_path):
    qs = [json.dumps({"question_id": 81 + i, "category": "writing", "turns": ["a", "b"]}) for i in range(80)]
    qs[5] = json.dumps({"question_id": 86, "category": "writing", "turns": ["only one"]})
    refs = [json.dumps({"question_id": 101 + i, "choices": [{"index": 0, "turns": ["x", "y"]}]}) for i in range(30)]
    q = _write(tmp_path / "mt_bench" / "question.jsonl", qs)
    _write(tmp_path / "mt_bench" / "reference_answer" / "gpt-4.jsonl", refs)
    msg = _error(get_task("mt_bench"), tmp_path)
    assert msg.startswith(f"{q}:6: ") and "'turns'" in msg


def test_mt_bench_missing_reference(tmp_path):
    qs = [json.dumps({"question_id": 81 + i, "category": "math" if i == 3 else "writing", "turns": ["a", "b"]})
          for i in range(80)]
    refs = [json.dumps({"question_id": 200 + i, "choices": [{"index": 0, "turns": ["x", "y"]}]}) for i in range(30)]
    _write(tmp_path / "mt_bench" / "question.jsonl", qs)
    r = _write(tmp_path / "mt_bench" / "reference_answer" / "gpt-4.jsonl", refs)
    msg = _error(get_task("mt_bench"), tmp_path)
    assert msg.startswith(f"{r}: ") and "question_id 84" in msg
