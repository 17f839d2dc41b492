"""HumanEval: code extraction, program assembly, pass@k, and the canonical solutions through the sandbox."""
import itertools
import math
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mars_bench.tasks import Sample, get_task
from mars_bench.tasks.humaneval import build_program, extract_code, pass_at_k, repair_body

from .conftest import data_dir as _data_dir

ROOT = Path(__file__).resolve().parent.parent




# ---- pass@k ----------------------------------------------------------------------------------------------
def _brute_pass_at_k(n, c, k):
    """Probability that a random k-subset of n answers (c correct) holds at least one correct answer."""
    answers = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(answers[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_known_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 5, 1) == 1.0 and pass_at_k(5, 5, 5) == 1.0
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 6)


def test_pass_at_k_brute_force():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_numerically_stable_for_large_n():
    v = pass_at_k(2000, 7, 1000)
    exact = 1 - math.comb(1993, 1000) / math.comb(2000, 1000)
    assert v == pytest.approx(exact, rel=1e-9)


# ---- extraction and assembly -----------------------------------------------------------------------------
def test_extract_code_fences():
    assert extract_code("```python\nx = 1\n```") == ("x = 1\n", "fenced")
    assert extract_code("Sure:\n```\nreturn 2\n```\nThat's it.") == ("return 2\n", "fenced")
    assert extract_code("```py\nreturn 3\n") == ("return 3\n", "fenced")            # unclosed fence
    assert extract_code("    return a + b\n") == ("    return a + b\n", "raw")
    text = "Example:\n```text\n>>> f(1)\n```\nCode:\n```python\nimport os\n```\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(text, "f") == ("def f(x):\n    return x\n", "fenced")     # the block defining f
    assert extract_code(text) == ("import os\n", "fenced")                        # else the first Python block
    assert extract_code("```python\n    for x in y:\n        pass\n```")[0] == "    for x in y:\n        pass\n"


def test_repair_body_indentation():
    assert repair_body("    return 1\n") == "    return 1\n"
    assert repair_body("return 1") == "    return 1\n"
    # only the first line lost its indentation (a common artefact of stripping the answer)
    assert repair_body("total = 0\n    for x in xs:\n        total += x\n    return total") == \
        "    total = 0\n    for x in xs:\n        total += x\n    return total\n"
    # a body written at column 0
    assert repair_body("if a:\n    return 1\nreturn 2") == "    if a:\n        return 1\n    return 2\n"
    # first line opens a block and the next is at the body indentation: the whole body was at column 0 + 4
    assert repair_body("for x in y:\n    pass") == "    for x in y:\n        pass\n"
    assert repair_body("\n\n  return 5\n") == "    return 5\n"
    assert repair_body("") == ""
    assert repair_body("  return 1", indent="  ") == "  return 1\n"


PROMPT = ('from typing import List\n\n\ndef helper(x):\n    return x * 2\n\n\n'
          'def f(xs: List[int]) -> int:\n    """Sum of doubled."""\n')
TEST = "def check(candidate):\n    assert candidate([1, 2]) == 6\n"


def _run(completion: str) -> dict:
    task = get_task("humaneval", timeout_s=10)
    s = Sample(id="t/0", turns=["x"], reference={"prompt": PROMPT, "test": TEST, "entry_point": "f",
                                                "canonical_solution": ""})
    return task.score(s, [completion])


def test_build_program_modes():
    prog, mode = build_program(PROMPT, "    return sum(helper(x) for x in xs)\n", "f", TEST)
    assert mode == "body" and prog.startswith(PROMPT) and prog.rstrip().endswith("check(f)")
    whole = "def f(xs):\n    return sum(helper(x) for x in xs)\n"
    prog, mode = build_program(PROMPT, whole, "f", TEST)
    assert mode == "function" and "def helper" in prog and "from typing import List" in prog
    assert prog.count("def f(") == 1


@pytest.mark.parametrize("completion,assembly,source", [
    ("    return sum(helper(x) for x in xs)\n", "body", "raw"),
    ("return sum(helper(x) for x in xs)", "body", "raw"),
    ("```python\ndef f(xs: List[int]) -> int:\n    return sum(helper(x) for x in xs)\n```", "function", "fenced"),
    ("Here you go:\n```python\nfrom typing import List\n\ndef f(xs: List[int]) -> int:\n    t = 0\n"
     "    for x in xs:\n        t += helper(x)\n    return t\n```\nThis doubles and sums.", "function", "fenced"),
    ("```\n    return sum(2 * x for x in xs)\n```", "body", "fenced"),
    ("```python\n    def f(xs):\n        return 2 * sum(xs)\n```", "function", "fenced"),       # indented whole def
])
def test_completion_forms_pass(completion, assembly, source):
    r = _run(completion)
    assert (r["passed"], r["assembly"], r["code_source"]) == (1, assembly, source), r


def test_wrong_and_broken_completions_fail():
    assert _run("    return 0\n")["passed"] == 0
    assert _run("    return (\n")["passed"] == 0          # syntax error
    r = _run("")
    assert r["passed"] == 0 and r["status"] == "failed"


def test_aggregate_pass_at_k_groups_by_problem():
    t = get_task("humaneval")
    a, b = Sample("A", ["x"], {}), Sample("B", ["x"], {})
    samples = [a] * 10 + [b] * 10
    scored = [{"passed": int(i < 3)} for i in range(10)] + [{"passed": 1}] * 10
    out = t.aggregate(samples, scored, [["x"]] * 20)
    assert out["pass@1"] == pytest.approx((0.3 + 1.0) / 2)
    assert out["pass@10"] == pytest.approx((1.0 + 1.0) / 2)
    assert "pass@100" not in out and out["n_problems"] == 2 and out["samples_per_problem"] == 10
    greedy = t.aggregate([a, b], [{"passed": 1}, {"passed": 0}], [["x"], ["y"]])
    assert greedy["pass@1"] == 0.5 and "pass@10" not in greedy


def test_canonical_solutions_pass_and_empty_completions_fail():
    """All 164 canonical solutions pass (pass@1 = 1); an empty completion passes none (pass@1 = 0)."""
    task = get_task("humaneval")
    samples = task.load(_data_dir())
    assert len(samples) == 164
    jobs = [(s, s.reference["canonical_solution"]) for s in samples] + [(s, "") for s in samples]
    with ThreadPoolExecutor(max_workers=2) as pool:
        scored = list(pool.map(lambda j: task.score(j[0], [j[1]]), jobs))
    good, empty = scored[:164], scored[164:]
    failures = [(s.id, r["status"], r["error"]) for s, r in zip(samples, good) if not r["passed"]]
    assert failures == []
    assert task.aggregate(samples, good, [[c] for _, c in jobs[:164]])["pass@1"] == 1.0
    assert task.aggregate(samples, empty, [[""]] * 164)["pass@1"] == 0.0


def test_whole_function_answers_of_canonical_solutions(tmp_path):
    """The same solutions written as a fenced whole function (prompt + body) or a dedented bare block pass."""
    task = get_task("humaneval")
    samples = task.load(_data_dir(), limit=12)
    forms = [f"```python\n{s.reference['prompt']}{s.reference['canonical_solution']}```" for s in samples] + \
            [f"```\n{textwrap.dedent(s.reference['canonical_solution'])}```" for s in samples]
    with ThreadPoolExecutor(max_workers=2) as pool:
        scored = list(pool.map(lambda a: task.score(a[0], [a[1]]), zip(samples + samples, forms)))
    assert [r["passed"] for r in scored] == [1] * 24
