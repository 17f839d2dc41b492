"""The columns of the report's frames: one flat row per run (its spec and its summary) and one per sample,
as ``Frames.runs`` / ``Frames.samples`` and the W&B logger hold them. Pure functions of dicts (no pandas).

Run row (``run_row``), by origin:
  spec       tag (the spec's label), method (the run's head: ar, sd, mars, sd_tree, sd+topk_delta, ...),
             scheme, rule, rule/<setting> (every setting of its rule), theta (a lossy rule's, else empty),
             sweep_knob and sweep_value (the knob a rules sweep varies, and its value), k, tree,
             sample_children, topk_q, p_min, draft_quant, batch_size, temperature, top_p, max_new_tokens, seed,
             system_prompt, budget, enable_thinking, task_prompts, option/<name> (the scheme's own knobs),
             lossless (a speculative method whose outputs follow the target's law), relaxed (a lossy rule),
             flags, family (runs differing only in the sweep knob), label, settings_label
  totals     n (samples), new_tokens, steps, wall_s, tokens_per_s, tau, tau_authors, idx_authors,
             acceptance_rate, acceptance_per_depth (a list), n_proposed, n_accepted, n_exact, n_relaxed, ...
  speedup    speedup (ours; ar: 1), speedup_authors (the authors' formula), speedup_mean_of_ratios,
             ar_tokens_per_s, n_common, speedup_authors_note
  fidelity   pct_identical, median_first_divergence, mean_chrf_to_ar, n_compared (vs ar's outputs)
  intervals  <x>_lo, <x>_hi, <x>_note (95% CI) for x in tau, tau_authors, tokens_per_s, speedup,
             speedup_authors, pct_identical, mean_chrf_to_ar, quality/<metric>; empty where the stored
             estimate is not of the value shown (e.g. a quality over fewer samples than its interval)
  quality    quality/<metric> (the task's aggregate), quality_n, metric_directions (a dict)
  tests      vs_ar/<metric>/<field> and vs_sd/<metric>/<field> (paired, on the same samples): value,
             value_lo, value_hi, base, base_lo, base_hi, delta, delta_lo, delta_hi, p_value, mde, n, level,
             test, note, discordant; the non-inferiority verdict ni_passes, ni_margin, ni_margin_rel,
             ni_bound, ni_p_value, ni_note
  stops      truncated (share of samples cut at max_new_tokens), stop/<reason>
  settings   level, ni_margin (the statistics settings the intervals were computed with)
  provenance model, task, task_version, fast_kernel (a list), machines (a list of labels), subset, limit
Sample row (``sample_row``): id, index, new_tokens, steps, tau, wall_s, tokens_per_s, n_proposed, n_accepted,
n_exact, n_relaxed, acceptance_rate, idx_authors, prefill_s, target_s, draft_s, n_turns, stop_reason (of
its last turn), fast_kernel, score/<key>, and z1, z2, outcome (per verified draft position, over turns).
"""
from __future__ import annotations

from mars_bench.store import metrics as M
from mars_bench.decode.rules import RULES

SPEEDUP = ("speedup", "speedup_authors", "speedup_mean_of_ratios", "ar_tokens_per_s", "n_common",
           "speedup_authors_note")
FIDELITY = ("pct_identical", "median_first_divergence", "mean_chrf_to_ar", "n_compared")
TEST_FIELDS = {"lo": "delta_lo", "hi": "delta_hi"}   # a test's own names -> its columns (delta's interval)
SAMPLE_FIELDS = ("index", "new_tokens", "steps", "tau", "wall_s", "n_proposed", "n_accepted", "n_exact",
                 "n_relaxed", "prefill_s", "target_s", "draft_s")


def val(row, key: str, default=None):
    """``row[key]`` of a dict or a pandas row; ``default`` where absent or missing (None, NaN, NA)."""
    v = row.get(key) if hasattr(row, "get") else None
    if v is None or (isinstance(v, float) and v != v) or type(v).__name__ == "NAType":
        return default
    return v


