"""The bf16 CPU target path (model.dtype=bf16 on the fast path): bf16 weight panels run by AMX tiles or
AVX512_BF16, everything else in fp32. Kernels against a plain-torch reference, batch invariance, greedy
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

needs_bf16 = pytest.mark.skipif(not panel.bf16_available(), reason=f"no bf16 panel kernel: {panel.unavailable()}")
KERNELS = [pytest.param(False, id="avx512-bf16"),
           pytest.param(True, id="amx-bf16", marks=pytest.mark.skipif(not panel.amx_available(), reason="no AMX"))]


class RefBf16Linear(nn.Module):
    """Plain torch: bf16-rounded inputs times bf16 weights, summed in fp32 (the kernels' arithmetic)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.w = linear.weight.detach().bfloat16().float()
        self.b = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x):
        return F.linear(x.bfloat16().float(), self.w, self.b)


def reference_model(model):
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, RefBf16Linear(child))
    return model.float()


@needs_bf16
@pytest.mark.parametrize("amx", KERNELS)
@pytest.mark.parametrize("out_f,in_f,bias", [(64, 64, True), (259, 64, False), (256, 1536, True), (1536, 8960, False)])
def test_bf16_kernel_matches_reference_and_is_batch_invariant(amx, out_f, in_f, bias):
    torch.manual_seed(0)
    lin = nn.Linear(in_f, out_f, bias=bias).bfloat16()
    pl = panel.PanelLinear(lin, amx=amx)
    assert pl.amx == amx and pl.weight is None and pl.kernel == ("panel-amx-bf16" if amx else "panel-avx512-bf16")
    ref = RefBf16Linear(lin)
    x = torch.randn(45, in_f)                   # 3 AMX blocks of 16 rows, 4 AVX chunks of 12, ragged tails
    full = pl(x)
    torch.testing.assert_close(full, ref(x), atol=1e-5 * in_f ** 0.5, rtol=1e-4)
    assert full.dtype == torch.float32 and full.shape == (45, out_f)
    for m in (1, 2, 5, 12, 13, 16, 17, 33):
        assert torch.equal(pl(x[:m]), full[:m]), m       # a row's result does not depend on the row count
    assert torch.equal(pl(x[7:8]), full[7:8])


@needs_bf16
def test_bf16_fast_path_keeps_non_gemm_work_in_fp32():
    target, _, _ = tiny_pair(dtype=torch.bfloat16)
    model = fastpath.enable_fast_path(target)
    assert fastpath.kind(model) == ("panel-amx-bf16" if panel.amx_available() else "panel-avx512-bf16")
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters())     # norms, embeddings, biases
    assert all(m.panels.dtype == torch.bfloat16 for m in model.modules() if isinstance(m, panel.PanelLinear))


@needs_bf16
@pytest.mark.parametrize("amx", KERNELS)
def test_greedy_sd_and_mars_theta1_equal_ar_and_hf_generate_in_bf16(prompt_ids, amx, monkeypatch):
    if not amx:
        monkeypatch.setitem(panel._state, "amx", False)
    target, draft, tok = tiny_pair(dtype=torch.bfloat16)
    t = CausalLMAdapter(fastpath.enable_fast_path(target))
    d = CausalLMAdapter(fastpath.enable_fast_path(draft), out_vocab=t.vocab)
    assert t.model.lm_head.amx == amx
    ref_model = reference_model(tiny_pair(dtype=torch.bfloat16)[0])
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
    monkeypatch.setattr(panel, "cpu", lambda: ("old cpu", {"avx2", "fma"}))
    monkeypatch.setattr(panel, "_state", {})
    target, _, _ = tiny_pair(dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="mars_bench.models.fastpath"):
        model = fastpath.enable_fast_path(target)
    lines = [r.getMessage() for r in caplog.records if "bf16 fast path unavailable" in r.getMessage()]
    assert len(lines) == 1 and "lacks AVX-512F" in lines[0]
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
