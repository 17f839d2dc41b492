"""engine=vllm engine.serve=true: the harness's client against ``vllm serve`` with the plugin (engines/vllm/serve.py,
client.py). Unmarked tests need no vLLM (the flat vllm_xargs, the server's flags, the /metrics parser); the ``vllm``
tier serves the tiny pair (vLLM's shape, engines/vllm.tiny_dirs) at concurrency 1 and 4, and runs the serving bench
(scripts/bench_serve.py) for 2 rounds at concurrency 2:
    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_serve.py
One module-scoped context holds two servers (ar; sd with the draft model, k = 4, max_num_seqs 4); the rule changes
per request. The embedded pair: tests/test_vllm_serve_embedded.py (slow tier).
"""
import json
import os
from pathlib import Path

import pytest

from mars_bench.base.errors import ConfigError
from mars_bench.decode.rules import RULES
from mars_bench.engines.vllm import client, serve, verify

from .test_vllm_engine import MAX_NEW, N, TINY, replay, tokens

SERVED = (*TINY, "engine.serve=true", "batch_size=4")


# ---- no vLLM needed -----------------------------------------------------------------------------------------------
def test_the_rule_travels_as_flat_vllm_xargs_and_decodes_to_the_same_spec():
    settings = RULES["mars"].settings({"theta": 0.8, "sampled_top1": "margin"})
    xargs = verify.request_args("mars", settings, "k-1")
    assert all(isinstance(v, (str, int, float)) for v in xargs.values())
    assert xargs["mars_bench_rule"] == "mars" and xargs["mars_bench_theta"] == 0.8
    rule, decoded = verify.spec_of({**xargs, "other_extension": 3})
    assert rule is RULES["mars"] and decoded == settings and verify.key_of(xargs) == "k-1"
    assert verify.spec_of({"other_extension": 3}) is None and verify.spec_of(None) is None
    # a setting the rule does not have, or a value outside its range, is the rule's own one-line refusal
    with pytest.raises(ValueError, match=r"^rule.delta is not a setting of rule mars"):
        verify.spec_of({**xargs, "mars_bench_delta": 1})
    with pytest.raises(ValueError, match=r"^rule.theta=2"):
        verify.spec_of({**xargs, "mars_bench_theta": 2})


def test_a_nested_value_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^rule setting theta=\{'value': 0.9\}; allowed: a string or a number") as e:
        verify.request_args("mars", {"theta": {"value": 0.9}}, "k")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^extra_args mars_bench_theta=\{'value': 0.9\}; allowed: a string or a "
                                         r"number") as e:
        verify.spec_of({"mars_bench_rule": "mars", "mars_bench_theta": {"value": 0.9}})
    with pytest.raises(ValueError, match=r"^extra_args mars_bench_rule='nope'; allowed: exact, "):
        verify.spec_of({"mars_bench_rule": "nope"})


def test_engine_arguments_become_server_flags():
    flags = serve.server_flags({"model": "/m", "dtype": "float32", "max_model_len": None, "enforce_eager": True,
                                "async_scheduling": False, "disable_log_stats": False,
                                "speculative_config": {"method": "draft_model", "num_speculative_tokens": 4},
                                "logits_processors": ["a:B"], "max_num_seqs": 4})
    assert flags == ["/m", "--dtype", "float32", "--enforce-eager", "--no-async-scheduling", "--speculative-config",
                     '{"method": "draft_model", "num_speculative_tokens": 4}', "--logits-processors", "a:B",
                     "--max-num-seqs", "4"]


def test_bad_serve_settings_are_refused_in_one_line():
    from types import SimpleNamespace as S

    from mars_bench.engines.vllm.engine import check_serve

    check_serve(S(serve=True, serve_port=None, serve_start_s=60))
    for bad, what in (({"serve": "yes"}, r"engine.serve='yes'; allowed: true, false"),
                      ({"serve_port": 70000}, r"engine.serve_port=70000; allowed: null"),
                      ({"serve_start_s": 0}, r"engine.serve_start_s=0; allowed: a number > 0")):
        with pytest.raises(ValueError, match="^" + what):
            check_serve(S(**{"serve": True, "serve_port": None, "serve_start_s": 60, **bad}))


