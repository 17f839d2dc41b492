"""A new user without local data: public copies are fetched into the user cache, verified (sha256, rows) and
reused; a bad download is one line and is not cached; ``MARS_BENCH_DATA_DIR`` still wins.

The download function is a stand-in serving the bytes of the offline copies (no network here): the seam is
``Task.download`` (url -> bytes)."""
import gzip
import hashlib

import pytest

from mars_bench.tasks import DataError, get_task
from mars_bench.tasks import data as D

from .conftest import data_dir

# the raw-file URL per data file must name the MANIFEST's repository and pinned commit
MANIFEST_COMMITS = {"gsm8k/test.jsonl": ("openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c"),
                    "humaneval/HumanEval.jsonl.gz": ("openai/human-eval", "6d43fb980f9fee3c892a914eda09951f772ad10d"),
                    "mt_bench/question.jsonl": ("lm-sys/FastChat", "0e6d3e4beaab66f4d3f93db72541a4abab8af28d"),
                    "wmt19_zh_en/src.zh": ("Helsinki-NLP/OPUS-MT-testsets",
                                           "ac0f19c0be3cb4e0d9450fcb2d7a9847c4bdd180")}


class Server:
    """Serves the offline copy of each PUBLIC file by its URL, counting calls; ``corrupt`` flips one byte."""

    def __init__(self, corrupt=False):
        self.by_url = {f.url: rel for rel, f in D.PUBLIC.items()}
        self.calls, self.corrupt = [], corrupt

    def __call__(self, url):
        self.calls.append(url)
        blob = (data_dir() / self.by_url[url]).read_bytes()
        return blob[:100] + bytes([blob[100] ^ 1]) + blob[101:] if self.corrupt else blob


@pytest.fixture
def new_user(tmp_path, monkeypatch):
    """No MARS_BENCH_DATA_DIR, no ../shared beside the checkout, an empty user cache."""
    monkeypatch.delenv("MARS_BENCH_DATA_DIR", raising=False)
    monkeypatch.setenv("MARS_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "SIBLING_DATA", tmp_path / "no-shared-here")   # our own constant, not a library's
    return tmp_path / "cache" / "data"


def test_recorded_hashes_and_urls_match_the_manifest():
    manifest = (data_dir() / "MANIFEST.md").read_text()
    for rel, f in D.PUBLIC.items():
        assert f"`{rel}` | {f.rows}" in manifest and f.sha256 in manifest, rel
        assert D.sha256_file(data_dir() / rel) == f.sha256, rel
    for rel, (repo, commit) in MANIFEST_COMMITS.items():
        assert D.PUBLIC[rel].url.startswith(f"https://raw.githubusercontent.com/{repo}/{commit}/"), rel


@pytest.mark.parametrize("name", ["gsm8k", "humaneval", "mt_bench", "wmt19_zh_en"])
def test_fetch_verify_cache_then_reuse(new_user, name):
    task = get_task(name)
    task.download = server = Server()
    samples = task.load(None)
    assert len(samples) == {"gsm8k": 1319, "humaneval": 164, "mt_bench": 80, "wmt19_zh_en": 2000}[name]
    assert len(server.calls) == len(task.data_files)
    for rel in task.data_files:
        cached = new_user / rel
        assert cached.is_file() and D.sha256_file(cached) == D.PUBLIC[rel].sha256
        assert task.data_sha256(None)[rel] == D.PUBLIC[rel].sha256      # the summary records what was read
    again = get_task(name)
    again.download = server
    assert [s.id for s in again.load(None)] == [s.id for s in samples]
    assert len(server.calls) == len(task.data_files)                    # second load: from the cache


def test_corrupt_download_is_one_line_and_not_cached(new_user):
    task = get_task("humaneval")
    task.download = Server(corrupt=True)
    with pytest.raises(DataError) as e:
        task.load(None)
    msg = str(e.value)
    assert "\n" not in msg and "sha256" in msg and D.PUBLIC["humaneval/HumanEval.jsonl.gz"].sha256 in msg
    assert not (new_user / "humaneval" / "HumanEval.jsonl.gz").exists()


def test_right_hash_wrong_rows_is_refused(new_user, monkeypatch):
    """Row counts are checked on the download too (a record with a wrong count would be caught here)."""
    blob = gzip.compress(b'{"a": 1}\n')
    rec = D.PublicFile("https://example.invalid/x.jsonl.gz", hashlib.sha256(blob).hexdigest(), 164)
    monkeypatch.setitem(D.PUBLIC, "x/x.jsonl.gz", rec)
    with pytest.raises(DataError, match="1 rows, expected 164"):
        D.locate("x/x.jsonl.gz", None, download=lambda url: blob)


def test_tampered_cache_is_fetched_again(new_user):
    task = get_task("gsm8k")
    task.download = server = Server()
    task.load(None)
    cached = new_user / "gsm8k" / "test.jsonl"
    cached.write_bytes(cached.read_bytes()[:-10])
    task.load(None)
    assert len(server.calls) == 2 and D.sha256_file(cached) == D.PUBLIC["gsm8k/test.jsonl"].sha256


def test_env_data_dir_wins_and_missing_dir_is_one_line(new_user, monkeypatch, tmp_path):
    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(data_dir()))
    task = get_task("gsm8k")
    task.download = server = Server()
    assert len(task.load(None)) == 1319 and server.calls == []     # (the CLI puts the env over data_dir)
    assert task.data_path(None, "gsm8k/test.jsonl") == data_dir() / "gsm8k" / "test.jsonl"
    monkeypatch.setenv("MARS_BENCH_DATA_DIR", str(tmp_path / "typo"))
    with pytest.raises(DataError) as e:
        task.load(None)
    assert "\n" not in str(e.value) and str(tmp_path / "typo") in str(e.value) and "allowed" in str(e.value)


def test_default_data_dir_is_not_a_machine_layout():
    from mars_bench.config.schema import Config

    assert Config().data_dir is None     # null: sibling shared/data when it exists, else the user cache
