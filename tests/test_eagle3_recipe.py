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


def test_an_exported_head_is_kept_and_anything_else_resumes(tmp_path, monkeypatch):
    """A rerun of a recipe whose head is exported (recipe.json equal, sha256 matching) returns it untouched; a head
    whose bytes or recipe differ, or no head, goes through the stages again (each resumes its own work)."""
    import hashlib
    import json

    recipe = R.Recipe(str(tmp_path / "target"), str(tmp_path / "work"), layer_ids=(1, 2, 3))
    ran = []
    monkeypatch.setattr(R, "corpus", lambda *a: ran.append("corpus") or [[1, 2]])
    monkeypatch.setattr(R, "features", lambda *a: ran.append("features"))
    monkeypatch.setattr(R, "dataset", lambda *a: ran.append("dataset"))
    monkeypatch.setattr(R, "train", lambda *a: ran.append("train"))
    monkeypatch.setattr(R, "export", lambda *a: ran.append("export") or head)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)
    head = tmp_path / "work" / "head"
    R.run(recipe)
    assert ran == ["corpus", "features", "dataset", "train", "export"]      # nothing there: every stage
    head.mkdir(parents=True)
    (head / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "work" / "head.sha256").write_text(hashlib.sha256(b"weights").hexdigest() + "  head/model.safetensors\n")
    ran.clear()
    assert R.run(recipe) == head and ran == []                                   # kept
    (head / "model.safetensors").write_bytes(b"other")
    R.run(recipe)
    assert ran[0] == "corpus"                                                    # its bytes differ: run again
    (head / "model.safetensors").write_bytes(b"weights")
    ran.clear()
    R.run(R.Recipe(str(tmp_path / "target"), str(tmp_path / "work"), layer_ids=(1, 2, 3), lr=5e-4))
    assert ran[0] == "corpus"                                                    # another recipe: run again
    assert json.loads((tmp_path / "work" / "recipe.json").read_text())["lr"] == 5e-4
