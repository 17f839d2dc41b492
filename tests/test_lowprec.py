"""The bf16 CPU target path (model.dtype=bf16 on the fast path): bf16 weight panels run by AMX tiles,
AVX512_BF16 or AVX2 + FMA (each kernel this CPU runs), everything else in fp32. Kernels against a plain-torch reference, batch invariance, greedy
sd / mars(theta=1) token-identical to ar at the same precision and to transformers generate of the same
computation, and the logged fallback on CPUs without the instruction set."""
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.models import fastpath, panel
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.tiny import tiny_pair

from .conftest import EOS, MAX_NEW
from .kernels import FAMILIES, use_family

needs_bf16 = pytest.mark.skipif(not panel.bf16_available(), reason=f"no bf16 panel kernel: {panel.unavailable()}")
_NO_BF16 = "avx512" not in FAMILIES or "avx512_bf16" not in panel.cpu()[1]
KERNELS = [pytest.param(("avx512", False), id="avx512-bf16", marks=pytest.mark.skipif(_NO_BF16, reason="no AVX512_BF16")),
           pytest.param(("avx512", True), id="amx-bf16",
                        marks=pytest.mark.skipif(_NO_BF16 or "amx_bf16" not in panel.cpu()[1], reason="no AMX")),
           pytest.param(("avx2", False), id="avx2-bf16", marks=pytest.mark.skipif("avx2" not in FAMILIES, reason="no AVX2"))]


@pytest.fixture
def kernel(request, monkeypatch):
    """(family, amx) of the parametrized kernel, switched on for the test."""
    family, amx = request.param
    use_family(monkeypatch, family)
    assert panel.bf16_available() and (not amx or panel.amx_available())
    return family, amx


class RefBf16Linear(nn.Module):
    """Plain torch: bf16 weights summed in fp32 (the kernels' arithmetic), the inputs rounded to bf16 where the
    kernel rounds them (AMX, AVX512_BF16; the avx2 kernel multiplies fp32 inputs)."""

    def __init__(self, linear: nn.Linear, round_inputs: bool = True):
        super().__init__()
        self.w = linear.weight.detach().bfloat16().float()
        self.b = None if linear.bias is None else linear.bias.detach().float()
        self.round = round_inputs

    def forward(self, x):
        return F.linear(x.bfloat16().float() if self.round else x, self.w, self.b)


def reference_model(model, round_inputs: bool = True):
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, RefBf16Linear(child, round_inputs))
    return model.float()


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
@pytest.mark.parametrize("out_f,in_f,bias", [(64, 64, True), (259, 64, False), (256, 1536, True), (1536, 8960, False)])
def test_bf16_kernel_matches_reference_and_is_batch_invariant(kernel, out_f, in_f, bias):
    family, amx = kernel
    torch.manual_seed(0)
    lin = nn.Linear(in_f, out_f, bias=bias).bfloat16()
    pl = panel.PanelLinear(lin, amx=amx)
    assert pl.amx == amx and pl.weight is None and pl.kernel == ("panel-amx-bf16" if amx else f"panel-{family}-bf16")
    assert pl.panels.dtype == torch.bfloat16 and pl.panels.numel() == pl.n_pad * in_f    # never widened in memory
    ref = RefBf16Linear(lin, pl.bf16_inputs)
    x = torch.randn(45, in_f)                   # AMX blocks of 16 rows, AVX chunks of 12 or 5, ragged tails
    full = pl(x)
    torch.testing.assert_close(full, ref(x), atol=1e-5 * in_f ** 0.5, rtol=1e-4)
    assert full.dtype == torch.float32 and full.shape == (45, out_f)
    for m in (1, 2, 4, 5, 6, 12, 13, 16, 17, 33):
        assert torch.equal(pl(x[:m]), full[:m]), m       # a row's result does not depend on the row count
    assert torch.equal(pl(x[7:8]), full[7:8])


