"""Alpaca (the authors' 80 instructions with reference outputs): corpus chrF of the raw answer to the reference,
a soft quality signal only (open-ended answers have many good forms; chrF rewards shared character n-grams without
tokenisation, so paraphrase and long answers still score smoothly, where ROUGE-L's single longest common
subsequence of words swings with wording and answer length)."""
from __future__ import annotations

from mars_bench.tasks.base import Sample
from mars_bench.tasks.release import ReleaseTask


class Alpaca(ReleaseTask):
    name = "alpaca"

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        from sacrebleu.metrics import CHRF

        hyp = outputs[0] if outputs else ""
        return {"hypothesis": hyp, "chrf_sentence": CHRF().sentence_score(hyp, [sample.reference]).score}

    def aggregate(self, samples, scored, outputs) -> dict:
        from sacrebleu.metrics import CHRF

        if not samples:
            return {"n": 0}
        chrf = CHRF()
        hyps = [r.get("hypothesis", o[0] if o else "") for r, o in zip(scored, outputs)]
        score = chrf.corpus_score(hyps, [[s.reference for s in samples]])
        return {"chrf": score.score, "sacrebleu_signature": f"chrF2 {chrf.get_signature()}", "n": len(samples)}
