"""load_frames (mars_bench.report.frames) on hand-made results trees: the rows and columns it gives, trees
named by run.json and legacy trees named by their tag alike, runs matched by spec (never by name), and the
tables and the W&B row saying what the frames say. The fixture tests/fixtures/results is described (and
its numbers derived by hand) in tests/test_report.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mars_bench.report import all_tables, load_frames
from mars_bench.report.columns import val
from mars_bench.store.spec import read_spec, write_spec

FIX = Path(__file__).resolve().parent / "fixtures" / "results"
TD = "toy-pair_fp32_cpu/gsm8k-v1"
TAGS = ["ar-T0-p1-n8-s0", "sd-k2-T0-p1-n8-s0", "mars-k2-th0.8-T0-p1-n8-s0", "mars-k2-th0.9-T0-p1-n8-s0"]


@pytest.fixture(scope="module")
def legacy():
    return load_frames(FIX)


def cells(column) -> list:
    """A column's values, None where empty."""
    return [val({"v": v}, "v") for v in column]


def spec_tree(dst: Path, names=None) -> Path:
    """The fixture with every run directory renamed (its spec's directory name, or ``names[tag]``) and
    holding its run.json: nothing but run.json says what a run is."""
    for src in sorted(FIX.glob(f"*/{TD}/*")):
        spec = read_spec(src)
        d = dst / src.parts[-4] / TD / (names or {}).get(spec.label, spec.dir_name)
        shutil.copytree(src, d)
        write_spec(d, spec)
    return dst


def test_rows_and_columns(legacy):
    runs, samples = legacy.runs, legacy.samples
    assert runs["tag"].tolist() == TAGS                                  # ar, lossless, lossy by theta
    assert runs["label"].tolist() == ["ar", "sd k=2", "mars θ=0.8 k=2", "mars θ=0.9 k=2"]
    for col in ("run", "model_dir", "task_dir", "method", "scheme", "rule", "theta", "k", "tree", "temperature",
                "top_p", "max_new_tokens", "seed", "batch_size", "system_prompt", "budget", "lossless", "relaxed",
                "n", "tau", "tau_lo", "tau_hi", "tokens_per_s", "speedup", "speedup_lo", "speedup_hi",
                "speedup_authors", "tau_authors", "acceptance_rate", "quality/accuracy_strict", "pct_identical",
                "vs_ar/accuracy_strict/delta", "vs_ar/accuracy_strict/delta_lo", "vs_ar/accuracy_strict/p_value",
                "vs_ar/accuracy_strict/ni_passes", "vs_sd/accuracy_strict/delta", "truncated", "problems", "notes"):
        assert col in runs, col
    assert (runs["method"].tolist(), runs["rule"].tolist()) == (["ar", "sd", "mars", "mars"],
                                                                 ["exact", "exact", "mars", "mars"])
    assert runs["theta"].tolist()[2:] == [0.8, 0.9] and runs["k"].tolist()[1:] == [2, 2, 2]
    assert runs["lossless"].tolist() == [False, True, False, False]      # ar is the baseline, not a method
    assert runs["n"].tolist() == [3, 3, 2, 3] and runs["group"].nunique() == 1
    key = dict(zip(runs["tag"], runs["run"]))
    assert cells(runs["baseline"]) == [None, key[TAGS[0]], key[TAGS[0]], key[TAGS[0]]]   # by spec
    assert cells(runs["reference"]) == [None, None, key[TAGS[1]], key[TAGS[1]]]
    # one row per sample and run: 3 + 3 + 2 + 3, each with its run's key, counts and scores
    assert len(samples) == 11 and set(samples["run"]) == set(runs["run"])
    q0 = samples[(samples["run"] == key[TAGS[3]]) & (samples["id"] == "q0")].iloc[0]
    assert (q0["new_tokens"], q0["steps"], q0["wall_s"], q0["score/correct_strict"]) == (8, 3, 1.0, 1)
    assert q0["outcome"] == "AAARAX" and q0["identical_to_ar"] is False and q0["first_divergence"] == 4
    # the run's totals are its samples' sums
    m9 = samples[samples["run"] == key[TAGS[3]]]
    assert m9["new_tokens"].sum() / m9["wall_s"].sum() == pytest.approx(runs.iloc[3]["tokens_per_s"])


def test_spec_named_tree_loads_like_the_legacy_tree(tmp_path, legacy):
    frames = load_frames(spec_tree(tmp_path / "r"))
    same = [c for c in legacy.runs.columns if c not in ("dirs", "problems", "notes")]
    assert frames.runs[same].equals(legacy.runs[same])
    assert frames.samples.equals(legacy.samples)
    assert [len(d) for d in frames.runs["dirs"]] == [1, 1, 1, 2]        # worker0 and worker1 merged


