"""The benchmarks of the paper (GSM8K, HumanEval, MT-Bench, WMT19 zh-en; Alpaca, CNN/DM and QA from the authors'
files) plus a tiny built-in prompt set; our scoring, with the authors' beside it where they differ.

    from mars_bench.tasks import get_task, TASKS, build_messages
    task = get_task("gsm8k", max_new_tokens=512)
    samples = task.load(data_dir, limit=None, subset="paper")
"""
from __future__ import annotations

from .alpaca import Alpaca
from .base import MetricSpec, Sample, Task
from .cnn_dm import CnnDm
from .data import DataError
from .gsm8k import GSM8K
from .humaneval import HumanEval
from .mt_bench import MTBench
from .prompts import Prompts
from .qa import QA
from .sandbox import sandbox_status
from .wmt19 import WMT19ZhEn

TASKS: dict[str, type[Task]] = {c.name: c for c in (GSM8K, HumanEval, MTBench, WMT19ZhEn, Alpaca, CnnDm, QA,
                                                    Prompts)}

__all__ = ["TASKS", "DataError", "MetricSpec", "Sample", "Task", "build_messages", "get_task", "sandbox_status"]


def get_task(name: str, **cfg_overrides) -> Task:
    """A task by name; ``cfg_overrides`` replace task.yaml defaults (max_new_tokens, stop_strings,
    system_prompt, or a task option). Unknown names and options raise a one-line ValueError."""
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; known: {', '.join(sorted(TASKS))}")
    return TASKS[name](**cfg_overrides)


def build_messages(task: Task, sample: Sample, previous_answers: list[str], turn_index: int) -> list[dict]:
    """Chat messages for turn ``turn_index`` (0-based): [system?] + user turns alternating with the model's own
    earlier answers, ending with the current user turn."""
    if not 0 <= turn_index < len(sample.turns):
        raise ValueError(f"sample {sample.id}: turn_index {turn_index} out of range (it has "
                         f"{len(sample.turns)} turns)")
    if len(previous_answers) < turn_index:
        raise ValueError(f"sample {sample.id}: turn {turn_index} needs {turn_index} earlier answers, "
                         f"got {len(previous_answers)}")
    msgs = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
    for i in range(turn_index):
        msgs += [{"role": "user", "content": sample.turns[i]}, {"role": "assistant", "content": previous_answers[i]}]
    msgs.append({"role": "user", "content": sample.turns[turn_index]})
    return msgs
