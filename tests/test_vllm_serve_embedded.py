"""engine=vllm engine.serve=true with the embedded pair (Qwen2.5-Coder 0.5B -> 1.5B, the converted bf16 directories of
the user cache): the served parity checks of tests/test_vllm_serve.py on a real pair, at concurrency 1 and 3.
Markers ``vllm`` and ``slow``: the vllm tier of .ci/run and ``make test-vllm`` (which name their files) leaves it out;
run it with
    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv-vllm/bin/python -m pytest -m "vllm and slow" \\
        tests/test_vllm_serve_embedded.py
One server at a time (ar's, stopped before sd's and mars'), ~5 GB of memory each.
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
    """(models, run, ar records): ar served first by a server of its own, then the sd / mars server."""
    tmp = tmp_path_factory.mktemp("runs")
    models, run = served_context(tmp, base=SERVED, methods=("ar",))
    ar = run("ar", "method=ar", "batch_size=1")
    models.close()
    models, run = served_context(tmp, base=SERVED, methods=("sd",))
    yield models, run, ar
    models.close()


def test_embedded_served_exact_is_ar_and_mars_theta1_is_exact(ctx):
    check_served_parity(ctx[1], sizes=(1, N), ar=ctx[2])


def test_embedded_served_mars_relaxations_replay(ctx):
    models, run, _ = ctx
    sd, mars = run(f"sd{N}", "method=sd", f"batch_size={N}"), run("mars0.9", "method=mars", "rule.theta=0.9",
                                                                 f"batch_size={N}")
    assert tau(mars) >= tau(sd)
    n = replay(models, mars, 0.9, dtype=torch.bfloat16, tol=BF16_TOL)
    assert n == sum(r["n_relaxed"] for r in mars.values())
    print(f"embedded pair bf16 through vllm serve at concurrency {N}: tau mars 0.9 {tau(mars):.3f} vs sd "
          f"{tau(sd):.3f}; {n} relaxations replayed")
