"""MT-Bench single-answer grading by an LLM judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

The four judge prompts follow the layout of FastChat's published single-answer formats (``single-v1``,
``single-math-v1`` and their ``-multi-turn`` variants; FastChat is Apache-2.0); the score is parsed from
``[[N]]`` (FastChat's primary pattern), else ``[N]`` (its backup). HTTP uses only ``urllib``.
The API key is read from the environment variable named in the config, at request time; it is never returned.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

NEED_REF_CATEGORIES = ("math", "reasoning", "coding")
PROMPT_VERSION = "fastchat-single-v1-layout"

_RATE = ('After providing your explanation, you must rate the response on a scale of 1 to 10 by strictly '
         'following this format: "[[rating]]", for example: "Rating: [[5]]".')
_GENERAL = ("Please act as an impartial judge and evaluate the quality of the response provided by an AI "
            "assistant to the user question displayed below. Your evaluation should consider factors such as "
            "the helpfulness, relevance, accuracy, depth, creativity, and level of detail of the response.")
_MATH = ("Please act as an impartial judge and evaluate the quality of the response provided by an AI "
         "assistant to the user question displayed below. Your evaluation should consider correctness and "
         "helpfulness. You will be given a reference answer and the assistant's answer.")
_CONV = ("<|The Start of Assistant A's Conversation with User|>\n\n### User:\n{question_1}\n\n### Assistant A:\n"
         "{answer_1}\n\n### User:\n{question_2}\n\n### Assistant A:\n{answer_2}\n\n"
         "<|The End of Assistant A's Conversation with User|>")

JUDGE_PROMPTS = {
    "single-v1": {
        "system": "You are a helpful assistant.",
        "template": "[Instruction]\n" + _GENERAL + " Begin your evaluation by providing a short explanation. "
                    "Be as objective as possible. " + _RATE + "\n\n[Question]\n{question}\n\n"
                    "[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]",
    },
    "single-math-v1": {
        "system": "You are a helpful assistant.",
        "template": "[Instruction]\n" + _MATH + " Begin your evaluation by comparing the assistant's answer "
                    "with the reference answer. Identify and correct any mistakes. Be as objective as possible. "
                    + _RATE + "\n\n[Question]\n{question}\n\n[The Start of Reference Answer]\n{ref_answer_1}\n"
                    "[The End of Reference Answer]\n\n[The Start of Assistant's Answer]\n{answer}\n"
                    "[The End of Assistant's Answer]",
    },
    "single-v1-multi-turn": {
        "system": _GENERAL + " Your evaluation should focus on the assistant's answer to the second user "
                  "question. Begin your evaluation by providing a short explanation. Be as objective as "
                  "possible. " + _RATE + "\n\n",
        "template": _CONV,
    },
    "single-math-v1-multi-turn": {
        "system": _MATH + " Your evaluation should focus on the assistant's answer to the second question. "
                  "Begin your evaluation by comparing the assistant's answer with the reference answer. "
                  "Identify and correct any mistakes. Be as objective as possible. " + _RATE + "\n\n",
        "template": "<|The Start of Reference Answer|>\n\n### User:\n{question_1}\n\n### Reference answer:\n"
                    "{ref_answer_1}\n\n### User:\n{question_2}\n\n### Reference answer:\n{ref_answer_2}\n\n"
                    "<|The End of Reference Answer|>\n\n\n" + _CONV,
    },
}

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
                         ref_answers: list[str] | None = None) -> tuple[str, list[dict]]:
    """(prompt name, chat messages) grading ``answers[turn-1]`` (turn 2 sees the whole conversation)."""
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
    p = JUDGE_PROMPTS[name]
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

    def grade(self, questions, answers, turn, category, ref_answers=None) -> dict:
        """{'score': float|None, 'judgment': str, 'prompt': name, 'error': str|None} for one turn."""
        name, messages = build_judge_messages(questions, answers, turn, category, ref_answers)
        try:
            text = self.complete(messages)
        except JudgeError as e:
            return {"score": None, "judgment": "", "prompt": name, "error": str(e)}
        score = parse_score(text)
        return {"score": score, "judgment": text, "prompt": name,
                "error": None if score is not None else "no [[rating]] in the judgment"}
