"""``engine=vllm engine.serve=true``: a job's samples sent to ``vllm serve`` (vLLM's OpenAI-compatible server) by the
harness's own client (``client.py``), ``batch_size`` requests in flight (docs/vllm.md "Serving").

One server per drafting setup of the run's methods (sd and mars share one: the rule is per request), started as a
subprocess of this Python (the vLLM virtualenv's) with the engine arguments the offline ``LLM`` gets
(``engine.engine_kwargs``) as flags, under the plugin's environment (``engine.plugin_env``: the plugin switched on, the
audit folder, the runner compat chose), ``--no-enable-prefix-caching`` (the rules decode the same prompts on one server:
the second would find the first's prefill cached), ``--generation-config vllm`` (else the model's generation_config.json
would set unsent sampling fields such as repetition_penalty) and the per-request detailed spec-decode metrics; ready
when ``/health`` answers; stopped (SIGINT to its process group, then SIGKILL) when the models are released or the
process exits. Each request carries its rule as flat ``vllm_xargs`` (``verify.request_args``) and is audited by the
plugin as in the offline engine; the self-check (``selfcheck.run``) runs through the server before the job's first
record. Records are the offline engine's (``engine.turn_record_of``) plus, per turn, the request's timing
(``client.Reply.timing``: TTFT, ITL, TPOT, latency); a call's samples are written when the call ends, each with the
call's wall time shared by its output tokens (so tokens / wall over a run is output tokens per second of the server),
and the call's ``/metrics`` deltas (per-position acceptance as vLLM counts it) go to ``calls.jsonl`` beside them.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from pathlib import Path

from mars_bench.base.errors import ConfigError
from mars_bench.engines.vllm import client, compat, verify
from mars_bench.engines.vllm.engine import Models, clear_cpu_kv_env, engine_kwargs, plugin_env, turn_record_of
from mars_bench.engines.vllm.plugin import read_audit

log = logging.getLogger("mars_bench")
logging.getLogger("httpx").setLevel(logging.WARNING)   # not a line per request

SERVED_NAME = "mars-bench-target"
STOP_S = 30           # a server's grace after SIGINT before SIGKILL
CALLS = "calls.jsonl"
WARMUP_TOKENS = 16    # new tokens of each warm-up request (discarded)


def server_flags(kwargs: dict) -> list[str]:
    """``LLM`` keyword arguments as ``vllm serve`` flags: the model first, then ``--name value`` (objects as JSON,
    lists as several values, true as ``--name``, false as ``--no-name``); None and ``disable_log_stats`` (the server
    logs its stats unless told not to) are left out."""
    kwargs = dict(kwargs)
    out = [str(kwargs.pop("model"))]
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if value is None or name == "disable_log_stats":
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``vllm serve`` process: ``start`` waits until ``/health`` answers (or refuses in one line with the tail
    of its log), ``stop`` ends its process group."""

    def __init__(self, flags: list, env: dict, port: int, start_s: float, log_dir: str, unset: tuple = ()):
        self.port, self.start_s = port, float(start_s)
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [sys.executable, "-c", compat.SERVE_LAUNCH, "serve", *flags, "--host", "127.0.0.1",
                    "--port", str(port), "--served-model-name", SERVED_NAME, "--generation-config", "vllm"]
        self.env, self.unset = env, unset     # unset: variables of this process the server must not see
        self.log_path = Path(log_dir) / f"vllm-serve-{port}.log"
        self.proc = None

    def start(self) -> "Server":
        import httpx

        log.info("vllm serve %s (log %s)", " ".join(self.cmd[4:]), self.log_path)
        with self.log_path.open("w") as out:
            env = {k: v for k, v in {**os.environ, **self.env}.items() if k not in self.unset}
            self.proc = subprocess.Popen(self.cmd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        deadline = time.monotonic() + self.start_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"vllm serve exited with {self.proc.returncode} before it was ready: "
                                  f"{self.tail()} (log {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise ConfigError(f"vllm serve did not answer /health within engine.serve_start_s={self.start_s:g} s: "
                          f"{self.tail()} (log {self.log_path})")

    def tail(self) -> str:
        lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        errors = [x for x in lines if "Error" in x or "error" in x]
        return " ".join((errors or lines or ["(no output)"])[-1].split())[:300]

    def stop(self) -> None:
        if self.proc is not None:
            self._finalizer()


