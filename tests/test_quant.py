"""Group-quantized draft kernels (mars_bench/models/quant.py): the kernel equals its float64 reference, a row's
result never depends on the other rows of a call, and a q4 / q8 / trimmed-vocabulary draft keeps greedy sd
token-identical to Hugging Face greedy decoding (the target decides)."""
import logging

import pytest
import torch

from mars_bench.config.spec import spec_of
from mars_bench.base.errors import ConfigError
from mars_bench.config import schema as C
from mars_bench.config.settings import draft_quant_of, method_of
from mars_bench.config.validation import validate
from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.models import panel, quant
from mars_bench.models.adapter import CausalLMAdapter
from mars_bench.models.pairs import draft_vocab_ids, trim_head
from mars_bench.models.tiny import tiny_pair, tiny_tokenizer

from .conftest import EOS, MAX_NEW
from .kernels import FAMILIES, family_params, use_family

needs_vnni = pytest.mark.skipif(not quant.available(), reason=f"no quant kernel here: {quant.unavailable()}")


@pytest.mark.parametrize("family", family_params())
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("out_f,in_f,bias", [(200, 96, True), (64, 256, False), (1000, 32, True)])
def test_kernel_equals_its_float64_reference(bits, out_f, in_f, bias, family, monkeypatch):
    use_family(monkeypatch, family)
    torch.manual_seed(bits + out_f)
    lin = torch.nn.Linear(in_f, out_f, bias=bias)
    ql = quant.QuantLinear(lin, bits)
    assert ql.kernel == f"q{bits}g32-" + ("avx2" if family == "avx2" else quant.kind())
    pad = ql.n_pad - out_f
    w = torch.cat([lin.weight, lin.weight.new_zeros(pad, in_f)])
    codes, scales = quant.quantize(w, bits)
    b = None if not bias else torch.cat([lin.bias, lin.bias.new_zeros(pad)])
    for m in (1, 2, 3, 4, 5, 9):                      # whole chunks of 4 rows and ragged tails
        x = torch.randn(m, in_f)
        with torch.no_grad():
            y = ql(x)
            ref = quant.reference(x, codes, scales, bits, b)[:, :out_f]
        assert y.shape == (m, out_f)
        assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-6
        rel = (y - lin(x)).norm() / lin(x).norm()   # quantized: close to the float layer, not equal
        assert 1e-5 < rel < (0.15 if bits == 4 else 0.01), rel


@pytest.mark.parametrize("family", family_params())
@pytest.mark.parametrize("bits", [4, 8])
def test_rows_do_not_depend_on_the_other_rows_of_the_call(bits, family, monkeypatch):
    use_family(monkeypatch, family)
    torch.manual_seed(2)
    ql = quant.QuantLinear(torch.nn.Linear(192, 700), bits)
    x = torch.randn(9, 192)
    x[1] *= 40.0
    x[2] = x[2].abs() * 1e-3
    x[3] = 0.0                                          # an all-zero row (scale 0)
    with torch.no_grad():
        alone = torch.cat([ql(x[i:i + 1]) for i in range(9)])
        assert torch.equal(ql(x), alone)
        assert torch.equal(ql(x[[4, 1, 4]])[0], alone[4])
        assert torch.equal(ql(x.view(3, 3, 192)).view(9, 700), alone)
        torch.set_num_threads(1)
        try:
            assert torch.equal(ql(x), alone)            # nor on the thread count
        finally:
            torch.set_num_threads(C_THREADS)


C_THREADS = torch.get_num_threads()


@pytest.mark.parametrize("bits", [4, 8])
def test_the_avx2_and_vnni_kernels_give_equal_results(bits, monkeypatch):
    """Their layouts differ but the group sums are exact integers and the fp32 steps after them are the same."""
    if "avx512" not in FAMILIES or "avx512_vnni" not in panel.cpu()[1] or "avx2" not in FAMILIES:
        pytest.skip("needs both the AVX512-VNNI and the AVX2 kernel")
    torch.manual_seed(bits)
    lin, x = torch.nn.Linear(256, 96), torch.randn(7, 256)
    out = {}
    for family in ("avx512", "avx2"):
        use_family(monkeypatch, family)
        with torch.no_grad():
            out[quant.kind()] = quant.QuantLinear(lin, bits)(x)
    assert set(out) == {"vnni", "avx2"} and torch.equal(out["vnni"], out["avx2"])


