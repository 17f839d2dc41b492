"""Registry, configuration, loading (subsets, limits, sha256) and chat-message building of mars_bench.tasks."""
import re
from pathlib import Path

import pytest

from mars_bench.tasks import TASKS, Sample, build_messages, get_task

from .conftest import data_dir as _data_dir

ROOT = Path(__file__).resolve().parent.parent




def test_registry_names():
    assert set(TASKS) == {"gsm8k", "humaneval", "mt_bench", "wmt19_zh_en", "alpaca", "cnn_dm", "qa", "prompts"}


def test_a_task_is_its_module_spec_and_config_group_entry():
    """The registry is found, not listed: every task has a spec and a Hydra task config, and nothing else names it
    (adding a task touches its module, specs/<name>/task.yaml and conf/task/<name>.yaml)."""
    specs = {p.parent.name for p in (ROOT / "mars_bench" / "tasks" / "specs").glob("*/task.yaml")}
    confs = {p.stem for p in (ROOT / "mars_bench" / "conf" / "task").glob("*.yaml")}
    assert set(TASKS) == specs == confs
    shared = "\n".join((ROOT / "mars_bench" / "tasks" / f).read_text() for f in ("__init__.py", "data.py"))
    assert not [c.__name__ for c in TASKS.values() if re.search(rf"import .*\b{c.__name__}\b", shared)]   # no list


def test_a_spec_names_its_public_copies(tmp_path):
    from mars_bench.tasks import data as D

    spec = tmp_path / "toy" / "task.yaml"
    spec.parent.mkdir()
    spec.write_text("name: toy\ndata:\n  files: [toy/a.jsonl, toy/b.jsonl]\n  rows: {toy/a.jsonl: 3, toy/b.jsonl: 4}\n"
                    "  sha256: {toy/a.jsonl: aa, toy/b.jsonl: bb}\n  public: {toy/b.jsonl: 'https://example.invalid/b'}\n")
    assert D.task_sources(tmp_path) == {"toy/b.jsonl": D.PublicFile("https://example.invalid/b", "bb", 4)}
    assert D.PUBLIC["gsm8k/test.jsonl"].url.endswith("/grade_school_math/data/test.jsonl")   # from its spec


def test_unknown_task_is_one_line_listing_known_names():
    with pytest.raises(ValueError) as e:
        get_task("gsm9k")
    msg = str(e.value)
    assert "\n" not in msg and "gsm9k" in msg
    for name in TASKS:
        assert name in msg


@pytest.mark.parametrize("name,max_new", [("gsm8k", 512), ("humaneval", 512), ("mt_bench", 512),
                                          ("wmt19_zh_en", 256), ("alpaca", 512), ("cnn_dm", 512), ("qa", 512),
                                          ("prompts", 64)])
def test_yaml_defaults(name, max_new):
    t = get_task(name)
    assert t.name == name and isinstance(t.version, int) and t.version >= 1
    assert t.max_new_tokens == max_new
    assert t.system_prompt is None
    assert isinstance(t.stop_strings, list)
    assert all(v in ("higher", "lower") for v in t.metric_directions.values())


def test_metric_directions_declared():
    assert get_task("gsm8k").metric_directions == {"accuracy_strict": "higher", "accuracy_flexible": "higher",
                                                   "accuracy_authors": "higher", "strict_format_rate": "higher"}
    assert get_task("humaneval").metric_directions["pass@1"] == "higher"
    assert get_task("wmt19_zh_en").metric_directions == {"bleu": "higher", "chrf": "higher", "bleu_raw": "higher",
                                                         "chrf_raw": "higher"}
    assert get_task("mt_bench").metric_directions["judge_score"] == "higher"
    assert get_task("prompts").metric_directions == {}