def _stop(proc) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, STOP_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class ServedModels(Models):
    """``engine.Models`` whose decodes go through ``vllm serve`` (module doc): the same tokenizer, prompts, seeds,
    rules, audit, self-check and records; ``decode_batched`` keeps ``batch_size`` requests in flight."""

    def __init__(self, cfg, methods):
        super().__init__(cfg, methods)
        self.log_dir = tempfile.mkdtemp(prefix="mars-bench-vllm-serve-")
        self.kernel = f"{self.kernel}-serve"
        self.warm: set = set()    # servers (their URLs) that decoded their warm-up

    def llm(self, method) -> Server:
        """The running server of ``method``'s drafting setup (started on first use: ``Models.llm``'s keys)."""
        from mars_bench.engines.vllm.engine import speculative_config

        key = repr(speculative_config(method, self.cfg.model, self.draft_dir))
        if key not in self.specs:
            raise RuntimeError(f"engine=vllm serve: method {method.name} needs a server ({key}) that the methods "
                               "these models were built with do not; allowed: those methods")
        if key not in self.llms:
            e = self.cfg.engine
            clear_cpu_kv_env(self.cfg)
            env = plugin_env(self.cfg, self.audit_dir, self.runner)
            kwargs = engine_kwargs(self.cfg, self.target_dir, self.specs[key], self.share, self.runner)
            # no prefix cache: the rules share a server and decode the same prompts one after another, so the second
            # would find the first's prefill cached and show a shorter TTFT
            flags = server_flags({**kwargs, "enable_prefix_caching": False})
            port = int(e.serve_port) + len(self.llms) if e.serve_port else free_port()
            unset = (compat.RUNNER_ENV,) if self.runner == compat.V2 else ()   # V2: vLLM's default (0.34 refuses 0)
            self.llms[key] = Server(flags, env, port, e.serve_start_s, self.log_dir, unset).start()
        return self.llms[key]

    def close(self) -> None:
        for server in self.llms.values():
            server.stop()

    def request(self, job, prompt: list, seed: int, key: str, rule: tuple | None = None,
                max_new: int | None = None) -> dict:
        """The completion request of one prompt (``client.body``): the job's sampling settings and budget, its rule
        (or ``rule``) as flat vllm_xargs for a lossy rule (``exact``: vLLM untouched, as offline)."""
        m, cfg = job.method, job.cfg
        name, settings = rule or (m.rule, dict(m.rule_kwargs))
        xargs = verify.request_args(name, dict(settings), key) if m.speculative and name != "exact" else None
        return client.body(SERVED_NAME, prompt, max_new or job.max_new, cfg.temperature, cfg.top_p, seed, self.eos,
                           list(job.task.stop_strings), xargs)

    def key(self) -> str:
        self.counter += 1
        return f"{os.getpid()}-{self.counter}-{uuid.uuid4().hex[:6]}"

    def decode_ids(self, job, prompts: list, seeds: list, rule: tuple, max_new: int) -> tuple[list, list]:
        """(output ids, audit steps) per prompt, all in flight at once (the self-check's decodes)."""
        server = self.llm(job.method)
        keys = [self.key() for _ in prompts]

        async def go():
            import httpx

            async with httpx.AsyncClient() as http:
                return await asyncio.gather(*(client.complete(http, server.url,
                                                              self.request(job, p, s, k, rule, max_new))
                                              for p, s, k in zip(prompts, seeds, keys)))
        replies = self._run(server, go())
        audit = read_audit(self.audit_dir)
        return [r.token_ids for r in replies], [audit.get(k, []) for k in keys]

    def decode_batched(self, job, todo: list, write, order: int = 0, source=None) -> None:
        """Samples ``todo`` ([(index, sample)]; ``source``: the claimed ones, read lazily), each sample's turns in
        sequence, ``batch_size`` samples in flight; their records written when the call ends."""
        self.self_check(job)
        server = self.llm(job.method)
        self.warm_up(job, server, todo)
        items = source if source is not None else todo
        done: list = []
        t0 = time.perf_counter()
        before = after = None

        async def go():
            nonlocal before, after
            import httpx

            limits = httpx.Limits(max_connections=job.tag.batch_size + 2)
            async with httpx.AsyncClient(limits=limits) as http:
                before = await client.scrape(http, server.url)
                await client.run_all((lambda item=item: self._sample(http, server, job, *item, done) for item in items),
                                     job.tag.batch_size)
                after = await client.scrape(http, server.url)
        self._run(server, go())
        wall = time.perf_counter() - t0
        audit = read_audit(self.audit_dir)
        self._write(job, done, audit, wall, order, write, client.metrics_delta(before, after))

    def warm_up(self, job, server: Server, todo: list) -> None:
        """Before a server's first timed call: the first turns of up to ``batch_size`` of ``todo``'s samples decoded
        with ``exact`` and a short budget, all in flight, the outputs discarded (a fresh server's first batch pays
        allocation and first-call costs, which would land on whichever rule happens to come first)."""
        if server.url in self.warm or not todo:
            return
        from mars_bench.store.recordbuild import sample_seed
        from mars_bench.tasks import build_messages

        first = todo[:job.tag.batch_size]
        prompts = [self.prompt_ids(build_messages(job.task, s, [], 0)) for _, s in first]
        self.decode_ids(job, prompts, [sample_seed(job.cfg.seed, i, 0) for i, _ in first], ("exact", {}),
                        WARMUP_TOKENS)
        self.warm.add(server.url)

    @staticmethod
    def _run(server: Server, coroutine):
        """``coroutine`` to its end; the server failing under it (a dropped connection, a timeout) is one line naming
        its log."""
        import httpx

        try:
            return asyncio.run(coroutine)
        except httpx.HTTPError as e:
            what = " ".join(str(e).split())[:200]
            raise ConfigError(f"vllm serve at {server.url} failed: {type(e).__name__}: {what}; its log: "
                              f"{server.tail()} ({server.log_path})") from e

    async def _sample(self, http, server, job, index: int, sample, done: list) -> None:
        from mars_bench.store.recordbuild import sample_seed
        from mars_bench.tasks import build_messages

        outputs, turns = [], []
        for t in range(len(sample.turns)):
            prompt = self.prompt_ids(build_messages(job.task, sample, outputs, t))
            key = self.key()
            seed = sample_seed(job.cfg.seed, index, t)
            reply = await client.complete(http, server.url, self.request(job, prompt, seed, key))
            outputs.append(self.tokenizer.decode(reply.token_ids, skip_special_tokens=True))
            turns.append((prompt, reply, key, outputs[-1]))
        done.append((index, sample, turns, outputs))

    def _write(self, job, done: list, audit: dict, wall: float, order: int, write, delta: dict) -> None:
        from mars_bench.store.io import atomic_write_json
        from mars_bench.store.recordbuild import sample_record

        if job.method.speculative and any(r.drafted is None for *_, ts, _ in done for _, r, _, _ in ts):
            raise ConfigError("vllm serve returned no per-request spec-decode counts; allowed: a server started with "
                              "--per-request-spec-decode-metrics detailed (serve.ServedModels.llm)")
        total = sum(len(r.token_ids) for *_, ts, _ in done for _, r, _, _ in ts) or 1
        call = uuid.uuid4().hex[:12]
        for index, sample, turns, outputs in done:
            recs = []
            for prompt, reply, key, text in turns:
                rec = turn_record_of(reply.token_ids, reply.finish_reason, reply.drafted, reply.accepted, prompt, text,
                                     audit.get(key, []), wall * len(reply.token_ids) / total, self.tokenizer)
                recs.append({**rec, **reply.timing(), "call": call})
            write(sample, sample_record(job, sample, index, recs, job.task.score(sample, outputs), self.kernel, order,
                                        self.machine))
        if not done:     # every sample was another process's
            return
        job.run_dir.mkdir(parents=True, exist_ok=True)
        server = self.llm(job.method)
        atomic_write_json(job.run_dir / "serve.json", {"vllm": self.version, "runner": self.runner,
                                                       "command": ["vllm", *server.cmd[3:]], "env": server.env})
        line = json.dumps({"call": call, "concurrency": job.tag.batch_size, "samples": len(done),
                           "wall_s": round(wall, 6), "output_tokens": total, "metrics": delta})
        with (job.run_dir / CALLS).open("a", encoding="utf-8") as f:   # one line per call, appended whole
            f.write(line + "\n")
