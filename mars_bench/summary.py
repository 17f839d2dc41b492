"""``summary.json`` for one run: totals, quality (the task's metrics), fidelity and speedup vs ``ar``."""
from __future__ import annotations

import time
from pathlib import Path

from omegaconf import OmegaConf

from . import records as R
from .config import draft_quant_of, method_of
from .decode.rules import RULES
from .tags import RunTag


def fidelity_vs_ar(recs: list[dict], ar_recs: list[dict]) -> dict | None:
    """Per-sample comparison with the ar output of the same target and settings, and its aggregate."""
    from .tasks.fidelity import aggregate_fidelity, fidelity

    ar = {r["id"]: r for r in ar_recs}
    per = {}
    for r in recs:
        if r["id"] not in ar:
            continue
        mine, base = r["turns"], ar[r["id"]]["turns"]
        per[r["id"]] = fidelity([t for x in mine for t in x["output_ids"]],
                                [t for x in base for t in x["output_ids"]],
                                "\n".join(x["output_text"] for x in mine),
                                "\n".join(x["output_text"] for x in base))
    if not per:
        return None
    return {"aggregate": aggregate_fidelity(list(per.values())), "per_sample": per}


def summarize_run(run_dir: Path, task, samples, cfg, data_dir, ar_dir: Path | None = None,
                  sd_dir: Path | None = None) -> dict:
    run_dir = Path(run_dir)
    recs, problems = R.read_samples(run_dir / "samples.jsonl")
    by_id = {r["id"]: r for r in recs}
    ordered = [(s, by_id[s.id]) for s in samples if s.id in by_id]
    method, tag = method_of(cfg), RunTag.parse(run_dir.name)
    quality = task.aggregate([s for s, _ in ordered], [r["score"] for _, r in ordered],
                             [[t["output_text"] for t in r["turns"]] for _, r in ordered]) if ordered else {}
    summary = {
        "run_dir": str(run_dir), "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": cfg.model.name, "task": task.name, "task_version": task.version,
        "method": tag.head if tag else method.name, "k": cfg.method.k,
        "draft_quant": draft_quant_of(cfg),
        "fast_kernel": sorted({r.get("fast_kernel", "unrecorded") for _, r in ordered}),   # one, unless resumed elsewhere
        "scheme": method.name, "rule": method.rule if method.speculative else None,
        "rule_settings": method.rule_kwargs, "lossless": (not method.speculative) or RULES[method.rule].lossless,
        "theta": method.rule_kwargs.get("theta"),
        "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "manifest": R.manifest(), "data_sha256": task.data_sha256(data_dir),
        "totals": R.totals([r for _, r in ordered]), "quality": quality,
        "metric_directions": task.metric_directions, "problems": problems,
        "definitions": {"tau": R.TAU_DEFINITION, "speedup": R.SPEEDUP_DEFINITION},
        "speedup": None, "fidelity": None,
    }
    if ar_dir is not None and (ar_dir / "samples.jsonl").exists():
        ar_recs, _ = R.read_samples(ar_dir / "samples.jsonl")
        mine = [r for _, r in ordered]
        summary["speedup"] = R.speedup(mine, ar_recs)
        summary["fidelity"] = fidelity_vs_ar(mine, ar_recs)
        summary["ar_run_dir"] = str(ar_dir)
    R.atomic_write_json(run_dir / "summary.json", summary)
    return summary