def test_overrides():
    t = get_task("gsm8k", max_new_tokens=64, system_prompt="You are careful.", stop_strings=["\n\n\n"])
    assert (t.max_new_tokens, t.system_prompt, t.stop_strings) == (64, "You are careful.", ["\n\n\n"])
    assert get_task("gsm8k", max_new_tokens=None).max_new_tokens == 512
    assert get_task("humaneval", timeout_s=3).options["timeout_s"] == 3
    with pytest.raises(ValueError, match="unknown option 'temprature'"):
        get_task("gsm8k", temprature=0.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        get_task("gsm8k", max_new_tokens=0)
    with pytest.raises(ValueError, match="system_prompt"):
        get_task("gsm8k", system_prompt=3)


def test_prompts_task_is_builtin():
    t = get_task("prompts")
    s = t.load(None)
    assert len(s) == 24 and len({x.id for x in s}) == 24
    assert all(len(x.turns) == 1 and x.turns[0] for x in s)
    assert t.score(s[0], ["anything"]) == {}
    assert t.aggregate(s, [{}] * len(s), [["x"]] * len(s)) == {}
    assert t.load(None, limit=5) == s[:5]
    assert set(t.data_sha256(None)) == {"prompts.jsonl"}


def test_build_messages_single_and_two_turns():
    t = get_task("mt_bench")
    s = Sample(id="x", turns=["first question", "second question"], reference=None)
    assert build_messages(t, s, [], 0) == [{"role": "user", "content": "first question"}]
    m = build_messages(t, s, ["my first answer"], 1)
    assert m == [{"role": "user", "content": "first question"},
                 {"role": "assistant", "content": "my first answer"},
                 {"role": "user", "content": "second question"}]
    ts = get_task("mt_bench", system_prompt="Be brief.")
    assert build_messages(ts, s, ["a"], 1)[0] == {"role": "system", "content": "Be brief."}
    with pytest.raises(ValueError):
        build_messages(t, s, [], 1)          # turn 2 needs the turn-1 answer
    with pytest.raises(ValueError):
        build_messages(t, s, ["a", "b"], 2)  # no third turn


def test_mt_bench_turn2_history_from_real_data():
    t = get_task("mt_bench")
    s = t.load(_data_dir(), limit=1)[0]
    assert len(s.turns) == 2
    m = build_messages(t, s, ["ANSWER-1"], 1)
    assert [x["role"] for x in m] == ["user", "assistant", "user"]
    assert m[0]["content"] == s.turns[0] and m[1]["content"] == "ANSWER-1" and m[2]["content"] == s.turns[1]


@pytest.mark.parametrize("name,n,subset,n_subset", [("gsm8k", 1319, "paper", 121), ("humaneval", 164, None, 164),
                                                     ("mt_bench", 80, "math", 10), ("wmt19_zh_en", 2000, "paper", 100)])
def test_load_counts_subsets_limits(name, n, subset, n_subset):
    d = _data_dir()
    t = get_task(name)
    full = t.load(d)
    assert len(full) == n and len({s.id for s in full}) == n
    sub = t.load(d, subset=subset)
    assert len(sub) == n_subset
    assert [s.id for s in t.load(d, limit=7, subset=subset)] == [s.id for s in sub[:7]]
    assert [s.id for s in t.load(d, limit=3)] == [s.id for s in full[:3]]   # deterministic first N
    assert t.load(d, limit=0) == []
    with pytest.raises(ValueError, match="unknown subset"):
        t.load(d, subset="nope")
    with pytest.raises(ValueError, match="limit"):
        t.load(d, limit=-1)


def test_prompt_templates_applied():
    d = _data_dir()
    g = get_task("gsm8k").load(d, limit=1)[0]
    assert g.turns[0].startswith("Solve the following math problem step by step. At the end, output your final "
                                 "numeric answer in this format: #### <final_answer>.\n\nJanet")
    assert g.reference == "18"
    h = get_task("humaneval").load(d, limit=1)[0]
    assert h.id == "HumanEval/0" and h.turns[0].startswith("Complete the code I provided.\n\nfrom typing import")
    w = get_task("wmt19_zh_en").load(d, limit=1)[0]
    assert w.turns[0] == ("Translate the following Chinese text to English.\n\n"
                          "张光军被任命为广东省副省长。")
    assert w.reference.startswith("Zhang Guangjun was appointed")


def test_data_sha256_matches_manifest():
    d = _data_dir()
    assert get_task("gsm8k").data_sha256(d) == {
        "gsm8k/test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"}
    assert get_task("humaneval").data_sha256(d)["humaneval/HumanEval.jsonl.gz"] == \
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
    mt = get_task("mt_bench").data_sha256(d)
    assert mt["mt_bench/reference_answer/gpt-4.jsonl"].startswith("f957a5bc")
    w = get_task("wmt19_zh_en").data_sha256(d)
    assert w["wmt19_zh_en/src.zh"].startswith("394db823") and w["wmt19_zh_en/ref.en"].startswith("8c8ffef4")


def test_data_sha256_absent_file(tmp_path):
    out = get_task("gsm8k").data_sha256(tmp_path)
    assert out["gsm8k/test.jsonl"].startswith("absent")


def test_env_data_dir(monkeypatch):
    d = _data_dir()
    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(d))
    assert len(get_task("humaneval").load(None, limit=2)) == 2
