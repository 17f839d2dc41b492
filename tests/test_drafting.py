"""The drafting schemes' one declaration (decode/drafting.py, issue 31): a scheme declared there alone is
validated, named, loaded and drafted by config, tags, runner and the proposer factory, and no module that
decides drafting compares a scheme's name."""
import ast
import json
from dataclasses import fields
from pathlib import Path

import pytest

from mars_bench.config.spec import spec_of
from mars_bench.base.errors import ConfigError
from mars_bench.config import schema as C
from mars_bench.config.settings import draft_quant_of, method_of
from mars_bench.config.validation import validate
from mars_bench.run import runner as R
from mars_bench.decode import drafting
from mars_bench.decode.drafters import as_drafter
from mars_bench.decode.drafting import Head, Scheme
from mars_bench.decode.proposers.tree import TreeProposer
from mars_bench.store.spec import RunSpec, read_spec

from .conftest import ROOT
from .test_cli import tiny_cfg

PKG = ROOT / "mars_bench"


@pytest.fixture
def self_draft(monkeypatch):
    """A test-only scheme, declared only in drafting.SCHEMES: a "head" under model.eagle3 whose loader returns the
    target itself as a tree drafter (self-drafting). ``calls`` holds what the loader was given."""
    calls = []

    def load(path, target):
        calls.append(path)
        return as_drafter(target)

    scheme = Scheme("selfdraft", TreeProposer, head=Head("eagle3", load, "a test head: a directory"), tree=True)
    monkeypatch.setitem(drafting.SCHEMES, "selfdraft", scheme)
    return calls


def _head_dir(tmp_path) -> str:
    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes(b"\0" * 64)   # identity hashes it; the test loader never reads it
    return str(head)


def _cfg(tmp_path, *extra):
    cfg = tiny_cfg(tmp_path / "runs", "method=sd_tree", "task=gsm8k", "limit=2", "max_new_tokens=10", *extra)
    cfg.method.name = "selfdraft"
    return cfg


def test_a_scheme_declared_once_is_validated_and_named(tmp_path, self_draft):
    cfg = _cfg(tmp_path)
    with pytest.raises(ConfigError) as e:            # its head's model key, from the declaration
        validate(cfg)
    assert str(e.value) == "method.name=selfdraft needs model.eagle3 (a test head: a directory)"
    cfg.model.eagle3 = _head_dir(tmp_path)
    validate(cfg)
    assert draft_quant_of(cfg, method_of(cfg)) is None   # no draft LM: no draft quantization
    spec = spec_of(cfg, 10)
    assert (spec.scheme, spec.k, spec.tree, spec.p_min) == ("selfdraft", None, "d3-w3-t10", 0.0)
    assert list(spec.draft_model) == ["eagle3"] and spec.draft_model["eagle3"].startswith("dir:")
    assert spec.label.startswith("selfdraft-d3-w3-t10-") and RunSpec.parse(spec.label).tree == "d3-w3-t10"
    assert R._tokens_per_step(method_of(cfg)) == 10  # a tree: its size, not k + 1
    cfg.method.name = "nodraft"
    with pytest.raises(ConfigError, match="allowed: ar, sd, lookup, sd_tree, eagle3, selfdraft, mars"):
        validate(cfg)


def test_the_runner_loads_and_drafts_with_a_declared_head(tmp_path, self_draft):
    """The runner loads the declared head once (from model.<key>), the tree proposer drafts with it, and the
    greedy output is ar's (rule exact); records and summary carry the spec's scheme and k."""
    cfg = _cfg(tmp_path, f"model.eagle3={_head_dir(tmp_path)}")
    summary = R.run(cfg)
    assert self_draft == [cfg.model.eagle3]
    ar = R.run(tiny_cfg(tmp_path / "runs", "method=ar", "task=gsm8k", "limit=2", "max_new_tokens=10"))
    recs = [json.loads(x) for x in (Path(summary["run_dir"]) / "samples.jsonl").read_text().splitlines()]
    base = {r["id"]: r for r in map(json.loads, (Path(ar["run_dir"]) / "samples.jsonl").read_text().splitlines())}
    assert len(recs) == 2 and all(r["n_proposed"] > 0 for r in recs)   # the head drafted
    assert all(r["turns"][0]["output_ids"] == base[r["id"]]["turns"][0]["output_ids"] for r in recs)
    assert {(r["scheme"], r["k"]) for r in recs} == {("selfdraft", None)}
    assert (summary["scheme"], summary["k"], summary["lossless"]) == ("selfdraft", None, True)
    assert read_spec(summary["run_dir"]).scheme == "selfdraft"


