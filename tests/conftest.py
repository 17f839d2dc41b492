import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(1)  # tiny tensors: a second thread only adds wake-up latency
# tiny runs on a shared machine: what a timed sample met is not measured (docs/timing.md), so that no test's speedup
# depends on the load; tests/test_contention.py measures where it tests it
os.environ.setdefault("MARS_BENCH_CONTENTION", "off")


def data_dir() -> Path:
    """The benchmark data (MANIFEST.md in ../shared/data); the tests need it, so its absence fails."""
    d = Path(os.environ.get("MARS_BENCH_DATA_DIR") or ROOT.parent / "shared" / "data")
    if not d.is_dir():
        pytest.fail(f"benchmark data not found at {d}; set MARS_BENCH_DATA_DIR")
    return d


PROMPTS = [
    "Tell me a story.", "What is 2+2?", "Write a function that reverses a list.", "hello",
    "Translate: bonjour", "List three colors.", "Why is the sky blue?", "def fib(n):",
    "Explain recursion in one line.", "Name a prime number.", "Sort these: 3 1 2", "Say yes or no.",
    "What day is it?", "Count to five.", "Spell 'cat' backwards.", "Give me a haiku.",
    "x = [1, 2, 3]\nprint(", "The capital of France is", "Q: 7*6? A:", "Finish: once upon a",
    "Describe a tree.", "import numpy as np\n",
]


EOS = 258      # the tiny tokenizer's <|im_end|>
MAX_NEW = 24   # new tokens per prompt in the losslessness tests


@pytest.fixture(scope="session")
def hf_reference(tiny, prompt_ids):
    """The target's own transformers ``generate(do_sample=False)`` continuation of every prompt."""
    out = []
    for ids in prompt_ids:
        g = tiny[0].model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                   eos_token_id=EOS, pad_token_id=256)
        out.append(g[0, len(ids):].tolist())
    return out


@pytest.fixture(scope="session")
def tiny():
    from mars_bench.models.adapter import CausalLMAdapter
    from mars_bench.models.tiny import tiny_pair

    target, draft, tok = tiny_pair()
    t = CausalLMAdapter(target)
    return t, CausalLMAdapter(draft, out_vocab=t.vocab), tok


@pytest.fixture(scope="session")
def prompt_ids(tiny):
    tok = tiny[2]
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                    return_dict=False) for p in PROMPTS]
