"""The EAGLE-3 recipe's corpus (mars_bench/run/eagle3_recipe.py): which files, in which order."""
import sysconfig

from mars_bench.run import eagle3_recipe as R


def _tree(root, files):
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("x = 1\n")


def test_corpus_files_take_packages_in_turn(tmp_path, monkeypatch):
    _tree(tmp_path, ["alpha/__init__.py", "alpha/b.py", "alpha/sub/c.py", "beta/__init__.py", "gamma.py",
                     "mars_bench/x.py", "lm_eval/y.py", "alpha-1.0.dist-info/METADATA"])
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": str(tmp_path)})
    got = [str(p.relative_to(tmp_path)) for p in R.corpus_files()]
    # first file of each package (sorted packages), then the second of each, ...; excluded packages left out
    assert got == ["alpha/__init__.py", "beta/__init__.py", "gamma.py", "alpha/b.py", "alpha/sub/c.py"]
    assert [str(p.relative_to(tmp_path)) for p in R.corpus_files(("alpha",))] == \
        ["alpha/__init__.py", "alpha/b.py", "alpha/sub/c.py"]
    assert R.corpus_files(("nothing",)) == []
