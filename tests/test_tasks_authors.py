"""The MARS authors' scoring beside ours (GSM8K cascade, HumanEval extraction), their prompts (``prompts: authors``),
FastChat's judge prompts, and metric registration. Expected values are hand-made from the authors' code
(5SSjw/MARS @ 8909b41: mars/eval/gsm8k/eval_gsm8k.py, mars/eval/humaneval/eval_humaneval.py)."""
import json
import shutil

import pytest

from mars_bench.tasks import DataError, Sample, TASKS, get_task
from mars_bench.tasks import data as D
from mars_bench.tasks.gsm8k import authors_correct, authors_reference, authors_value, extract_authors
from mars_bench.tasks.humaneval import build_program_authors, extract_code_authors
from mars_bench.tasks.judge import build_judge_messages, load_judge_prompts

from .conftest import data_dir as _data_dir


# ---- GSM8K: the authors' extraction cascade, values and comparison ------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("so <final_answer> 7 </final_answer> and later 9", "7"),     # first number after the last tag
    ("<final_answer>a</final_answer> x 5 <final_answer>", "5"),    # none after it: the last number before it
    ("<FINAL_ANSWER> $ 1,000", "1000"),                              # tag case-insensitive, '$' and commas dropped
    ("first #### 7\nthen #### 9", "7"),                             # no tag: the FIRST '####'
    ("#### 18 dollars", "18 dollars"),                               # the whole rest of the line
    ("#### 1/2", "1/2"),
    ("The total is 1,234,567.89 and so", "1234567.89"),             # else the last number
    ("so 1/2 of them", "2"),                                         # a fraction is never found by the search
    ("10,00 apples", "00"),
    ("no digits here", None), ("", None),
])
def test_extract_authors(text, expected):
    assert extract_authors(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("18", 18.0), ("1,234.5", 1234.5), ("1/2", 0.5), ("12%", 0.12), ("-7/8", -0.875), ("3/0", None),
    ("18 dollars", None), ("", None), (None, None),
])
def test_authors_value(text, expected):
    assert authors_value(text) == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("gold,pred,ok", [
    ("18", "18.0000001", True), ("18", "18.00001", False),          # absolute tolerance 1e-6
    ("0.5", "1/2", True), ("0.12", "12%", True), ("18", "18 dollars", False),
    ("abc", " abc ", True),                                          # no number: stripped strings compared
    ("18", None, False),
])
def test_authors_correct(gold, pred, ok):
    assert authors_correct(gold, pred) is ok


def test_authors_reference_matches_their_file():
    """Their gold is the solution's last line through their extraction: equal to the 121 rows they ship."""
    ours = get_task("gsm8k").load(_data_dir(), subset="paper")
    theirs = [json.loads(x) for x in (_data_dir() / "mars_release/gsm8k/question.jsonl").read_text().splitlines()]
    for s, row in zip(ours, sorted(theirs, key=lambda r: r["question_id"])):
        line = row["reference"][-1].strip()
        assert s.meta["reference_authors"] == (extract_authors(line) or line)
    assert authors_reference("Some work\n#### 1,000") == "1000"


def test_gsm8k_scores_side_by_side():
    t = get_task("gsm8k")
    s = Sample("g/0", ["q"], "18", {"reference_authors": "18"})
    r = t.score(s, ["Step... 18 total.\n#### 18 dollars"])
    assert (r["correct_strict"], r["correct_authors"], r["pred_authors"]) == (1, 0, "18 dollars")
    r = t.score(s, ["<final_answer>18</final_answer>"])
    assert (r["correct_strict"], r["correct_flexible"], r["correct_authors"]) == (0, 1, 1)


# ---- HumanEval: the authors' extraction, program, timeout and denominator --------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("```python\ndef f():\n  return 1\n```\nUse:\n```python\nprint(f())\n```", "def f():\n  return 1"),
    ("```python\nx = 1\n```\n```python\ny = 2\n```", "y = 2"),            # no 'def ': the last block
    ("```PYTHON\ndef f(): pass\n```", "def f(): pass"),
    ("```py\nx=1\n```", "x=1"),
    ("```\ndef g(): pass\n```", "def g(): pass"),
    ("```js\nconsole.log(1)\n```", "js\nconsole.log(1)"),                   # the language word stays
    ("Here:\n```python\ndef f():", "Here:"),                               # unclosed fence: the text before it
    ("   return 1  \n", "return 1"),
    ("```\n```", ""),
])
def test_extract_code_authors(text, expected):
    assert extract_code_authors(text) == expected


def test_build_program_authors():
    assert build_program_authors("P\n", "C", "f", "T") == "P\nC\nT\ncheck(f)"


