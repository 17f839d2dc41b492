"""A tiny built-in prompt set (``tasks/specs/prompts/prompts.jsonl``) for smoke runs and tests; no quality metric."""
from __future__ import annotations

from mars_bench.tasks import data as D
from mars_bench.tasks.base import Sample, Task


class Prompts(Task):
    name = "prompts"
    FIELDS = {"id": "str", "prompt": "str"}

    def read_rows(self, data_dir) -> list[dict]:
        rel = self.data_files[0]
        path = self.data_path(data_dir, rel)   # built in: relative to the task folder, never downloaded
        rows = D.read_jsonl(path, self.FIELDS)
        D.check_count(rows, self.spec["data"]["rows"], path)
        return rows

    def make_sample(self, index: int, row: dict) -> Sample:
        return Sample(id=row["id"], turns=[self.format_prompt(prompt=row["prompt"])], reference=None,
                      meta={"index": index})

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        return {}

    def aggregate(self, samples, scored, outputs) -> dict:
        return {}
