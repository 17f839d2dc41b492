"""Tasks read straight from the MARS authors' evaluation files (``mars_release/<set>/question.jsonl``, 5SSjw/MARS
``mars/data/``): one JSON object per line with ``question_id``, ``category``, ``turns`` (the user messages, their
instruction already inside, sent as given) and, except ``qa``, ``reference`` (a list; its first item is used)."""
from __future__ import annotations

from mars_bench.tasks import data as D
from mars_bench.tasks.base import Sample, Task


class ReleaseTask(Task):
    """Base of alpaca, cnn_dm and qa: rows in question_id order, turns as given, no prompt template of ours."""

    has_reference = True

    def read_rows(self, data_dir) -> list[dict]:
        rel = self.data["files"][0]
        fields = {"question_id": "int", "category": "str", "turns": "list"}
        if self.has_reference:
            fields["reference"] = "list"
        rows = self.jsonl_rows(data_dir, rel, fields, self.rows_expected(rel))
        path = self.display_path(data_dir, rel)
        seen = set()
        for i, row in enumerate(rows, 1):
            if not (row["turns"] and all(isinstance(t, str) and t.strip() for t in row["turns"])):
                raise D.DataError(path, "expected field 'turns' to be a list of non-empty strings", i)
            if self.has_reference and not (row["reference"] and isinstance(row["reference"][0], str)):
                raise D.DataError(path, "expected field 'reference' to be a list holding a string", i)
            if row["question_id"] in seen:
                raise D.DataError(path, f"expected unique question_id, {row['question_id']} repeats", i)
            seen.add(row["question_id"])
        return sorted(rows, key=lambda r: r["question_id"])

    def make_sample(self, index: int, row: dict) -> Sample:
        return Sample(id=f"{self.name}/{row['question_id']}", turns=list(row["turns"]),
                      reference=row["reference"][0] if self.has_reference else None,
                      meta={"index": index, "question_id": row["question_id"], "category": row["category"],
                            "questions": list(row["turns"])})
