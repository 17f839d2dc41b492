"""``engine=llamacpp``: a job's samples decoded by llama.cpp (``models/llamacpp.py``: the llama-cpp-python binding)
instead of this package's loop (docs/llamacpp.md).

What runs: the model config's GGUF files (``model=embedded``: the pinned Q4_K_M files, sha256-checked; the run's
model identity is that sha256, ``models.identity``; ``model=tiny``: the tiny pair written as F32 GGUF files), with
the same tokenizer, chat template, prompt token ids, EOS ids, stop strings and budget as the native engine
(``decode.types.Stopper``). Methods: ar, and sd with rule exact (llama.cpp's own speculative decoding: the draft
GGUF proposes up to ``method.k`` greedy tokens, fewer where its top-1 probability is below ``method.p_min``).
Greedy only, batch size 1, budget exact; everything else is refused in one line before any model loads. The draft
runs as stored: ``model.draft_quant`` (the native engine's draft setting, e.g. given once for a whole ``+compare``)
is set to none here, so the run's spec says so.

Records are the native engine's ``SampleRecord``: tokens, wall time (prefill included), the prefill (to the first
token), the target's and the draft's evaluation seconds, per-step drafts proposed / accepted (the prefill is the
first step, with no drafts). Threads: torch's (``torch.get_num_threads()``), so both engines of one process run
the same count. One loaded target serves ar and sd, one draft every k.
"""
from __future__ import annotations

import atexit
import logging
from pathlib import Path
from types import SimpleNamespace

from mars_bench.models import llamacpp

log = logging.getLogger("mars_bench")

SCHEMES = ("ar", "sd")
SOURCES = ("embedded", "tiny")
N_CTX = 4096     # engine.max_model_len null: llama.cpp's context


def check(cfg, m) -> str:
    """Everything engine=llamacpp refuses for the job's resolved method ``m``, before any model loads: one-line
    ValueError; returns the binding's version."""
    if m.name not in SCHEMES:
        raise ValueError(f"method={cfg.method.name} cannot run on engine=llamacpp; allowed: ar, sd (llama.cpp drafts "
                         "chains with a draft model)")
    if m.speculative and m.rule != "exact":
        raise ValueError(f"rule={m.rule} cannot run on engine=llamacpp (llama.cpp has no relaxed acceptance); "
                         "allowed: exact")
    if float(cfg.temperature) != 0.0:
        raise ValueError(f"temperature={cfg.temperature} cannot run on engine=llamacpp; allowed: 0 (greedy)")
    if int(cfg.get("batch_size", 1) or 1) != 1:
        raise ValueError(f"batch_size={cfg.batch_size} cannot run on engine=llamacpp; allowed: 1")
    if cfg.protocol.budget != "exact":
        raise ValueError(f"protocol.budget={cfg.protocol.budget} cannot run on engine=llamacpp; allowed: exact")
    if cfg.model.source not in SOURCES:
        raise ValueError(f"model.source={cfg.model.source} cannot run on engine=llamacpp; allowed: "
                         f"{', '.join(SOURCES)} (GGUF files)")
    if cfg.model.device not in ("cpu", "auto"):
        raise ValueError(f"model.device={cfg.model.device} cannot run on engine=llamacpp (a CPU build); allowed: cpu")
    if m.speculative and cfg.model.get("draft_vocab", 0):
        raise ValueError(f"model.draft_vocab={cfg.model.draft_vocab} cannot run on engine=llamacpp (it runs the draft "
                         "GGUF as stored); allowed: 0")
    if cfg.model.draft_quant != "none":   # e.g. the native entries' draft in one +compare: not this engine's
        log.info("engine=llamacpp runs the draft GGUF as stored: model.draft_quant=%s does not apply (none)",
                 cfg.model.draft_quant)
        cfg.model.draft_quant = "none"
    n_ctx = cfg.engine.max_model_len
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1):
        raise ValueError(f"engine.max_model_len={n_ctx!r}; allowed: an integer >= 1 or null ({N_CTX})")
    why = llamacpp.unavailable()
    if why:
        raise ValueError(f"engine=llamacpp: {why}")
    return llamacpp.version()


def gguf_paths(mcfg, need_draft: bool) -> tuple[Path, Path | None]:
    """(target, draft) GGUF files of a model config: the embedded pair's pinned files (fetched and sha256-checked
    by ``models.embedded.fetch_gguf``) or the tiny pair written as GGUF."""
    if mcfg.source == "tiny":
        target, draft = llamacpp.tiny_gguf_pair(mcfg.seed, mcfg.noise)
        return target, draft if need_draft else None
    from mars_bench.models.embedded import SPECS, default_cache_dir, fetch_gguf

    cache = Path(mcfg.cache_dir).expanduser() if mcfg.cache_dir else default_cache_dir()
    target = fetch_gguf(SPECS[mcfg.target], cache)
    return target, fetch_gguf(SPECS[mcfg.draft], cache) if need_draft and mcfg.draft else None


