"""A run is keyed by the weights it ran (issue 31): two runs whose weights differ never share a run directory,
whatever model.name says; a directory holding another model's records is refused, never resumed; result trees
written before run identities stay readable and are never matched by a new run."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from mars_bench.base.errors import ConfigError
from mars_bench.run import runner as R
from mars_bench.models import identity as I
from mars_bench.store.spec import SPEC_FILE, RunSpec, read_spec

from .test_cli import tiny_cfg


def _save(dirname: Path, seed: int) -> str:
    """A tiny Qwen2 target saved as a Hugging Face directory; ``seed`` changes only its weights."""
    from mars_bench.models.tiny import tiny_pair

    target, _, tok = tiny_pair(seed=seed)
    target.save_pretrained(dirname)
    tok.save_pretrained(dirname)
    return str(dirname)


def _hf_cfg(results, model_dir, *extra):
    return tiny_cfg(results, "model.source=hf", f"model.target={model_dir}", f"model.draft={model_dir}",
                    "model.name=mine", "model.device=cpu", "limit=2", "max_new_tokens=8", *extra)


def _records(summary) -> list[dict]:
    return [json.loads(x) for x in (Path(summary["run_dir"]) / "samples.jsonl").read_text().splitlines()]


def test_same_name_other_weights_never_share_a_run(tmp_path):
    """The bug as a user met it: the same model.name and the same path, the weights replaced in between."""
    model_dir = tmp_path / "model"
    _save(model_dir, seed=0)
    first = R.run(_hf_cfg(tmp_path / "r", model_dir, "method=ar"))
    shutil.rmtree(model_dir)
    _save(model_dir, seed=1)                       # same name, same path, same shapes: other weights
    second = R.run(_hf_cfg(tmp_path / "r", model_dir, "method=ar"))
    assert first["run_dir"] != second["run_dir"]
    a, b = _records(first), _records(second)
    assert len(a) == len(b) == 2                   # the second decoded its own samples, none "already done"
    assert [r["turns"][0]["output_ids"] for r in a] != [r["turns"][0]["output_ids"] for r in b]
    specs = [read_spec(Path(s["run_dir"])) for s in (first, second)]
    assert specs[0].model["weights"] != specs[1].model["weights"]
    assert specs[0].model["weights"].startswith("dir:")
    # and each rerun resumes its own run only
    again = R.run(_hf_cfg(tmp_path / "r", model_dir, "method=ar"))
    assert again["run_dir"] == second["run_dir"] and _records(again) == b


def test_other_draft_weights_give_another_run_but_the_same_baseline(tmp_path):
    t = _save(tmp_path / "t", seed=0)
    d0, d1 = _save(tmp_path / "d0", seed=0), _save(tmp_path / "d1", seed=3)
    specs = []
    for d in (d0, d1):
        cfg = tiny_cfg(tmp_path / "r", "model.source=hf", f"model.target={t}", f"model.draft={d}", "method=sd")
        job = R.Job(cfg)
        specs.append(job.tag)
    assert specs[0].dir_name != specs[1].dir_name
    assert specs[0].model == specs[1].model and specs[0].draft_model != specs[1].draft_model
    assert specs[0].baseline() == specs[1].baseline()          # one ar baseline: the target is the same
    assert specs[0].baseline().draft_model is None and specs[0].baseline().model == specs[0].model


@pytest.mark.parametrize("override", ["model.dtype=bf16", "model.fast_path=off", "model.seed=1"])
def test_every_setting_that_changes_the_target_changes_the_run(tmp_path, override):
    base = R.Job(tiny_cfg(tmp_path, "method=ar")).tag
    other = R.Job(tiny_cfg(tmp_path, "method=ar", override)).tag
    assert base.digest != other.digest and base.model != other.model


def test_tiny_draft_noise_is_part_of_the_draft_identity(tmp_path):
    a = R.Job(tiny_cfg(tmp_path, "method=sd")).tag
    b = R.Job(tiny_cfg(tmp_path, "method=sd", "model.noise=0.2")).tag
    assert a.model == b.model and a.draft_model != b.draft_model and a.dir_name != b.dir_name
    assert R.Job(tiny_cfg(tmp_path, "method=ar", "model.noise=0.2")).tag == a.baseline()   # ar has no draft


def test_a_directory_with_another_models_records_is_refused(tmp_path):
    cfg = tiny_cfg(tmp_path, "method=ar", "limit=1", "max_new_tokens=4")
    job = R.Job(cfg)
    job.run_dir.mkdir(parents=True)
    forged = RunSpec.from_dict({**job.tag.to_dict(), "model": {**job.tag.model, "weights": "dir:0123456789abcdef"}})
    (job.run_dir / SPEC_FILE).write_text(json.dumps(forged.to_dict()))
    (job.run_dir / "samples.jsonl").write_text("")
    with pytest.raises(ConfigError) as e:
        R.run(cfg)
    msg = str(e.value)
    assert "records of other weights" in msg and "allowed" in msg and "\n" not in msg
    assert (job.run_dir / "samples.jsonl").read_text() == ""   # nothing written into it


def test_old_run_json_reads_with_unknown_model_and_is_never_matched(tmp_path):
    job = R.Job(tiny_cfg(tmp_path, "method=ar"))
    old = {k: v for k, v in job.tag.to_dict().items() if k not in ("model", "draft_model", "engine", "engine_version")}
    old["spec_version"] = 1
    legacy = RunSpec.from_dict(old)
    assert legacy.model is None and legacy.draft_model is None and legacy.engine == "native"
    assert legacy.digest != job.tag.digest
    d = tmp_path / "tiny_fp32_auto" / "x" / legacy.dir_name
    d.mkdir(parents=True)
    (d / SPEC_FILE).write_text(json.dumps(old))
    assert read_spec(d) == legacy
    assert "unknown" in I.describe(legacy.model)
    # a spec written before run.json existed (read from its name) has no identity either
    assert RunSpec.parse(legacy.label).model is None


def test_dir_digest_reads_headers_not_weights(tmp_path):
    d = Path(_save(tmp_path / "m", seed=0))
    first = I.dir_digest(str(d))
    (d / ".locks").mkdir()
    (d / ".locks" / "x.lock").write_text("pid")
    assert I.dir_digest(str(d)) == first                        # lock files and caches change nothing
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_theta"] = 12345.0
    (d / "config.json").write_text(json.dumps(cfg))
    assert I.dir_digest(str(d)) != first                        # a config change is another model
    second = I.dir_digest(str(d))
    from safetensors.torch import load_file, save_file

    weights = next(d.glob("*.safetensors"))
    state = load_file(weights)
    name = sorted(state)[0]
    state[name] = state[name][: state[name].shape[0] - 1].clone()   # one row fewer: header and size change
    save_file(state, weights, metadata={"format": "pt"})
    assert I.dir_digest(str(d)) != second
    (tmp_path / "empty").mkdir()
    with pytest.raises(I.IdentityError, match="no weight file"):
        I.dir_digest(str(tmp_path / "empty"))


def test_large_weight_files_are_sampled_and_a_sampled_change_is_seen(tmp_path, monkeypatch):
    """Above SMALL_WEIGHTS a weight file is read in a fixed sample: a change in a sampled block (as retraining
    changes nearly all of them) is seen; one in a skipped byte only by the full hash (documented)."""
    for name, value in (("SMALL_WEIGHTS", 1 << 10), ("EDGE", 1 << 10), ("BLOCKS", 16), ("BLOCK", 64)):
        monkeypatch.setattr(I, name, value)                 # the tiny model's file counts as large
    I._file_digest.cache_clear()
    d = Path(_save(tmp_path / "m", seed=0))
    weights = next(d.glob("*.safetensors"))
    size = weights.stat().st_size
    assert size > 2 * I.EDGE + I.BLOCKS * I.BLOCK // 8
    quick, full = I.dir_digest(str(d)), I.dir_digest(str(d), full=True)
    data = bytearray(weights.read_bytes())
    step = (size - 2 * I.EDGE - I.BLOCK) // (I.BLOCKS - 1)
    skipped = I.EDGE + step // 2 + I.BLOCK                  # between the first two sampled blocks
    assert step > 2 * I.BLOCK
    data[skipped] ^= 0xFF
    weights.write_bytes(bytes(data))
    I._file_digest.cache_clear()
    assert I.dir_digest(str(d)) == quick and I.dir_digest(str(d), full=True) != full
    data[I.EDGE + 3 * step] ^= 0xFF                         # inside a sampled block
    weights.write_bytes(bytes(data))
    I._file_digest.cache_clear()
    assert I.dir_digest(str(d)) != quick


def test_uncached_hub_id_offline_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    I.hub_revision.cache_clear()
    cfg = tiny_cfg(tmp_path / "r", "model.source=hf", "model.target=someone/not-cached-anywhere", "method=ar")
    with pytest.raises(ConfigError) as e:
        R.prepare(cfg) and R.Job(cfg)
    msg = str(e.value)
    assert "someone/not-cached-anywhere" in msg and "allowed" in msg and "\n" not in msg
    assert not (tmp_path / "r").exists()


def test_embedded_identity_is_the_pinned_file():
    from mars_bench.models.embedded import SPECS, TARGET

    assert I.weights_identity("embedded", TARGET) == f"embedded:{TARGET}@{SPECS[TARGET].sha256}"
    with pytest.raises(I.IdentityError, match="allowed"):
        I.weights_identity("embedded", "no-such-model")
