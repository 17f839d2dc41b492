"""The typed sample record (mars_bench.store.records.SampleRecord / TurnRecord): samples.jsonl lines round trip with
today's keys plus record_version, lines written before the version existed still load, and the runner and
the summary go through it without changing a number."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mars_bench.store import metrics as M
from mars_bench.store import provenance as P
from mars_bench.store import records as R
from mars_bench.decode.types import DecodeResult, DecodeStats
from mars_bench.store.records import RECORD_VERSION, SampleRecord, TurnRecord
from mars_bench.store.writer import SampleWriter
from mars_bench.store.io import read_samples
from mars_bench.store.summary import fidelity_vs_ar, run_stats, stop_reasons
from mars_bench.stats import StatsSettings

FIX = Path(__file__).parent / "fixtures" / "results" / "worker0" / "toy-pair_fp32_cpu" / "gsm8k-v1"
TURN_KEYS = ["stop_reason", "steps", "proposed", "accepted", "relaxed", "z1", "z2", "outcome", "depth_proposed",
             "prefill_s", "wall_s", "target_s", "draft_s", "prompt_tokens", "new_tokens", "n_retokenized", "tau",
             "output_ids", "output_text"]
SAMPLE_KEYS = ["record_version", "id", "index", "task", "task_version", "model", "method", "scheme", "rule",
               "rule_settings", "k", "p_min", "draft_quant", "fast_kernel", "temperature", "seed", "timing",
               "order", "phase", "machine", "commit", "new_tokens", "steps", "tau", "n_proposed", "n_accepted", "n_exact", "n_relaxed",
               "n_by_clause", "prefill_s", "wall_s", "target_s", "draft_s", "score", "batch_size", "turns"]


def _fixture(run: str) -> list[dict]:
    recs, problems = read_samples(FIX / run / "samples.jsonl")
    assert problems == [] and recs
    return recs


def _res(tokens, steps, proposed, accepted, relaxed=()):
    return SimpleNamespace(tokens=list(tokens), steps=steps, tau=len(tokens) / steps, stop_reason="eos",
                           prefill_s=0.01, wall_s=0.5, target_s=0.3, draft_s=0.1, proposed=list(proposed),
                           accepted=list(accepted), relaxed=list(relaxed), z1=[0.912345, 0.5], z2=[0.05, 0.4],
                           outcome="AR", depth_proposed=[])


def _job(interleaved=False):
    from mars_bench.store.recordbuild import job_fields
    from mars_bench.store.spec import RunSpec

    tag = RunSpec("sd", "mars", 0.0, 1.0, 8, 0, k=2, settings={"theta": 0.9})
    return SimpleNamespace(fields=job_fields(tag, SimpleNamespace(name="gsm8k", version=1), "tiny", None, interleaved,
                                             None))


def test_runner_builds_a_versioned_record_with_todays_keys():
    from mars_bench.store.recordbuild import sample_record, turn_record

    lenient = {"clause": "top2", "pos": 1, "z1": 0.9, "z2": 0.5}
    turns = [turn_record(_res([5, 6, 7], 2, [2, 2], [1, 1], [lenient]), [1, 2, 3], "a b c"),
             turn_record(SimpleNamespace(**vars(_res([8], 1, [2], [0])), span_s=2.5), [1], "d", batched=True)]
    assert list(turns[0]) == TURN_KEYS and turns[0]["z1"] == [0.9123, 0.5]
    rec = sample_record(_job(), SimpleNamespace(id="q0"), 0, turns, {"correct_strict": 1}, "mkl", 1)
    assert list(rec) == SAMPLE_KEYS and rec["record_version"] == RECORD_VERSION
    assert (rec["new_tokens"], rec["steps"], rec["tau"]) == (4, 3, 4 / 3)
    assert (rec["n_proposed"], rec["n_accepted"], rec["n_exact"], rec["n_relaxed"]) == (6, 2, 1, 1)
    assert rec["n_by_clause"] == {"top2": 1} and rec["wall_s"] == pytest.approx(1.0)
    assert rec["rule_settings"]["theta"] == 0.9 and SampleRecord.from_dict(rec).theta == 0.9   # theta once
    assert rec["method"] == "mars" and rec["timing"] == "sequential" and rec["order"] == 1
    assert "span_s" not in rec["turns"][0] and rec["turns"][1]["span_s"] == 2.5
    back = SampleRecord.from_dict(json.loads(json.dumps(rec)))
    assert back.to_dict() == rec and back.turns[1].span_s == 2.5 and back.turns[0].output_text == "a b c"


def test_round_trip_keeps_every_key_and_unknown_ones():
    rec = SampleRecord(id="q1", index=3, new_tokens=5, steps=2, wall_s=0.25, score={"passed": True},
                       turns=[TurnRecord(new_tokens=5, steps=2, proposed=[4, 4], accepted=[2, 1])])
    line = json.loads(json.dumps(rec.to_dict()))
    assert SampleRecord.from_dict(line) == rec and list(line)[0] == "record_version"
    assert "writer" not in line and "span_s" not in line["turns"][0]          # written only when set
    later = {**line, "gpu_temp_c": 61, "turns": [{**line["turns"][0], "draft_entropy": [0.5]}]}
    back = SampleRecord.from_dict(later)
    assert back.extra == {"gpu_temp_c": 61} and back.turns[0].extra == {"draft_entropy": [0.5]}
    assert back.to_dict() == later


def test_a_record_written_before_the_version_existed_loads():
    old = _fixture("ar-T0-p1-n8-s0")[0]
    assert "record_version" not in old and "scheme" not in old and "n_retokenized" not in old["turns"][0]
    rec = SampleRecord.from_dict(old)
    assert rec.record_version == 0 and rec.id == old["id"] and rec.new_tokens == old["new_tokens"]
    assert rec.scheme is None and rec.fast_kernel is None and rec.turns[0].n_retokenized is None
    assert rec.turns[0].output_ids == old["turns"][0]["output_ids"] and rec.extra == {}
    out = rec.to_dict()                             # its own keys unchanged, but theta (held in rule_settings)
    assert "theta" not in out and rec.theta == old["theta"] is None
    assert {k: v for k, v in out.items() if k in old and k != "turns"} == {
        k: v for k, v in old.items() if k not in ("turns", "theta")}
    assert [{k: v for k, v in t.items() if k in o} for t, o in zip(out["turns"], old["turns"])] == old["turns"]


@pytest.mark.parametrize("line,theta,settings", [
    ({"id": "a", "theta": 0.9}, 0.9, {"theta": 0.9}),                              # before rule_settings existed
    ({"id": "a", "theta": 0.9, "rule_settings": {"theta": 0.9, "x": 1}}, 0.9, {"theta": 0.9, "x": 1}),   # both
    ({"id": "a", "rule_settings": {"theta": 0.8}}, 0.8, {"theta": 0.8}),           # today's: rule_settings only
    ({"id": "a", "theta": None, "rule_settings": {}}, None, {}),                   # a rule without theta
])
def test_theta_is_read_from_rule_settings_of_old_and_new_lines(line, theta, settings):
    rec = SampleRecord.from_dict(line)
    assert rec.theta == theta and rec.rule_settings == settings and "theta" not in rec.to_dict()
    assert "theta" not in rec.extra


def test_the_committed_fixtures_read_their_theta():
    for run, theta in (("mars-k2-th0.9-T0-p1-n8-s0", 0.9), ("ar-T0-p1-n8-s0", None)):
        recs = R.as_records(_fixture(run))
        assert {r.theta for r in recs} == {theta}


@pytest.mark.parametrize("bad,needle", [
    ({"id": "q0", "record_version": RECORD_VERSION + 1}, f"record_version={RECORD_VERSION + 1}; allowed:"),
    ({"id": "q0", "record_version": "1"}, "record_version='1'; allowed:"),
    ({"new_tokens": 3}, "allowed: a JSON object with an 'id'"),
    ([1, 2], "allowed: a JSON object with an 'id'"),
    ({"id": "q0", "turns": [7]}, "turn record 7; allowed: a JSON object"),
])
def test_unreadable_records_are_one_line_errors(bad, needle):
    with pytest.raises(ValueError, match="^[^\n]+$") as e:
        SampleRecord.from_dict(bad)
    assert needle in str(e.value)


def test_summary_numbers_are_unchanged_through_the_typed_record():
    """The fixture's stored summaries were written from dict records: totals, speedup, fidelity and the
    stats block come out the same from dicts and from SampleRecords."""
    ar, mars = _fixture("ar-T0-p1-n8-s0"), _fixture("mars-k2-th0.9-T0-p1-n8-s0")
    stored = json.loads((FIX / "mars-k2-th0.9-T0-p1-n8-s0" / "summary.json").read_text())
    totals = M.totals(mars)
    assert {k: totals[k] for k in stored["totals"]} == stored["totals"]
    typed_ar, typed_mars = R.as_records(ar), R.as_records(mars)
    assert M.totals(typed_mars) == totals
    assert M.speedup(typed_mars, typed_ar) == M.speedup(mars, ar)
    assert stored["speedup"]["speedup"] == M.speedup(mars, ar)["speedup"]
    assert fidelity_vs_ar(typed_mars, typed_ar) == fidelity_vs_ar(mars, ar)
    assert stop_reasons(typed_mars) == stop_reasons(mars)
    settings = StatsSettings(n_boot=200)
    assert run_stats(typed_mars, typed_ar, settings=settings) == run_stats(mars, ar, settings=settings)


def test_sample_writer_takes_a_record(tmp_path):
    w = SampleWriter(tmp_path / "run" / "samples.jsonl")
    assert w.claim("q0")
    w.write(SampleRecord(id="q0", new_tokens=1, steps=1))
    w.close()
    (line,), _ = read_samples(tmp_path / "run" / "samples.jsonl")
    assert line["record_version"] == RECORD_VERSION and line["writer"] and SampleRecord.from_dict(line).id == "q0"


def test_machine_is_recorded_and_speed_compares_only_within_one_machine():
    from mars_bench import stats as S
    from mars_bench.store.summary import run_stats

    here = P.machine()
    assert here["cpu"] and here["threads"] >= 1 and set(here["isa"]) <= set(P.ISA_FLAGS)
    assert str(here["threads"]) in P.machine_label(here) and P.machine_label(None) == "unrecorded"
    other = {**here, "cpu": "Another CPU", "isa": []}

    def rec(i, wall, m):
        return SampleRecord(id=f"s{i}", new_tokens=10, steps=5, wall_s=wall, machine=m)

    ar = [rec(i, 2.0, here) for i in range(6)]
    mine = [rec(i, 1.0, here) for i in range(3)] + [rec(i, 0.1, other) for i in range(3, 6)]
    assert len(M.paired_records(mine, ar)) == 6 and len(M.speed_pairs(mine, ar)) == 3
    assert M.speedup(mine, ar)["speedup"] == 2.0 and M.speedup(mine, ar)["n_common"] == 3   # not 11x
    st = run_stats(mine, ar, settings=S.StatsSettings(n_boot=200))
    assert st["speedup"]["value"] == 2.0 and "3 of 6 samples left out" in st["speedup"]["note"]
    assert M.machines(mine) == sorted({P.machine_label(here), P.machine_label(other)})
    legacy = [rec(i, 1.0, None) for i in range(6)]      # written before machines were recorded: still compared
    assert len(M.speed_pairs(legacy, ar)) == 6


def test_two_generations_behind_one_cpu_name_are_two_machines():
    """Virtual machines report 'AMD EPYC' for Zen 1 (family 23) and Zen 3 (family 25) alike, ~2x apart in speed:
    the recorded name carries family and model, so their samples are never paired for a speedup."""
    from mars_bench.models.panel import parse_cpuinfo

    def info(family):
        return (f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: 1\n"
                "model name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n\nprocessor\t: 1\ncpu family\t: 99\n")

    (zen1, flags), (zen3, _) = parse_cpuinfo(info(23)), parse_cpuinfo(info(25))
    assert zen1 == "AMD EPYC (family 23 model 1)" and zen3 == "AMD EPYC (family 25 model 1)"
    assert {"avx2", "fma"} <= flags
    assert parse_cpuinfo("Features\t: fp asimd bf16\nCPU implementer\t: 0x41\n") == ("", {"fp", "asimd", "bf16"})
    here = P.machine()
    ar = [SampleRecord(id=f"s{i}", new_tokens=10, steps=5, wall_s=2.0, machine={**here, "cpu": zen1}) for i in range(3)]
    sd = [SampleRecord(id=f"s{i}", new_tokens=10, steps=5, wall_s=1.0, machine={**here, "cpu": zen3}) for i in range(3)]
    assert len(M.speed_pairs(sd, ar)) == 0


def test_a_summary_over_two_machines_is_current_for_the_report(tmp_path):
    """summary.json's speedup pairs only same-machine samples; the report must read it as current, not restate
    it (a restated summary has no references, so its BLEU tests would be lost)."""
    from mars_bench import stats as S
    from mars_bench.store.read import RunFiles
    from mars_bench.report.restate import _current
    from mars_bench.store.summary import run_stats

    here = P.machine()
    other = {**here, "threads": here["threads"] + 1}
    ar = [SampleRecord(id=f"s{i}", new_tokens=10, steps=10, wall_s=2.0, machine=here if i < 3 else other)
          for i in range(6)]
    mine = [SampleRecord(id=f"s{i}", new_tokens=10, steps=5, wall_s=1.0, machine=here) for i in range(6)]
    stats = run_stats(mine, ar, settings=S.StatsSettings(n_boot=200))
    assert stats["speedup"]["n"] == 3
    run = RunFiles.__new__(RunFiles)
    run.records = [r.to_dict() for r in mine]
    assert _current(stats, run, [r.to_dict() for r in ar], None)


def test_outside_forward_share_is_of_the_loop_time_prefill_excluded():
    # wall 3 s of which prefill 1 s; forwards 1.5 + 0.3 s of the 2 s loop: 10% outside
    rec = SampleRecord(id="q0", new_tokens=4, steps=2, prefill_s=1.0, wall_s=3.0, target_s=1.5, draft_s=0.3)
    assert M.totals([rec])["outside_forward_share"] == pytest.approx(0.1)
    assert M.outside_forward_share(1.0, 1.0, 0.0) is None      # no loop time: no share


def test_a_turn_holds_the_decode_stats_declared_once():
    """TurnRecord is the engine's DecodeStats plus the record's own fields: every stat of a DecodeResult lands in
    the turn under its name (z1, z2 rounded); depth_proposed is null on disk for a chain and a list for a tree."""
    from dataclasses import fields

    from mars_bench.store.recordbuild import turn_record

    stats = [f.name for f in fields(DecodeStats)]
    assert issubclass(TurnRecord, DecodeStats) and issubclass(DecodeResult, DecodeStats)
    res = DecodeResult(tokens=[4, 5, 6], stop_reason="eos", steps=2, proposed=[3, 3], accepted=[2, 0],
                       relaxed=[{"clause": "top2", "pos": 1}], z1=[0.123456, 0.9], z2=[0.5, 0.25], outcome="ARX",
                       depth_proposed=[3, 2], prefill_s=0.1, wall_s=0.4, target_s=0.2, draft_s=0.1)
    assert all(getattr(res, n) != getattr(DecodeStats(), n) for n in stats)   # every stat set: a missed copy shows
    turn = turn_record(res, [1, 2], "x")
    assert {n: turn[n] for n in stats} == {**{n: getattr(res, n) for n in stats}, "z1": [0.1235, 0.9]}
    assert (turn["new_tokens"], turn["tau"], turn["output_ids"]) == (3, 1.5, [4, 5, 6])
    assert TurnRecord.from_dict(turn).to_dict() == turn
    chain = turn_record(DecodeResult(tokens=[4], steps=1, proposed=[2], accepted=[0]), [1], "y")
    assert chain["depth_proposed"] is None and TurnRecord.from_dict(chain).depth_proposed == []
    assert TurnRecord.from_dict(chain).to_dict() == chain
