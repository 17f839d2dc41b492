"""Named system prompts: chosen by name (``protocol.system_prompt``), each text stated once, here.

``none`` sends no system message. ``llama2`` is the LLaMA-2 chat default system prompt, which the authors'
LLaMA-3, DeepSeek and Qwen3 MARS scripts put first in every conversation (5SSjw/MARS,
mars/evaluation/gen_ea_answer_*.py; note the two spaces after "safe.").
"""
from __future__ import annotations

SYSTEM_PROMPTS: dict[str, str | None] = {
    "none": None,
    "llama2": (
        "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being "
        "safe.  Your answers should not include any harmful, unethical, racist, sexist, toxic, dangerous, or illegal "
        "content. Please ensure that your responses are socially unbiased and positive in nature.\n\n"
        "If a question does not make any sense, or is not factually coherent, explain why instead of answering "
        "something not correct. If you don't know the answer to a question, please don't share false information."
    ),
}


def system_prompt_text(name: str) -> str | None:
    """The text of a named system prompt (None for ``none``); ValueError naming the allowed names."""
    if name not in SYSTEM_PROMPTS:
        raise ValueError(f"protocol.system_prompt={name!r}; allowed: {', '.join(SYSTEM_PROMPTS)}")
    return SYSTEM_PROMPTS[name]