@needs_bf16
def test_bf16_fast_path_keeps_non_gemm_work_in_fp32():
    target, _, _ = tiny_pair(dtype=torch.bfloat16)
    model = fastpath.enable_fast_path(target)
    assert fastpath.kind(model) == ("panel-amx-bf16" if panel.amx_available() else "panel-bfdot-bf16"
                                    if panel.bfdot_available() else f"panel-{panel.family()}-bf16")
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters())     # norms, embeddings, biases
    assert all(m.panels.dtype == torch.bfloat16 for m in model.modules() if isinstance(m, panel.PanelLinear))


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
def test_greedy_sd_and_mars_theta1_equal_ar_and_hf_generate_in_bf16(prompt_ids, kernel, monkeypatch):
    family, amx = kernel
    if not amx:
        monkeypatch.setitem(panel._state, "amx", False)
    target, draft, tok = tiny_pair(dtype=torch.bfloat16)
    t = CausalLMAdapter(fastpath.enable_fast_path(target))
    d = CausalLMAdapter(fastpath.enable_fast_path(draft), out_vocab=t.vocab)
    assert t.model.lm_head.amx == amx
    ref_model = reference_model(tiny_pair(dtype=torch.bfloat16)[0], t.model.lm_head.bf16_inputs)
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    mars1 = Method("mars", k=4, rule="mars", rule_kwargs={"theta": 1.0})
    for ids in prompt_ids[:8]:
        ar = generate(t, d, tok, ids, Method("ar"), cfg).tokens
        with torch.inference_mode():
            g = ref_model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                   eos_token_id=EOS, pad_token_id=256)
        assert ar == g[0, len(ids):].tolist(), ids
        for method in (Method("sd", k=3), Method("sd", k=7), mars1, Method("sd_tree", k=4)):
            assert generate(t, d, tok, ids, method, cfg).tokens == ar, (method, ids)


@needs_bf16
def test_bf16_path_differs_from_fp32(prompt_ids):
    """The test above could not pass by accident of the bf16 model being the fp32 one."""
    t32, _, _ = tiny_pair()
    t16 = fastpath.enable_fast_path(tiny_pair(dtype=torch.bfloat16)[0])
    x = torch.tensor([prompt_ids[0]])
    with torch.inference_mode():
        z32, z16 = t32(x).logits, t16(x).logits
    assert not torch.equal(z32, z16) and torch.allclose(z32, z16, atol=0.1)


def test_without_a_bf16_kernel_the_bf16_model_runs_in_fp32_with_one_line(monkeypatch, caplog):
    monkeypatch.delenv(panel.ISA_ENV, raising=False)
    monkeypatch.setattr(panel, "cpu", lambda: ("old cpu", {"sse4_2"}))
    monkeypatch.setattr(panel, "_state", {})
    target, _, _ = tiny_pair(dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="mars_bench.models.fastpath"):
        model = fastpath.enable_fast_path(target)
    lines = [r.getMessage() for r in caplog.records if "bf16 fast path unavailable" in r.getMessage()]
    assert len(lines) == 1 and "lacks AVX2 + FMA and AVX-512F" in lines[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert fastpath.kind(model) in ("mkl-packed", "off")


@needs_bf16
def test_int8_draft_of_a_bf16_pair_runs_in_fp32_and_sd_stays_lossless(prompt_ids):
    """What load_pair does for model.dtype=bf16 with the embedded int8 draft."""
    target, draft, tok = tiny_pair(dtype=torch.bfloat16)
    t = CausalLMAdapter(fastpath.enable_fast_path(target))
    d = CausalLMAdapter(fastpath.enable_fast_path(fastpath.quantize_int8(draft)), out_vocab=t.vocab)
    assert all(p.dtype == torch.float32 for p in d.model.parameters())
    assert isinstance(d.model.lm_head, fastpath.Int8Linear)
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    for ids in prompt_ids[:6]:
        assert generate(t, d, tok, ids, Method("sd", k=4), cfg).tokens == generate(t, d, tok, ids, Method("ar"), cfg).tokens
