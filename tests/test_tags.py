"""Run specs (mars_bench.store.spec): run.json round trips exactly, directories are named <label>@<digest> with a
digest that tells apart settings the label rounds and is the same in every process, legacy directories (no
run.json) are still read by name, and the runner writes run.json before the first sample."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mars_bench.config.spec import spec_of
from mars_bench.run import runner as R
from mars_bench.store.writer import SampleWriter
from mars_bench.store.spec import SPEC_FILE, SPEC_VERSION, RunSpec, read_spec, write_spec

from .test_cli import tiny_cfg

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "results" / "worker0" / "toy-pair_fp32_cpu" / "gsm8k-v1"
LABELS = ["ar-T0-p1-n8-s0", "mars-k4-th0.9-T0-p1-n8-s0", "sd+typical-k4-eps0.09-al0.3-T0.7-p0.9-n8-s1",
          "mars_tree-d4-w4-t16-qdraft-th0.9-ratio-margin-T1-p1-n8-s0", "sd_tree-paths0a1b2c3d-sample-T1-p1-n8-s0",
          "sd+topk_delta-k4-top10-dl0.3-draftint8-b2-afterstep-T0-p1-n64-s0",
          "ar-sysllama2-afterstep-nothink-promptsauthors-T0-p1-n512-s0", "sd-k4-pmin0.75-draftint8-T0-p1-n8-s0"]


def _json_round_trip(spec: RunSpec) -> RunSpec:
    return RunSpec.from_dict(json.loads(json.dumps(spec.to_dict())))


def test_theta_past_six_digits_gets_its_own_directory_and_round_trips_exactly(tmp_path):
    a, b = (spec_of(tiny_cfg(tmp_path, "method=mars", f"method.theta={t}"), 24)
            for t in ("0.9", "0.9000001"))
    assert a.label == b.label == "mars-k4-th0.9-T0-p1-n24-s0"          # the label rounds to 6 digits
    assert a.dir_name != b.dir_name and a.digest != b.digest
    back = _json_round_trip(b)
    assert back == b and back.settings["theta"] == 0.9000001 and back.dir_name == b.dir_name
    assert b.to_dict()["spec_version"] == SPEC_VERSION and isinstance(SPEC_VERSION, int)


@pytest.mark.parametrize("label", LABELS)
def test_every_field_round_trips_through_json(label):
    spec = RunSpec.parse(label)
    assert spec is not None and spec.label == label
    assert _json_round_trip(spec) == spec
    odd = RunSpec.from_dict({**spec.to_dict(), "temperature": 0.7000000000000001, "top_p": 0.95000000001,
                             "seed": 123456789})
    back = _json_round_trip(odd)
    assert (back.temperature, back.top_p) == (0.7000000000000001, 0.95000000001) and back.digest == odd.digest
    assert odd.digest != spec.digest


def test_dir_name_is_label_at_digest_and_never_a_legacy_name():
    spec = RunSpec.parse("mars-k4-th0.9-T0-p1-n24-s0")
    label, _, digest = spec.dir_name.partition("@")
    assert label == spec.label and len(digest) == 10 and int(digest, 16) >= 0
    assert RunSpec.parse(spec.dir_name) is None                         # a name with a digest is not legacy
    assert str(spec) == spec.label


def test_equal_settings_of_other_python_types_share_a_directory():
    a = RunSpec("sd", "mars", 0, 1, 24, 0, k=4, settings={"theta": 1})
    b = RunSpec("sd", "mars", 0.0, 1.0, 24, 0, k=4, settings={"theta": 1.0})
    assert a == b and a.dir_name == b.dir_name and isinstance(a.settings["theta"], float)


_PRINT_NAMES = ("import json, sys; from mars_bench.store.spec import RunSpec; "
                "print(json.dumps([RunSpec.parse(n).dir_name for n in json.loads(sys.argv[1])]))")


def test_dir_name_is_the_same_in_every_process():
    here = [RunSpec.parse(n).dir_name for n in LABELS]
    for seed in ("0", "1", "12345"):      # str hashes differ per process unless PYTHONHASHSEED fixes them
        out = subprocess.run([sys.executable, "-c", _PRINT_NAMES, json.dumps(LABELS)], cwd=ROOT, text=True,
                             capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout) == here
    # the digest of a spec without rule settings, fixed: a change would orphan every existing run directory
    assert RunSpec("ar", "exact", 0.0, 1.0, 24, 0).dir_name == "ar-T0-p1-n24-s0@0786e31926"


def test_a_neutral_field_leaves_the_digest_alone_and_defaults_do_not():
    spec = RunSpec.parse("sd-k4-T0-p1-n8-s0")
    assert RunSpec.from_dict({k: v for k, v in spec.to_dict().items() if k != "options"}).digest == spec.digest
    assert RunSpec.from_dict({**spec.to_dict(), "options": {"max_ngram": 3}}).digest != spec.digest
    assert replace(spec, p_min=0.1).digest != spec.digest != replace(spec, budget="after_step").digest


@pytest.mark.parametrize("change,needle", [
    ({"spec_version": 99}, "spec_version=99; allowed: an integer from 1 to"),
    ({"spec_version": None}, "spec_version=None"),
    ({"colour": "red"}, "run spec field 'colour'; allowed: scheme, rule"),
    ({"scheme": "beam"}, "scheme='beam'; allowed:"),
    ({"rule": "fuzzy"}, "rule='fuzzy'; allowed:"),
    ({"settings": 5}, "run spec value of the wrong type"),
])
def test_from_dict_refuses_what_it_cannot_read_in_one_line(change, needle):
    data = {**RunSpec.parse("mars-k4-th0.9-T0-p1-n8-s0").to_dict(), **change}
    with pytest.raises(ValueError, match="^[^\n]+$") as e:
        RunSpec.from_dict(data)
    assert needle in str(e.value)
    data = RunSpec.parse("ar-T0-p1-n8-s0").to_dict()
    del data["seed"]
    with pytest.raises(ValueError, match="run spec lacks 'seed'"):
        RunSpec.from_dict(data)


def test_legacy_directory_without_run_json_is_read_by_its_name(tmp_path):
    for d in FIX.iterdir():                                             # the report fixture: legacy names
        assert not (d / SPEC_FILE).exists() and read_spec(d) == RunSpec.parse(d.name) is not None
    assert read_spec(FIX / "mars-k2-th0.9-T0-p1-n8-s0").settings["theta"] == 0.9
    for name in ("report", "multirun", "mars-k4-th0.9-bogus-T0-p1-n8-s0", "sd-k4-pmin0-5-T0-p1-n8-s0",
                 RunSpec.parse("ar-T0-p1-n8-s0").dir_name):             # a new name that lost its run.json
        assert read_spec(tmp_path / name) is None


def test_run_json_wins_over_the_name_and_a_bad_one_names_its_path(tmp_path):
    spec = spec_of(tiny_cfg(tmp_path, "method=mars", "method.theta=0.9000001"), 24)
    run = tmp_path / "mars-k4-th0.9-T0-p1-n24-s0"                      # a legacy-looking name
    write_spec(run, spec)
    assert read_spec(run) == spec and read_spec(run).settings["theta"] == 0.9000001
    write_spec(run, spec)                                               # once: the same spec again is fine
    other = RunSpec.parse("mars-k4-th0.8-T0-p1-n24-s0")
    with pytest.raises(ValueError, match="holds the spec of mars-k4-th0.9-T0-p1-n24-s0@"):
        write_spec(run, other)
    (run / SPEC_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=f"^{run / SPEC_FILE}: "):
        read_spec(run)


def test_baseline_and_reference_name_the_runs_the_runner_writes(tmp_path):
    mars = R.Job(tiny_cfg(tmp_path, "method=mars", "rule.theta=0.8", "limit=1"))
    ar = R.Job(tiny_cfg(tmp_path, "method=ar", "limit=1"))
    sd = R.Job(tiny_cfg(tmp_path, "method=sd", "limit=1"))
    assert mars.tag.baseline().dir_name == ar.run_dir.name
    assert mars.tag.lossless_reference().dir_name == sd.run_dir.name
    assert mars.run_dir.name == mars.tag.dir_name and mars.run_dir.name.startswith("mars-k4-th0.8-T0-p1-n24-s0@")
    assert not mars.run_dir.exists()                                    # building a job writes nothing


def test_run_json_is_written_before_the_first_sample_and_a_rerun_resumes(tmp_path, monkeypatch):
    seen = []
    write = SampleWriter.write

    def spy(self, record):
        seen.append((self.path.parent / SPEC_FILE).is_file())
        return write(self, record)

    monkeypatch.setattr(SampleWriter, "write", spy)
    cfg = tiny_cfg(tmp_path, "method=mars", "method.theta=0.9000001", "max_new_tokens=8", "limit=2")
    first = R.run(cfg)
    run = Path(first["run_dir"])
    assert seen == [True, True]
    spec = spec_of(cfg, 8)
    assert run.name == spec.dir_name and read_spec(run) == spec
    assert json.loads((run / SPEC_FILE).read_text())["settings"]["theta"] == 0.9000001
    assert first["method"] == "mars" and first["lossless"] is False     # summary read the spec from run.json
    again = R.run(cfg)
    assert again["run_dir"] == first["run_dir"] and len(seen) == 2      # same directory, nothing decoded again