def test_humaneval_authors_beside_ours():
    t = get_task("humaneval", timeout_s=10, authors_timeout_s=1)
    s = t.load(_data_dir(), limit=1)[0]
    ref = s.reference
    whole = f"```python\n{ref['prompt']}{ref['canonical_solution']}```"
    slow = f"```python\nimport time\ntime.sleep(2)\n{ref['prompt']}{ref['canonical_solution']}```"
    answers = [whole, ref["canonical_solution"], "", slow]
    scored = [t.score(s, [a]) for a in answers]
    assert [r["passed"] for r in scored] == [1, 1, 0, 1]
    assert [r["passed_authors"] for r in scored] == [1, 0, None, 0]   # a bare body sits at column 0 for them
    assert scored[3]["error_authors"] == "timeout"
    agg = t.aggregate([s] * 4, scored, [[a] for a in answers])
    assert agg["pass@1"] == 0.75 and agg["pass@1_authors"] == pytest.approx(1 / 3) and agg["n_authors"] == 3
    info = {"n_problems", "samples_per_problem", "sandbox_backend", "n_authors"}
    assert set(agg) - info <= set(t.metrics)


# ---- prompts: ours | authors ------------------------------------------------------------------------------------
def test_authors_prompts_byte_for_byte():
    d = _data_dir()
    theirs = [json.loads(x) for x in (d / "mars_release/gsm8k/question.jsonl").read_text().splitlines()]
    t = get_task("gsm8k", prompts="authors")
    samples = t.load(d)
    assert len(samples) == 121                                      # only the problems their file covers
    assert [s.turns for s in samples] == [r["turns"] for r in sorted(theirs, key=lambda r: r["question_id"])]
    assert samples[0].turns[0].startswith("Solve the following math problem step by step.  At the end")
    ours = get_task("gsm8k").load(d, limit=1)[0]
    assert ours.turns[0].startswith("Solve the following math problem step by step. At the end")
    assert (samples[0].id, samples[0].reference) == (ours.id, ours.reference)
    assert "mars_release/gsm8k/question.jsonl" in t.data_sha256(d)
    assert t.output_options() == {"prompts": "authors"} and get_task("gsm8k").output_options() == {}


@pytest.mark.parametrize("name,subset,n", [("humaneval", None, 164), ("mt_bench", "math", 10),
                                           ("wmt19_zh_en", "paper", 100)])
def test_authors_prompts_other_tasks(name, subset, n):
    d = _data_dir()
    samples = get_task(name, prompts="authors").load(d, subset=subset)
    assert len(samples) == n
    ours = get_task(name).load(d, subset=subset)
    assert [s.id for s in samples] == [s.id for s in ours]
    for a, o in zip(samples, ours):
        assert all(q in t for q, t in zip(o.meta["questions"], a.turns))


