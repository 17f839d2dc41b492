"""What every report table shares: the definitions its captions cite, the columns naming a run, the
truncation flag, the paired-test cells and the metric label. Its own module so that the tables assembled
elsewhere (``study.py``, ``claims.py``) and ``tables.py`` import it, not each other."""
from __future__ import annotations

from mars_bench.store import metrics as M
from mars_bench.report.columns import val
from mars_bench.report.writer import ARROW, ci

AUTHORS_DEFINITIONS = (f"Authors' formulas, shown beside ours, never instead: {M.SPEEDUP_AUTHORS_DEFINITION}; "
                       f"{M.TAU_AUTHORS_DEFINITION}")
NI_DEFINITION = ("NI = non-inferiority to ar of the quality metric: the one-sided 95% bound of Δ clears the "
                 "margin declared before looking, margin = stats.ni_margin x |ar's score| (yes / no; – when "
                 "untested)")
ACCEPTANCE_DEFINITION = ("acceptance rate at depth i = accepted drafts at depth i / verification steps "
                         "that proposed a draft at depth i")
TRUNCATION_LIMIT = 0.05   # a run whose share of samples cut at max_new_tokens exceeds this is flagged
CI_DEFINITION = ("v [lo, hi] = value and its 95% CI (bootstrap over samples; speedup paired with ar on the "
                 "same resampled samples); p = paired test vs ar (McNemar exact for binary scores, sacrebleu "
                 "paired bootstrap for BLEU/chrF, paired bootstrap of per-sample scores otherwise, e.g. ROUGE); "
                 "MDE = smallest difference this n detects at 80% power, 5% level; truncated = share of samples "
                 "stopped at max_new_tokens")
SPEED_DEFS = f"{M.TAU_DEFINITION}. {M.SPEEDUP_DEFINITION}."
NO_BUDGET_DEFINITION = ("speedup without budget hits = the same speedup over the samples where neither the method's "
                        "nor ar's output hit max_new_tokens in any turn (runaway samples often repeat text that "
                        "drafts easily; leaving them out shows how far they move the headline, either way)")

BASE = {"model_dir": "model", "task_dir": "task", "settings_label": "settings", "method": "method", "k": "k",
        "theta": "theta", "label": "label"}


def paired_cells(key: str, vs: str) -> dict:
    """A ``cells`` mapping: the paired test vs ``vs`` as Δ [CI] in ``key``, its p and MDE beside it."""
    return {**ci(f"vs_{vs}/{{m}}/delta", key), f"vs_{vs}/{{m}}/p_value": f"p_{key}", f"vs_{vs}/{{m}}/mde": f"mde_{key}"}


def metric_label(run, metric: str | None) -> str | None:
    if not metric:
        return None
    return f"{metric} {ARROW.get(val(run, 'metric_directions', {}).get(metric), '')}".strip()


DEFINITIONS = (M.TAU_DEFINITION, M.SPEEDUP_DEFINITION, M.TAU_AUTHORS_DEFINITION, M.SPEEDUP_AUTHORS_DEFINITION,
               NO_BUDGET_DEFINITION, ACCEPTANCE_DEFINITION, NI_DEFINITION, CI_DEFINITION)   # in the order shown


def strip_definitions(caption: str) -> tuple[str, list[str]]:
    """The caption without the definitions it cites (shown once at the top of the report), and those definitions
    (``DEFINITIONS`` in its order; the authors' two count as theirs)."""
    import re

    found = [d for d in DEFINITIONS if d in caption]
    text = caption.replace(AUTHORS_DEFINITIONS, "")
    for d in sorted(found, key=len, reverse=True):
        text = text.replace(d, "")
    text = re.sub(r"\s*([.;:])(\s*[.;:])+", r"\1", text)   # the punctuation left around a removed sentence
    text = re.sub(r"\(\s*\)|\s+(?=[.;,)])", "", re.sub(r"\s{2,}", " ", text)).strip(" ;")
    return text, found
