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
from .test_vllm_engine import replay, tau, tokens
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
    """At concurrency 1 served sd == ar and mars theta 1 == sd, token for token. At concurrency N continuous batching
    puts the rows of whichever requests are running into one bf16 forward, whose sums differ from one request's and
    from run to run (the schedule follows timing), so a token may differ where the target's top-2 are within bf16's
    tolerance (``near_ties``): sd against ar, and mars theta 1 (which relaxes nothing) against sd."""
    models, run, ar = ctx
    check_served_parity(run, sizes=(1,), ar=ar)
    sd = run(f"sd{N}", "method=sd", f"batch_size={N}")
    strict = run("mars1n", "method=mars", "rule.theta=1", f"batch_size={N}")
    assert sum(r["n_relaxed"] for r in strict.values()) == 0
    said = []
    for name, a, b in (("sd vs ar", ar, sd), ("mars theta 1 vs sd", sd, strict)):
        gaps = near_ties(models, a, b)
        assert all(g <= BF16_TOL for _, _, g in gaps), (name, gaps)
        said.append(f"{name}: {len(a) - len(gaps)}/{len(a)} identical, divergent (sample, position, top-1 - top-2 "
                    f"logit) {gaps}")
    print(f"embedded pair bf16 served: at concurrency 1 sd == ar and mars theta 1 == sd on {len(ar)}/{len(ar)}; "
          f"at {N}: " + "; ".join(said))


def near_ties(models, a: dict, b: dict) -> list:
    """Each sample whose tokens differ between ``a`` and ``b``: (id, first divergent position, the target's top-1
    minus top-2 logit there, from a transformers bf16 forward of the prompt and the shared prefix)."""
    from transformers import AutoModelForCausalLM

    from .test_vllm_engine import _prompt

    out, target = [], None
    for i, r in a.items():
        x, y = r["turns"][0]["output_ids"], b[i]["turns"][0]["output_ids"]
        if x == y:
            continue
        pos = next((j for j, (u, w) in enumerate(zip(x, y)) if u != w), min(len(x), len(y)))
        target = target or AutoModelForCausalLM.from_pretrained(models.target_dir, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            z = target(torch.tensor([_prompt(models, r) + x[:pos]])).logits[0, -1].float()
        top = z.topk(2).values
        out.append((i, pos, round(float(top[0] - top[1]), 4)))
    return out


def test_embedded_served_mars_relaxations_replay(ctx):
    """mars theta 0.9 at concurrency 1 and N: tau at least sd's, and every audited relaxation replays against a
    transformers bf16 forward of the target (within bf16's tolerance)."""
    models, run, _ = ctx
    said = []
    for c in (1, N):
        sd = run(f"sd{c}", "method=sd", f"batch_size={c}")
        mars = run(f"mars0.9-{c}", "method=mars", "rule.theta=0.9", f"batch_size={c}")
        assert tau(mars) >= tau(sd)
        n = replay(models, mars, 0.9, dtype=torch.bfloat16, tol=BF16_TOL)
        assert n == sum(r["n_relaxed"] for r in mars.values())
        said.append(f"concurrency {c}: tau mars 0.9 {tau(mars):.3f} vs sd {tau(sd):.3f}, {n} relaxations replayed")
    print("embedded pair bf16 through vllm serve, " + "; ".join(said))
