"""WMT19 Chinese->English: corpus BLEU and chrF with sacrebleu (signature kept), on the cleaned translation and,
as the MARS authors score it, on the raw output.

Two sets: the default is newstest2019 (2000 segments; ``subset=newstest2019_100`` its first 100); ``subset=paper``
is the authors' 100 segments, the first 100 of the Hugging Face ``wmt19`` zh-en validation split = newstest2018,
read from their ``mars_release/wmt19/question.jsonl`` (else from Hugging Face ``datasets``, checked by sha256).
"""
from __future__ import annotations

import hashlib
import json
import re

from mars_bench.tasks import data as D
from mars_bench.tasks.base import Sample, Task

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


AUTHORS_SET = "newstest2018_authors"
AUTHORS_PREFIX = "Translate the following Chinese text to English.\n\n"   # the authors' turn = prefix + source
# sha256 of the authors' 100 (source, reference) pairs as ``pairs_sha256`` serialises them (their question.jsonl)
AUTHORS_PAIRS_SHA256 = "56d8025e7f5ef51532749e2d5cffba36385d37574395bf1b93b25998c7af3f29"
HF_SOURCE = 'Hugging Face datasets load_dataset("wmt19", "zh-en", split="validation"), first 100'


def pairs_sha256(rows: list[dict]) -> str:
    """sha256 of the JSON list [[zh, en], ...] (UTF-8, ``ensure_ascii=False``, json's default separators)."""
    pairs = [[r["zh"], r["en"]] for r in rows]
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode("utf-8")).hexdigest()


def hf_first_100() -> list[dict]:
    """The authors' 100 segments from Hugging Face ``datasets`` (the ``hf`` extra; imported only here)."""
    from datasets import load_dataset

    ds = load_dataset("wmt19", "zh-en", split="validation")
    return [{"zh": r["translation"]["zh"], "en": r["translation"]["en"]} for r in ds.select(range(100))]


class WMT19ZhEn(Task):
    name = "wmt19_zh_en"

    def __init__(self, **overrides):
        super().__init__(**overrides)
        self.hf_load = hf_first_100   # the second source of the authors' set (a seam: tests pass a stand-in)

    def read_rows(self, data_dir) -> list[dict]:
        return self._authors_rows(data_dir) if self.data_set == AUTHORS_SET else self._newstest_rows(data_dir)

    def _newstest_rows(self, data_dir) -> list[dict]:
        src_rel, ref_rel = self.data["files"]
        lines = {}
        for rel in (src_rel, ref_rel):
            shown = self.display_path(data_dir, rel)
            lines[rel] = D.read_lines(self.local_file(data_dir, rel))
            D.check_count(lines[rel], self.rows_expected(rel), shown)
            for i, line in enumerate(lines[rel], 1):
                if not line.strip():
                    raise D.DataError(shown, "expected a non-empty segment, got an empty line", i)
        return [{"zh": z, "en": e} for z, e in zip(lines[src_rel], lines[ref_rel])]

    def _authors_rows(self, data_dir) -> list[dict]:
        rel = self.data["files"][0]
        n = self.rows_expected(rel)
        try:
            path = self.local_file(data_dir, rel)
        except D.DataError as e:
            return self._hf_rows(n, e)
        rows = D.read_jsonl(path, {"question_id": "int", "turns": "list", "reference": "list"})
        D.check_count(rows, n, path)
        out = []
        for i, r in enumerate(rows, 1):
            turns, refs = r["turns"], r["reference"]
            if not (len(turns) == 1 and isinstance(turns[0], str) and turns[0].startswith(AUTHORS_PREFIX)):
                raise D.DataError(path, f"expected 'turns' = [{AUTHORS_PREFIX!r} + source]", i)
            if not (refs and isinstance(refs[0], str) and refs[0].strip()):
                raise D.DataError(path, "expected 'reference' = [a non-empty English reference]", i)
            out.append((r["question_id"], {"zh": turns[0][len(AUTHORS_PREFIX):], "en": refs[0]}))
        return [row for _, row in sorted(out, key=lambda x: x[0])]

    def _hf_rows(self, n: int, missing: D.DataError) -> list[dict]:
        try:
            rows = self.hf_load()
        except ImportError:
            raise D.DataError(missing, "or install the 'hf' extra (datasets) to read the same 100 segments from "
                                       "Hugging Face") from None
        except Exception as e:  # noqa: BLE001 - any failure of the second source: one line
            raise D.DataError(missing, f"and {HF_SOURCE} failed ({type(e).__name__}: {e})") from None
        got = pairs_sha256(rows[:n])
        if len(rows) < n or got != AUTHORS_PAIRS_SHA256:
            raise D.DataError(HF_SOURCE, f"its first {n} (source, reference) pairs have sha256 {got}, expected "
                                         f"{AUTHORS_PAIRS_SHA256} (the authors' file)")
        return rows[:n]

    def make_sample(self, index: int, row: dict) -> Sample:
        prefix = "wmt19_zh_en/newstest2018" if self.data_set == AUTHORS_SET else "wmt19_zh_en"
        return Sample(id=f"{prefix}/{index}", turns=[self.format_prompt(zh=row["zh"])], reference=row["en"],
                      meta={"index": index, "source": row["zh"], "questions": [row["zh"]]})

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        """``hypothesis`` (cleaned, ours) and ``hypothesis_raw`` (the output as is, as the authors score it)."""
        from sacrebleu.metrics import CHRF

        raw = outputs[0] if outputs else ""
        hyp = clean_translation(raw, sample.meta.get("source"))
        return {"hypothesis": hyp, "hypothesis_raw": raw,
                "chrf_sentence": CHRF().sentence_score(hyp, [sample.reference]).score}

    def aggregate(self, samples, scored, outputs) -> dict:
        if not samples:
            return {"n": 0}
        refs = [s.reference for s in samples]
        hyps = [r["hypothesis"] if "hypothesis" in r else clean_translation(o[0] if o else "", s.meta.get("source"))
                for s, r, o in zip(samples, scored, outputs)]
        raws = [r["hypothesis_raw"] if "hypothesis_raw" in r else (o[0] if o else "")
                for r, o in zip(scored, outputs)]
        out = corpus_scores(hyps, refs)
        raw = corpus_scores(raws, refs)
        out.update(bleu_raw=raw["bleu"], chrf_raw=raw["chrf"], n=len(samples))
        return out
