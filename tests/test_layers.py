"""The package's import graph: no cycle between modules and no import from a lower layer up, lazy imports inside
functions included. mars_bench/ holds packages only, each a layer of ``scripts/layers.py`` LAYERS (the one list);
a new package is placed there, or this fails. docs/architecture.md's generated block is current."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("layers", ROOT / "scripts" / "layers.py")
L = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(L)
PKG = L.PKG

# Upward imports still to remove (none left: listed here, one by one, when one is known).
KNOWN_UP: set[str] = set()
# Lazy imports that close a cycle inside one layer, still to remove (none left: listed here when one is known).
KNOWN_CYCLE: set[str] = set()


def test_no_import_from_a_lower_layer_up():
    mods = L.modules()
    up = sorted(f"{a} -> {b}" for a, bs in L.edges(mods).items() for b in bs if L.layer(b) > L.layer(a))
    assert set(up) >= KNOWN_UP, f"gone, remove from KNOWN_UP: {sorted(KNOWN_UP - set(up))}"
    up = [e for e in up if e not in KNOWN_UP]
    assert not up, "imports from a lower layer up:\n" + "\n".join(up)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle():
    edges = {a: {b for b in bs if f"{a} -> {b}" not in KNOWN_UP | KNOWN_CYCLE} for a, bs in L.edges(L.modules()).items()}
    cycles = _cycles(edges)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path):
    """The checks above can fail: a planted lower -> upper import and a planted cycle are found."""
    mods = {"mars_bench.decode.x": tmp_path / "x.py", "mars_bench.decode.y": tmp_path / "y.py",
            "mars_bench.run.runner": tmp_path / "runner.py"}
    (tmp_path / "x.py").write_text("from . import y\n")
    (tmp_path / "y.py").write_text("def f():\n    from ..run.runner import run\n    from .x import g\n")
    (tmp_path / "runner.py").write_text("")
    edges = L.edges(mods)
    assert edges["mars_bench.decode.x"] == {"mars_bench.decode.y"}
    assert edges["mars_bench.decode.y"] == {"mars_bench.run.runner", "mars_bench.decode.x"}
    assert L.layer("mars_bench.decode.y") < L.layer("mars_bench.run.runner")
    assert _cycles(edges) == [["mars_bench.decode.x", "mars_bench.decode.y"]]


def test_mars_bench_holds_packages_only():
    """The tree shows the layers: no flat module beside the packages, and every package is a layer."""
    flat = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert not flat, f"modules outside a package: {flat}; place each in the package of its layer"
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    layered = {name for name, _ in L.LAYERS}
    assert packages == layered, f"packages not in LAYERS: {sorted(packages - layered)}; in LAYERS, no package: " \
                                f"{sorted(layered - packages)}"


def test_architecture_doc_block_is_current():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert L.replace_block(text, L.block()) == text, \
        "docs/architecture.md's layer block is stale: python scripts/layers.py --write docs/architecture.md"
