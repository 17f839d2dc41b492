"""GSM8K answer extraction (strict and flexible), numeric comparison and scoring."""
import pytest

from mars_bench.tasks import Sample, get_task
from mars_bench.tasks.gsm8k import extract_flexible, extract_strict, normalize_number, reference_answer, same_number


@pytest.mark.parametrize("text,expected", [
    ("1,234.00", "1234"), ("$1,234", "1234"), ("-5", "-5"), ("\u22125", "-5"), ("3.50", "3.5"), ("42.", "42"),
    ("0.0", "0"), ("-0", "0"), (".5", "0.5"), ("$ 7", "7"), ("abc", None), ("", None), (None, None),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("Step 1... so 5 + 13 = 18\n#### 18", "18"),
    ("#### 1,234.00", "1234"),
    ("#### $1,234", "1234"),
    ("The total is #### -3.", "-3"),
    ("####42", "42"),
    ("#### **42**", "42"),
    ("first #### 7 then corrected: #### 9", "9"),       # the last marker counts
    ("#### 3.50", "3.5"),
    ("The answer is 42.", None),                         # no marker: strict fails
    ("#### the answer is 42", None),                     # marker not followed by a number
    ("", None),
])
def test_extract_strict(text, expected):
    assert extract_strict(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("The answer is 42.", "42"),
    ("We get 1,234.00 dollars in total", "1234"),
    ("It costs $5, then $7.50 more.", "7.5"),
    ("Temperature drops to -3 degrees", "-3"),
    ("From 2023-2024 she saved 12", "12"),
    ("5-3=2", "2"),
    ("He has 3 apples and 4 pears, so 7 fruits. Done", "7"),
    ("#### 18", "18"),
    ("x2 and y", None),                                  # digits glued to a word are not a number
    ("no numbers here", None),
    ("version 3.5.1 is out", "3.5"),              # "1" is glued to a "."
])
def test_extract_flexible(text, expected):
    assert extract_flexible(text) == expected


def test_same_number_and_reference():
    assert same_number("1234", normalize_number("1,234.00"))
    assert same_number("-3", "-3.0") and not same_number("3", "-3")
    assert not same_number(None, "1")
    assert reference_answer("blah <<2*3=6>>6\n#### 6") == "6"
    assert reference_answer("#### 1,000") == "1000"
    assert reference_answer("no marker") is None


def test_score_and_aggregate():
    t = get_task("gsm8k")
    s = Sample(id="g/0", turns=["q"], reference="1234")
    a = t.score(s, ["First 1,000 then 234 more, total 1,234.00.\n#### 1,234.00"])
    assert a == {"correct_strict": 1, "correct_flexible": 1, "correct_authors": 1, "pred_strict": "1234",
                 "pred_flexible": "1234", "pred_authors": "1234.00", "reference": "1234", "reference_authors": "1234"}
    b = t.score(s, ["I think it's $1,234."])
    assert (b["correct_strict"], b["correct_flexible"], b["pred_strict"]) == (0, 1, None)
    assert (b["correct_authors"], b["pred_authors"]) == (1, "1234")          # their fallback: the last number
    c = t.score(s, ["#### 1234\nActually, wait, it is 99"])
    assert (c["correct_strict"], c["correct_flexible"], c["correct_authors"]) == (1, 0, 1)   # their first '####'
    agg = t.aggregate([s] * 3, [a, b, c], [["x"]] * 3)
    assert agg["accuracy_strict"] == pytest.approx(2 / 3) and agg["accuracy_flexible"] == pytest.approx(2 / 3)
    assert agg["accuracy_authors"] == 1.0
    assert agg["strict_format_rate"] == pytest.approx(2 / 3) and agg["n"] == 3
    assert set(agg) - {"n"} <= set(t.metric_directions)
