"""Experiment-tracker hooks for ``mars_bench.run.runner``: ``make_logger(cfg.logger, run_dir, config)``.

    logger = make_logger(cfg.logger, run_dir, config, spec=spec, sweep=sweep)   # once the run directory is known
    logger.log_sample(record)                        # after each sample record is written
    logger.log_summary(summary, figures=None)        # at the end; figures: PNG paths (None: drawn here)
    logger.close()                                   # in a finally: ends the tracker run if still open

``logger=none`` (default) gives a no-op. ``logger=wandb`` (conf/logger/wandb.yaml) logs to Weights &
Biases: wandb is imported only then, mode ``offline`` by default (files under ``<run_dir>/wandb``, upload
later with ``wandb sync``), one W&B run per mars-bench run, named by its spec's directory name. Runs are
grouped by sweep: ``$WANDB_RUN_GROUP`` when set, else ``<sweep>/<model dir>/<task dir>/<settings>`` where
<sweep> is the chosen ``sweep`` or ``experiment`` config (``multirun`` / ``run`` otherwise; the CLI reads it from
Hydra and hands it down, ``config.overrides.Launch``), the two folders
place the run and <settings> are those of its ar baseline's spec (run.json; ``unknown`` without one), so every
method and theta of one sweep over the same settings lands in one group. The run
summary is the run's row as the report's frames hold it (``mars_bench.report.columns.run_row``: the column
names of ``Frames.runs``), read from summary.json, never recomputed: its spec (method, k, theta, ...),
totals, ``speedup`` with ``speedup_lo`` / ``speedup_hi``, ``quality/<metric>``, every paired test
(``vs_ar/<metric>/p_value``, ``vs_ar/<metric>/ni_passes``, ...). The authors' formulas keep their own names
beside ours, ``speedup_authors`` and ``tau_authors`` (with ``_lo`` / ``_hi``). Each sample is logged as its
row of ``Frames.samples`` under ``sample/``. Once its group holds two or more θ of a family, a run also logs the θ
figure's data (``theta_panel``): a table and line plots of speedup, τ and Δ quality against θ. The results files
stay the record; the tracker only mirrors them.
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


def make_logger(logger_cfg: Any, run_dir: str | Path, cfg: Any = None, spec=None, sweep: str = "run"):
    """The run's logger; ``cfg``: the resolved config (a plain dict or a config) the tracker records; ``spec``:
    the run's RunSpec (else read from ``run_dir``); ``sweep``: the group's first part (``sweep_group``)."""
    name = getattr(logger_cfg, "name", None) or "none"
    if name == "none":
        return NoopLogger()
    if name == "wandb":
        return WandbLogger(logger_cfg, Path(run_dir), cfg, spec, sweep)
    raise ValueError(f"logger.name={name!r}; allowed: none, wandb")


def sweep_group(run_dir: Path, spec=None, sweep: str = "run") -> str | None:
    """The W&B group of a run (``spec``: its RunSpec, else read from ``run_dir``; ``sweep``: the ``Launch``'s,
    ``run`` outside the CLI); None lets wandb use $WANDB_RUN_GROUP."""
    from mars_bench.store.spec import read_spec

    if os.environ.get("WANDB_RUN_GROUP"):
        return None
    run_dir = Path(run_dir)
    spec = spec if spec is not None else read_spec(run_dir)
    settings = spec.baseline().label.removeprefix("ar-") if spec is not None else "unknown"   # run.json's
    return f"{sweep}/{run_dir.parent.parent.name}/{run_dir.parent.name}/{settings}"   # the folders: where, not what


def summary_values(summary: dict, spec=None) -> dict:
    """The numbers of the run's frame row (``report.columns.run_row``; ``spec``: its RunSpec, None for the
    summary's statistics alone) that the tracker mirrors."""
    from mars_bench.report.columns import run_row, scalars

    return scalars(run_row(spec, summary))


