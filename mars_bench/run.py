"""The Hydra entry point: ``mars-bench model=tiny method=mars method.theta=0.9 method.k=4 ...``.

Thin on purpose: validate, load the task's samples, skip samples already in ``samples.jsonl``,
decode the rest (records written one by one), then write ``summary.json`` atomically.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from . import config as C
from .decoding import generate
from . import interrupts   # [rel]
from .records import SampleWriter, StorageError, atomic_write_text   # [rel] StorageError
from .summary import summarize_run
from .wandb_logger import make_logger

log = logging.getLogger("mars_bench")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def _fmt(x: float) -> str:
    return f"{float(x):g}"


def run_tag(cfg, max_new: int) -> str:
    """Directory name holding every setting that changes outputs (so reruns resume, never mix)."""
    m = cfg.method
    tag = m.name if m.name == "ar" else f"{m.name}-k{m.k}"
    if m.name in C.TREE_METHODS:
        shape = (f"paths{hashlib.sha1(str(list(map(list, m.static_paths))).encode()).hexdigest()[:8]}"
                 if m.static_paths is not None else f"d{m.depth}-w{m.top_k}-t{m.total_tokens}")
        tag = f"{m.name}-{shape}" + ("-sample" if m.children == "sample" and cfg.temperature > 0 else "")
    if m.name in C.MARS_METHODS:
        tag += f"-th{_fmt(m.theta)}" + ("-ratio" if m.nonpositive_top1 == "ratio" else "")
        tag += "-margin" if (m.sampled_top1 == "margin" and cfg.temperature > 0) else ""
    if C.draft_quant_of(cfg) not in (None, "none"):
        tag += f"-draft{cfg.model.draft_quant}"
    return tag + f"-T{_fmt(cfg.temperature)}-p{_fmt(cfg.top_p)}-n{max_new}-s{cfg.seed}"


def ar_tag(cfg, max_new: int) -> str:
    return f"ar-T{_fmt(cfg.temperature)}-p{_fmt(cfg.top_p)}-n{max_new}-s{cfg.seed}"


def model_dir(cfg) -> str:
    m = cfg.model
    return f"{m.name}_{m.dtype}_{m.device}" + {"off": "_nofast", "mkl": "_mklfast"}.get(m.fast_path, "")


def prepare(cfg):
    """Everything that can fail on bad input, before any model is loaded or file written."""
    from .tasks import get_task

    C.validate(cfg)
    overrides = {} if cfg.task.system_prompt is None else {"system_prompt": cfg.task.system_prompt}
    task = get_task(cfg.task.name, **overrides)
    data_dir = os.environ.get("MARS_BENCH_DATA_DIR") or cfg.data_dir
    samples = task.load(data_dir, limit=cfg.limit, subset=cfg.subset)
    max_new = cfg.max_new_tokens or cfg.task.max_new_tokens or task.max_new_tokens
    task_dir = Path(cfg.results_dir) / model_dir(cfg) / f"{task.name}-v{task.version}"
    return task, samples, data_dir, max_new, task_dir


def run(cfg: DictConfig) -> dict:
    task, samples, data_dir, max_new, task_dir = prepare(cfg)
    run_dir = task_dir / run_tag(cfg, max_new)
    method = C.method_of(cfg)
    writer = SampleWriter(run_dir / "samples.jsonl")
    todo = [(i, s) for i, s in enumerate(samples) if s.id not in writer.done]
    label = f"{cfg.model.name} | {task.name} | {cfg.method.name}" + (
        f" theta={_fmt(cfg.method.theta)}" if cfg.method.name in C.MARS_METHODS else "")
    log.info("%s: %d samples (%d already done) -> %s", label, len(samples), len(samples) - len(todo), run_dir)
    logger = make_logger(cfg.logger, run_dir, cfg)
    try:
        if todo:   # a finished run (e.g. a reused ar baseline) loads no model: it only re-summarizes
            _decode(cfg, task, method, max_new, run_dir, todo, writer, logger, label)
        summary = summarize_run(run_dir, task, samples, cfg, data_dir,
                                ar_dir=task_dir / ar_tag(cfg, max_new) if method.name != "ar" else None)
        logger.log_summary(summary)
    finally:
        logger.close()
    log.info("%s: %s", label, {k: summary["totals"][k] for k in ("tokens_per_s", "tau", "n_relaxed")})
    return summary


def _decode(cfg, task, method, max_new, run_dir, todo, writer, logger, label) -> None:
    """Decode the samples not done yet; one record per sample, written as soon as it finishes."""
    from .models import fastpath
    from .models.pairs import load_pair
    from .tasks import build_messages

    pair = load_pair(cfg.model, need_draft=method.name in C.DRAFT_METHODS)
    draft = pair.draft
    if method.name.startswith("eagle3"):
        from .eagle3 import load_eagle3_drafter

        draft = load_eagle3_drafter(cfg.model.eagle3, pair.target)
    tok = pair.tokenizer
    kernel = fastpath.kind(pair.target.model)   # recorded: which linear kernel the target ran on
    eos = {tok.eos_token_id} | set(_as_list(getattr(pair.target.model.generation_config, "eos_token_id", None)))
    dcfg = C.decode_config(cfg, max_new, sorted(i for i in eos if i is not None), task.stop_strings)
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    try:
        for i, sample in _progress(writer.claimed(todo), label, cfg.progress):   # [rel] claims: no sample twice
            outputs, turns = [], []
            for t in range(len(sample.turns)):
                ids = tok.apply_chat_template(build_messages(task, sample, outputs, t),
                                              add_generation_prompt=True, return_dict=False)
                res = generate(pair.target, draft, tok, ids, method, dcfg,
                               seed=cfg.seed * 1_000_003 + i + 100_003 * t)
                outputs.append(tok.decode(res.tokens, skip_special_tokens=True))
                turns.append(_turn_record(res, ids, outputs[-1]))
            record = _sample_record(cfg, task, sample, i, turns, task.score(sample, outputs), kernel)
            writer.write(record)
            logger.log_sample(record)
    finally:
        writer.close()


def _as_list(x):
    return [] if x is None else (list(x) if isinstance(x, (list, tuple)) else [x])


def _progress(items, label, enabled):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=label, unit="sample", dynamic_ncols=True)


def _turn_record(res, prompt_ids, text) -> dict:
    return {"prompt_tokens": len(prompt_ids), "new_tokens": len(res.tokens), "steps": res.steps,
            "tau": res.tau, "stop_reason": res.stop_reason, "prefill_s": res.prefill_s,
            "wall_s": res.wall_s, "target_s": res.target_s, "draft_s": res.draft_s,
            "proposed": res.proposed, "accepted": res.accepted, "relaxed": res.relaxed,
            "z1": [round(x, 4) for x in res.z1], "z2": [round(x, 4) for x in res.z2],
            "outcome": res.outcome, "output_ids": res.tokens, "output_text": text,
            "depth_proposed": getattr(res, "depth_proposed", None)}


def _sample_record(cfg, task, sample, index, turns, score, fast_kernel: str) -> dict:
    s = lambda key: sum(t[key] for t in turns)  # noqa: E731
    n_acc = sum(sum(t["accepted"]) for t in turns)
    n_rel = sum(len(t["relaxed"]) for t in turns)
    return {"id": sample.id, "index": index, "task": task.name, "task_version": task.version,
            "model": cfg.model.name, "method": cfg.method.name, "k": cfg.method.k,
            "draft_quant": C.draft_quant_of(cfg), "fast_kernel": fast_kernel,
            "theta": cfg.method.theta if cfg.method.name in C.MARS_METHODS else None,
            "temperature": cfg.temperature, "seed": cfg.seed,
            "new_tokens": s("new_tokens"), "steps": s("steps"),
            "tau": s("new_tokens") / s("steps") if s("steps") else 0.0,
            "n_proposed": sum(sum(t["proposed"]) for t in turns), "n_accepted": n_acc,
            "n_exact": n_acc - n_rel, "n_relaxed": n_rel, "prefill_s": s("prefill_s"),
            "wall_s": s("wall_s"), "target_s": s("target_s"), "draft_s": s("draft_s"),
            "score": score, "turns": turns}


C.register()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig):
    try:
        return run(cfg)
    except StorageError as e:   # [rel] full disk / read-only results: one line naming the path, exit 1
        print(f"mars-bench: error: {e}", file=sys.stderr)
        sys.exit(1)
    except (C.ConfigError, ValueError) as e:   # bad input: one line, no traceback, exit 2
        if not isinstance(e, C.ConfigError) and getattr(e, "__traceback__", None) and _generating(e):
            raise
        print(f"mars-bench: error: {e}", file=sys.stderr)
        sys.exit(2)


def _generating(e: BaseException) -> bool:
    """True when the error came from inside the decode loop (a bug, not bad input)."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "generate":
            return True
        tb = tb.tb_next
    return False


def main() -> None:
    interrupts.run_main(_checked_main)   # [rel] SIGINT/SIGTERM: one line, exit 130/143, finished samples kept


def _checked_main() -> None:   # [rel] overrides Hydra would refuse in several lines: one line, exit 2
    try:
        C.check_overrides(sys.argv[1:])
    except C.ConfigError as e:
        print(f"mars-bench: error: {e}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
