"""`make bench`'s llama.cpp section (scripts/bench_llamacpp.py) on the tiny pair, tiny sizes (marker ``llamacpp``):
one runner invocation per task, every row and ratio from its records."""
import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.llamacpp

ROWS = ["ar", "sd k=6", "mars k=8 θ=0.9", "ar (llama.cpp)", "sd k=6 (llama.cpp)", "sd k≤16 p_min=0.75 (llama.cpp)"]


def test_the_script_puts_both_engines_in_one_table_with_paired_ratios(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "scripts/bench_llamacpp.py", "--model", "tiny", "--wmt19", "2", "--gsm8k",
                          "2", "--max-new-tokens", "12", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "out" / "llamacpp.json").read_text())
    rows = out["rows"]
    for task in ("wmt19_zh_en", "gsm8k"):
        mine = {r["row"]: r for r in rows if r["task"] == task}
        assert sorted(mine) == sorted(ROWS) and all(r["n"] == 2 for r in mine.values())
        assert mine["ar"]["vs_native_ar"] == pytest.approx(1.0) and mine["ar (llama.cpp)"]["vs_llama_ar"] == pytest.approx(1.0)
        for r in mine.values():
            assert r["vs_native_ar_lo"] <= r["vs_native_ar"] <= r["vs_native_ar_hi"] or r["row"] == "ar"
            assert r["vs_llama_ar_lo"] <= r["vs_llama_ar"] <= r["vs_llama_ar_hi"] or r["row"] == "ar (llama.cpp)"
        # a greedy lossless row has its engine's ar tokens
        assert mine["sd k=6"]["same_as_native_ar"] == 2 and mine["sd k=6 (llama.cpp)"]["same_as_llama_ar"] == 2
        # ratios of summed rates on the same samples compose: mars / llama.cpp sd = (mars / ar) / (llama.cpp sd / ar)
        heads = {h["ratio"]: h for h in out["headlines"] if h["task"] == task}
        mars_over = heads["mars k=8 θ=0.9 / sd k=6 (llama.cpp)"]
        assert mars_over["n"] == 2 and mars_over["lo"] <= mars_over["value"] <= mars_over["hi"]
        assert mars_over["value"] == pytest.approx(mine["mars k=8 θ=0.9"]["vs_native_ar"]
                                                   / mine["sd k=6 (llama.cpp)"]["vs_native_ar"])
    md = (tmp_path / "out" / "llamacpp.md").read_text()
    assert "llama-cpp-python 0.3" in md and "mars k=8 θ=0.9 / sd k=6 (llama.cpp)" in md
