"""engine=vllm engine.serve=true with the embedded pair (Qwen2.5-Coder 0.5B -> 1.5B, the converted bf16 directories of
the user cache): the served parity checks of tests/test_vllm_serve.py on a real pair, at concurrency 1 and 3.
Markers ``vllm`` and ``slow``: the vllm tier of .ci/run and ``make test-vllm`` (which name their files) leaves it out;
run it with
    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv-vllm/bin/python -m pytest -m "vllm and slow" \\
        tests/test_vllm_serve_embedded.py
Two servers at once (ar; sd and mars), ~10 GB of memory.
"""
import pytest
import torch

from .test_vllm_embedded import BF16_TOL, EMBEDDED
from .test_vllm_engine import replay, tau
from .test_vllm_serve import check_served_parity, served_context

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

N = 3
SERVED = (*EMBEDDED, "engine.serve=true", f"batch_size={N}")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    models, run = served_context(tmp_path_factory.mktemp("runs"), base=SERVED)
    yield models, run
    models.close()


def test_embedded_served_exact_is_ar_and_mars_theta1_is_exact(ctx):
    check_served_parity(ctx[1], sizes=(1, N))


def test_embedded_served_mars_relaxations_replay(ctx):
    models, run = ctx
    sd, mars = run(f"sd{N}", "method=sd", f"batch_size={N}"), run("mars0.9", "method=mars", "rule.theta=0.9",
                                                                 f"batch_size={N}")
    assert tau(mars) >= tau(sd)
    n = replay(models, mars, 0.9, dtype=torch.bfloat16, tol=BF16_TOL)
    assert n == sum(r["n_relaxed"] for r in mars.values())
    print(f"embedded pair bf16 through vllm serve at concurrency {N}: tau mars 0.9 {tau(mars):.3f} vs sd "
          f"{tau(sd):.3f}; {n} relaxations replayed")
