"""MT-Bench: judge prompts, request building and score parsing against a local OpenAI-compatible test server."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mars_bench.tasks import Sample, get_task
from mars_bench.tasks.judge import JudgeClient, build_judge_messages, judge_prompt_name, parse_score

from .conftest import data_dir as _data_dir

ROOT = Path(__file__).resolve().parent.parent
KEY_ENV = "MARS_TEST_JUDGE_KEY"




class Judge:
    """A local judge: records each request, answers with the next canned reply (status, content)."""

    def __init__(self):
        self.requests, self.replies = [], []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append({"path": self.path, "headers": dict(self.headers),
                                       "body": json.loads(body)})
                status, content = owner.replies.pop(0) if owner.replies else (200, "Fine. Rating: [[7]]")
                data = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    j = Judge()
    yield j
    j.close()


def _task(judge, **kw):
    return get_task("mt_bench", judge=True, judge_url=judge.url, judge_model="judge-model",
                    judge_api_key_env=KEY_ENV, judge_retries=kw.pop("retries", 0), judge_backoff_s=0.0, **kw)


@pytest.mark.parametrize("text,expected", [
    ("The answer is good. Rating: [[8]]", 8.0), ("Rating: [[7.5]]", 7.5), ("[[10]] then [[2]]", 10.0),
    ("Rating: [6]", 6.0), ("no score", None), ("Rating: 8/10", None), ("[[x]] but [3]", 3.0),
])
def test_parse_score(text, expected):
    assert parse_score(text) == expected


def test_prompt_choice_and_contents():
    assert judge_prompt_name("writing", 1) == "single-v1"
    assert judge_prompt_name("math", 1) == "single-math-v1"
    assert judge_prompt_name("coding", 2) == "single-math-v1-multi-turn"
    assert judge_prompt_name("roleplay", 2) == "single-v1-multi-turn"
    name, m = build_judge_messages(["Q1", "Q2"], ["A1", "A2"], 1, "writing")
    assert name == "single-v1" and m[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert "[Question]\nQ1\n\n[The Start of Assistant's Answer]\nA1\n[The End of Assistant's Answer]" in m[1]["content"]
    assert '"[[rating]]"' in m[1]["content"] and "A2" not in m[1]["content"]
    name, m = build_judge_messages(["Q1", "Q2"], ["A1", "A2"], 2, "math", ["R1", "R2"])
    u = m[1]["content"]
    assert name == "single-math-v1-multi-turn" and "second question" in m[0]["content"]
    assert u.index("### Reference answer:\nR1") < u.index("### Reference answer:\nR2") < \
        u.index("### Assistant A:\nA1") < u.index("### Assistant A:\nA2")
    with pytest.raises(ValueError):
        build_judge_messages(["Q1", "Q2"], ["A1"], 2, "writing")
    with pytest.raises(ValueError):
        build_judge_messages(["Q1"], ["A1"], 1, "math", None)


def test_judge_off_by_default():
    t = get_task("mt_bench")
    assert t.options["judge"] is False
    s = Sample("81", ["q1", "q2"], {"category": "writing", "ref_answers": None}, {"questions": ["q1", "q2"]})
    assert t.score(s, ["a1", "a2"]) == {}
    assert t.aggregate([s], [{}], [["a1", "a2"]]) == {}


def test_request_and_scores_two_turns(judge):
    t = _task(judge)
    s = t.load(_data_dir(), subset="math", limit=1)[0]
    assert s.reference["category"] == "math" and len(s.reference["ref_answers"]) == 2
    judge.replies = [(200, "Correct. Rating: [[9]]"), (200, "Mostly fine [6]")]
    out = t.score(s, ["MY-TURN-1-ANSWER", "MY-TURN-2-ANSWER"])
    assert out["judge_score_turn1"] == 9.0 and out["judge_score_turn2"] == 6.0
    assert out["judge_prompt_turn1"] == "single-math-v1" and out["judge_error_turn1"] is None
    assert len(judge.requests) == 2
    r1, r2 = judge.requests
    assert r1["path"] == "/v1/chat/completions"
    assert r1["headers"]["Authorization"] == "Bearer sk-test-123"
    b = r1["body"]
    assert b["model"] == "judge-model" and b["temperature"] == 0.0 and b["max_tokens"] == 2048
    assert [m["role"] for m in b["messages"]] == ["system", "user"]
    assert s.meta["questions"][0] in b["messages"][1]["content"]
    assert s.reference["ref_answers"][0] in b["messages"][1]["content"]
    assert "MY-TURN-1-ANSWER" in b["messages"][1]["content"] and "MY-TURN-2-ANSWER" not in b["messages"][1]["content"]
    u2 = r2["body"]["messages"][1]["content"]
    assert "MY-TURN-1-ANSWER" in u2 and "MY-TURN-2-ANSWER" in u2 and s.meta["questions"][1] in u2
    assert "sk-test-123" not in json.dumps(out)          # the key is never stored in results


def test_no_key_no_auth_header(judge, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    client = JudgeClient(judge.url + "/", "m", KEY_ENV, retries=0)
    assert client.complete([{"role": "user", "content": "hi"}]) == "Fine. Rating: [[7]]"
    assert "Authorization" not in judge.requests[-1]["headers"]
    full = JudgeClient(judge.url + "/chat/completions", "m", None, retries=0)
    assert full.endpoint == judge.url + "/chat/completions"


def test_retry_then_success_and_failures_do_not_stop_the_run(judge):
    t = _task(judge, retries=2)
    s = Sample("81", ["q1", "q2"], {"category": "writing", "ref_answers": None}, {"questions": ["q1", "q2"]})
    judge.replies = [(500, "oops"), (200, "[[4]]"), (200, "no rating at all")]
    out = t.score(s, ["a1", "a2"])
    assert out["judge_score_turn1"] == 4.0 and len(judge.requests) == 3
    assert out["judge_score_turn2"] is None and "rating" in out["judge_error_turn2"]
    t0 = _task(judge, retries=0)
    judge.replies = [(400, "bad request"), (200, "[[5]]")]
    out2 = t0.score(s, ["a1", "a2"])
    assert out2["judge_score_turn1"] is None and "HTTP 400" in out2["judge_error_turn1"]
    assert out2["judge_score_turn2"] == 5.0


def test_unreachable_judge_gives_none():
    t = get_task("mt_bench", judge=True, judge_url="http://127.0.0.1:9/v1", judge_retries=0, judge_timeout_s=2)
    s = Sample("81", ["q1", "q2"], {"category": "writing", "ref_answers": None}, {"questions": ["q1", "q2"]})
    out = t.score(s, ["a1", "a2"])
    assert out["judge_score_turn1"] is None and out["judge_error_turn1"]


def test_aggregate():
    t = get_task("mt_bench", judge=True, judge_url="http://unused")
    scored = [{"category": "math", "judge_model": "j", "judge_score_turn1": 8.0, "judge_score_turn2": 6.0},
              {"category": "writing", "judge_model": "j", "judge_score_turn1": 10.0, "judge_score_turn2": None},
              {"category": "writing", "judge_model": "j", "judge_score_turn1": 4.0, "judge_score_turn2": 2.0}]
    out = t.aggregate([None] * 3, scored, [["a", "b"]] * 3)
    assert out["judge_score_turn1"] == pytest.approx(22 / 3) and out["judge_score_turn2"] == pytest.approx(4.0)
    assert out["judge_score"] == pytest.approx(30 / 5)
    assert out["judge_score_math"] == 7.0 and out["judge_score_writing"] == pytest.approx(16 / 3)
    assert out["n_judged"] == 5 and out["n_judge_failed"] == 1 and out["judge_model"] == "j"
    numeric = {k for k, v in out.items() if k.startswith("judge_score")}
    assert numeric <= set(t.metric_directions)


def test_references_attached_only_where_fastchat_uses_them():
    samples = get_task("mt_bench").load(_data_dir())
    with_ref = {s.meta["category"] for s in samples if s.reference["ref_answers"]}
    assert with_ref == {"math", "reasoning", "coding"}
    assert sum(1 for s in samples if s.reference["ref_answers"]) == 30
