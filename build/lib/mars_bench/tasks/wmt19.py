"""WMT19 Chinese->English (newstest2019, 2000 segments): corpus BLEU and chrF with sacrebleu, signature kept."""
from __future__ import annotations

import re

from . import data as D
from .base import Sample, Task

_LEAD = r"(?:(?:sure|certainly|of course|okay|ok)\s*[,!.]?\s*)?"
_HERE = (r"here(?:'s|\u2019s|\s+is|\s+are)\s+(?:the\s+|an?\s+|my\s+|your\s+)?(?:english\s+|possible\s+)?"
         r"translations?\b[^:\n\uff1a]{0,60}")
_LABEL = (r"(?:the\s+)?(?:english\s+)?(?:translation|translated\s+text|english)"
          r"(?:\s+in\s+english|\s*\(english\))?")
_PREFIX = re.compile(rf"^\s*{_LEAD}(?:{_HERE}|\**{_LABEL}\**)\s*[:\uff1a]\s*(?:\*\*)?\s*", re.I)
_PREAMBLE_LINE = re.compile(rf"^\s*{_LEAD}{_HERE}\s*[.!]?\s*$", re.I)
_NOTE = re.compile(r"^\s*[(\[*]*\s*(?:note|notes|explanation|translation\s+notes?)\b", re.I)
_QUOTES = [('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"), ("\u300c", "\u300d"),
           ("\u300e", "\u300f"), ("\u00ab", "\u00bb")]
_SOURCE_QUOTES = {"\u201c", "\u2018", '"', "'", "\u300c", "\u300e", "\u00ab"}


def clean_translation(text: str, source: str | None = None) -> str:
    """The translation alone: preambles ('Translation:', 'Here is the translation:', 'English:', ...), trailing
    'Note:' paragraphs and wrapping quotes removed; lines joined by single spaces.
    Wrapping quotes are kept when the ``source`` itself is a quotation (starts with a quote mark)."""
    s = text.strip()
    for _ in range(3):
        lines = s.split("\n", 1)
        if len(lines) == 2 and _PREAMBLE_LINE.match(lines[0]) and lines[1].strip():
            s = lines[1].strip()
            continue
        t = _PREFIX.sub("", s, count=1)
        if t == s or not t.strip():
            break
        s = t.strip()
    paras = [p for p in re.split(r"\n\s*\n", s) if p.strip()]
    for i, p in enumerate(paras[1:], start=1):
        if _NOTE.match(p):
            paras = paras[:i]
            break
    s = " ".join(" ".join(paras).split())
    if len(s) >= 4 and s.startswith("**") and s.endswith("**") and s.count("**") == 2:
        s = s[2:-2].strip()
    if source is not None and source.strip()[:1] in _SOURCE_QUOTES:
        return s
    for left, right in _QUOTES:
        inner = s[len(left):-len(right)] if len(s) >= 2 else ""
        if s.startswith(left) and s.endswith(right) and len(s) >= 2 and left not in inner and right not in inner:
            s = inner.strip()
            break
    return s


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU (13a) and chrF (chrF2) with sacrebleu's defaults, and both signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {"bleu": b.score, "chrf": c.score,
            "sacrebleu_signature": f"BLEU {bleu.get_signature()} ; chrF2 {chrf.get_signature()}"}


class WMT19ZhEn(Task):
    name = "wmt19_zh_en"

    def read_rows(self, data_dir) -> list[dict]:
        src_rel, ref_rel = self.data_files
        n = self.spec["data"]["rows"]
        src_path, ref_path = self.local_file(data_dir, src_rel), self.local_file(data_dir, ref_rel)
        src_shown, ref_shown = self.display_path(data_dir, src_rel), self.display_path(data_dir, ref_rel)
        if src_path is not None and ref_path is not None:
            src, ref = D.read_lines(src_path), D.read_lines(ref_path)
        else:
            shown = src_shown if src_path is None else ref_shown
            src, ref = D.from_public(shown, "sacrebleu DATASETS['wmt19'] zh-en", _download)
        for lines, shown in ((src, src_shown), (ref, ref_shown)):
            D.check_count(lines, n, shown)
            for i, line in enumerate(lines, 1):
                if not line.strip():
                    raise D.DataError(shown, "expected a non-empty segment, got an empty line", i)
        return [{"zh": z, "en": e} for z, e in zip(src, ref)]

    def make_sample(self, index: int, row: dict) -> Sample:
        return Sample(id=f"wmt19_zh_en/{index}", turns=[self.format_prompt(zh=row["zh"])], reference=row["en"],
                      meta={"index": index, "source": row["zh"]})

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        from sacrebleu.metrics import CHRF

        hyp = clean_translation(outputs[0] if outputs else "", sample.meta.get("source"))
        return {"hypothesis": hyp, "chrf_sentence": CHRF().sentence_score(hyp, [sample.reference]).score}

    def aggregate(self, samples, scored, outputs) -> dict:
        if not samples:
            return {"n": 0}
        hyps = [r["hypothesis"] if "hypothesis" in r else clean_translation(o[0] if o else "", s.meta.get("source"))
                for s, r, o in zip(samples, scored, outputs)]
        out = corpus_scores(hyps, [s.reference for s in samples])
        out["n"] = len(samples)
        return out


def _download() -> tuple[list[str], list[str]]:
    from sacrebleu import DATASETS  # the public copy; sacrebleu downloads into ~/.sacrebleu

    ds = DATASETS["wmt19"]
    src_file, ref_file = ds.get_source_file("zh-en"), ds.get_reference_files("zh-en")[0]
    return _lines(src_file), _lines(ref_file)


def _lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines
