"""The committed serving benchmarks (``results/bench/serve_<pair>_<task>.md``) regenerate from their packed runs
(``serve_<pair>_<task>.runs.tar.xz``: the run directories ``scripts/bench_serve.py`` wrote): the tables
``report/serving.py`` renders from the unpacked records equal the committed file, so every number docs/results.md
copies from it comes from records. Default tier, no vLLM."""
import tarfile
from pathlib import Path

import pytest

from mars_bench.report import serving

from .conftest import ROOT

PACKS = sorted((ROOT / "results" / "bench").glob("serve_*.runs.tar.xz"))


@pytest.mark.parametrize("pack", PACKS, ids=[p.name for p in PACKS])
def test_the_served_tables_regenerate_from_their_records(pack, tmp_path):
    with tarfile.open(pack) as tar:
        tar.extractall(tmp_path, filter="data")
    df = serving.rows(serving.load(tmp_path))
    assert not df.empty and set(df["rounds"]) == {3}
    committed = pack.with_name(pack.name.removesuffix(".runs.tar.xz") + ".md").read_text()
    assert serving.render(df) == committed


def test_a_serving_pack_is_committed():
    assert PACKS, "no results/bench/serve_*.runs.tar.xz"