def sample_values(record: dict) -> dict:
    """The numbers of the sample's frame row (``report.columns.sample_row``) as ``sample/<column>``; the
    per-position logits stay in the results files."""
    from mars_bench.report.columns import sample_row, scalars

    return scalars({k: v for k, v in sample_row(record).items() if k not in ("z1", "z2", "outcome")}, "sample/")


def theta_panel(wandb, run_dir: Path) -> dict:
    """The run's sweep group's θ figure as W&B objects (``report.theta.theta_rows``): ``theta/table`` (every point,
    with its CIs) and line plots of speedup, τ and the paired quality change vs ar against θ (``theta/speedup``,
    ``theta/tau``, ``theta/delta_quality``), one line per family; the group's last run holds the whole sweep. {} while
    no family has two θ, or when the results cannot be read (the files stay the record)."""
    from mars_bench.report.theta import COLUMNS, run_group, theta_rows

    try:
        points = theta_rows(run_group(run_dir))
    except Exception as e:  # a convenience, like the figures
        log.warning("wandb: no θ panel for %s (%s)", run_dir, e)
        return {}
    if not points:
        return {}
    table = wandb.Table(columns=list(COLUMNS), data=[[p[c] for c in COLUMNS] for p in points])
    metric = points[0]["metric"] or "quality"
    out = {"theta/table": table}
    for y, title in (("speedup", "speedup over ar vs θ"), ("tau", "τ vs θ"),
                     ("delta_quality", f"Δ {metric} vs ar (paired) vs θ")):
        out[f"theta/{y}"] = wandb.plot.line(table, "theta", y, stroke="family", title=title)
    return out


class WandbLogger:
    def __init__(self, logger_cfg: Any, run_dir: Path, cfg: Any = None, spec=None, sweep: str = "run"):
        try:
            import wandb
        except ImportError:
            raise ValueError("logger.name='wandb' needs the wandb package: pip install -e '.[wandb]' "
                             "(or logger=none)") from None
        from mars_bench.store.spec import read_spec

        self.wandb = wandb
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.spec = spec if spec is not None else read_spec(self.run_dir)
        config = {}
        if cfg is not None:
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
        config["run_dir"] = str(self.run_dir)
        if wandb.run is not None:          # a previous job of the same multirun process
            wandb.run.finish()
        method = (config.get("method") or {}).get("name")
        task = (config.get("task") or {}).get("name")
        name = self.spec.dir_name if self.spec is not None else self.run_dir.name
        self.run = wandb.init(project=getattr(logger_cfg, "project", "mars-bench"),
                              mode=getattr(logger_cfg, "mode", "offline") or "offline",
                              dir=str(self.run_dir), name=name, group=sweep_group(self.run_dir, self.spec, sweep),
                              job_type=method, tags=[t for t in (method, task) if t], config=config)
        self._open = True

    def log_sample(self, record: dict) -> None:
        self.run.log(sample_values(record))

    def log_summary(self, summary: dict, figures=None) -> None:
        self.run.summary.update(summary_values(summary, self.spec))
        if figures is None:
            try:
                from mars_bench.report import run_figures

                figures = run_figures(self.run_dir)
            except Exception as e:  # figures are a convenience; the run's files are what count
                log.warning("wandb: no figures for %s (%s)", self.run_dir, e)
                figures = []
        images = {f"figures/{Path(p).name.split('__')[0]}": self.wandb.Image(str(p))
                  for p in figures if str(p).endswith(".png")}
        if images:
            self.run.log(images)
        self.run.log(theta_panel(self.wandb, self.run_dir))
        self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            self.run.finish()
            # finish() can return before wandb's service has written the run's records (wandb 0.31: the
            # offline run-*.wandb held only its header when read right after); teardown waits for the
            # service to flush and stop, so the offline files are whole for `wandb sync` once close returns
            self.wandb.teardown()