# ---- spec ------------------------------------------------------------------------------------------
def spec_columns(spec) -> dict:
    """The run's settings (a ``tags.RunSpec``) and the labels the tables and figures show."""
    rule = RULES[spec.rule]
    settings = rule.settings(spec.settings) if spec.scheme != "ar" else {}
    relaxed = spec.scheme != "ar" and not rule.lossless
    knob = rule.sweep if relaxed else None
    value = settings.get(knob) if knob else None
    flags = _flags(spec, rule, settings, relaxed, knob, value)
    k = [f"k={spec.k}"] if spec.k is not None else []
    label = "ar" if spec.scheme == "ar" else " ".join(
        [spec.head + (f" {'θ' if knob == 'theta' else knob}={value:g}" if knob else "")] + k + list(flags))
    out = {"tag": spec.label, "method": spec.head, "scheme": spec.scheme, "rule": spec.rule,
           "theta": settings.get("theta") if relaxed else None, "sweep_knob": knob, "sweep_value": value}
    out.update({name: getattr(spec, name) for name in (
        "k", "tree", "sample_children", "topk_q", "p_min", "draft_quant", "batch_size", "temperature", "top_p",
        "max_new_tokens", "seed", "system_prompt", "budget", "enable_thinking", "task_prompts")})
    out.update({f"rule/{name}": v for name, v in settings.items()})
    out.update({f"option/{name}": v for name, v in _options(spec).items()})
    out.update(lossless=spec.lossless, relaxed=relaxed, flags=flags, family=" ".join([spec.head] + k + list(flags)),
               label=label, settings_label=settings_label(spec))
    return out


def _flags(spec, rule, settings: dict, relaxed: bool, knob: str | None, value) -> tuple[str, ...]:
    """Every other setting: tree shape, the rule's other settings, p_min, topk_q, draft quant, options."""
    parts = rule.tag_parts(settings, spec.temperature, spec.top_p) if relaxed else []
    if knob:
        parts = [p for p in parts if p != f"{rule.knob_map[knob].tag}{value:g}"]
    out = [x for x in (spec.tree, "sample" if spec.sample_children else None) if x] + parts
    out += [f"pmin{spec.p_min:g}"] if spec.p_min else []
    out += [f"q{spec.topk_q}"] if spec.topk_q != "onehot" else []
    out += [f"draft{spec.draft_quant}"] if spec.draft_quant else []
    return tuple(out + [f"{name}={v}" for name, v in sorted(_options(spec).items())])


def _options(spec) -> dict:
    """The scheme's own knobs (lookup's n-gram sizes, ...): not in the tag, so they are flags."""
    return dict(getattr(spec, "options", None) or {})


def settings_label(spec) -> str:
    """What runs compared with each other share: decoding, budget, seed, batch size and protocol."""
    out = f"T={spec.temperature:g} p={spec.top_p:g} n≤{spec.max_new_tokens} seed={spec.seed}"
    out += f" b={spec.batch_size}" if spec.batch_size > 1 else ""
    out += f" system prompt {spec.system_prompt}" if spec.system_prompt != "none" else ""
    out += " budget after step" if spec.budget == "after_step" else ""
    out += "" if spec.enable_thinking is None else f" thinking {'on' if spec.enable_thinking else 'off'}"
    return out + (f" prompts {spec.task_prompts}" if spec.task_prompts != "ours" else "")


# ---- summary ---------------------------------------------------------------------------------------
def summary_columns(s: dict) -> dict:
    """Every statistic of a summary.json, flat (see the module doc)."""
    tot, st = s.get("totals") or {}, s.get("stats") or {}
    agg = (s.get("fidelity") or {}).get("aggregate") or {}
    out = {("n" if k == "n_samples" else k): v for k, v in tot.items()}
    out.update({k: None for k in SPEEDUP}, **(s.get("speedup") or {}))
    out.update({k: None for k in FIDELITY}, **{("n_compared" if k == "n" else k): v for k, v in agg.items()})
    for name in ("tau", "tokens_per_s", "speedup"):
        out.update(_interval(name, st.get(name)))
    out.update(_interval("tau_authors", _same(st.get("tau_authors"), tot.get("tau_authors"))))
    out.update(_interval("speedup_authors", _same(st.get("speedup_authors"), out.get("speedup_authors"))))
    for name in ("pct_identical", "mean_chrf_to_ar"):   # over the samples compared with ar
        est = (st.get("fidelity") or {}).get(name)
        out.update(_interval(name, est if est and est.get("n") == agg.get("n") else None))
    out.update(quality_columns(s))
    for vs in ("ar", "sd"):
        for metric, t in (st.get(f"quality_vs_{vs}") or {}).items():
            out.update(paired_columns(f"vs_{vs}/{metric}", t))
    stops = s.get("stop_reasons") or {}
    out["truncated"] = stops.get("max_new_tokens")
    out.update({f"stop/{k}": v for k, v in stops.items() if k != "n"})
    cfg = s.get("config") or {}
    out.update(level=(st.get("settings") or {}).get("level"), ni_margin=(st.get("settings") or {}).get("ni_margin"),
               model=s.get("model"), task=s.get("task"), task_version=s.get("task_version"),
               fast_kernel=s.get("fast_kernel"), machines=s.get("machines"), subset=cfg.get("subset"),
               limit=cfg.get("limit"))
    return out


