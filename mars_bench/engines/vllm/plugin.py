"""vLLM general plugin (entry point ``vllm.general_plugins`` -> ``mars_bench = mars_bench.engines.vllm.plugin:register``).

vLLM calls ``register`` in every process it starts. It does nothing unless the harness asked for it
(``MARS_BENCH_VLLM_PLUGIN=1`` in the environment, set by ``engines/vllm.py`` before the ``LLM`` is built), so
an installed mars-bench never changes a user's other vLLM runs. When active it patches vLLM's verification
(``vllm_compat.install``) so that requests carrying the harness's flat ``SamplingParams.extra_args``
(``verify.request_args``: ``mars_bench_rule``, ``mars_bench_key``, one ``mars_bench_<knob>`` per setting; from
``vllm serve`` they come as the request's ``vllm_xargs``) are verified by this project's rule registry
(``verify.py``) from the raw target logits, and
every step's audit of those requests (output tokens before the step, drafts proposed / accepted, z1 / z2,
relaxed acceptances) is appended to ``$MARS_BENCH_VLLM_AUDIT/<pid>.jsonl`` as one JSON line per request and step,
by tensor-parallel rank 0 only (``vllm_compat.writes_audit``). Rule ``exact`` is observed only: no input of vLLM's
kernel is changed. Other requests pass through untouched.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from mars_bench.engines.vllm import verify

ACTIVE = "MARS_BENCH_VLLM_PLUGIN"
AUDIT = "MARS_BENCH_VLLM_AUDIT"


def register() -> None:
    """vLLM's entry point: a no-op unless ``MARS_BENCH_VLLM_PLUGIN=1``."""
    if os.environ.get(ACTIVE) != "1":
        return
    from mars_bench.engines.vllm import compat as vllm_compat

    vllm_compat.check_version()
    if os.environ.get(vllm_compat.RUNNER_ENV) == "0":    # V1 (the engine's choice); V2: the LogitsProcessor (v2.py)
        vllm_compat.install(step)


def step(draft, num_draft, raw, logits, draft_probs, uniform, greedy, extra, done, run_kernel):
    """One verification step of a batch (``vllm_compat.install``): decide, rewrite, run vLLM's kernel, audit."""
    specs = [verify.spec_of(e) for e in extra]
    if not any(specs):
        return run_kernel(logits)
    dec = verify.decide(draft, num_draft, raw, logits, draft_probs, uniform, greedy, specs)
    out = run_kernel(verify.rewrite(logits, draft, dec.relaxed))
    from mars_bench.engines.vllm import compat as vllm_compat

    if not vllm_compat.writes_audit():    # another tensor-parallel rank writes this step
        return out
    records = verify.audit(dec, draft, num_draft, verify.accepted_counts(out))
    write_audit([(verify.key_of(e), {**r, "done": n}) for e, r, n in zip(extra, records, done) if r is not None])
    return out


def write_audit(rows: list) -> None:
    """Append (key, step record) rows to this process's audit file (one JSON line each)."""
    folder = os.environ.get(AUDIT)
    if not folder or not rows:
        return
    path = Path(folder) / f"{os.getpid()}.jsonl"
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(json.dumps({"key": key, **rec}) + "\n" for key, rec in rows))


def read_audit(folder) -> dict[str, list[dict]]:
    """Every step record in ``folder`` grouped by request key, in the order written (per process); the files are
    removed once read (call it when vLLM's ``generate`` has returned: no step is being written then)."""
    out: dict[str, list[dict]] = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            out.setdefault(rec.pop("key"), []).append(rec)
        path.unlink()
    return out
