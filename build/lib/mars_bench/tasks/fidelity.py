"""Output fidelity of a method against autoregressive (``ar``) decoding of the same target and settings."""
from __future__ import annotations

import statistics


def fidelity(sample_tokens: list[int], ar_tokens: list[int], sample_text: str, ar_text: str) -> dict:
    """identical: same token ids; first_divergence: first token index where they differ (the shorter length
    when one is a prefix of the other), None when identical; chrf_to_ar: sentence chrF of the text vs ar's."""
    a, b = list(sample_tokens), list(ar_tokens)
    identical = a == b
    first = None
    if not identical:
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if sample_text == ar_text:
        chrf = 100.0
    else:
        from sacrebleu.metrics import CHRF

        chrf = float(CHRF().sentence_score(sample_text, [ar_text]).score)
    return {"identical": identical, "first_divergence": first, "chrf_to_ar": chrf}


def aggregate_fidelity(items: list[dict]) -> dict:
    """pct_identical (0-100), median_first_divergence over divergent samples only (None if none diverge),
    mean_chrf_to_ar; n is the number of samples compared."""
    items = list(items)
    if not items:
        return {"pct_identical": None, "median_first_divergence": None, "mean_chrf_to_ar": None, "n": 0}
    div = [d["first_divergence"] for d in items if not d["identical"] and d["first_divergence"] is not None]
    return {"pct_identical": 100.0 * sum(bool(d["identical"]) for d in items) / len(items),
            "median_first_divergence": statistics.median(div) if div else None,
            "mean_chrf_to_ar": statistics.fmean(float(d["chrf_to_ar"]) for d in items),
            "n": len(items)}
