"""llama.cpp through the binding (models/llamacpp.py; marker ``llamacpp``: bash .ci/llamacpp.sh): greedy AR and
speculative decoding of a tiny GGUF, its step counts and the bench's forward costs."""
import pytest

from mars_bench.models import llamacpp

from .test_embedded import write_tiny_gguf

pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("llamacpp")
    return write_tiny_gguf(d / "target.gguf", tied=False, seed=0), write_tiny_gguf(d / "draft.gguf", tied=False, seed=1)


def test_ar_and_speculative_with_the_target_as_draft_agree(gguf_pair):
    target, _ = gguf_pair
    ar = llamacpp.LlamaCppRunner(str(target), threads=1, n_ctx=64)
    spec = llamacpp.LlamaCppRunner(str(target), draft_gguf=str(target), k=4, threads=1, n_ctx=64)
    prompt = [5, 6, 7, 8]
    a = ar.run(prompt, 20, eos_ids=())
    b = spec.run(prompt, 20, eos_ids=())
    assert len(a["tokens"]) == 20 and a["steps"] == 20 and a["proposed"] == [] and a["wall_s"] > a["prefill_s"] > 0
    assert b["tokens"] == a["tokens"]                       # F32 tiny model: same greedy tokens
    assert 0 < b["steps"] < len(b["tokens"])                # a draft equal to the target is accepted
    assert b["steps"] == len(b["proposed"]) and b["accepted"][1:] == b["proposed"][1:-1] + b["accepted"][-1:]
    stop = a["tokens"][3]
    first = a["tokens"].index(stop)
    assert ar.run(prompt, 20, eos_ids={stop})["tokens"] == a["tokens"][:first + 1]   # stops at eos
    plain = spec.run(prompt, 20, eos_ids=(), speculative=False)
    assert plain["tokens"] == a["tokens"] and plain["steps"] == 20 and plain["draft_s"] == 0
    with pytest.raises(ValueError, match="needs a draft_gguf"):
        ar.run(prompt, 5, eos_ids=(), speculative=True)


def test_a_different_draft_still_gives_tokens_of_the_right_length(gguf_pair):
    target, draft = gguf_pair
    spec = llamacpp.LlamaCppRunner(str(target), draft_gguf=str(draft), k=3, threads=1, n_ctx=64)
    out = spec.run([9, 10, 11], 12, eos_ids=())
    assert len(out["tokens"]) == 12 and out["steps"] >= 1
    costs = spec.forward_ms(ctx=8, ns=(1, 4), reps=1)
    assert set(costs) == {1, 4} and all(v > 0 for v in costs.values())
