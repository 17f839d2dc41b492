"""The study's greedy identity check: an error on a row-invariant backend (the CPU path), a recorded mismatch
rate with the first divergent position and the logit gap there elsewhere (CUDA, device_map)."""
import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from mars_bench.run import runner, study as study_mode
from mars_bench.store.io import atomic_write_text


def turn(ids, accepted, outcome, z1, z2):
    return {"output_ids": ids, "accepted": accepted, "outcome": outcome, "z1": z1, "z2": z2}


# step 1: 2 drafts accepted, the third rejected (X): entries 0, 1 (accepted) and 2 (the correction's row);
# step 2: 4 of 4 accepted, then a bonus token (no entry for it)
Z1 = [5.0, 4.0, 3.0, 9.0, 8.0, 7.0, 6.0]
Z2 = [1.0, 2.0, 2.5, 1.0, 1.0, 6.5, 1.0]
RECORD = {"turns": [turn(list(range(8)), [2, 4], "AAXAAAA", Z1, Z2), turn([1, 2], [1], "A", [2.0], [1.5])]}


@pytest.mark.parametrize("pos,gap", [(0, 4.0), (1, 2.0), (2, 0.5), (3, 8.0), (5, 0.5), (7, None), (8, 0.5),
                                     (9, None)])
def test_logit_gap_walks_steps_to_the_committed_token(pos, gap):
    assert study_mode.logit_gap(RECORD, pos) == gap


def test_logit_gap_of_a_tree_step_with_a_relaxed_acceptance():
    rec = {"turns": [turn([7, 8, 9], [2], "ARX", [3.0, 2.0, 1.25], [1.0, 1.9, 1.0])]}
    assert [study_mode.logit_gap(rec, p) for p in range(3)] == [2.0, 0.1, 0.25]


def _job(tmp_path, name):
    run_dir = tmp_path / name
    run_dir.mkdir()
    atomic_write_text(run_dir / "samples.jsonl", json.dumps({"id": "b", **RECORD}) + "\n")
    return SimpleNamespace(tag=SimpleNamespace(scheme="sd", head="sd"), cfg=None, samples=["a", "b"], label=name,
                           run_dir=run_dir)


def test_row_invariant_backend_raises_and_others_record_the_mismatch(tmp_path, monkeypatch):
    monkeypatch.setattr(study_mode, "tokens_are_ars", lambda cfg: True)
    per = {"a": {"identical": True, "first_divergence": None}, "b": {"identical": False, "first_divergence": 2}}
    job = _job(tmp_path, "sd")
    with pytest.raises(study_mode.StudyError, match="1 of 2 samples differ"):
        study_mode._check_identity([job], [{"fidelity": {"per_sample": per}}], row_invariant=True)
    summary = {"fidelity": {"per_sample": per}}
    reports = study_mode._check_identity([job], [summary], row_invariant=False)
    want = {"compared": 2, "expected": 2, "mismatched": 1, "mismatch_rate": 0.5,
            "divergent": [{"sample": "b", "first_divergence": 2, "logit_gap": 0.5}]}
    assert reports == [want] and summary["identity"] == want
    assert json.loads((job.run_dir / "identity.json").read_text()) == want


def test_identical_samples_on_cuda_record_a_zero_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(study_mode, "tokens_are_ars", lambda cfg: True)
    per = {"a": {"identical": True, "first_divergence": None}}
    job = _job(tmp_path, "sd")
    job.samples = ["a"]
    (report,) = study_mode._check_identity([job], [{"fidelity": {"per_sample": per}}], row_invariant=False)
    assert report["mismatch_rate"] == 0.0 and report["divergent"] == []


@pytest.mark.parametrize("model,invariant", [({"device": "cpu"}, True), ({"device": "cpu", "device_map": "auto"}, False)])
def test_backend_row_invariance_follows_the_device(model, invariant):
    assert runner.backend_row_invariant(OmegaConf.create({"model": model})) is invariant
