"""Interleaved comparison (``interleave``): one process decodes each sample with every method in turn,
rotating the order per sample; outputs equal the one-method-per-job runs, each method keeps its own
resumable run directory, and the records say how they were timed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "mars_bench.cli", *args, "model=tiny", "progress=false"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def records(root: Path) -> dict:
    out = {}
    for f in root.rglob("samples.jsonl"):
        out[f.parent.name] = [json.loads(line) for line in f.read_text().splitlines()]
    return out


def test_interleaved_equals_sequential_and_rotates(tmp_path):
    common = ["task=prompts", "limit=4", "max_new_tokens=12"]
    res = cli("+compare=methods", *common, f"results_dir={tmp_path / 'i'}")
    assert res.returncode == 0, res.stderr
    res = cli("-m", "method=ar,sd,mars", *common, f"results_dir={tmp_path / 's'}")
    assert res.returncode == 0, res.stderr
    inter, seq = records(tmp_path / "i"), records(tmp_path / "s")
    assert sorted(inter) == sorted(seq) and len(inter) == 3
    for tag in inter:
        a = {r["id"]: r["turns"][0]["output_ids"] for r in inter[tag]}
        b = {r["id"]: r["turns"][0]["output_ids"] for r in seq[tag]}
        assert a == b, tag                                # greedy: timing mode changes nothing decoded
        assert {r["timing"] for r in inter[tag]} == {"interleaved"}
        assert {r["timing"] for r in seq[tag]} == {"sequential"}
    # the order rotates: sample i starts with method i mod 3, so every method is first once in 3 samples
    firsts = {r["index"]: tag for tag in inter for r in inter[tag] if r["order"] == 0}
    assert len(set(firsts[i] for i in range(3))) == 3
    s = json.loads(next((tmp_path / "i").rglob("mars-k4-th0.9-T0-p1-n12-s0@*/summary.json")).read_text())
    assert s["speedup"]["n_common"] == 4 and s["stats"]["speedup"]["lo"] is not None


def test_interleaved_resumes_and_refuses_bad_entries(tmp_path):
    r = f"results_dir={tmp_path / 'r'}"
    assert cli("+compare=methods", "limit=2", "max_new_tokens=8", r).returncode == 0
    res = cli("+compare=methods", "limit=3", "max_new_tokens=8", r)
    assert res.returncode == 0 and "(3 decodes to do)" in res.stderr + res.stdout
    assert all(len(v) == 3 for v in records(tmp_path / "r").values())
    bad = cli("+compare=methods", "interleave=[['method=ar'],['task=gsm8k']]", r)
    assert bad.returncode == 2 and "interleave entry 'task=gsm8k'" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("interleave=[['method=ar'],['method=mars','rule.theta=7']]", r)
    assert bad.returncode == 2 and "rule.theta=7" in bad.stderr and "Traceback" not in bad.stderr
