"""W&B (offline): a sweep's group carries the θ figure's data, a table and line plots of speedup, τ and Δ quality
against θ, as the report's ``theta.theta_rows`` reads them from the results files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mars_bench.report import load_frames
from mars_bench.report.frames import groups
from mars_bench.report.theta import COLUMNS, theta_rows

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "results" / "worker0"
TASK = Path("toy-pair_fp32_cpu") / "gsm8k-v1"


def test_theta_rows_are_the_figures_points():
    (group,) = [g for g in groups(load_frames(FIX).runs).values()]
    points = theta_rows(group)
    runs = {r["theta"]: r for _, r in group.iterrows() if r["method"] == "mars"}
    assert [p["theta"] for p in points] == sorted(runs) and len(points) == 2
    for p in points:
        r = runs[p["theta"]]
        assert p["speedup"] == r["speedup"] and p["tau"] == r["tau"]
        assert p["delta_quality"] == r[f"vs_ar/{p['metric']}/delta"]
    one = group[(group["method"] != "mars") | (group["theta"] == 0.9)]
    assert theta_rows(one) == []          # one θ: no curve


def _log(run_dir: Path, monkeypatch) -> Path:
    from mars_bench.run.wandb_logger import make_logger

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = OmegaConf.create({"method": {"name": "mars"}, "task": {"name": "gsm8k"}})
    logger = make_logger(OmegaConf.create({"name": "wandb", "project": "t", "mode": "offline"}), run_dir, cfg)
    logger.log_summary(json.loads((run_dir / "summary.json").read_text()), figures=[])
    logger.close()
    (files,) = list(run_dir.glob("wandb/offline-run-*/files"))
    return files


def test_a_sweep_group_logs_the_theta_table_and_plots_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    shutil.copytree(FIX, tmp_path / "res")
    run_dir = tmp_path / "res" / TASK / "mars-k2-th0.9-T0-p1-n8-s0"
    files = _log(run_dir, monkeypatch)
    body = json.loads(next(p for p in files.glob("media/table/theta/table_*.table.json")).read_text())
    assert body["columns"] == list(COLUMNS)
    assert sorted(row[1] for row in body["data"]) == [0.8, 0.9]
    record = next(files.parent.glob("run-*.wandb")).read_bytes()   # the run's records, as wandb sync uploads them
    for plot in ("speedup", "tau", "delta_quality"):   # wandb.plot.line: a line chart of that column against θ
        assert f"theta/{plot}".encode() in record and f'"y":"{plot}"'.encode() in record, plot
    assert record.count(b"wandb/line/v0") >= 3

    alone = tmp_path / "alone"                            # one θ in the group: no panel
    shutil.copytree(FIX, alone)
    shutil.rmtree(alone / TASK / "mars-k2-th0.8-T0-p1-n8-s0")
    files = _log(alone / TASK / "mars-k2-th0.9-T0-p1-n8-s0", monkeypatch)
    assert not list(files.glob("media/table/theta/*"))
    assert b"wandb/line/v0" not in next(files.parent.glob("run-*.wandb")).read_bytes()