def test_runs_are_matched_by_spec_not_by_name(tmp_path, legacy):
    """Directories named anything: the ar baseline and the sd reference are found by spec equality, and the
    two workers' copies of one run merge although their names differ."""
    names = {"ar-T0-p1-n8-s0": "baseline", "sd-k2-T0-p1-n8-s0": "reference-run"}
    root = spec_tree(tmp_path / "r", names)
    shutil.move(str(next(root.glob(f"worker1/{TD}/*"))), root / "worker1" / TD / "late-worker")
    runs = load_frames(root).runs.set_index("tag")
    assert runs.loc["sd-k2-T0-p1-n8-s0", "speedup"] == pytest.approx(20 / 11)       # vs ar (test_report)
    assert runs.loc["mars-k2-th0.9-T0-p1-n8-s0", "sd_tag"] == "sd-k2-T0-p1-n8-s0"
    assert len(runs.loc["mars-k2-th0.9-T0-p1-n8-s0", "dirs"]) == 2
    old = legacy.runs.set_index("tag")
    for col in ("speedup", "speedup_lo", "vs_ar/accuracy_strict/delta", "vs_sd/accuracy_strict/p_value"):
        assert runs[col].equals(old[col]), col


def test_unreadable_run_json_is_skipped_and_said(tmp_path):
    root = spec_tree(tmp_path / "r")
    bad = next(root.glob(f"worker0/{TD}/sd-k2-*"))
    (bad / "run.json").write_text("{not json")
    frames = load_frames(root)
    assert "sd-k2-T0-p1-n8-s0" not in frames.runs["tag"].tolist()
    assert any(p.startswith(str(bad / "run.json")) and "skipped" in p for p in frames.problems)


def test_model_task_and_version_are_read_from_the_files_not_the_folder_names(tmp_path):
    """Folders renamed: the model, task and task version still come from summary.json / the samples, dtype and
    device from run.json; a run whose files name none of them reads as unknown (None), never from its folders;
    config.yaml names the model and task of a run whose other files do not."""
    from dataclasses import replace

    root = spec_tree(tmp_path / "r")
    for d in sorted(root.glob(f"*/{TD}/*")):
        spec = replace(read_spec(d), model={"weights": "toy", "dtype": "fp32", "device": "cpu"})
        (d / "run.json").unlink()
        write_spec(d, spec)
    for w in ("worker0", "worker1"):
        (root / w / "toy-pair_fp32_cpu").rename(root / w / "m_bf16_cuda")
        (root / w / "m_bf16_cuda" / "gsm8k-v1").rename(root / w / "m_bf16_cuda" / "other-v7")
    runs = load_frames(root).runs
    assert set(runs["model"]) == {"toy-pair"} and set(runs["task"]) == {"gsm8k"} and set(runs["task_version"]) == {1}
    assert set(runs["title"]) == {"toy-pair (fp32, cpu) | gsm8k v1"}

    bare = tmp_path / "bare" / "m_bf16_cuda" / "other-v7"
    src = next(root.glob("worker0/m_bf16_cuda/other-v7/*"))
    d = bare / src.name
    d.mkdir(parents=True)
    shutil.copy(src / "run.json", d / "run.json")
    lines = [json.loads(x) for x in (src / "samples.jsonl").read_text().splitlines() if x.strip()]
    (d / "samples.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k not in (
        "model", "task", "task_version")}) + "\n" for r in lines))
    row = load_frames(tmp_path / "bare").runs.iloc[0]
    assert (cells([row["model"], row["task"], row["task_version"]])) == [None, None, None]
    assert row["title"] == "? (fp32, cpu) | ? v?"
    (d / "config.yaml").write_text("model:\n  name: toy-pair\ntask:\n  name: gsm8k\n")
    row = load_frames(tmp_path / "bare").runs.iloc[0]
    assert (row["model"], row["task"], val(row, "task_version")) == ("toy-pair", "gsm8k", None)


def test_tables_say_what_the_frames_say(legacy):
    runs = legacy.runs.set_index("label")
    tables = all_tables(legacy)
    for row in tables["main"].rows:
        r = runs.loc[row["label"]]
        for key in ("n", "tokens_per_s", "tau", "speedup", "speedup_lo", "speedup_hi", "speedup_authors",
                    "speedup_authors_lo", "tau_authors", "tau_authors_hi"):
            assert row[key] == val(r, key), (row["label"], key)
        assert row["quality"] == val(r, "quality/accuracy_strict") and row["acceptance"] == val(r, "acceptance_rate")
        assert (row["d_ar"], row["d_ar_lo"], row["p_d_ar"]) == tuple(val(r, f"vs_ar/accuracy_strict/{k}")
                                                                     for k in ("delta", "delta_lo", "p_value"))
        assert row["ni"] == {True: "yes", False: "no"}.get(val(r, "vs_ar/accuracy_strict/ni_passes"))
        assert row["truncated"] == pytest.approx(100 * r["truncated"])
    for row in tables["theta"].rows:
        r = runs.loc[row["label"]]
        for m in ("accuracy_strict", "accuracy_flexible"):
            assert row[f"q:{m}"] == val(r, f"quality/{m}") and row[f"d:{m}"] == val(r, f"vs_ar/{m}/delta")
            assert row[f"p_d:{m}"] == val(r, f"vs_ar/{m}/p_value")
    for row in tables["fidelity"].rows:
        r = runs.loc[row["label"]]
        assert (row["pct_identical"], row["pct_identical_lo"], row["mean_chrf_to_ar"], row["n_compared"]) == \
            (r["pct_identical"], val(r, "pct_identical_lo"), r["mean_chrf_to_ar"], r["n_compared"])
    for row in tables["acceptance"].rows:
        assert [row["d1"], row["d2"]] == runs.loc[row["label"], "acceptance_per_depth"]
    for row in tables["quality"].rows:
        r, prefix = runs.loc[row["label"]], f"vs_{row['vs'][:2]}/{row['metric']}"
        assert (row["delta"], row["delta_lo"], row["delta_hi"], row["p_value"], row["n_pairs"]) == \
            tuple(val(r, f"{prefix}/{k}") for k in ("delta", "delta_lo", "delta_hi", "p_value", "n"))
    assert len(tables["quality"].rows) == sum(val(r, f"vs_{vs}/{m}/n") is not None for _, r in runs.iterrows()
                                              for vs in ("ar", "sd") for m in ("accuracy_strict", "accuracy_flexible"))


