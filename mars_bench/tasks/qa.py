"""QA (the authors' 80 Natural Questions-style questions, no references): speed and fidelity only."""
from __future__ import annotations

from mars_bench.tasks.base import Sample
from mars_bench.tasks.release import ReleaseTask


class QA(ReleaseTask):
    name = "qa"
    has_reference = False

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        return {}

    def aggregate(self, samples, scored, outputs) -> dict:
        return {"n": len(scored)}