def test_the_metrics_parser_reads_vllms_spec_decode_counters():
    text = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 22.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 88.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""
    after = client.parse_metrics(text)
    assert after == {"num_drafts": 22.0, "num_draft_tokens": 88.0, "num_accepted_tokens": 18.0,
                     "accepted_per_pos": {0: 9.0, 1: 6.0}}
    before = client.parse_metrics(text.replace("9.0", "4.0"))
    assert client.metrics_delta(before, after)["accepted_per_pos"] == [5.0, 0.0]


def test_a_reply_times_its_chunks():
    r = client.Reply(sent=10.0, token_ids=[1, 2, 3, 4], chunk_times=[10.5, 10.75, 11.0], chunk_tokens=[1, 2, 1],
                     done=11.5, drafted=[0, 4], accepted=[0, 1])
    t = r.timing()
    assert (t["ttft_s"], t["latency_s"], t["itl_s"], t["tpot_s"]) == (0.5, 1.5, [0.25, 0.25], round(1.0 / 3, 6))
    assert t["spec_counts"] == "per_request"


# ---- vllm serve on the tiny pair ----------------------------------------------------------------------------------
def job_of(tmp, *overrides, base=SERVED):
    from mars_bench.run.runner import Job

    from .test_vllm_engine import cfg_of

    return Job(cfg_of(tmp, *overrides, base=base))


def decode(models, job, todo=None) -> None:
    """The runner's path for one job: its samples still to do, claimed, decoded, written (runner.run_batched)."""
    todo = todo if todo is not None else [(i, s) for i, s in enumerate(job.samples) if s.id in job.todo]
    try:
        models.decode_batched(job, todo, lambda s, r: job.writer.write(r), source=job.writer.claimed(todo))
    finally:
        job.writer.close()