def test_ar_records_and_summary_carry_the_specs_k(tmp_path):
    """k is the RunSpec's everywhere: None for ar (method.k = 4 is not ar's), k for a chain."""
    for method, k in (("ar", None), ("sd", 3)):
        s = R.run(tiny_cfg(tmp_path, f"method={method}", "method.k=3", "task=gsm8k", "limit=1", "max_new_tokens=6"))
        recs = [json.loads(x) for x in (Path(s["run_dir"]) / "samples.jsonl").read_text().splitlines()]
        assert s["k"] == k == read_spec(s["run_dir"]).k and {r["k"] for r in recs} == {k}


def test_the_report_reads_old_ar_records_that_carry_k():
    """Result trees written before: ar's records say k = 4; the report's k is the spec's (None for ar)."""
    from mars_bench.report import load_frames
    from mars_bench.report.columns import val

    fix = ROOT / "tests" / "fixtures" / "results"
    old_ar = fix / "worker0" / "toy-pair_fp32_cpu" / "gsm8k-v1" / "ar-T0-p1-n8-s0" / "samples.jsonl"
    assert '"method": "ar", "k": 4' in old_ar.read_text()
    runs = {r["tag"]: r for _, r in load_frames(fix).runs.iterrows()}
    assert val(runs["ar-T0-p1-n8-s0"], "k") is None and val(runs["sd-k2-T0-p1-n8-s0"], "k") == 2


def test_every_declaration_is_complete():
    """Each scheme has its conf/method/<name>.yaml; each head names a ModelConfig field; a half declaration fails."""
    method_files = {p.stem for p in (ROOT / "conf" / "method").glob("*.yaml")}
    assert set(drafting.SCHEMES) <= method_files
    model_keys = {f.name for f in fields(C.ModelConfig)}
    assert all(s.head.key in model_keys for s in drafting.SCHEMES.values() if s.head)
    with pytest.raises(ValueError, match="one of them"):
        Scheme("both", TreeProposer, draft_lm=True, head=Head("eagle3", None, "x"))
    with pytest.raises(ValueError, match="no proposer"):
        Scheme("none", None, draft_lm=True)


# Modules that still compare scheme names, and why (anything else deciding drafting reads decode/drafting.py).
NAMED = {"engines/vllm/engine.py": "maps each scheme onto vLLM's own speculative config (an engine's capability)",
         "report": "figures and tables name the paper's methods (presentation)"}


def _compares_a_scheme_name(path: Path) -> list[int]:
    names = set(drafting.SCHEMES) - {"ar"}   # ar is the baseline every run is measured against, by name

    def consts(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return {n.value}
        return {e.value for e in getattr(n, "elts", []) if isinstance(e, ast.Constant)}

    return [n.lineno for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Compare)
            and (consts(n.left).union(*map(consts, n.comparators)) & names)]


def test_no_module_outside_the_declarations_compares_a_scheme_name(tmp_path):
    found = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel != "decode/drafting.py" and not any(rel == k or rel.startswith(k + "/") for k in NAMED):
            found += [f"{rel}:{line}" for line in _compares_a_scheme_name(p)]
    assert not found, f"scheme names compared outside decode/drafting.py: {found}"
    planted = tmp_path / "x.py"                       # the check can fail
    planted.write_text('def f(m):\n    return m.name == "eagle3" or m.scheme in ("sd", "x")\n')
    assert _compares_a_scheme_name(planted) == [2, 2]


def test_a_job_resolves_its_method_once(tmp_path, monkeypatch):
    """Settings passed, not recomputed: one run resolves ``method_of`` once, in validation, which hands it to the
    job; the engine's checks, the RunSpec, the records' draft quantization and the summary take that one. Every
    module of the package that holds ``method_of`` is counted, so a new caller anywhere shows."""
    import sys

    from mars_bench.config import settings as decode_settings

    calls = []
    real = decode_settings.method_of

    def counted(cfg):
        calls.append(1)
        return real(cfg)

    holders = [m for name, m in list(sys.modules.items())
               if name.startswith("mars_bench.") and getattr(m, "method_of", None) is real]
    assert decode_settings in holders and len(holders) >= 2   # the definition and its callers
    for module in holders:
        monkeypatch.setattr(module, "method_of", counted)
    summary = R.run(tiny_cfg(tmp_path, "method=sd", "task=gsm8k", "limit=1", "max_new_tokens=6"))
    assert summary["draft_quant"] == "none" and len(calls) == 1, len(calls)
