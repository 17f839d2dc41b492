"""GSM8K (test, 1319 problems): final-number accuracy, strict (``#### N``) and flexible (last number)."""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from . import data as D
from .base import Sample, Task, mean

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
        rows = self.jsonl_rows(data_dir, rel, self.FIELDS, self.spec["data"]["rows"], "Hugging Face openai/gsm8k main/test", _download)
        for i, row in enumerate(rows, 1):
            if reference_answer(row["answer"]) is None:
                raise D.DataError(shown, "expected field 'answer' to end with '#### <number>'", i)
        return rows

    def make_sample(self, index: int, row: dict) -> Sample:
        return Sample(id=f"gsm8k/{index}", turns=[self.format_prompt(question=row["question"])],
                      reference=reference_answer(row["answer"]),
                      meta={"index": index, "solution": row["answer"]})

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        text = outputs[0] if outputs else ""
        strict, flexible = extract_strict(text), extract_flexible(text)
        return {"correct_strict": int(same_number(strict, sample.reference)),
                "correct_flexible": int(same_number(flexible, sample.reference)),
                "pred_strict": strict, "pred_flexible": flexible, "reference": sample.reference}

    def aggregate(self, samples, scored, outputs) -> dict:
        if not scored:
            return {"n": 0}
        return {"accuracy_strict": mean(s["correct_strict"] for s in scored),
                "accuracy_flexible": mean(s["correct_flexible"] for s in scored),
                "strict_format_rate": mean(int(s["pred_strict"] is not None) for s in scored),
                "n": len(scored)}


def _download() -> list[dict]:
    from datasets import load_dataset  # lazy: only users without the local copy need it

    ds = load_dataset("openai/gsm8k", "main", split="test")
    return [{"question": r["question"], "answer": r["answer"]} for r in ds]