def served_context(tmp, base=SERVED, methods=("ar", "sd")):
    """(models, run): the served ``Models`` of ``base``'s pair (a server per drafting setup of ``methods``: ar; sd and
    mars) and ``run(name,
    *overrides)``, which decodes a job through the runner's writer once per name and returns its records
    (samples.jsonl) by sample id. tests/test_vllm_serve_embedded.py uses it too."""
    from mars_bench.config.settings import method_of
    from mars_bench.run.runner import engine_models
    from mars_bench.store.io import read_samples

    from .test_vllm_engine import cfg_of

    held = [method_of(cfg_of(tmp, f"method={m}", base=base)) for m in methods]
    models = engine_models(cfg_of(tmp, f"method={methods[-1]}", base=base), held)
    runs = {}

    def run(name, *overrides):
        if name not in runs:
            job = job_of(tmp, *overrides, base=base)
            decode(models, job)
            recs, problems = read_samples(job.run_dir / "samples.jsonl")
            assert not problems
            runs[name] = {r["id"]: r for r in recs}
        return runs[name]
    return models, run


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    os.environ.setdefault("MARS_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    models, run = served_context(tmp_path_factory.mktemp("runs"))
    yield models, run
    models.close()


def check_served_parity(run, sizes=(1, 4), ar=None) -> None:
    """Served sd with ``exact`` decodes ar's tokens (``ar``: its records; default: served here) at each concurrency,
    and mars at theta 1 sd's."""
    ar = ar if ar is not None else run("ar", "method=ar", "batch_size=1")
    for c in sizes:
        sd = run(f"sd{c}", "method=sd", f"batch_size={c}")
        assert tokens(sd) == tokens(ar), c
        assert sum(r["n_accepted"] for r in sd.values()) > 0
    strict = run("mars1", "method=mars", "rule.theta=1", f"batch_size={sizes[-1]}")
    assert tokens(strict) == tokens(run(f"sd{sizes[-1]}"))
    assert sum(r["n_relaxed"] for r in strict.values()) == 0


@pytest.mark.vllm
def test_served_exact_is_ar_and_mars_theta1_is_exact_at_concurrency_1_and_4(ctx):
    assert isinstance(ctx[0], serve.ServedModels)
    check_served_parity(ctx[1])


@pytest.mark.vllm
def test_served_relaxations_obey_the_rule(ctx):
    models, run = ctx
    mars = run("mars0.9", "method=mars", "rule.theta=0.9", "batch_size=4")
    n = replay(models, mars, 0.9)
    assert n == sum(r["n_relaxed"] for r in mars.values()) > 0
    (check,) = [c for c in models.checked.values() if c["rule"] == "mars" and c["settings"]["theta"] == 0.9]
    assert check["passed"] and check["replayed"] and check["runner"] == "v1"


@pytest.mark.vllm
def test_served_records_are_complete_and_match_vllms_counters(ctx):
    models, run = ctx
    recs = run("mars0.9", "method=mars", "rule.theta=0.9", "batch_size=4")
    job = job_of(models.cfg.results_dir, "method=mars", "rule.theta=0.9", "batch_size=4")
    assert len(recs) == N and job.todo == set()
    assert "-vllm-serve-" in job.run_dir.name and job.tag.serve
    for r in recs.values():
        assert r["fast_kernel"].endswith("-serve") and r["batch_size"] == 4
        t = r["turns"][0]
        assert t["spec_counts"] == "per_request" and t["ttft_s"] > 0 and t["latency_s"] >= t["ttft_s"]
        assert len(t["itl_s"]) == len(t["chunk_tokens"]) - 1 and sum(t["chunk_tokens"]) == t["new_tokens"]
        assert len(t["proposed"]) == t["steps"] and r["score"] is not None
    calls = [json.loads(x) for x in (job.run_dir / serve.CALLS).read_text().splitlines()]
    k = 4
    per_pos = [0] * k
    for r in recs.values():
        for a in r["turns"][0]["accepted"]:
            for i in range(a):
                per_pos[i] += 1
    from_metrics = [sum(c["metrics"]["accepted_per_pos"][i] for c in calls) for i in range(k)]
    assert per_pos == from_metrics      # vLLM's per-request counts == its /metrics deltas
    assert sum(c["output_tokens"] for c in calls) == sum(r["new_tokens"] for r in recs.values())
    assert {"engine_check.json", "serve.json", "config.yaml", "run.json"} <= {p.name for p in job.run_dir.iterdir()}


@pytest.mark.vllm
def test_a_served_run_resumes(ctx):
    models, run = ctx
    overrides = ("method=sd", "batch_size=4", "max_new_tokens=12")
    job = job_of(models.cfg.results_dir, *overrides)
    decode(models, job, list(enumerate(job.samples))[:3])      # interrupted after 3 samples
    again = job_of(models.cfg.results_dir, *overrides)
    assert len(again.todo) == N - 3
    decode(models, again)
    assert job_of(models.cfg.results_dir, *overrides).todo == set()
    from mars_bench.store.io import read_samples

    recs, problems = read_samples(again.run_dir / "samples.jsonl")
    assert not problems and sorted(r["id"] for r in recs) == sorted(s.id for s in job.samples)
    # greedy: the same prompts in another grouping give the same tokens, cut at the smaller budget
    full = run("sd4", "method=sd", "batch_size=4")
    for r in recs:
        assert r["turns"][0]["output_ids"] == full[r["id"]]["turns"][0]["output_ids"][:12]


@pytest.mark.vllm
def test_the_server_refuses_a_nested_vllm_xargs_in_one_line(ctx):
    import asyncio

    import httpx

    models, _ = ctx
    server = next(s for key, s in models.llms.items() if "draft_model" in key)
    payload = client.body(serve.SERVED_NAME, [1, 2, 3], 4, 0.0, 1.0, 0, [], [], None)
    payload["vllm_xargs"] = {"mars_bench_rule": "mars", "mars_bench_theta": {"value": 0.9}}

    async def go():
        async with httpx.AsyncClient() as http:
            return await client.complete(http, server.url, payload)
    with pytest.raises(ConfigError, match=r"^vllm serve refused the request \(HTTP 400\): ") as e:
        asyncio.run(go())
    assert "\n" not in str(e.value)


@pytest.mark.vllm
def test_a_failed_self_check_refuses_the_served_run_before_any_record(ctx, monkeypatch):
    models, run = ctx
    real = type(models).decode_ids

    def tampered(self, job, prompts, seeds, rule, max_new):   # the strict decode answers other tokens
        ids, audits = real(self, job, prompts, seeds, rule, max_new)
        return ([i[:-1] + [i[-1] + 1] for i in ids] if rule[0] == "mars" and rule[1]["theta"] == 1.0 else ids), audits
    monkeypatch.setattr(type(models), "decode_ids", tampered)
    with pytest.raises(ConfigError, match=rf"^engine=vllm self-check failed on vLLM {models.version}, Model Runner V1: "
                                          r"prompt 0: the strict mars .* gave other tokens than exact") as e:
        run("mars0.7-tampered", "method=mars", "rule.theta=0.7", "batch_size=4")
    assert "\n" not in str(e.value)
    job = job_of(models.cfg.results_dir, "method=mars", "rule.theta=0.7", "batch_size=4")
    assert not Path(job.run_dir / "samples.jsonl").is_file() or not (job.run_dir / "samples.jsonl").read_text()


@pytest.mark.vllm
def test_the_serving_report_reads_the_served_runs(ctx, tmp_path):
    from mars_bench.report import serving

    models, run = ctx
    run("sd4", "method=sd", "batch_size=4")
    run("mars0.9", "method=mars", "rule.theta=0.9", "batch_size=4")
    for name in ("sd4", "mars0.9"):      # the summaries the runner writes after decoding (exact's first)
        over = {"sd4": ("method=sd",), "mars0.9": ("method=mars", "rule.theta=0.9")}[name]
        job_of(models.cfg.results_dir, *over, "batch_size=4").summarize()
    df = serving.rows(serving.load(models.cfg.results_dir))
    at4 = df[(df["concurrency"] == 4) & df["settings"].str.endswith(f"max new tokens {MAX_NEW}")]
    exact = at4[at4["rule"] == "exact"].iloc[0]
    mars = at4[(at4["rule"] == "mars") & (at4["theta"] == 0.9)].iloc[0]
    assert mars["rounds"] == exact["rounds"] == 1 and mars["vs_exact_n"] == 1      # one round: no interval
    assert mars["vs_exact"] == pytest.approx(mars["tokens_per_s"] / exact["tokens_per_s"])
    assert mars["vs_exact_lo"] is None and serving.ratio_text(mars) == f"{mars['vs_exact']:.2f} (CI n/a: 1 round)"
    assert mars["tokens_per_s"] > 0 and mars["relaxed"] > 0 and mars["ttft_p50_ms"] > 0
    assert mars["positions"] == pytest.approx(mars["positions_metrics"])    # records and /metrics agree
    assert mars["identical_to_exact"].endswith(f"/{N}")
    md, figs = serving.write(models.cfg.results_dir, tmp_path / "serve.md")
    assert "| 4 " in md and "mars 0.9" in md and "TTFT p99 (ms)" in md and "(CI n/a: 1 round)" in md
    assert figs and all(p.is_file() for p in figs)
    assert serving.render(serving.rows([])).startswith("No served runs")
    from mars_bench.report import write_report      # mars-bench-report: the serving part is its last section

    res = write_report(models.cfg.results_dir, tmp_path / "report")
    page = (res["out"] / "report.md").read_text()
    assert "## Serving (vllm serve)" in page and "### prompts" in page and "](serving/" in page
    assert list((res["out"] / "serving").glob("serving__*.png"))


@pytest.mark.vllm
def test_served_records_equal_the_offline_engines(ctx, tmp_path):
    """Concurrency 1, greedy: the served sd and mars theta 0.9 records are the offline engine's at B = 1 (same tokens,
    per-step drafts proposed / accepted, outcome and audited relaxations): only the transport differs."""
    from .test_vllm_engine import context

    _, served = ctx
    offline_models, offline = context(tmp_path)
    for name, overrides in (("sd", ("method=sd",)), ("mars0.9", ("method=mars", "rule.theta=0.9"))):
        a = served(f"{name}-c1", *overrides, "batch_size=1")
        b = offline(name, *overrides)
        assert a.keys() == b.keys()
        for i in a:
            x, y = a[i]["turns"][0], b[i]["turns"][0]
            for key in ("output_ids", "proposed", "accepted", "outcome", "relaxed", "stop_reason"):
                assert x[key] == y[key], (name, i, key)


@pytest.mark.vllm
def test_the_bench_serves_rounds_and_the_ratio_has_a_ci_over_them(tmp_path):
    """scripts/bench_serve.py --rounds 2 at concurrency 2 on 4 GSM8K questions: one run directory per rule and round
    (seed = round - 1), the rule decoded first alternating (the records' ``order``), and the report's x exact row: n = 2
    rounds, the geometric mean of the per-round ratios and its t-interval, recomputed here from samples.jsonl's tokens
    and calls.jsonl's wall times."""
    import math
    import subprocess
    import sys

    import numpy as np
    from scipy.stats import t as student

    from mars_bench.store.io import read_samples
    from mars_bench.store.spec import read_spec

    from .conftest import ROOT

    runs, out = tmp_path / "runs", tmp_path / "out"
    env = {**os.environ, "MARS_BENCH_CACHE": os.environ.get("MARS_BENCH_CACHE") or str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_serve.py"), "--pair", "tiny", "--task",
                           "gsm8k", "--limit", "4", "--max-new-tokens", "16", "--concurrency", "2", "--rounds", "2",
                           "--threads", "1", "--runs", str(runs), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rate = {}
    for d in sorted(p.parent for p in runs.rglob("run.json")):
        spec = read_spec(d)
        recs, problems = read_samples(d / "samples.jsonl")
        assert not problems and len(recs) == 4 and spec.batch_size == 2
        first = (spec.rule == "exact") == (spec.seed == 0)          # sd first in round 1, mars in round 2
        assert {r["order"] for r in recs} == {0 if first else 1}, (spec.rule, spec.seed)
        wall = sum(json.loads(x)["wall_s"] for x in (d / serve.CALLS).read_text().splitlines())
        rate[spec.rule, spec.seed] = sum(t["new_tokens"] for r in recs for t in r["turns"]) / wall
    assert sorted(rate) == [("exact", 0), ("exact", 1), ("mars", 0), ("mars", 1)]     # 4 distinct run directories
    logs = [math.log(rate["mars", s] / rate["exact", s]) for s in (0, 1)]
    half = student.ppf(0.975, 1) * np.std(logs, ddof=1) / math.sqrt(2)
    table = json.loads((out / "serve_tiny_gsm8k.json").read_text())
    (row,) = [r for r in table if r["rule"] == "mars"]
    assert row["rounds"] == row["vs_exact_n"] == 2 and row["seeds"] == [0, 1]
    assert row["vs_exact"] == pytest.approx(math.exp(np.mean(logs)))
    assert (row["vs_exact_lo"], row["vs_exact_hi"]) == pytest.approx((math.exp(np.mean(logs) - half),
                                                                      math.exp(np.mean(logs) + half)))
    assert row["vs_exact_lo"] < row["vs_exact"] < row["vs_exact_hi"]
    assert "accuracy_strict" in row["quality"] and row["quality_vs_exact"]["accuracy_strict"]["n"] == 4
    md = (out / "serve_tiny_gsm8k.md").read_text()
    assert f"{row['vs_exact']:.2f} [{row['vs_exact_lo']:.2f}, {row['vs_exact_hi']:.2f}]" in md
