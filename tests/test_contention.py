"""Contention detection (docs/timing.md): the rule on synthetic /proc readings, the record's field (old records
still read), re-timing of flagged samples on resume, and speed pairs without flagged samples."""
from __future__ import annotations

import json

import pytest

from mars_bench.store import contention as C
from mars_bench.store import metrics as M
from mars_bench.store.io import read_samples
from mars_bench.store.records import SampleRecord

STAT = """cpu  {user} 0 {system} {idle} 5 0 {softirq} {steal} 0 0
cpu0 1 0 1 1 0 0 0 0 0 0
intr 1
procs_running {running}
procs_blocked 0
"""


def _stat(user, system, idle, softirq=0, steal=0, running=1) -> C.StatReading:
    return C.parse_stat(STAT.format(user=user, system=system, idle=idle, softirq=softirq, steal=steal,
                                    running=running), tick_hz=100)


def test_parse_stat_reads_busy_steal_and_the_run_queue():
    r = _stat(user=1000, system=200, idle=5000, softirq=30, steal=70, running=4)
    assert r.busy_s == pytest.approx((1000 + 200 + 30) / 100)   # idle, iowait and steal are not busy
    assert r.steal_s == pytest.approx(0.7) and r.procs_running == 4


def test_a_kernel_without_steal_reports_none():
    r = C.parse_stat("cpu  10 0 5 100 0 0 0\nprocs_running 2\n", tick_hz=100)
    assert r.steal_s is None and r.busy_s == pytest.approx(0.15)
    assert C.why_disturbed(C.Contention(wall_s=1.0, cpu_s=0.1, other_cpu_s=0.0, steal_s=None)) is None


def test_a_text_without_a_cpu_line_is_one_line():
    with pytest.raises(ValueError, match="without a 'cpu ' line") as e:
        C.parse_stat("intr 1\n", tick_hz=100)
    assert "\n" not in str(e.value)


def _span(before, after, wall_s, own_cpu_s) -> C.Contention:
    """The Contention a Probe computes from two readings (its arithmetic, without reading /proc)."""
    return C.Contention(wall_s=wall_s, cpu_s=own_cpu_s, other_cpu_s=after.busy_s - before.busy_s - own_cpu_s,
                        steal_s=after.steal_s - before.steal_s)


def test_the_rule_flags_other_processes_above_the_limit_and_not_our_own_work():
    before = _stat(user=1000, system=100, idle=9000)
    # 2 s, our 2 threads busy (4 CPU s of 4): nothing else ran
    quiet = _span(before, _stat(user=1380, system=120, idle=9000), wall_s=2.0, own_cpu_s=4.0)
    assert quiet.other_cores == pytest.approx(0.0) and not C.disturbed(quiet)
    # 2 s, another process took one core (2 CPU s), we got the other
    busy = _span(before, _stat(user=1380, system=120, idle=9000), wall_s=2.0, own_cpu_s=2.0)
    assert busy.other_cores == pytest.approx(1.0)
    assert C.why_disturbed(busy) == "other processes 1.00 cores"
    # just under and just over the limit
    limit = C.OTHER_CORES_LIMIT
    under = C.Contention(wall_s=2.0, cpu_s=3.0, other_cpu_s=2.0 * limit * 0.9)
    over = C.Contention(wall_s=2.0, cpu_s=3.0, other_cpu_s=2.0 * limit * 1.1)
    assert not C.disturbed(under) and C.disturbed(over)


def test_the_rule_flags_steal():
    before = _stat(user=1000, system=100, idle=9000, steal=0)
    stolen = _span(before, _stat(user=1360, system=100, idle=9000, steal=40), wall_s=2.0, own_cpu_s=3.6)
    assert stolen.steal_cores == pytest.approx(0.2) and stolen.other_cores == pytest.approx(0.0)
    assert C.why_disturbed(stolen) == "steal 0.20 cores"


def test_tick_noise_below_zero_reads_as_no_other_load():
    c = C.Contention(wall_s=1.0, cpu_s=2.0, other_cpu_s=-0.02)
    assert c.other_cores == 0.0 and not C.disturbed(c)


def test_unrecorded_contention_is_not_flagged():
    assert not C.disturbed(None)


def test_the_test_suite_measures_nothing_unless_a_test_asks():
    assert not C.measuring()   # conftest: tiny runs' speedups never depend on the machine's load


def test_a_probe_measures_a_span_of_this_process():
    probe = C.Probe(threads=1)
    mark = probe.begin()
    x = 0
    for i in range(200_000):
        x += i
    c = probe.end(mark)
    assert c is not None and c.wall_s > 0 and c.cpu_s > 0 and c.threads == 1 and c.cpus >= 1
    assert c.other_cpu_s is not None


