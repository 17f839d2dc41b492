"""MT-Bench single-answer grading by an LLM judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

The four judge prompts are FastChat's own (``single-v1``, ``single-math-v1`` and their ``-multi-turn`` variants),
read byte for byte from FastChat's ``judge_prompts.jsonl`` as the MARS authors ship it
(``mars_release/judge_prompts.jsonl``, found like every data file: ``data.locate``; FastChat is Apache-2.0); the
score is parsed from ``[[N]]`` (FastChat's primary pattern), else ``[N]`` (its backup). HTTP uses only ``urllib``.
The API key is read from the environment variable named in the config, at request time; it is never returned.
"""
from __future__ import annotations

import functools
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from mars_bench.tasks import data as D

NEED_REF_CATEGORIES = ("math", "reasoning", "coding")
JUDGE_PROMPTS_FILE = "mars_release/judge_prompts.jsonl"
SINGLE_PROMPTS = ("single-v1", "single-math-v1", "single-v1-multi-turn", "single-math-v1-multi-turn")
PROMPT_VERSION = "fastchat-judge_prompts.jsonl@" + D.PUBLIC[JUDGE_PROMPTS_FILE].sha256[:12]


@functools.lru_cache(maxsize=4)
def read_judge_prompts(path: Path) -> dict[str, dict]:
    """{name: {'system', 'template'}} of the four single-answer prompts in a FastChat ``judge_prompts.jsonl``."""
    rows = D.read_jsonl(path, {"name": "str", "system_prompt": "str", "prompt_template": "str"})
    prompts = {r["name"]: {"system": r["system_prompt"], "template": r["prompt_template"]} for r in rows}
    missing = [n for n in SINGLE_PROMPTS if n not in prompts]
    if missing:
        raise D.DataError(path, f"expected the judge prompts {', '.join(SINGLE_PROMPTS)}; missing {missing}")
    return {n: prompts[n] for n in SINGLE_PROMPTS}


def load_judge_prompts(data_dir=None, download=D.http_get) -> dict[str, dict]:
    """FastChat's judge prompts from ``mars_release/judge_prompts.jsonl`` (local, cached, or the pinned download)."""
    return read_judge_prompts(D.locate(JUDGE_PROMPTS_FILE, data_dir, download=download))


_SCORE = re.compile(r"\[\[(\d+\.?\d*)\]\]")
_SCORE_BACKUP = re.compile(r"\[(\d+\.?\d*)\]")


class JudgeError(RuntimeError):
    pass


def parse_score(judgment: str) -> float | None:
    """The first ``[[N]]`` in the judgment, else the first ``[N]``; None when there is neither."""
    m = _SCORE.search(judgment) or _SCORE_BACKUP.search(judgment)
    return float(m.group(1)) if m else None


def judge_prompt_name(category: str, turn: int) -> str:
    base = "single-math-v1" if category in NEED_REF_CATEGORIES else "single-v1"
    return base + ("-multi-turn" if turn == 2 else "")


def build_judge_messages(questions: list[str], answers: list[str], turn: int, category: str,
                         ref_answers: list[str] | None = None, prompts: dict | None = None) -> tuple[str, list[dict]]:
    """(prompt name, chat messages) grading ``answers[turn-1]`` (turn 2 sees the whole conversation), with
    ``prompts`` from ``load_judge_prompts`` (read with the default data location when None)."""
    if turn not in (1, 2) or len(answers) < turn or len(questions) < turn:
        raise ValueError(f"judge turn {turn} needs {turn} questions and answers")
    name = judge_prompt_name(category, turn)
    if category in NEED_REF_CATEGORIES and (not ref_answers or len(ref_answers) < turn):
        raise ValueError(f"category '{category}' is graded against a reference answer, none given")
    fields = {"question": questions[0], "answer": answers[0]} if turn == 1 else {
        "question_1": questions[0], "question_2": questions[1], "answer_1": answers[0], "answer_2": answers[1]}
    if category in NEED_REF_CATEGORIES:
        fields["ref_answer_1"] = ref_answers[0]
        if turn == 2:
            fields["ref_answer_2"] = ref_answers[1]
    p = (prompts if prompts is not None else load_judge_prompts())[name]
    return name, [{"role": "system", "content": p["system"]},
                  {"role": "user", "content": p["template"].format(**fields)}]


class JudgeClient:
    """POST ``{url}/chat/completions`` (``url`` may already end with it); retries on 429/5xx/network errors."""

    def __init__(self, url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = 120.0, max_tokens: int = 2048, temperature: float = 0.0,
                 retries: int = 3, backoff_s: float = 2.0):
        if not url:
            raise ValueError("judge_url is required when the judge is enabled")
        url = url.rstrip("/")
        self.endpoint = url if url.endswith("/chat/completions") else url + "/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.timeout_s, self.max_tokens, self.temperature = float(timeout_s), int(max_tokens), float(temperature)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        host = urllib.parse.urlsplit(self.endpoint).hostname or ""
        # a local judge never goes through a proxy from the environment
        proxies = {} if host in ("localhost", "127.0.0.1", "::1") else None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))

    def request_body(self, messages: list[dict]) -> dict:
        return {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "n": 1}

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def complete(self, messages: list[dict]) -> str:
        data = json.dumps(self.request_body(messages)).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(self.endpoint, data=data, headers=self._headers(), method="POST")
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    payload = json.loads(resp.read().decode("utf-8"))
                return str(payload["choices"][0]["message"]["content"])
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} from {self.endpoint}"
                if e.code != 429 and e.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except (ValueError, KeyError, IndexError, TypeError) as e:
                last = f"unexpected response from {self.endpoint}: {type(e).__name__}: {e}"
                break
        raise JudgeError(last)

    def grade(self, questions, answers, turn, category, ref_answers=None, prompts=None) -> dict:
        """{'score': float|None, 'judgment': str, 'prompt': name, 'error': str|None} for one turn."""
        name, messages = build_judge_messages(questions, answers, turn, category, ref_answers, prompts)
        try:
            text = self.complete(messages)
        except JudgeError as e:
            return {"score": None, "judgment": "", "prompt": name, "error": str(e)}
        score = parse_score(text)
        return {"score": score, "judgment": text, "prompt": name,
                "error": None if score is not None else "no [[rating]] in the judgment"}
