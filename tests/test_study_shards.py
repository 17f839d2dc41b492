"""`make reproduce-full` in shards (mars_bench/run/shards.py), on a 2-shard mini study of the tiny pair: one shard
killed mid-run and resumed ends with exactly the samples (ids, phases, tokens) of an uninterrupted run; each
shard writes its own pack; the report reads any set of packs and names the shards missing; a dirty tree is
refused unless allowed; a shard parked on one machine resumes on a fresh one only at the same decoding code on the
same kind of machine."""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from mars_bench.run import shards as S
from mars_bench.report import write_report

from .conftest import data_dir

ROOT = Path(__file__).resolve().parent.parent
COMMON = ("model=tiny", "progress=false", "max_new_tokens=24", "study.batch_size=3", "study.timed_min=3",
          "study.timed_max=3")
MINI = {"a": S.Shard((("+compare=methods", "task=gsm8k", "limit=8", *COMMON),), 1, "tiny GSM8K"),
        "b": S.Shard((("+compare=methods", "task=prompts", "limit=4", *COMMON),), 1, "tiny prompts")}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(data_dir()))


def _contents(pack: Path) -> dict:
    """run path -> {sample id: (phase, output tokens per turn)} of every samples.jsonl in a pack."""
    out = {}
    with tarfile.open(pack, "r:xz") as tar:
        for m in tar.getmembers():
            if m.name.endswith("samples.jsonl"):
                recs = [json.loads(x) for x in tar.extractfile(m).read().decode().splitlines() if x.strip()]
                out[str(Path(m.name).parent)] = {r["id"]: (r["phase"], [t["output_ids"] for t in r["turns"]])
                                                 for r in recs}
    return out


