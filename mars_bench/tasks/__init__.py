"""The benchmarks of the paper (GSM8K, HumanEval, MT-Bench, WMT19 zh-en; Alpaca, CNN/DM and QA from the authors'
files) plus a tiny built-in prompt set; our scoring, with the authors' beside it where they differ.

    from mars_bench.tasks import get_task, TASKS, build_messages
    task = get_task("gsm8k", max_new_tokens=512)
    samples = task.load(data_dir, limit=None, subset="paper")
"""
from __future__ import annotations

import importlib
import pkgutil

from mars_bench.tasks.base import MetricSpec, Sample, Task
from mars_bench.tasks.data import DataError
from mars_bench.tasks.sandbox import sandbox_status


def _discover() -> dict[str, type[Task]]:
    """Every named ``Task`` subclass defined in a module of this package, by name. Adding a task is its module
    here, its ``specs/<name>/task.yaml`` and its ``conf/task/<name>.yaml``: no list to extend."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    found: dict[str, type[Task]] = {}
    todo = [Task]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.name and cls.__module__.startswith(f"{__name__}."):
            if found.get(cls.name, cls) is not cls:
                raise TypeError(f"task name {cls.name!r} defined twice: {found[cls.name].__module__}, {cls.__module__}")
            found[cls.name] = cls
    return dict(sorted(found.items()))


TASKS: dict[str, type[Task]] = _discover()

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