def test_the_layouts_hold_every_code_once():
    codes = torch.arange(64 * 64, dtype=torch.int64).reshape(64, 64) % 251
    scales = torch.ones(64, 2, dtype=torch.float16)
    for layout in ("vnni", "avx2", "neon"):
        packed = quant.pack(codes.to(torch.uint8), scales, 8, layout)
        assert packed.shape == (2, 2, 1024 + 64)
        held = packed[..., :1024].flatten()
        if layout == "neon":                             # signed codes q = u - 128, as int8 bytes
            held = (held.view(torch.int8).to(torch.int64) + 128)
        assert sorted(held.tolist()) == sorted(codes.flatten().tolist())
    with pytest.raises(ValueError, match=r"^layout='sve'; allowed: vnni, avx2, neon$"):
        quant.pack(codes.to(torch.uint8), scales, 8, "sve")


def test_codes_span_their_range_and_scales_reproduce_the_weight():
    torch.manual_seed(3)
    w = torch.randn(64, 128)
    for bits, lo, hi, tol in ((4, 0, 15, 0.12), (8, 1, 255, 0.01)):
        codes, scales = quant.quantize(w, bits)
        assert codes.dtype == torch.uint8 and scales.dtype == torch.float16 and scales.shape == (64, 4)
        assert int(codes.min()) >= lo and int(codes.max()) <= hi
        off = 8 if bits == 4 else 128
        back = ((codes.float() - off).view(64, 4, 32) * scales.float().unsqueeze(-1)).view(64, 128)
        assert (back - w).norm() / w.norm() < tol


@needs_vnni
@pytest.mark.parametrize("scheme,vocab", [("q4", 0), ("q8", 0), ("q4", 128), (None, 128)])
def test_quantized_or_trimmed_draft_keeps_greedy_sd_lossless(scheme, vocab, prompt_ids, hf_reference):
    target, draft, tok = tiny_pair()
    t = CausalLMAdapter(target)
    keep = None
    if vocab:
        keep = draft_vocab_ids(tok, vocab, t.vocab)
        assert keep[:vocab].tolist() == list(range(vocab)) and EOS in keep.tolist()
        trim_head(draft, keep)
    if scheme:
        quant.quantize_model(draft, scheme)
        assert not any(type(m) is torch.nn.Linear for m in draft.modules())
    d = CausalLMAdapter(draft, out_vocab=t.vocab, vocab_ids=keep)
    z = d.forward(prompt_ids[0])
    assert z.shape[-1] == t.vocab
    if keep is not None:
        dropped = sorted(set(range(t.vocab)) - set(keep.tolist()))
        assert dropped and torch.isinf(z[:, dropped]).all() and torch.isfinite(z[:, keep]).all()
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=(EOS,))
    for k in (2, 5):
        for ids, ref in zip(prompt_ids, hf_reference):
            assert generate(t, d, tok, ids, Method("sd", k=k), cfg).tokens == ref
            assert generate(t, d, tok, ids, Method("mars", k=k, rule="mars", rule_kwargs={"theta": 1.0}),
                            cfg).tokens == ref


def _cfg(**model):
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(C.Config)
    cfg.method.name = "sd"
    for key, value in model.items():
        cfg.model[key] = value
    return cfg


def test_config_names_the_scheme_and_trimmed_vocabulary_in_the_run_tag():
    from mars_bench.store.spec import RunSpec

    cfg = _cfg(draft_quant="q4", draft_vocab=32768)
    validate(cfg)
    tag = spec_of(cfg, 16).label
    want = "q4g32" if quant.available() else "int8row"
    assert f"-draft{want}-dvocab32768-" in tag
    assert "dvocab" not in spec_of(_cfg(draft_quant="q4"), 16).label
    for bad in (100, -1, 255):
        with pytest.raises(ConfigError, match=r"^model.draft_vocab=.*; allowed: 0 \(the full vocabulary\) or an "
                                                r"integer >= 256$"):
            validate(_cfg(draft_vocab=bad))
    with pytest.raises(ConfigError, match="allowed: 0 or 256 .. 258"):
        draft_vocab_ids(tiny_tokenizer(), 259, 259)


def test_without_vnni_q4_falls_back_to_int8_in_one_line_and_says_so(monkeypatch, caplog):
    from mars_bench.models import pairs
    from mars_bench.store.spec import RunSpec

    monkeypatch.setattr(quant, "_state", {"why": "CPU 'test' lacks avx512_vnni"})
    assert not quant.available()
    cfg = _cfg(draft_quant="q4")
    assert draft_quant_of(cfg, method_of(cfg)) == "int8row" and "-draftint8row-" in spec_of(cfg, 16).label
    with caplog.at_level(logging.WARNING):
        assert pairs._quantize_draft("q4") == "int8"
    assert [r.getMessage() for r in caplog.records] == [
        "model.draft_quant=q4 unavailable (CPU 'test' lacks avx512_vnni): the draft runs int8 (fbgemm)"]
    with pytest.raises(RuntimeError, match="quantized draft kernel unavailable: CPU 'test' lacks avx512_vnni"):
        quant.QuantLinear(torch.nn.Linear(32, 32), 4)