def quality_columns(s: dict) -> dict:
    """quality/<metric> and its interval where the stored one is over the same samples; quality_n."""
    quality, cis = s.get("quality") or {}, (s.get("stats") or {}).get("quality") or {}
    out = {"quality_n": quality.get("n"), "metric_directions": dict(s.get("metric_directions") or {})}
    for metric, v in quality.items():
        if metric != "n":
            out[f"quality/{metric}"] = v
            out.update(_interval(f"quality/{metric}", _same(cis.get(metric), v)))
    return out


def _interval(name: str, est: dict | None) -> dict:
    """``<name>_lo`` / ``_hi`` of an estimate, and ``<name>_note`` where it has a note."""
    est = est or {}
    return {f"{name}_lo": est.get("lo"), f"{name}_hi": est.get("hi"),
            **({f"{name}_note": est["note"]} if est.get("note") else {})}


def _same(est: dict | None, value) -> dict | None:
    """The stored estimate when it is of ``value`` (over the same samples), else None (no interval)."""
    ok = est and est.get("value") is not None and value is not None \
        and abs(est["value"] - value) <= 1e-9 * max(1, abs(value))
    return est if ok else None


def paired_columns(prefix: str, t: dict | None) -> dict:
    """One paired test as ``<prefix>/<field>``; its non-inferiority verdict as ``<prefix>/ni_<field>``."""
    out = {}
    for k, v in (t or {}).items():
        if k == "noninferiority":
            out.update({f"{prefix}/ni_{x}": y for x, y in (v or {}).items()})
        else:
            out[f"{prefix}/{TEST_FIELDS.get(k, k)}"] = v
    return out


def paired_test(row, prefix: str) -> dict | None:
    """The paired test at ``prefix`` (e.g. vs_ar/bleu) as ``mars_bench.stats`` returns it; None if absent."""
    if val(row, f"{prefix}/n") is None:
        return None
    back = {v: k for k, v in TEST_FIELDS.items()}
    keys = [k for k in row.keys() if k.startswith(prefix + "/") and not k[len(prefix) + 1:].startswith("ni_")]
    return {back.get(k[len(prefix) + 1:], k[len(prefix) + 1:]): val(row, k) for k in keys}


def run_row(spec, summary: dict | None) -> dict:
    """A run's row: its spec's columns, then its summary's; ar's speedup over itself is 1 by definition."""
    out = {**(spec_columns(spec) if spec is not None else {}), **summary_columns(summary or {})}
    if spec is not None and spec.scheme == "ar":
        out["speedup"] = 1.0
    return out


# ---- samples ---------------------------------------------------------------------------------------
def sample_row(rec: dict) -> dict:
    """One sample record, flat: its counts and times, its scores, its per-position logits over turns."""
    out = {"id": rec.get("id"), **{k: rec.get(k) for k in SAMPLE_FIELDS}}
    wall, proposed, turns = rec.get("wall_s") or 0, rec.get("n_proposed") or 0, rec.get("turns") or []
    out.update(tokens_per_s=(rec.get("new_tokens") or 0) / wall if wall else None,
               acceptance_rate=(rec.get("n_accepted") or 0) / proposed if proposed else None,
               idx_authors=M.authors_idx(rec) if turns else 0, n_turns=len(turns),
               stop_reason=(turns[-1].get("stop_reason") if turns else None), fast_kernel=rec.get("fast_kernel"))
    out.update({f"score/{k}": v for k, v in (rec.get("score") or {}).items()})
    z1, z2, outcome = [], [], ""
    for t in turns:
        a, b, o = t.get("z1") or [], t.get("z2") or [], t.get("outcome") or ""
        n = min(len(a), len(b), len(o))
        z1, z2, outcome = z1 + list(a[:n]), z2 + list(b[:n]), outcome + o[:n]
    return {**out, "z1": z1, "z2": z2, "outcome": outcome}


def scalars(row: dict, prefix: str = "") -> dict:
    """The numbers of a row (booleans as 0 / 1; lists of numbers as <key>/<i>, from 1), for a tracker."""
    out = {}
    for k, v in row.items():
        if isinstance(v, bool):
            out[prefix + k] = int(v)
        elif isinstance(v, (int, float)) and v == v:
            out[prefix + k] = v
        elif isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out.update({f"{prefix}{k}/{i + 1}": x for i, x in enumerate(v)})
    return out


__all__ = ["paired_columns", "paired_test", "run_row", "sample_row", "scalars", "spec_columns", "summary_columns",
           "val"]