def _kill_mid_run(tree: Path) -> int:
    """Start shard a's command in ``tree``, SIGKILL it once a sample is written; the samples written by then."""
    args = MINI["a"].commands[0]
    proc = subprocess.Popen([sys.executable, "-m", "mars_bench.cli", *args, f"results_dir={tree}"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    lines = lambda: sum(f.read_bytes().count(b"\n") for f in tree.rglob("samples.jsonl"))  # noqa: E731
    while time.monotonic() < deadline and proc.poll() is None and lines() < 1:
        time.sleep(0.01)
    assert proc.poll() is None, "the shard ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return lines()


def test_interrupted_shards_end_with_the_samples_of_an_uninterrupted_run(tmp_path):
    whole = {n: S.run_shard(n, MINI, tmp_path / "u" / "runs", tmp_path / "u" / "packs", cwd=ROOT) for n in MINI}

    cut = tmp_path / "i"
    done = _kill_mid_run(cut / "runs" / "a")
    total = sum(len(v) for v in _contents(whole["a"]).values())
    assert 1 <= done < total and not S.pack_path("a", cut / "packs").exists()
    resumed = {n: S.run_shard(n, MINI, cut / "runs", cut / "packs", cwd=ROOT) for n in MINI}
    for n in MINI:
        assert resumed[n] == S.pack_path(n, cut / "packs")
        assert _contents(resumed[n]) == _contents(whole[n]), n
    phases = {p for run in _contents(resumed["a"]).values() for p, _ in run.values()}
    assert phases == {"quality", "timed"}
    # a packed shard is done: rerunning it decodes nothing and keeps its pack
    before = resumed["a"].read_bytes()
    assert S.run_shard("a", MINI, cut / "runs", cut / "packs", cwd=ROOT).read_bytes() == before

    # the report reads any set of packs and names the shards missing, as the plan (here MINI) tells its caller
    one = write_report([resumed["a"]], tmp_path / "rep1", figures=False,
                       missing_shards=S.missing([resumed["a"]], MINI))
    both = write_report(list(resumed.values()), tmp_path / "rep2", figures=False,
                        missing_shards=S.missing(list(resumed.values()), MINI))
    assert one["missing_shards"] == ["b"] and "Shards missing: b" in (tmp_path / "rep1" / "report.md").read_text()
    assert both["missing_shards"] == [] and set(both["frames"].runs["task"]) == {"gsm8k", "prompts"}


def _rewrite(part: Path, out: Path, **fields) -> Path:
    """A copy of a part whose records' ``fields`` are replaced (records decoded elsewhere, or by other code)."""
    with tarfile.open(part, "r:xz") as src, tarfile.open(out, "w:xz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name.endswith("samples.jsonl"):
                data = "".join(json.dumps({**json.loads(x), **fields}) + "\n"
                               for x in data.decode().splitlines() if x.strip()).encode()
            m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    return out


def test_a_parked_shard_resumes_on_a_fresh_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "SHARDS", MINI)
    whole = S.run_shard("a", MINI, tmp_path / "u" / "runs", tmp_path / "u" / "packs", cwd=ROOT)

    cut, parts = tmp_path / "i", tmp_path / "i" / "parts"
    done = _kill_mid_run(cut / "runs" / "a")
    part = S.park("a", cut / "runs", parts)
    commits, machines = S.part_origin(part)
    assert part == S.pack_path("a", parts) and len(commits) == 1 and len(machines) == 1
    assert sum(len(v) for v in _contents(part).values()) == done
    kept = shutil.copy(part, tmp_path / "kept.tar.xz")
    shutil.rmtree(cut / "runs")                               # the next sitting: a fresh machine, the part committed

    # a tree with uncommitted changes decodes as no commit did: its records resume only when mixing is allowed
    mixed = commits[0].endswith("+dirty")
    assert S.same_code(commits[0]) is not mixed
    resumed = S.run_shard("a", MINI, cut / "runs", cut / "packs", cwd=ROOT, parts=parts, allow_mixed=mixed)
    assert _contents(resumed) == _contents(whole)
    assert not part.exists()                                  # the pack holds it now

    # another commit's records, or another kind of machine's, are refused with one line and nothing written
    for fields, says in [({"commit": "0" * 40}, "decoded at 0000000000"),
                         ({"machine": {**machines[0], "cpu": "Other CPU (family 1 model 2)"}}, "decoded on Other CPU")]:
        if "machine" in fields:      # the code check passed (tested above and in test_same_code_...)
            monkeypatch.setattr(S, "same_code", lambda commit: True)
        fresh = tmp_path / "f" / "runs"
        _rewrite(kept, S.pack_path("a", parts), **fields)
        with pytest.raises(S.PartMismatch, match=says):
            S.restore("a", fresh, parts)
        assert not fresh.exists()
        assert S.restore("a", fresh, parts, allow_mixed=True) and _contents(S.pack_path("a", parts))
        assert sum(1 for _ in fresh.rglob("samples.jsonl")) == len(_contents(kept))
        shutil.rmtree(tmp_path / "f")


def test_same_code_ignores_reports_and_docs_only(tmp_path, monkeypatch):
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@t"), git("config", "user.name", "t")
    for f in ("mars_bench/decode/engine.py", "mars_bench/report/tables.py", "mars_bench/run/shards.py", "docs/x.md"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("a\n")
    git("add", "-A"), git("commit", "-qm", "one")
    first = git("rev-parse", "HEAD")
    for f in ("mars_bench/report/tables.py", "mars_bench/run/shards.py", "docs/x.md"):
        (tmp_path / f).write_text("b\n")
    git("commit", "-qam", "two")
    second = git("rev-parse", "HEAD")
    assert S.same_code(first, tmp_path) and S.same_code(first, tmp_path, against=second)
    (tmp_path / "mars_bench/decode/engine.py").write_text("b\n")      # uncommitted, in the decoding code
    assert not S.same_code(first, tmp_path)
    git("commit", "-qam", "three")
    third = git("rev-parse", "HEAD")
    assert not S.same_code(first, tmp_path) and S.same_code(third, tmp_path)
    assert not S.same_code(second, tmp_path, against=third) and not S.same_code(first, tmp_path, against="unknown")
    assert not any(S.same_code(c, tmp_path) for c in (None, "unknown", first + "+dirty", "f" * 40))


def test_park_refuses_what_it_cannot_park(tmp_path, capsys):
    where = ["--runs", str(tmp_path / "runs"), "--packs", str(tmp_path / "packs"), "--parts", str(tmp_path / "parts")]
    assert S.main(["park", "nope", *where]) == 2 and "shard 'nope'" in capsys.readouterr().err
    assert S.main(["park", "gsm8k", *where]) == 2 and "no records" in capsys.readouterr().err
    (tmp_path / "packs").mkdir()
    (tmp_path / "packs" / "gsm8k.tar.xz").write_bytes(b"")
    assert S.main(["park", "gsm8k", *where]) == 2 and "is done" in capsys.readouterr().err
    assert not (tmp_path / "parts").exists()


def test_missing_is_none_outside_a_sharded_study():
    assert S.missing(["results/study.tar.xz", "results"]) is None
    assert S.missing(["results/study/gsm8k.tar.xz"]) == [n for n in S.SHARDS if n != "gsm8k"]


def test_a_dirty_tree_is_refused_unless_allowed(monkeypatch, capsys):
    import mars_bench.store.provenance as P

    monkeypatch.setattr(P, "git_commit", lambda: "abc1234+dirty")
    with pytest.raises(S.DirtyTree, match=r"abc1234\+dirty.*--allow-dirty"):
        S.check_clean(False)
    assert S.check_clean(True) == "abc1234+dirty"
    assert S.main(["run", "gsm8k"]) == 2 and "uncommitted changes" in capsys.readouterr().err
    monkeypatch.setattr(P, "git_commit", lambda: "abc1234")
    assert S.check_clean(False) == "abc1234"


def test_every_shard_fits_two_hours_on_the_machine_that_timed_the_study():
    assert set(S.SHARDS) == {"wmt19", "gsm8k", "humaneval", "mt_bench", "alpaca", "cnn_dm", "trees",
                             "gsm8k_t1", "humaneval_t1", "trees_t1_wmt19", "trees_t1_humaneval", "eagle3",
                             "eagle3_t1", "wmt19_t02"}
    # the T = 1 shards take longer than a sitting (measured: shards.py), the greedy ones fit one; HumanEval's T = 1
    # trees at its n are several sittings (parked and resumed)
    bound = lambda n: 1100 if n == "trees_t1_humaneval" else 300 if "_t1" in n else 120   # noqa: E731
    assert all(0 < s.est_min <= bound(n) for n, s in S.SHARDS.items())
    for s in S.SHARDS.values():   # a fixed timed size: which samples are timed never depends on an interruption
        for args in s.commands:
            opts = dict(a.split("=", 1) for a in args if "=" in a)
            if "study.timed_min" in opts or "+experiment=study_methods" in args:
                assert opts["study.timed_min"] == opts["study.timed_max"]


@pytest.fixture(scope="module")
def hydra_ctx():
    from hydra import initialize_config_dir

    from mars_bench.config import schema as C

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "mars_bench" / "conf"), version_base="1.3"):
        yield


@pytest.mark.parametrize("name", sorted(S.SHARDS))
def test_every_shard_command_composes_and_validates(hydra_ctx, name):
    """Each command of each real shard composes with its overrides and validates (a study's too), every interleaved
    entry included, before anyone spends hours on it."""
    from hydra import compose

    from mars_bench.config.validation import validate, validate_study

    for args in S.SHARDS[name].commands:
        cfg = compose("config", overrides=list(args))
        validate(cfg)
        if cfg.study.batch_size:
            validate_study(cfg)
            assert cfg.study.timed_min == cfg.study.timed_max and cfg.subset == "paper"
        for entry in cfg.interleave:
            validate(compose("config", overrides=[*args, *entry]))


def _files(pack: Path) -> dict:
    with tarfile.open(pack, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_retime_keeps_the_quality_phase_and_decodes_the_timed_phase_again(tmp_path, monkeypatch):
    """A packed shard re-timed here: its quality runs are the pack's, byte for byte; its timed runs are decoded
    again (new records, the same samples and tokens); an interrupted retime resumes; a pack without a timed phase,
    or no pack, is refused in one line with nothing written."""
    packs = tmp_path / "packs"
    first = S.run_shard("a", MINI, tmp_path / "runs", packs, cwd=ROOT)
    before = {}
    with tarfile.open(first, "r:xz") as tar:
        for m in tar.getmembers():
            if m.name.endswith("samples.jsonl"):
                before[m.name] = tar.extractfile(m).read()
    kept = shutil.copy(first, tmp_path / "first.tar.xz")

    real = subprocess.run
    calls = []

    def crash(cmd, **kw):   # the first sitting dies before its command finishes
        calls.append(cmd)
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(S.subprocess, "run", crash)
    with pytest.raises(subprocess.CalledProcessError):
        S.retime("a", MINI, tmp_path / "runs", packs, cwd=ROOT)
    tree = tmp_path / "runs" / "a.retime"
    assert (tree / S.RETIMING).is_file() and first.read_bytes() == Path(kept).read_bytes()   # pack untouched
    assert {S._phase(d) for d in tree.rglob("*") if (d / "samples.jsonl").is_file()} == {"quality"}
    monkeypatch.setattr(S.subprocess, "run", real)
    again = S.retime("a", MINI, tmp_path / "runs", packs, cwd=ROOT)
    assert again == first and not (tree / S.RETIMING).exists()

    after, files_before, files_after = {}, _files(Path(kept)), _files(again)
    with tarfile.open(again, "r:xz") as tar:
        for m in tar.getmembers():
            if m.name.endswith("samples.jsonl"):
                after[m.name] = tar.extractfile(m).read()
    assert set(after) == set(before) and set(files_after) == set(files_before)
    phase = {n: json.loads(b.splitlines()[0])["phase"] for n, b in before.items()}
    assert set(phase.values()) == {"quality", "timed"}
    for n in before:
        if phase[n] == "quality":
            assert after[n] == before[n], n          # kept as packed: every file of the run, its summary too
            run = str(Path(n).parent)
            assert {k: v for k, v in files_after.items() if k.startswith(run)} == \
                {k: v for k, v in files_before.items() if k.startswith(run)}
        else:
            assert after[n] != before[n], n          # decoded again: new wall times
    assert _contents(again) == _contents(Path(kept))   # the same samples, phases and tokens

    # refusals: no pack; a pack of plain batch-size-1 runs (no timed phase)
    with pytest.raises(ValueError, match="has no pack"):
        S.retime("b", MINI, tmp_path / "runs", packs, cwd=ROOT)
    plain = _rewrite(Path(kept), tmp_path / "plain.tar.xz", phase=None)
    shutil.copy(plain, S.pack_path("b", packs))
    with pytest.raises(ValueError, match="has no timed phase"):
        S.retime("b", MINI, tmp_path / "runs", packs, cwd=ROOT)
    assert not (tmp_path / "runs" / "b.retime").exists()


def test_a_pack_written_into_the_checkout_leaves_the_commit_clean(tmp_path):
    """A shard's pack (under results/) written by an earlier shard of the same command does not make the next
    shard's records say '+dirty'; a change to code does."""
    from mars_bench.store import provenance as P

    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "results" / "study").mkdir(parents=True)
    (tmp_path / "results" / "study" / "a.tar.xz").write_bytes(b"old")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    head = P.git_commit(tmp_path)
    assert len(head) == 40 and not head.endswith("+dirty")
    (tmp_path / "results" / "study" / "a.tar.xz").write_bytes(b"new pack")
    assert P.git_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert P.git_commit(tmp_path) == head + "+dirty"


def test_a_shards_prepare_command_runs_before_its_commands(tmp_path, monkeypatch):
    """``prepare`` (the eagle3 shard's head recipe) runs first, in run and in retime, and a failing one stops the
    shard before any decoding (nothing packed)."""
    calls = []

    def fake(cmd, check, cwd=None):
        calls.append(cmd[2] if cmd[1] == "-m" else cmd)
        if cmd[2] == "broken.recipe":
            raise subprocess.CalledProcessError(1, cmd)
    monkeypatch.setattr(S.subprocess, "run", fake)
    shards = {"p": S.Shard((("task=gsm8k",),), 1, "x", ("my.recipe", "--work", "w")),
              "q": S.Shard((("task=gsm8k",),), 1, "x", ("broken.recipe",))}
    monkeypatch.setattr("mars_bench.store.pack.pack", lambda tree, out: [])
    S.run_shard("p", shards, runs=tmp_path / "runs", packs=tmp_path / "packs", parts=tmp_path / "parts")
    assert calls == ["my.recipe", "mars_bench.cli"]
    calls.clear()
    with pytest.raises(subprocess.CalledProcessError):
        S.run_shard("q", shards, runs=tmp_path / "runs", packs=tmp_path / "packs", parts=tmp_path / "parts")
    assert calls == ["broken.recipe"] and not (tmp_path / "packs" / "q.tar.xz").exists()
    assert S.SHARDS["eagle3"].prepare[:2] == ("mars_bench.run.eagle3_recipe", "embedded-sitting")
