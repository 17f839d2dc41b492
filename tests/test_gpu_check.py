"""scripts/gpu_check.py (the device machine's check of the decoding engine) on CPU at small shapes: every
check passes with identity required exactly, drafts are really accepted, host reads per step are within
bounds, the runner's interleaved path runs on the device (tiny pair, its own process) with sd's tokens ar's,
no tokens/s is timed by the script itself, the JSON summary is written ($OUT or --out), a mismatch is
reported with its position and logit gap, and a CUDA request without CUDA exits 2."""
import importlib.util
import json

import torch

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

IDENTITY = {"ar_vs_generate", "sd k=4_vs_ar", "mars theta=1_vs_ar", "sd_tree_vs_ar", "eagle3_vs_ar", "sd_B2_vs_B1",
            "sd_B8_vs_B1", "sd k=4_fixed_vs_eager", "sd_tree_fixed_vs_eager"}      # capture's "compile": CUDA only


def test_cpu_small_run_passes_and_writes_the_summary_to_out(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--device", "cpu", "--small", "--prompts", "3", "--max-new", "16", "--draws", "200",
                           "--runner-prompts", "2"]) == 0
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {c["check"]: c for c in summary["checks"]}
    assert summary["passed"] and summary["device"] == "cpu" and summary["small"] and summary["prompts"] == 3
    assert set(checks) == IDENTITY | {"eagle3_inv_freq_fp32", "chi2_first_token", "host_reads_per_step",
                                      "runner_interleaved"}
    assert all(checks[k]["required_zero"] and checks[k]["mismatch_rate"] == 0 for k in IDENTITY)   # CPU: exact
    assert checks["host_reads_per_step"]["sd k=4"] <= 2 and checks["chi2_first_token"]["bins"] > 2
    assert summary["timing"]["sd k=4"]["tau"] > 1.5          # drafts accepted: the identity checks bite
    assert all(t["draft_ms"] > 0 for k, t in summary["timing"].items() if k in ("sd k=4", "sd_tree", "eagle3"))
    assert not any("tokens_per_s" in t for t in summary["timing"].values())   # no speed loop of its own
    assert all(summary["timing"][f"{m} fixed"]["tau"] == summary["timing"][m]["tau"] for m in ("sd k=4", "sd_tree"))
    runner = checks["runner_interleaved"]
    assert runner["n"] == [2, 2, 2] and runner["sd_identical_to_ar"] == 2 and runner["required_zero"]
    assert runner["methods"][0] == "ar" and runner["peak_rss_gb"] > 0
    out = capsys.readouterr().out
    assert "NOT a speed claim" in out and "runner, tiny pair (summary.json's numbers" in out
    assert f"PASS: {len(checks)}/{len(checks)} checks passed on cpu" in out


def test_first_divergence_names_the_position_and_the_logit_gap(tiny, prompt_ids, hf_reference):
    ref = hf_reference[0]
    got = ref[:5] + [(ref[5] + 1) % 256] + ref[6:]
    d = gpu_check.first_divergence(got, ref, tiny[0], prompt_ids[0])
    assert d["position"] == 5 and d["logit_gap"] >= 0
    assert gpu_check.first_divergence(ref, ref, tiny[0], prompt_ids[0]) is None
    c = gpu_check.compare("x", [got, ref], [ref, ref], tiny[0], prompt_ids[:2], exact=True)
    assert c["mismatch_rate"] == 0.5 and not c["passed"] and c["divergent"][0]["prompt"] == 0
    assert gpu_check.compare("x", [got, ref], [ref, ref], tiny[0], prompt_ids[:2], exact=False)["passed"]


def test_cuda_requested_without_cuda_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "CUDA" in out and not (tmp_path / "x.json").exists()
