"""llama.cpp through its Python binding (optional extra ``llamacpp``): greedy decoding of GGUF files,
autoregressive or speculative with a draft GGUF, each step counted and timed (engine=llamacpp,
``mars_bench/engines/llamacpp/``; the bench's forward costs).

Not this package's decoding: llama.cpp computes with the GGUF's own blocks (the embedded pair's Q4_K_M; our
models are the same weights dequantized), and its 1-token and batched evaluations of a position differ
slightly (not batch-invariant), so its speculative output may differ from its own autoregressive one.

Speculative decoding is the binding's own (``Llama.generate`` with a ``draft_model``): each step the target
evaluates [newest token, d_1..d_m] in one batch, samples every position greedily and keeps the drafts up to the
first mismatch plus the target's token there (llama.cpp's scheme; its speculative example does the same). The
draft is a second ``Llama`` wrapped as the binding's ``LlamaDraftModel`` (``GreedyDraft``): it keeps its own KV
cache, rolls it back to the longest common prefix of what it is shown and proposes up to ``k`` greedy tokens,
stopping early where its top-1 probability is below ``p_min`` (llama.cpp's ``--draft-p-min``; 0: never). The
draft's logits are read for its last position only; the target's for every position (the binding turns
``logits_all`` on when a draft is given, and ``LlamaCppRunner`` always: its prefill then also computes the LM head
for every prompt position, for ar and sd alike, whether or not a draft is loaded).

Steps: the prefill commits the first token (no drafts), then each draft call is one target evaluation: steps =
1 + calls, and a call's accepted count is the length of the common prefix of its drafts and the tokens that
followed (``steps_of``).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def unavailable() -> str | None:
    """None when the binding imports, else why (one line)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama-cpp-python not installed ({e.name}); pip install 'mars-bench[llamacpp]'"
    return None


def version() -> str:
    """The installed binding's version (it pins the llama.cpp sources it vendors)."""
    import llama_cpp

    return str(llama_cpp.__version__)


def _timed_llama_class():
    from llama_cpp import Llama

    class TimedLlama(Llama):
        """A ``Llama`` that times each evaluation (``eval_s``: seconds per ``eval`` call, in order)."""

        eval_s: list

        def eval(self, tokens):
            t0 = time.perf_counter()
            super().eval(tokens)
            self.eval_s.append(time.perf_counter() - t0)

    return TimedLlama


def _load(path: str, threads: int, n_ctx: int, logits_all: bool = False, draft=None):
    llm = _timed_llama_class()(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               n_gpu_layers=0, logits_all=logits_all, draft_model=draft, verbose=False, seed=0)
    llm.eval_s = []
    return llm


def _greedy_draft_class():
    from llama_cpp.llama_speculative import LlamaDraftModel

    class GreedyDraft(LlamaDraftModel):
        """Proposes up to ``k`` greedy tokens of a draft GGUF after the ids it is shown; records each call as
        (position of its first draft, drafts) in ``calls`` and its seconds in ``draft_s``."""

        def __init__(self, llm, k: int, eos_ids=(), p_min: float = 0.0):
            self.llm, self.k, self.eos, self.p_min = llm, k, set(eos_ids), float(p_min)
            self.start()

        def start(self) -> None:
            """A new sequence: forget the cached prefix and the calls."""
            self.llm.n_tokens = 0
            self.calls: list[tuple[int, list[int]]] = []
            self.draft_s = 0.0

        def _next(self) -> tuple[int, float]:
            """The greedy token after the last evaluated position and its probability (1 when p_min is 0)."""
            import llama_cpp

            z = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.llm.n_vocab(),))
            t = int(np.argmax(z))
            if not self.p_min:
                return t, 1.0
            return t, float(1.0 / np.exp(z - z[t]).sum())   # softmax at the argmax: 1 / sum_j exp(z_j - z_max)

        def __call__(self, input_ids, /, **kwargs):
            t0 = time.perf_counter()
            ids = [int(t) for t in input_ids]
            cached = self.llm.input_ids[: self.llm.n_tokens].tolist()
            n = 0
            while n < min(len(cached), len(ids) - 1) and cached[n] == ids[n]:
                n += 1
            self.llm.n_tokens = n          # eval() drops cached positions >= n_tokens first
            self.llm.eval(ids[n:])
            out = []
            for i in range(self.k):
                t, prob = self._next()
                if prob < self.p_min:
                    break
                out.append(t)
                if t in self.eos:
                    break
                if i < self.k - 1:
                    self.llm.eval([t])
            self.calls.append((len(ids), out))
            self.draft_s += time.perf_counter() - t0
            return np.array(out, dtype=np.intc)

    return GreedyDraft


