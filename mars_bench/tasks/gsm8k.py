"""GSM8K (test, 1319 problems): final-number accuracy, strict (``#### N``) and flexible (last number), and beside
them the MARS authors' extraction cascade (``accuracy_authors``)."""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from mars_bench.tasks import data as D
from mars_bench.tasks.base import Sample, Task, mean

# "#### 1,234.00", "#### $5", "#### **42**", "####-3"; the last such marker in the text counts.
_STRICT = re.compile(r"####\s*(?:\*\*)?\s*(-?\s*\$?\s*-?(?:\d[\d,]*)?\.?\d+)")
# A number not glued to a word or to a preceding '.'/digit; a '-' counts only when it starts the token.
_FLEX = re.compile(r"(?<![\w.])(-?)\$?(\d[\d,]*(?:\.\d+)?|\.\d+)")
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\uff0d": "-"})


def normalize_number(text: str | None) -> str | None:
    """Canonical string for a number: ``"$1,234.00"`` -> ``"1234"``, ``"-0.50"`` -> ``"-0.5"``; None if none."""
    if text is None:
        return None
    s = text.translate(_MINUS).replace(",", "").replace("$", "").replace(" ", "").strip().rstrip(".")
    if not s or s in ("-", "."):
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def extract_strict(text: str) -> str | None:
    """The number right after the last ``####`` (format the prompt asks for), normalised; else None."""
    matches = _STRICT.findall(text.translate(_MINUS))
    return normalize_number(matches[-1]) if matches else None


def extract_flexible(text: str) -> str | None:
    """The last number anywhere in the text, normalised; else None."""
    matches = _FLEX.findall(text.translate(_MINUS))
    for sign, digits in reversed(matches):
        value = normalize_number(sign + digits.rstrip(","))
        if value is not None:
            return value
    return None


def same_number(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


# The MARS authors' scoring (5SSjw/MARS, mars/eval/gsm8k/eval_gsm8k.py), restated. A number token: an optional
# '$', then -1,234.5 / 1234 / 3.14, else a fraction -7/8 (never reached by a search: the first branch already
# matches its numerator, so fractions are read only from a '####' line or a reference).
_AUTHORS_NUMBER = re.compile(r"\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\d+/\d+)")
_AUTHORS_TAG = re.compile(r"<\s*final_answer\s*>", re.I)
_AUTHORS_HASH = re.compile(r"####\s*([^\n#]+)")   # the FIRST '####', everything up to the line end or a '#'
AUTHORS_ABS_TOL = 1e-6


def _authors_clean(s: str) -> str:
    return s.replace("$", "").replace(",", "").strip()


def extract_authors(text: str | None) -> str | None:
    """The authors' answer string: after the last ``<final_answer>`` tag the first number (else the last number
    before it); else the text after the first ``####`` to the line end; else the last number; else None."""
    if not text:
        return None
    tags = list(_AUTHORS_TAG.finditer(text))
    if tags:
        after = _AUTHORS_NUMBER.search(text, tags[-1].end())
        if after:
            return _authors_clean(after.group(1))
        before = list(_AUTHORS_NUMBER.finditer(text, 0, tags[-1].start()))
        if before:
            return _authors_clean(before[-1].group(1))
    marker = _AUTHORS_HASH.search(text)
    if marker:
        return _authors_clean(marker.group(1))
    numbers = list(_AUTHORS_NUMBER.finditer(text))
    return _authors_clean(numbers[-1].group(1)) if numbers else None


def authors_value(s: str | None) -> float | None:
    """The authors' reading of an answer string as a float: ``12%`` -> 0.12, ``1/2`` -> 0.5 (no letters),
    else ``float`` after removing commas; None when it does not parse (or divides by zero)."""
    st = (s or "").strip()
    if not st:
        return None
    if st.endswith("%"):
        try:
            return float(st[:-1].replace(",", "").strip()) / 100.0
        except ValueError:
            return None
    parts = st.split("/")
    if len(parts) == 2 and not any(ch.isalpha() for ch in st):
        try:
            num, den = float(parts[0].replace(",", "").strip()), float(parts[1].replace(",", "").strip())
            return None if den == 0 else num / den
        except ValueError:
            pass
    try:
        return float(st.replace(",", ""))
    except ValueError:
        return None


def authors_correct(gold: str, pred: str | None) -> bool:
    """The authors' comparison: no prediction is wrong; two numbers within 1e-6; else the stripped strings equal."""
    if pred is None:
        return False
    g, p = authors_value(gold), authors_value(pred)
    if g is not None and p is not None:
        return math.isclose(g, p, rel_tol=0.0, abs_tol=AUTHORS_ABS_TOL)
    return str(gold).strip() == str(pred).strip()


def authors_reference(answer: str) -> str:
    """The authors' gold: their extraction applied to the solution's last line, else that line itself."""
    line = answer.split("\n")[-1].strip()
    return extract_authors(line) or line


def reference_answer(answer: str) -> str | None:
    """The dataset's final answer: the number after ``####`` at the end of the solution."""
    if "####" not in answer:
        return None
    return normalize_number(answer.rsplit("####", 1)[1].strip())


class GSM8K(Task):
    name = "gsm8k"
    FIELDS = {"question": "str", "answer": "str"}

    def read_rows(self, data_dir) -> list[dict]:
        rel = self.data_files[0]
        shown = self.display_path(data_dir, rel)
        rows = self.jsonl_rows(data_dir, rel, self.FIELDS, self.rows_expected(rel))
        for i, row in enumerate(rows, 1):
            if reference_answer(row["answer"]) is None:
                raise D.DataError(shown, "expected field 'answer' to end with '#### <number>'", i)
        return rows

    def make_sample(self, index: int, row: dict) -> Sample:
        return Sample(id=f"gsm8k/{index}", turns=[self.format_prompt(question=row["question"])],
                      reference=reference_answer(row["answer"]),
                      meta={"index": index, "solution": row["answer"], "questions": [row["question"]],
                            "reference_authors": authors_reference(row["answer"])})

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        text = outputs[0] if outputs else ""
        strict, flexible, theirs = extract_strict(text), extract_flexible(text), extract_authors(text)
        gold = sample.meta.get("reference_authors") or sample.reference or ""
        return {"correct_strict": int(same_number(strict, sample.reference)),
                "correct_flexible": int(same_number(flexible, sample.reference)),
                "correct_authors": int(authors_correct(gold, theirs)),
                "pred_strict": strict, "pred_flexible": flexible, "pred_authors": theirs,
                "reference": sample.reference, "reference_authors": gold}

    def aggregate(self, samples, scored, outputs) -> dict:
        if not scored:
            return {"n": 0}
        return {"accuracy_strict": mean(s["correct_strict"] for s in scored),
                "accuracy_flexible": mean(s["correct_flexible"] for s in scored),
                "accuracy_authors": mean(s["correct_authors"] for s in scored),
                "strict_format_rate": mean(int(s["pred_strict"] is not None) for s in scored),
                "n": len(scored)}

