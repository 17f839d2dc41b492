"""The plugin's patch of vLLM's ``rejection_sample`` (vllm_compat.install + vllm_plugin.step) with vLLM's own kernels
(the CPU build's C++ overrides), on CPU tensors: the same checks as tests/test_vllm_verify.py makes against its
emulated kernel. Marker ``vllm``: run with the vLLM virtualenv (.venv-vllm/bin/python -m pytest -m vllm)."""
import types

import pytest
import torch
from scipy.stats import binomtest, chisquare

from mars_bench.decode import rules, sampling
from mars_bench.engines.vllm import verify

from .test_mars_sampled import P, Q, Z, analytic, committed_law

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    import vllm.platforms  # noqa: F401  (the CPU platform registers its kernel overrides)
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler as rs

    from mars_bench.engines.vllm import compat as vllm_compat, plugin as vllm_plugin

    current_platform.register_triton_kernel_overrides()
    vllm_compat.install(vllm_plugin.step)
    return rs, vllm_compat._LOCAL


def call(rs, local, draft, num_draft, z, logits, q, greedy, spec, gens=None):
    """The patched rejection_sample on one step: returns the kernel's output [B, max + 1]."""
    b = len(num_draft)
    extra = [None if s is None else verify.request_args(s[0], s[1], f"r{i}")
             for i, s in enumerate(spec)]
    local.raw, local.extra, local.done = z, extra, [0] * b
    meta = types.SimpleNamespace(all_greedy=all(greedy), all_random=not any(greedy),
                                 temperature=torch.tensor([0.0 if g else 1.0 for g in greedy]), generators=gens or {})
    cu = torch.tensor(num_draft, dtype=torch.int32).cumsum(0).to(torch.int32)
    bonus = torch.full((b, 1), 7, dtype=torch.int64)
    try:
        return rs.rejection_sample(draft.to(torch.int32).contiguous(), num_draft, max(num_draft), cu, q, logits.clone(),
                                   bonus, meta)
    finally:
        local.raw = local.extra = local.done = None


def test_greedy_prefix_and_next_token_equal_the_native_rule(patched):
    rs, local = patched
    gen = torch.Generator().manual_seed(5)
    settings = rules.mars.settings({"theta": 0.8})
    relaxed = 0
    for _ in range(20):
        num_draft = [4, 3, 5]
        n = sum(num_draft)
        z = torch.randn(n, 64, generator=gen) * 2 + 3
        order = z.argsort(-1, descending=True)
        draft = order.gather(-1, torch.randint(0, 3, (n, 1), generator=gen)).squeeze(-1)
        out = call(rs, local, draft, num_draft, z, z, None, [True] * 3, [("mars", settings)] * 3)
        start = 0
        for b, k in enumerate(num_draft):
            rows = torch.cat([z[start:start + k], z[start:start + 1]])
            cv = rules.verify_chain(rules.mars, draft[start:start + k], rows, None, 0.0, 1.0, None, **settings)
            want = draft[start:start + cv.n_accepted].tolist() + [7 if cv.n_accepted == k else cv.next_token]
            got = [t for t in out[b].tolist() if t != -1]
            assert got == want, (b, got, want)
            relaxed += sum(c is not None for c in cv.clause)
            start += k
    assert relaxed > 0


def test_untouched_without_extra_args(patched):
    rs, local = patched
    gen = torch.Generator().manual_seed(9)
    z = torch.randn(8, 64, generator=gen)
    draft = z.argsort(-1, descending=True)[:, 1]       # every draft the top-2: standard rejects at position 0
    out = call(rs, local, draft, [4, 4], z, z, None, [True, True], [None, None])
    assert out[:, 1].tolist() == [-1, -1] and out[:, 0].tolist() == z[[0, 4]].argmax(-1).tolist()


@pytest.mark.parametrize("theta,sampled_top1", [(0.8, "always"), (0.95, "margin")])
def test_sampled_law_with_vllms_kernel(patched, theta, sampled_top1):
    """20000 one-draft requests at the toy position, drafts from Q, vLLM's uniforms and residual draw."""
    rs, local = patched
    n = 20000
    torch.manual_seed(2026)
    gen = torch.Generator().manual_seed(2026)
    settings = rules.mars.settings({"theta": theta, "sampled_top1": sampled_top1})
    d = sampling.sample(Q.expand(n, 4), gen)
    logits = torch.log(P).expand(n, 4).contiguous()
    out = call(rs, local, d, [1] * n, Z.expand(n, 4).contiguous(), logits, Q.expand(n, 4).contiguous(),
               [False] * n, [("mars", settings)] * n)
    accepted = (out[:, 1] != -1)
    std, top2, top1 = analytic(theta, sampled_top1)
    assert binomtest(int(accepted.sum()), n, std + top2 + top1).pvalue > 1e-3
    law = committed_law(theta, sampled_top1)
    first = torch.bincount(out[:, 0].long(), minlength=4).tolist()
    assert chisquare(first, (law / law.sum() * n).tolist()).pvalue > 1e-3, (first, law)


def test_only_tensor_parallel_rank_0_writes_the_audit(patched, tmp_path, monkeypatch):
    """Every tensor-parallel rank verifies the same step: one audit line per request and step, from rank 0."""
    from vllm.distributed import parallel_state

    from mars_bench.engines.vllm import plugin as vllm_plugin

    rs, local = patched
    monkeypatch.setenv(vllm_plugin.AUDIT, str(tmp_path))
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(8, 64, generator=gen)
    draft = z.argsort(-1, descending=True)[:, 0]
    spec = [("mars", rules.mars.settings({"theta": 0.8}))] * 2
    outs = {}
    monkeypatch.setattr(parallel_state, "model_parallel_is_initialized", lambda: True)
    for rank in (1, 0):
        monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_rank", lambda rank=rank: rank)
        outs[rank] = call(rs, local, draft, [4, 4], z, z, None, [True, True], spec)
        audit = vllm_plugin.read_audit(tmp_path)
        assert sorted(audit) == ([] if rank else ["r0", "r1"])
        assert all(len(steps) == 1 for steps in audit.values())
    assert torch.equal(outs[0], outs[1])


def test_vllms_ray_executor_would_copy_the_plugins_variables(tmp_path):
    """vLLM's own list of variables for Ray workers (``vllm.ray.ray_env.get_env_vars_to_copy``), in a fresh process
    with the environment ``engines/vllm.build_llm`` sets, names the plugin's switch and audit folder."""
    import os
    import subprocess
    import sys

    from mars_bench.engines.vllm import compat as vllm_compat

    env = vllm_compat.carried_to_workers({"MARS_BENCH_VLLM_PLUGIN": "1", "MARS_BENCH_VLLM_AUDIT": str(tmp_path)})
    code = "from vllm.ray.ray_env import get_env_vars_to_copy as g; print(','.join(sorted(g())))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert {"MARS_BENCH_VLLM_PLUGIN", "MARS_BENCH_VLLM_AUDIT"} <= set(out.split(","))
