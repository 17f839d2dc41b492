"""scripts/gpu_check.py (the device machine's check of the decoding engine) on CPU, with small settings:
every check passes, the JSON summary is written ($OUT or --out), a mismatch is reported with its
position and logit gap, and a CUDA request without CUDA exits 2."""
import importlib.util
import json

import torch

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_cpu_run_passes_and_writes_the_summary_to_out(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--device", "cpu", "--prompts", "3", "--max-new", "12"]) == 0
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["passed"] and summary["device"] == "cpu" and summary["prompts"] == 3
    assert set(summary["checks"]) == {"ar_matches_hf_generate", "sd_chain_matches_hf_generate",
                                      "tree_and_lookup_matches_hf_generate", "batch4_equals_batch1"}
    assert all(c["passed"] and c["compared"] > 0 and not c["mismatches"] for c in summary["checks"].values())
    assert summary["timings"]["ar"]["ratio_to_ar"] == 1.0
    assert all(t["tokens"] > 0 and t["tokens_per_s"] > 0 for t in summary["timings"].values())
    out = capsys.readouterr().out
    assert "NOT a speed claim" in out and "PASS: 4/4 checks passed on cpu" in out


def test_first_diff_names_the_position_and_the_logit_gap(tiny, prompt_ids, hf_reference):
    ref = hf_reference[0]
    got = ref[:5] + [(ref[5] + 1) % 256] + ref[6:]
    msg = gpu_check.first_diff(got, ref, tiny[0], prompt_ids[0])
    assert msg.startswith("token 5:") and "top1-top2 gap" in msg


def test_cuda_requested_without_cuda_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "CUDA" in out and not (tmp_path / "x.json").exists()