def test_a_current_summary_is_read_and_is_what_wandb_logs(tmp_path):
    """Summaries restated once (through the writer's functions) and written back are current: loading again
    restates nothing, gives the same numbers, and the W&B row of each summary is its frame row."""
    from mars_bench.store.read import find_runs
    from mars_bench.report.restate import current_summary
    from mars_bench.run.wandb_logger import summary_values

    root = spec_tree(tmp_path / "r")
    shutil.rmtree(root / "worker1")                                    # one directory per run
    before = load_frames(root)
    found = {r.spec.label: r for r in find_runs([root])}
    summaries = {}
    for tag, run in found.items():
        ar = found["ar-T0-p1-n8-s0"] if tag != "ar-T0-p1-n8-s0" else None
        ref = found["sd-k2-T0-p1-n8-s0"] if tag.startswith("mars") else None
        summaries[tag] = current_summary(run, ar, ref)
        (run.dirs[0] / "summary.json").write_text(json.dumps(summaries[tag]))
    after = load_frames(root)
    assert not any("computed from samples" in n or "recomputed" in n for ns in after.runs["notes"] for n in ns)
    stats = [c for c in before.runs.columns if c.endswith(("_lo", "_hi", "/p_value", "/delta")) or c in ("speedup",)]
    assert after.runs[stats].equals(before.runs[stats])
    for _, row in after.runs.iterrows():
        values = summary_values(summaries[row["tag"]], row["spec"])
        assert values and all(val(row, k) == pytest.approx(v) for k, v in values.items()
                              if "/" not in k or not k.split("/")[-1].isdigit()), row["tag"]


def test_headline_skips_a_metric_whose_format_the_model_never_wrote():
    from mars_bench.report.frames import headline

    row = {"task": "gsm8k", "metrics": ["accuracy_strict", "accuracy_flexible", "accuracy_authors"],
           "quality/accuracy_strict": 0.0, "quality/accuracy_flexible": 0.425, "quality/strict_format_rate": 0.0}
    assert headline(row) == "accuracy_flexible"          # strict accuracy needs '####'; rate 0: says nothing
    assert headline({**row, "quality/strict_format_rate": 0.5}) == "accuracy_strict"
    assert headline({**row, "quality/strict_format_rate": None}) == "accuracy_strict"   # rate unknown: as declared
    # the method wrote '####' once, its ar never: one metric for both (the committed GSM8K shard's mars and ar)
    assert headline({**row, "quality/strict_format_rate": 0.008, "baseline_quality/strict_format_rate": 0.0}) \
        == "accuracy_flexible"
    # mostly unformatted (the T = 1 GSM8K shard: 3-7% of answers wrote '####'): strict accuracy measures the format
    assert headline({**row, "quality/strict_format_rate": 0.066, "baseline_quality/strict_format_rate": 0.033}) \
        == "accuracy_flexible"
    assert headline({**row, "quality/strict_format_rate": 0.9, "baseline_quality/strict_format_rate": 0.4}) \
        == "accuracy_flexible"
    assert headline({**row, "quality/strict_format_rate": 0.9, "baseline_quality/strict_format_rate": 0.6}) \
        == "accuracy_strict"


def test_a_metric_may_need_only_a_format_rate_of_its_own_task():
    import pytest

    from mars_bench.tasks.base import parse_metrics

    ok = parse_metrics({"a": {"higher": True, "test": "binary", "per_sample": "x", "needs_format": "r"},
                        "r": {"higher": True, "test": "none"}}, "t.yaml")
    assert ok["a"].needs_format == "r" and ok["r"].needs_format is None
    with pytest.raises(ValueError, match="needs_format='nope'; allowed: a metric of this task"):
        parse_metrics({"a": {"higher": True, "test": "binary", "per_sample": "x", "needs_format": "nope"}}, "t.yaml")