def _record(i: str, contention=None, **kw) -> dict:
    return SampleRecord(id=i, new_tokens=10, wall_s=1.0, steps=5, contention=contention, **kw).to_dict()


QUIET = C.Contention(wall_s=1.0, cpu_s=1.9, other_cpu_s=0.01, steal_s=0.0, threads=2)
BUSY = C.Contention(wall_s=1.0, cpu_s=1.0, other_cpu_s=1.0, steal_s=0.0, threads=2)


def test_the_record_writes_contention_only_when_measured_and_old_records_read():
    old = SampleRecord.from_dict({"id": "a", "new_tokens": 3})
    assert old.contention is None and "contention" not in old.to_dict()
    rec = SampleRecord.from_dict(json.loads(json.dumps(_record("b", BUSY))))
    assert rec.contention == BUSY and C.disturbed(rec.contention)
    assert rec.to_dict()["contention"]["other_cpu_s"] == 1.0


def test_a_flagged_record_is_replaced_by_its_rerun_and_a_quiet_one_is_kept(tmp_path):
    from mars_bench.store.writer import SampleWriter, writer_name

    path = tmp_path / "run" / "samples.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in (_record("a", QUIET), _record("b", BUSY))))
    writer = SampleWriter(path)
    assert writer.done == {"a"}              # b is not done: a rerun re-times it
    assert writer.claim("b") and not writer.claim("a")
    writer.write(_record("b", QUIET, seed=1))
    writer.write(_record("a", QUIET, seed=2))   # a second quiet copy of a never replaces the first
    writer.close()
    recs, problems = read_samples(path)
    assert not problems and [r["id"] for r in recs] == ["a", "b"]
    assert recs[1]["seed"] == 1 and not C.disturbed(recs[1]["contention"]) and recs[0].get("seed") is None
    assert SampleWriter(path).done == {"a", "b"}
    # this process's own flagged record stays done (a study's later rounds re-time nothing; a rerun does)
    path.write_text(json.dumps({**_record("c", BUSY), "writer": writer_name()}) + "\n"
                    + json.dumps(_record("d", BUSY)) + "\n")
    assert SampleWriter(path).done == {"c"}


def test_speed_pairs_leave_flagged_samples_out_and_the_note_names_them():
    mine = [SampleRecord.from_dict(_record(i, c)) for i, c in (("a", QUIET), ("b", BUSY), ("c", None))]
    ar = [SampleRecord.from_dict(_record(i, c)) for i, c in (("a", BUSY), ("b", QUIET), ("c", QUIET))]
    assert [r.id for r, _ in M.speed_pairs(mine, ar)] == ["c"]
    assert M.contended(mine) == ["b"] and M.contention_recorded(mine) is None
    note = M.left_out_note(mine, ar)
    assert note.startswith("2 of 3 samples left out: timed under contention") and note.endswith(": a, b")


def test_a_timed_comparison_beside_a_cpu_bound_load_is_flagged_and_a_rerun_retimes_it(tmp_path, monkeypatch):
    """A real competing load: two CPU-bound processes started beside `+compare=methods` on the tiny pair. Every
    timed sample is flagged, the phase says the machine is busy before it starts, the summary leaves the flagged
    samples out of its speedup, and rerunning the command decodes exactly the flagged samples again."""
    import subprocess
    import sys
    import time

    from tests.test_interleaved import cli, records

    monkeypatch.setenv(C.MEASURE_ENV, "on")   # the CLI's processes inherit it (conftest turns it off)
    spin = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        args = ("+compare=methods", "task=prompts", "limit=2", "max_new_tokens=32", f"results_dir={tmp_path}")
        res = cli(*args)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert res.returncode == 0, res.stderr
    assert "machine busy before timing (other processes" in res.stdout + res.stderr
    runs = records(tmp_path)
    assert len(runs) == 3 and all(len(v) == 2 for v in runs.values())
    flagged = {tag: [r["id"] for r in recs if C.disturbed(r["contention"])] for tag, recs in runs.items()}
    assert all(len(ids) == 2 for ids in flagged.values()), {t: [r["contention"] for r in v] for t, v in runs.items()}
    s = json.loads(next(tmp_path.rglob("mars-k4-th0.9-*/summary.json")).read_text())
    assert s["speedup"] is None and "2 of 2 samples left out: timed under contention" in s["stats"]["speedup"]["note"]
    again = cli(*args)   # whatever the machine does now: the flagged samples are decoded again
    assert again.returncode == 0 and "(6 decodes to do)" in again.stderr + again.stdout
    after = records(tmp_path)
    assert all(len(v) == 4 for v in after.values())   # appended; reading keeps the first undisturbed copy
