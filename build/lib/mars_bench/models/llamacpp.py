"""llama.cpp as a measured anchor (optional extra ``llama-cpp-python``): greedy decoding of the embedded
GGUF files themselves, autoregressive or speculative with the draft GGUF.

Not a mars-bench model path: llama.cpp computes with the quantized Q4_K_M blocks (our models are the
same weights dequantized), and its 1-token and batched evaluations of a position differ slightly (not
batch-invariant), so its speculative output may differ from its own autoregressive one. The draft is
a second ``Llama`` wrapped as the binding's ``LlamaDraftModel`` (the binding's hook for speculative
decoding): it keeps its own KV cache, rolls it back to the longest common prefix of what it was shown,
and proposes ``k`` greedy tokens; the binding's ``generate`` verifies them in one target evaluation.
"""
from __future__ import annotations

import time

import numpy as np


def unavailable() -> str | None:
    """None when the binding imports, else why (one line)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama-cpp-python not installed ({e.name}); pip install 'mars-bench[llamacpp]'"
    return None


def _load(path: str, threads: int, n_ctx: int, logits_all: bool = False, draft=None):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                 logits_all=logits_all, draft_model=draft, verbose=False, seed=0)


def _greedy_draft_class():
    from llama_cpp.llama_speculative import LlamaDraftModel

    class GreedyDraft(LlamaDraftModel):
        """Proposes ``k`` greedy tokens of a draft GGUF after the ids it is shown."""

        def __init__(self, llm, k: int, eos_ids=()):
            self.llm, self.k, self.eos = llm, k, set(eos_ids)
            self.calls = 0

        def __call__(self, input_ids, /, **kwargs):
            self.calls += 1
            ids = [int(t) for t in input_ids]
            cached = self.llm.input_ids[: self.llm.n_tokens].tolist()
            n = 0
            while n < min(len(cached), len(ids) - 1) and cached[n] == ids[n]:
                n += 1
            self.llm.n_tokens = n          # eval() drops cached positions >= n_tokens first
            self.llm.eval(ids[n:])
            out = []
            for i in range(self.k):
                t = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
                out.append(t)
                if t in self.eos:
                    break
                if i < self.k - 1:
                    self.llm.eval([t])
            return np.array(out, dtype=np.intc)

    return GreedyDraft


class LlamaCppRunner:
    """Greedy generation with llama.cpp: ``run(ids, max_new_tokens, eos_ids)`` -> tokens, wall s, steps."""

    def __init__(self, target_gguf: str, draft_gguf: str | None = None, k: int = 4, threads: int = 2,
                 n_ctx: int = 2048, eos_ids=()):
        self.draft = None
        if draft_gguf is not None:
            self.draft = _greedy_draft_class()(_load(draft_gguf, threads, n_ctx, logits_all=True), k, eos_ids)
        self.llm = _load(target_gguf, threads, n_ctx, draft=self.draft)

    def run(self, ids, max_new_tokens: int, eos_ids, speculative: bool | None = None) -> dict:
        """``speculative``: None = with the draft when there is one; False = autoregressive (one loaded
        target serves both)."""
        eos = set(eos_ids)
        spec = self.draft is not None and speculative is not False
        if speculative and self.draft is None:
            raise ValueError("speculative=True needs a draft_gguf")
        self.llm.draft_model = self.draft if spec else None   # the binding reads it on every generate()
        if spec:
            self.draft.calls = 0
        out = []
        t0 = time.perf_counter()
        for tok in self.llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                     reset=True):
            out.append(int(tok))
            if tok in eos or len(out) >= max_new_tokens:
                break
        wall = time.perf_counter() - t0
        steps = self.draft.calls if spec else None
        return {"tokens": out, "wall_s": wall, "steps": steps, "forward_s": None}

    def forward_ms(self, ctx: int = 200, ns=(1, 5, 8, 12), reps: int = 3, seed: int = 0) -> dict:
        """ms of one target evaluation of n new tokens after a ctx-token prefix (best of ``reps``)."""
        rng, vocab = np.random.default_rng(seed), self.llm.n_vocab()
        prefix = rng.integers(0, vocab, ctx).tolist()
        self.llm.reset()
        self.llm.eval(prefix)
        out = {}
        for n in ns:
            best = float("inf")
            for _ in range(reps):
                self.llm.n_tokens = ctx
                batch = rng.integers(0, vocab, n).tolist()
                t0 = time.perf_counter()
                self.llm.eval(batch)
                best = min(best, time.perf_counter() - t0)
            out[n] = best * 1000
        return out