def tokenizer_of(mcfg):
    """(tokenizer, chat template kwargs, EOS ids) exactly as the native engine takes them (``models.pairs``)."""
    from mars_bench.models.pairs import chat_template_kwargs, eos_ids

    if mcfg.source == "tiny":
        from mars_bench.models.tiny import tiny_config, tiny_tokenizer

        tok = tiny_tokenizer()
        config, name = tiny_config(len(tok)), "tiny"
    else:
        from transformers import AutoConfig

        from mars_bench.models.pairs import load_tokenizers

        tok, name, _ = load_tokenizers(mcfg)
        config = AutoConfig.from_pretrained(name)
    from transformers import GenerationConfig

    gen = GenerationConfig.from_model_config(config)
    if mcfg.source != "tiny" and (Path(name) / "generation_config.json").is_file():
        gen = GenerationConfig.from_pretrained(name)
    return tok, chat_template_kwargs(tok, mcfg.get("enable_thinking"), name), eos_ids(
        SimpleNamespace(generation_config=gen), tok)


class Models:
    """The runner's ``Models`` for engine=llamacpp: one llama.cpp target (and draft, when a method drafts) loaded
    once; ``decode`` / ``decode_batched`` as ``runner.Models``."""

    def __init__(self, cfg, methods):
        import torch

        from mars_bench.store.provenance import machine

        self.cfg, self.version = cfg, [check(cfg, m) for m in methods][-1]
        self.tokenizer, self.chat_kwargs, self.eos = tokenizer_of(cfg.model)
        need_draft = any(m.speculative for m in methods)
        target, draft = gguf_paths(cfg.model, need_draft)
        self.n_ctx = int(cfg.engine.max_model_len or N_CTX)
        threads = torch.get_num_threads()
        log.info("llama.cpp %s: target %s, draft %s, n_ctx %d, %d threads", self.version, target, draft, self.n_ctx,
                 threads)
        self.runner = llamacpp.LlamaCppRunner(str(target), str(draft) if draft else None, threads=threads,
                                              n_ctx=self.n_ctx, eos_ids=self.eos)
        atexit.register(self.runner.close)
        self.kernel = f"llama.cpp-{self.version}"
        self.machine = machine("cpu")

    def prompt_ids(self, messages) -> list[int]:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False,
                                                  **self.chat_kwargs)

    def decode(self, job, sample, index: int, order: int = 0) -> dict:
        """One sample (all its turns) with the job's method; returns its record."""
        out = []
        self.decode_batched(job, [(index, sample)], lambda s, rec: out.append(rec), order)
        return out[0]

    def decode_batched(self, job, todo: list, write, order: int = 0, source=None) -> None:
        """Samples ``todo`` ([(index, sample)]) one at a time (batch size 1), ``write(sample, record)`` after each.
        ``source``: the claimed samples, iterated lazily."""
        for index, sample in (todo if source is None else source):
            write(sample, self._decode_one(job, sample, index, order))

    def _decode_one(self, job, sample, index: int, order: int) -> dict:
        from mars_bench.base.errors import ConfigError
        from mars_bench.config.settings import decode_config
        from mars_bench.decode.types import DecodeResult, Stopper
        from mars_bench.store.recordbuild import sample_record, turn_record
        from mars_bench.tasks import build_messages

        task, m = job.task, job.method
        stopper = Stopper(self.tokenizer, decode_config(job.tag, job.max_new, self.eos, task.stop_strings))
        if m.speculative:
            self.runner.set_draft(m.k, m.p_min)
        outputs, turns = [], []
        for t in range(len(sample.turns)):
            ids = self.prompt_ids(build_messages(task, sample, outputs, t))
            need = len(ids) + job.max_new + (m.k if m.speculative else 0) + 1
            if need > self.n_ctx:
                raise ConfigError(f"engine.max_model_len={self.n_ctx}: sample {sample.id} turn {t} needs {need} "
                                  "positions (prompt + max_new_tokens + k + 1); allowed: at least that")
            r = self.runner.run(ids, job.max_new, speculative=m.speculative,
                                stop=lambda out: stopper.cut(out, len(out) - 1))
            text = self.tokenizer.decode(r["tokens"], skip_special_tokens=True)
            outputs.append(text)
            res = DecodeResult(stop_reason=r["stop_reason"] or "", steps=r["steps"], proposed=r["proposed"],
                               accepted=r["accepted"], outcome=outcome(r["proposed"], r["accepted"]),
                               prefill_s=r["prefill_s"], wall_s=r["wall_s"], target_s=r["target_s"],
                               draft_s=r["draft_s"], tokens=r["tokens"])
            turns.append(turn_record(res, ids, text, self.tokenizer))
        return sample_record(job, sample, index, turns, task.score(sample, outputs), self.kernel, order, self.machine)


def outcome(proposed: list[int], accepted: list[int]) -> str:
    """Per verified draft position: A accepted, X where a step's drafts end in a rejection (as the native loop)."""
    return "".join("A" * a + ("X" if a < p else "") for p, a in zip(proposed, accepted) if p)
