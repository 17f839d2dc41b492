"""The Hydra entry end to end on model=tiny, the audit trail, and bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from mars_bench.config import schema as C
from mars_bench.base.errors import ConfigError
from mars_bench.config.validation import validate
from mars_bench.run import runner as R
from mars_bench.models import fastpath
from mars_bench.models.pairs import TokenizerMismatch, check_tokenizers
from mars_bench.models.tiny import tiny_pair
from mars_bench.decode.rules import top2

from .conftest import ROOT, data_dir

C.register()


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def tiny_cfg(tmp, *extra):
    return cfg_of("model=tiny", f"results_dir={tmp}", f"data_dir={data_dir()}", "progress=false",
                  "max_new_tokens=24", *extra)


def test_default_config_is_the_embedded_pair():
    cfg = cfg_of()
    assert cfg.model.source == "embedded" and cfg.model.target == "qwen2.5-coder-1.5b-instruct"
    validate(cfg)


@pytest.mark.parametrize("override,needle", [
    ("method.theta=0", "method.theta=0"), ("method.theta=1.5", "method.theta=1.5"),
    ("method.theta=-0.1", "method.theta=-0.1"), ("method.k=0", "method.k=0"),
    ("max_new_tokens=0", "max_new_tokens=0"), ("method.name=beam", "method.name='beam'"),
    ("rule.name=fuzzy", "rule='fuzzy'"), ("rule.theta=2", "rule.theta=2"),
    ("rule.top_k=3", "rule.top_k is not a setting of rule mars"), ("top_p=0", "top_p=0"),
    ("temperature=-1", "temperature=-1"), ("method.nonpositive_top1=abs", "'abs'"),
    ("model.fast_path=panel", "model.fast_path='panel'"),
])
def test_bad_values_one_line_error(tmp_path, override, needle):
    cfg = tiny_cfg(tmp_path / "r", override)
    with pytest.raises(ConfigError) as e:
        R.prepare(cfg)
    msg = str(e.value)
    assert needle in msg and "allowed" in msg and "\n" not in msg
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("override", ["method.theta=abc", "rule.theta=abc", "rule.theta=nan"])
def test_theta_not_a_number_is_refused(override):
    """Rule settings are typed by their registration (mars_bench/decode/rules), so the check is ours."""
    with pytest.raises(ConfigError, match=r"theta=.*; allowed: a number in \(0, 1\]"):
        R.prepare(tiny_cfg("/nonexistent", override))


def test_unknown_key_fails_loudly():
    with pytest.raises(Exception, match="thetta"):
        tiny_cfg("/nonexistent", "method.thetta=0.5")
    with pytest.raises(ConfigError, match="unknown key method.thetta; allowed: name, k"):
        validate(tiny_cfg("/nonexistent", "+method.thetta=0.5"))


def _save_tiny(tmp, mutate_vocab=False):
    from mars_bench.models.tiny import tiny_pair

    target, _, tok = tiny_pair()
    target.save_pretrained(tmp)
    if mutate_vocab:   # swap two ids: same size, different ids
        data = json.loads(tok.backend_tokenizer.to_str())
        vocab = data["model"]["vocab"]
        a, b = list(vocab)[:2]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)),
                                      eos_token="<|im_end|>", chat_template=tok.chat_template)
    tok.save_pretrained(tmp)
    return str(tmp)


def test_draft_with_other_tokenizer_fails_before_models_load(tmp_path, monkeypatch):
    target = _save_tiny(tmp_path / "t")
    draft = _save_tiny(tmp_path / "d", mutate_vocab=True)
    import transformers

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the tokenizer check")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    cfg = tiny_cfg(tmp_path / "r", "model.source=hf", f"model.target={target}", f"model.draft={draft}",
                   "model.name=mismatch")
    with pytest.raises(TokenizerMismatch) as e:
        R.run(cfg)
    assert "draft tokenizer differs" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "r").exists()


def test_padded_draft_embeddings_are_fine(tiny):
    target, draft, tok = tiny
    assert draft.vocab > target.vocab and draft.out_vocab == target.vocab
    check_tokenizers(tok, tok)


def _fresh_logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()


def test_end_to_end_audit_and_theta_monotonicity(tmp_path):
    relaxed, summaries = [], {}
    for theta in (1.0, 0.95, 0.9, 0.8, 0.6):
        cfg = tiny_cfg(tmp_path, "method=mars", f"method.theta={theta}", "limit=12")
        summaries[theta] = R.run(cfg)
        relaxed.append(summaries[theta]["totals"]["n_relaxed"])
    assert relaxed[0] == 0 and relaxed[-1] > 0
    assert all(a <= b for a, b in zip(relaxed, relaxed[1:])), relaxed
    # every relaxed acceptance satisfies the rule, checked against a fresh target forward
    from mars_bench.models.pairs import load_pair

    cfg = tiny_cfg(tmp_path, "method=mars", "method.theta=0.8", "limit=12")
    pair = load_pair(cfg.model)
    run_dir = Path(summaries[0.8]["run_dir"])
    checked = 0
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for turn in rec["turns"]:
            prompt = pair.tokenizer.apply_chat_template(
                [{"role": "user", "content": _prompt_text(rec["id"])}], add_generation_prompt=True,
                return_dict=False)
            for r in turn["relaxed"]:
                z = _fresh_logits(pair.target.model, prompt + turn["output_ids"][: r["pos"]])
                z1, z2, t1, t2 = (x.item() for x in top2(z))
                assert r["draft"] == t2 == r["top2"] and t1 == r["top1"] and r["draft"] != t1
                assert z1 > 0 and z2 / z1 > 0.8
                assert abs(z1 - r["z1"]) < 1e-3 and abs(z2 - r["z2"]) < 1e-3
                assert turn["output_ids"][r["pos"]] == r["draft"]
                checked += 1
    assert checked == summaries[0.8]["totals"]["n_relaxed"] > 0


def _prompt_text(sample_id):
    from mars_bench.tasks import get_task

    samples = get_task("prompts").load(data_dir())
    return next(s.turns[0] for s in samples if s.id == sample_id)


def test_speedup_and_fidelity_when_ar_exists(tmp_path):
    R.run(tiny_cfg(tmp_path, "method=ar", "limit=4"))
    s = R.run(tiny_cfg(tmp_path, "method=sd", "limit=4"))
    assert s["speedup"]["n_common"] == 4 and s["speedup"]["speedup"] > 0
    assert s["fidelity"]["aggregate"]["pct_identical"] == 100.0   # greedy sd is lossless
    assert s["fast_kernel"] == ["off"]           # model=tiny: fast_path=auto leaves it off, and the record says so
    on = R.run(tiny_cfg(tmp_path / "on", "method=sd", "limit=2", "model.fast_path=on"))
    assert on["fast_kernel"] == [fastpath.kind(fastpath.enable_fast_path(tiny_pair()[0]))] != ["off"]
    mkl = R.run(tiny_cfg(tmp_path / "on", "method=sd", "limit=2", "model.fast_path=mkl"))
    assert mkl["fast_kernel"] == (["mkl-packed"] if fastpath.available() else ["off"])
    assert "_mklfast" in mkl["run_dir"] and "_mklfast" not in on["run_dir"]   # kernels never share a results dir
    m = R.run(tiny_cfg(tmp_path, "method=mars", "method.theta=0.6", "limit=4"))
    assert m["fidelity"]["aggregate"]["pct_identical"] < 100.0


def test_cli_subprocess_ok_and_bad_input(tmp_path):
    env = dict(os.environ, MARS_BENCH_DATA_DIR=str(data_dir()))
    base = [sys.executable, "-m", "mars_bench.cli", "model=tiny", f"results_dir={tmp_path}/r",
            "progress=false", "limit=2", "max_new_tokens=8"]
    ok = subprocess.run(base + ["method=sd", "method.k=3"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert list((tmp_path / "r").rglob("summary.json")) and list((tmp_path / "r").rglob("samples.jsonl"))
    bad = subprocess.run(base[:3] + [f"results_dir={tmp_path}/bad", "method.theta=2"], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "method.theta=2" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_a_bug_in_a_scorer_keeps_its_traceback(tmp_path, monkeypatch):
    """Only bad input becomes a one-line exit: a ValueError raised by a task's scorer is a bug and
    propagates with its traceback, while a bad value still ends with exit 2."""
    import traceback

    from mars_bench.cli import app as cli
    from mars_bench.tasks import get_task

    cls = type(get_task("prompts"))

    def broken(self, sample, outputs):
        raise ValueError("bug in a scorer")

    monkeypatch.setattr(cls, "score", broken)
    with pytest.raises(ValueError, match="bug in a scorer") as e:
        cli.run_or_exit(tiny_cfg(tmp_path / "r", "method=ar", "limit=1", "max_new_tokens=2"))
    assert any(f.name == "broken" for f in traceback.extract_tb(e.value.__traceback__))
    with pytest.raises(SystemExit) as bad:
        cli.run_or_exit(tiny_cfg(tmp_path / "r", "method.k=0"))
    assert bad.value.code == 2
