"""CNN/DailyMail (the authors' ``sum`` set, 80 articles, "Summarize: ..."): ROUGE-1/2/L F-measure per sample by
the ``rouge-score`` package (Porter stemming), averaged over the samples."""
from __future__ import annotations

from mars_bench.tasks.base import Sample, mean
from mars_bench.tasks.release import ReleaseTask

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_f(hypothesis: str, reference: str) -> dict[str, float]:
    """{rouge1, rouge2, rougeL}: F-measures of ``rouge_scorer.RougeScorer(..., use_stemmer=True)``."""
    from rouge_score import rouge_scorer

    scores = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True).score(reference, hypothesis)
    return {t: scores[t].fmeasure for t in ROUGE_TYPES}


class CnnDm(ReleaseTask):
    name = "cnn_dm"

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        return rouge_f(outputs[0] if outputs else "", sample.reference)

    def aggregate(self, samples, scored, outputs) -> dict:
        if not scored:
            return {"n": 0}
        return {**{t: mean(r[t] for r in scored) for t in ROUGE_TYPES}, "n": len(scored)}