def steps_of(prompt_len: int, tokens: list[int], calls: list) -> tuple[list[int], list[int]]:
    """(proposed, accepted) per target evaluation of a speculative decode: the prefill first (no drafts), then
    one per draft call (position of its first draft in prompt + tokens, drafts); accepted = the common prefix of
    the drafts and the tokens that followed (a last step cut at a stop counts what was kept)."""
    seq = [None] * prompt_len + list(tokens)
    proposed, accepted = [0], [0]
    for start, drafts in calls:
        a = 0
        while a < len(drafts) and start + a < len(seq) and seq[start + a] == drafts[a]:
            a += 1
        proposed.append(len(drafts))
        accepted.append(a)
    return proposed, accepted


class LlamaCppRunner:
    """Greedy generation with llama.cpp: ``run(ids, max_new_tokens, eos_ids)`` -> tokens, timings and steps."""

    def __init__(self, target_gguf: str, draft_gguf: str | None = None, k: int = 4, threads: int = 2,
                 n_ctx: int = 2048, eos_ids=(), p_min: float = 0.0):
        self.n_ctx, self.draft = n_ctx, None
        if draft_gguf is not None:
            self.draft = _greedy_draft_class()(_load(draft_gguf, threads, n_ctx), k, eos_ids, p_min)
        # logits_all: as the binding sets it for a target with a draft, also without one, so ar costs the same
        # whether or not a draft is loaded beside it
        self.llm = _load(target_gguf, threads, n_ctx, logits_all=True, draft=self.draft)

    def close(self) -> None:
        """Free llama.cpp's models and contexts now (at interpreter exit the binding's own cleanup finds its
        library half torn down)."""
        for llm in (self.llm, self.draft.llm if self.draft else None):
            if llm is not None:
                llm.close()

    def set_draft(self, k: int, p_min: float = 0.0) -> None:
        """The next speculative runs' most drafts per step and early stop (one loaded draft serves every k)."""
        self.draft.k, self.draft.p_min = int(k), float(p_min)

    def run(self, ids, max_new_tokens: int, eos_ids=(), speculative: bool | None = None, stop=None) -> dict:
        """Greedy tokens after ``ids``, from a cold cache (no prefix of an earlier run reused). ``speculative``:
        None = with the draft when there is one; False = autoregressive (one loaded target serves both).
        ``stop(tokens)``: (length to keep, reason) once the tokens end generation, else None (default: an EOS
        id or ``max_new_tokens``). Returns tokens, stop_reason, wall_s (prefill included), prefill_s (to the
        first token), target_s (the target's evaluations after the prefill), draft_s, steps, proposed and
        accepted per step (ar: one step per token, no drafts)."""
        eos = set(eos_ids)
        spec = self.draft is not None and speculative is not False
        if speculative and self.draft is None:
            raise ValueError("speculative=True needs a draft_gguf")
        stop = stop or (lambda out: (len(out), "eos") if out[-1] in eos else
                        (max_new_tokens, "max_new_tokens") if len(out) >= max_new_tokens else None)
        self.llm.draft_model = self.draft if spec else None   # the binding reads it on every generate()
        if spec:
            self.draft.start()
        self.llm.reset()        # n_tokens = 0: generate() reuses no cached prefix, its first eval clears the cache
        self.llm.eval_s = []
        out, reason, prefill = [], None, None
        t0 = time.perf_counter()
        for tok in self.llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                     reset=True):
            out.append(int(tok))
            if prefill is None:
                prefill = time.perf_counter() - t0
            hit = stop(out)
            if hit is not None:
                del out[hit[0]:]
                reason = hit[1]
                break
        wall = time.perf_counter() - t0
        if spec:
            proposed, accepted = steps_of(len(ids), out, self.draft.calls)
        else:
            proposed, accepted = [], []
        steps = len(proposed) if spec else len(out)
        return {"tokens": out, "stop_reason": reason, "wall_s": wall, "prefill_s": prefill or 0.0,
                "target_s": sum(self.llm.eval_s[1:]), "draft_s": self.draft.draft_s if spec else 0.0,
                "steps": steps, "proposed": proposed, "accepted": accepted}

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


