"""Experiment-tracker hooks for ``mars_bench.run``: ``make_logger(cfg.logger, run_dir, cfg)``.

    logger = make_logger(cfg.logger, run_dir, cfg)   # after the run directory is known
    logger.log_sample(record)                        # after each sample record is written
    logger.log_summary(summary, figures=None)        # at the end; figures: PNG paths (None: drawn here)
    logger.close()                                   # in a finally: ends the tracker run if still open

``logger=none`` (default) gives a no-op. ``logger=wandb`` (conf/logger/wandb.yaml) logs to Weights &
Biases: wandb is imported only then, mode ``offline`` by default (files under ``<run_dir>/wandb``, upload
later with ``wandb sync``), one W&B run per mars-bench run, named by its run tag. Runs are grouped by
sweep: ``$WANDB_RUN_GROUP`` when set, else ``<sweep>/<model dir>/<task dir>/<settings>`` where <sweep> is
the chosen ``sweep`` or ``experiment`` config (``multirun`` / ``run`` otherwise), so every method and
theta of one sweep over the same settings lands in one group. The run summary mirrors summary.json's
numbers (``summary_values``), every interval and test included (``stats/speedup/lo``,
``stats/quality_vs_ar/<metric>/p_value``, ``.../noninferiority/passes``, ...), read from the summary, never
recomputed. The authors' formulas (``mars_bench.records``) are mirrored again under their own label,
``authors_formula/speedup`` and ``authors_formula/tau`` (with ``_lo`` / ``_hi``), beside ours. The results
files stay the record; the tracker only mirrors them.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("mars_bench")


class NoopLogger:
    """logger=none."""

    def log_sample(self, record: dict) -> None:
        pass

    def log_summary(self, summary: dict, figures=None) -> None:
        pass

    def close(self) -> None:
        pass


def make_logger(logger_cfg: Any, run_dir: str | Path, cfg: Any = None):
    name = getattr(logger_cfg, "name", None) or "none"
    if name == "none":
        return NoopLogger()
    if name == "wandb":
        return WandbLogger(logger_cfg, Path(run_dir), cfg)
    raise ValueError(f"logger.name={name!r}; allowed: none, wandb")


def sweep_group(run_dir: Path) -> str | None:
    """The W&B group of a run; None lets wandb use $WANDB_RUN_GROUP."""
    if os.environ.get("WANDB_RUN_GROUP"):
        return None
    sweep = "run"
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        choices = hc.runtime.choices
        sweep = choices.get("sweep") or choices.get("experiment") or (
            "multirun" if hc.mode == RunMode.MULTIRUN else "run")
    except (ValueError, ImportError, AttributeError):   # not inside a Hydra app
        pass
    run_dir = Path(run_dir)
    settings = run_dir.name[run_dir.name.find("-T") + 1:] if "-T" in run_dir.name else run_dir.name
    return f"{sweep}/{run_dir.parent.parent.name}/{run_dir.parent.name}/{settings}"


def _scalars(prefix: str, d: dict | None) -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, (int, float)):
            out[f"{prefix}/{k}"] = v
    return out


def _flat(prefix: str, d) -> dict:
    """Numbers of a nested dict as ``prefix/key/subkey`` (e.g. stats/speedup/lo, stats/quality_vs_ar/bleu/p_value)."""
    if isinstance(d, dict):
        return {k: v for key, sub in d.items() for k, v in _flat(f"{prefix}/{key}", sub).items()}
    if isinstance(d, bool):
        return {prefix: int(d)}
    return {prefix: d} if isinstance(d, (int, float)) else {}


def summary_values(summary: dict) -> dict:
    """The scalars of summary.json that the tracker mirrors: totals, quality, speedup, fidelity, every
    interval and test of ``stats`` (value / lo / hi / p_value / mde / n) and the stop-reason shares."""
    values = {**_scalars("totals", summary.get("totals")), **_scalars("quality", summary.get("quality")),
              **_scalars("speedup", summary.get("speedup")),
              **_scalars("fidelity", (summary.get("fidelity") or {}).get("aggregate")),
              **_flat("stats", {k: v for k, v in (summary.get("stats") or {}).items() if k != "settings"}),
              **_scalars("stop_reasons", summary.get("stop_reasons"))}
    for i, a in enumerate((summary.get("totals") or {}).get("acceptance_per_depth") or []):
        values[f"totals/acceptance_depth_{i + 1}"] = a
    values.update(authors_formula(summary))
    return values


def authors_formula(summary: dict) -> dict:
    """The authors' speedup and tau (labelled as theirs) with their intervals, where summary.json has them."""
    st, out = summary.get("stats") or {}, {}
    for name in ("speedup", "tau"):
        est = st.get(f"{name}_authors") or {}
        for suffix, key in (("", "value"), ("_lo", "lo"), ("_hi", "hi")):
            if isinstance(est.get(key), (int, float)):
                out[f"authors_formula/{name}{suffix}"] = est[key]
    return out


class WandbLogger:
    def __init__(self, logger_cfg: Any, run_dir: Path, cfg: Any = None):
        try:
            import wandb
        except ImportError:
            raise ValueError("logger.name='wandb' needs the wandb package: pip install -e '.[wandb]' "
                             "(or logger=none)") from None
        self.wandb = wandb
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = {}
        if cfg is not None:
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
        config["run_dir"] = str(self.run_dir)
        if wandb.run is not None:          # a previous job of the same multirun process
            wandb.run.finish()
        method = (config.get("method") or {}).get("name")
        task = (config.get("task") or {}).get("name")
        self.run = wandb.init(project=getattr(logger_cfg, "project", "mars-bench"),
                              mode=getattr(logger_cfg, "mode", "offline") or "offline",
                              dir=str(self.run_dir), name=self.run_dir.name, group=sweep_group(self.run_dir),
                              job_type=method, tags=[t for t in (method, task) if t], config=config)
        self._open = True

    def log_sample(self, record: dict) -> None:
        wall = record.get("wall_s") or 0.0
        proposed = record.get("n_proposed") or 0
        row = {"sample/index": record.get("index"), "sample/new_tokens": record.get("new_tokens"),
               "sample/steps": record.get("steps"), "sample/tau": record.get("tau"),
               "sample/wall_s": wall, "sample/tokens_per_s": (record.get("new_tokens") or 0) / wall if wall else None,
               "sample/n_relaxed": record.get("n_relaxed"),
               "sample/acceptance_rate": (record.get("n_accepted") or 0) / proposed if proposed else None}
        row.update(_scalars("score", record.get("score")))
        self.run.log({k: v for k, v in row.items() if v is not None})

    def log_summary(self, summary: dict, figures=None) -> None:
        self.run.summary.update(summary_values(summary))
        if figures is None:
            try:
                from .report import run_figures

                figures = run_figures(self.run_dir)
            except Exception as e:  # figures are a convenience; the run's files are what count
                log.warning("wandb: no figures for %s (%s)", self.run_dir, e)
                figures = []
        images = {f"figures/{Path(p).name.split('__')[0]}": self.wandb.Image(str(p))
                  for p in figures if str(p).endswith(".png")}
        if images:
            self.run.log(images)
        self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            self.run.finish()
