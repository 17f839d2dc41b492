"""The harness's client of ``vllm serve`` (asyncio + httpx): one streamed ``/v1/completions`` request per turn, the
prompt as the harness's own token ids, the rule and its settings as flat ``vllm_xargs`` (``verify.request_args``).

Per request (``Reply``): the output token ids (``return_token_ids``: each streamed chunk carries its delta ids), the
arrival time and size of every chunk that carried tokens, the finish reason, and vLLM's per-request per-step draft
counts from the final usage chunk (``metrics.speculative_decoding``: the server runs with
``--per-request-spec-decode-metrics detailed``). From the chunks: TTFT (send to the first token), the inter-token
latencies (ITL: gaps between successive token-bearing chunks; with speculative decoding one chunk carries the tokens
of one verification step), the end-to-end latency and TPOT ((latency - TTFT) / (tokens - 1)), as ``vllm bench serve``
defines them. ``client`` arguments are ``httpx.AsyncClient``s (httpx comes with vLLM). ``scrape`` reads the server's
Prometheus ``/metrics`` (the speculative-decoding counters, per draft position) so that a caller can take deltas
around a batch of requests.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

from mars_bench.base.errors import ConfigError

TIMEOUT_S = 3600.0          # one request's read timeout (a CPU server at concurrency 16 answers slowly)
SPEC_PREFIX = "vllm:spec_decode_"


@dataclass
class Reply:
    """One streamed completion as the client saw it (module doc); times in seconds of ``time.perf_counter``."""
    sent: float
    token_ids: list = field(default_factory=list)
    chunk_times: list = field(default_factory=list)    # arrival of each chunk that carried tokens
    chunk_tokens: list = field(default_factory=list)   # tokens in that chunk
    finish_reason: str | None = None
    done: float | None = None
    drafted: list | None = None                        # vLLM's per-step drafts proposed (None: no speculation)
    accepted: list | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def latency_s(self) -> float:
        return (self.done or self.sent) - self.sent

    @property
    def tpot_s(self) -> float | None:
        n = len(self.token_ids)
        return (self.latency_s - self.ttft_s) / (n - 1) if n > 1 else None

    def timing(self) -> dict:
        """What a turn record holds of the request's timing (seconds, rounded to microseconds)."""
        r = lambda x: None if x is None else round(x, 6)  # noqa: E731
        return {"ttft_s": r(self.ttft_s), "tpot_s": r(self.tpot_s), "latency_s": r(self.latency_s),
                "itl_s": [r(x) for x in self.itl_s], "chunk_tokens": list(self.chunk_tokens),
                "spec_counts": "per_request" if self.drafted is not None else None}


def body(model: str, prompt: list, max_tokens: int, temperature: float, top_p: float, seed: int, stop_ids: list,
         stop: list, xargs: dict | None) -> dict:
    """A streamed ``/v1/completions`` request as the offline engine's ``SamplingParams`` (engine.Models.params): the
    stop strings kept in the output, special tokens skipped in the text, token ids returned, usage (and with it
    vLLM's per-request metrics) in a final chunk."""
    out = {"model": model, "prompt": list(prompt), "max_tokens": int(max_tokens), "temperature": float(temperature),
           "top_p": float(top_p), "seed": int(seed), "stop_token_ids": list(stop_ids), "stop": list(stop) or None,
           "include_stop_str_in_output": True, "skip_special_tokens": True, "return_token_ids": True,
           "stream": True, "stream_options": {"include_usage": True}}
    if xargs:
        out["vllm_xargs"] = dict(xargs)
    return out


async def complete(client, url: str, payload: dict) -> Reply:
    """One streamed request; a refusal by the server (HTTP 4xx / 5xx, or an error event in the stream) is one line
    (``ConfigError``) naming what it said."""
    reply = Reply(sent=time.perf_counter())
    async with client.stream("POST", f"{url}/v1/completions", json=payload, timeout=TIMEOUT_S) as resp:
        if resp.status_code != 200:
            raise ConfigError(f"vllm serve refused the request (HTTP {resp.status_code}): "
                              f"{_message(await resp.aread())}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise ConfigError(f"vllm serve failed the request: {_message(json.dumps(chunk))}")
            for choice in chunk.get("choices") or []:
                ids = choice.get("token_ids") or []
                if ids:
                    reply.token_ids += ids
                    reply.chunk_times.append(now)
                    reply.chunk_tokens.append(len(ids))
                if choice.get("finish_reason"):
                    reply.finish_reason = choice["finish_reason"]
            spec = ((chunk.get("metrics") or {}).get("speculative_decoding") or {})
            if spec.get("per_step_drafted") is not None:
                reply.drafted, reply.accepted = list(spec["per_step_drafted"]), list(spec["per_step_accepted"])
    reply.done = time.perf_counter()
    return reply


def _message(raw: bytes | str) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        data = json.loads(text)
        text = (data.get("error") or {}).get("message", text) if isinstance(data.get("error"), dict) else \
            data.get("message", text)
    except (ValueError, AttributeError):
        pass
    return " ".join(str(text).split())[:300]


async def run_all(jobs, concurrency: int):
    """Await every coroutine factory of the iterable ``jobs`` (read lazily) with at most ``concurrency`` of them in
    flight; the first failure cancels the rest and is raised."""
    it = iter(jobs)
    lock = asyncio.Lock()

    async def worker():
        while True:
            async with lock:
                job = next(it, None)
            if job is None:
                return
            await job()

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))


_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')


def parse_metrics(text: str) -> dict:
    """vLLM's speculative-decoding counters from Prometheus text: ``num_drafts``, ``num_draft_tokens``,
    ``num_accepted_tokens`` and ``accepted_per_pos`` (position -> count), each summed over engines."""
    out = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0, "accepted_per_pos": {}}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or not m["name"].startswith(SPEC_PREFIX):
            continue
        name = m["name"][len(SPEC_PREFIX):].removesuffix("_total")
        value = float(m["value"])
        if name == "num_accepted_tokens_per_pos":
            pos = int(re.search(r'position="(\d+)"', m["labels"] or "")[1])
            out["accepted_per_pos"][pos] = out["accepted_per_pos"].get(pos, 0.0) + value
        elif name in out:
            out[name] += value
    return out


def metrics_delta(before: dict, after: dict) -> dict:
    """``after`` - ``before`` of two ``parse_metrics`` readings (positions as a list from 0)."""
    pos = sorted(set(before["accepted_per_pos"]) | set(after["accepted_per_pos"]))
    return {**{k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")},
            "accepted_per_pos": [after["accepted_per_pos"].get(p, 0.0) - before["accepted_per_pos"].get(p, 0.0)
                                 for p in pos]}


async def scrape(client, url: str) -> dict:
    resp = await client.get(f"{url}/metrics", timeout=60)
    resp.raise_for_status()
    return parse_metrics(resp.text)