# ---- the tiny pair as GGUF files (tests: engine=llamacpp with model=tiny) ------------------------------------
GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
               **{f"self_attn.{p}_proj.{w}": f"attn_{p}.{w}" for p in "qkv" for w in ("weight", "bias")}}


def gguf_name(hf_name: str) -> str:
    """A Qwen2 tensor's GGUF name (llama.cpp's qwen2 layout: rotary halves as in transformers, no permutation)."""
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    parts = hf_name.split(".")
    if parts[:2] != ["model", "layers"] or ".".join(parts[3:]) not in LAYER_NAMES:
        raise ValueError(f"tensor {hf_name!r}; allowed: a Qwen2 tensor ({', '.join(GGUF_NAMES)}, model.layers.*)")
    return f"blk.{parts[2]}.{LAYER_NAMES['.'.join(parts[3:])]}"


def write_qwen2_gguf(model, tokenizer, path: Path, name: str) -> Path:
    """A transformers Qwen2 model as an F32 GGUF (llama.cpp's qwen2 architecture), its vocabulary the
    tokenizer's tokens (the first ``len(tokenizer)`` embedding rows: a padded draft is cut to them)."""
    import gguf

    c, vocab = model.config, len(tokenizer)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(name)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    specials = set(tokenizer.all_special_ids)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokenizer.convert_ids_to_tokens(list(range(vocab))))
    w.add_token_types([3 if i in specials else 1 for i in range(vocab)])   # 3: control
    w.add_token_merges([f"{t} {t}" for t in tokenizer.convert_ids_to_tokens([0])])   # llama.cpp requires merges; it
    #                      never tokenizes here (the ids come from the tokenizer), so one placeholder serves
    w.add_eos_token_id(int(tokenizer.eos_token_id))
    w.add_add_bos_token(False)
    for hf_name, t in model.state_dict().items():
        a = t.detach().float().numpy()
        if hf_name in ("model.embed_tokens.weight", "lm_head.weight"):
            a = a[:vocab]
        w.add_tensor(gguf_name(hf_name), np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_gguf_pair(seed: int = 0, noise: float = 0.05, root: str | None = None) -> tuple[Path, Path]:
    """The tiny pair (``models.tiny.tiny_pair``: same seeds and noise) as two F32 GGUF files, written once under
    ``root`` (default: the user cache) and reused."""
    import os
    import tempfile

    from mars_bench.models.tiny import tiny_pair

    base = Path(root or os.environ.get("MARS_BENCH_CACHE") or Path.home() / ".cache" / "mars-bench")
    out = base / f"tiny-gguf-s{seed}-n{noise:g}"
    paths = (out / "target.gguf", out / "draft.gguf")
    if paths[1].is_file():
        return paths
    base.mkdir(parents=True, exist_ok=True)
    target, draft, tok = tiny_pair(seed=seed, noise=noise)
    tmp = Path(tempfile.mkdtemp(dir=base))
    write_qwen2_gguf(target, tok, tmp / "target.gguf", "tiny target")
    write_qwen2_gguf(draft, tok, tmp / "draft.gguf", "tiny draft")
    try:
        tmp.rename(out)
    except OSError:   # another process wrote it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return paths