def test_authors_prompts_mismatch_is_one_line(tmp_path):
    d = _data_dir()
    shutil.copytree(d / "gsm8k", tmp_path / "gsm8k")
    rows = (d / "mars_release/gsm8k/question.jsonl").read_text().splitlines()
    row = json.loads(rows[3])
    row["turns"] = ["Solve this: something else entirely"]
    rows[3] = json.dumps(row)
    p = tmp_path / "mars_release/gsm8k/question.jsonl"
    p.parent.mkdir(parents=True)
    p.write_text("\n".join(rows))
    with pytest.raises(DataError) as e:
        get_task("gsm8k", prompts="authors").load(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: question_id 3") and "gsm8k/3" in msg


def test_wmt19_authors_prompts_refuse_newstest2019():
    with pytest.raises(DataError, match="question_id 0"):
        get_task("wmt19_zh_en", prompts="authors").load(_data_dir())


@pytest.mark.parametrize("name", ["gsm8k", "humaneval", "mt_bench", "wmt19_zh_en"])
def test_unknown_prompts_value(name):
    with pytest.raises(ValueError) as e:
        get_task(name, prompts="theirs")
    assert str(e.value) == f"task {name}: prompts='theirs'; allowed: ours, authors"


def test_prompts_option_only_where_declared():
    with pytest.raises(ValueError, match="unknown option 'prompts'"):
        get_task("qa", prompts="authors")


# ---- MT-Bench judge: FastChat's prompts --------------------------------------------------------------------------
def _fastchat():
    lines = (_data_dir() / "mars_release/judge_prompts.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["name"]: r for r in map(json.loads, lines)}


@pytest.mark.parametrize("category,turn,name", [("writing", 1, "single-v1"), ("math", 1, "single-math-v1"),
                                                ("roleplay", 2, "single-v1-multi-turn"),
                                                ("coding", 2, "single-math-v1-multi-turn")])
def test_judge_prompts_equal_fastchat(category, turn, name):
    fc = _fastchat()[name]
    fields = {"question": "Q1", "answer": "A1"} if turn == 1 else {
        "question_1": "Q1", "question_2": "Q2", "answer_1": "A1", "answer_2": "A2"}
    refs = ["R1", "R2"] if category in ("math", "reasoning", "coding") else None
    if refs:
        fields.update({"ref_answer_1": "R1"} if turn == 1 else {"ref_answer_1": "R1", "ref_answer_2": "R2"})
    got, messages = build_judge_messages(["Q1", "Q2"], ["A1", "A2"], turn, category, refs)
    assert got == name
    assert messages == [{"role": "system", "content": fc["system_prompt"]},
                        {"role": "user", "content": fc["prompt_template"].format(**fields)}]


def test_judge_prompts_keep_fastchats_wording():
    prompts = load_judge_prompts(_data_dir())
    assert "You evaluation should focus on the assistant's answer to the second user question." in \
        prompts["single-v1-multi-turn"]["system"]
    assert prompts["single-math-v1-multi-turn"]["system"].startswith(
        "Please act as an impartial judge and evaluate the quality of the response provided by an AI assistant to "
        "the user question. Your evaluation")


def test_judge_prompts_file_missing_a_prompt(tmp_path):
    p = tmp_path / "mars_release/judge_prompts.jsonl"
    p.parent.mkdir(parents=True)
    p.write_text("\n".join(x for x in (_data_dir() / "mars_release/judge_prompts.jsonl").read_text().splitlines()
                           if '"single-v1-multi-turn"' not in x) + "\n")
    shutil.copytree(_data_dir() / "mt_bench", tmp_path / "mt_bench")
    with pytest.raises(DataError) as e:
        get_task("mt_bench", judge=True, judge_url="http://unused").load(tmp_path)   # before any generation
    assert str(e.value).startswith(f"{p}: ") and "missing ['single-v1-multi-turn']" in str(e.value)
    assert get_task("mt_bench").load(tmp_path, limit=1)                 # judge off: the prompts are not read


def test_mt_bench_per_sample_judge_score():
    t = get_task("mt_bench", judge=True, judge_url="http://unused")
    t.client = lambda: _Stub()
    s = Sample("81", ["q1", "q2"], {"category": "writing", "ref_answers": None}, {"questions": ["q1", "q2"]})
    out = t.score(s, ["a1", "a2"])
    assert (out["judge_score_turn1"], out["judge_score_turn2"], out["judge_score"]) == (8.0, None, 8.0)


class _Stub:
    model = "stub"

    def grade(self, questions, answers, turn, category, ref_answers=None, prompts=None):
        return {"score": 8.0 if turn == 1 else None, "judgment": "", "prompt": "p", "error": None}


# ---- metric registration -----------------------------------------------------------------------------------------
def test_every_task_registers_metric_specs():
    for name in TASKS:
        t = get_task(name)
        for m in t.metrics.values():
            assert m.test in ("binary", "mean", "corpus_bleu", "corpus_chrf", "none")
            assert (m.per_sample is None) == (m.test == "none")
            assert t.metric_directions[m.name] == ("higher" if m.higher else "lower")


@pytest.mark.parametrize("metrics,needle", [
    ("  accuracy_strict: higher\n", "metric 'accuracy_strict'"),
    ("  a: {higher: 1, test: binary, per_sample: x}\n", "higher=1"),
    ("  a: {higher: true, test: ttest, per_sample: x}\n", "test='ttest'; allowed: binary, mean"),
    ("  a: {higher: true, test: binary}\n", "per_sample=None"),
    ("  a: {higher: true, test: none, per_sample: x}\n", "with test none"),
    ("  a: {higher: true, test: mean, per_sample: x, scale: 2}\n", "unknown key(s) ['scale']"),
])
def test_bad_metric_registration_is_one_line(tmp_path, monkeypatch, metrics, needle):
    specs = tmp_path / "specs"
    shutil.copytree(D.tasks_dir(), specs)
    path = specs / "gsm8k" / "task.yaml"
    text = path.read_text()
    start, end = text.index("metrics:"), text.index("subsets:")
    path.write_text(text[:start] + "metrics:\n" + metrics + text[end:])
    monkeypatch.setenv(D.ENV_TASKS_DIR, str(specs))
    with pytest.raises(ValueError) as e:
        get_task("gsm8k")
    assert "\n" not in str(e.value) and needle in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("name,output", [("gsm8k", "#### 18"), ("wmt19_zh_en", "Translation: x"),
                                         ("alpaca", "an answer"), ("cnn_dm", "a summary")])
def test_per_sample_keys_are_in_the_score(name, output):
    t = get_task(name)
    s = t.load(_data_dir(), limit=1)[0]
    score = t.score(s, [output])
    for m in t.metrics.values():
        if m.per_sample:
            assert m.per_sample in score, (name, m)
