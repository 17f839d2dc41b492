"""The package's import graph (issue 31): no cycle between modules and no import from a lower layer up, lazy
imports inside functions included. mars_bench/ holds packages only (its layers); a new package is placed in LAYERS,
or this fails."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mars_bench"

# Lowest first: the packages of mars_bench/, each a layer. A module may import its own package's modules (without a
# cycle) and any lower package's; the tree itself shows the layers (docs/architecture.md).
LAYERS = [
    {"base"},       # errors, file hashes, flock claims, deferred interrupts: no project imports
    {"decode"},     # the engine: one step, rules, proposers, trees; no Hydra, no files, no models/ (backends plug in)
    {"models"},     # backends (forward paths, kernels), loading, model identity
    {"tasks"},      # datasets, prompts, scoring
    {"stats"},      # intervals, tests, MDE: numbers in, numbers out
    {"store"},      # the run directory: spec, records, writer, summary, metrics, provenance, packs, reading runs
    {"config"},     # the schema, its checks, the settings a composed config resolves to (method, decode, spec)
    {"engines"},    # engines other than native, one package each (vllm/)
    {"report"},     # tables, figures, docs sections: reads store/ only
    {"run"},        # the runner, study mode, shards, SLURM, callbacks, W&B, the scripts' bench library
    {"cli", "__init__"},   # entry points: mars-bench, mars-bench-report, mars-bench-cache
]


# Upward imports still to remove (none left: listed here, one by one, when one is known).
KNOWN_UP: set[str] = set()
# Lazy imports that close a cycle inside one layer, still to remove (none left: listed here when one is known).
KNOWN_CYCLE: set[str] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                found = subs if len(subs) == len(node.names) else [target] + subs
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            edges[name] |= {t for t in found if t in mods and t != name}
    return edges


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for i, group in enumerate(LAYERS):
        if top in group:
            return i
    raise AssertionError(f"mars_bench.{top} is in no layer of tests/test_layers.py LAYERS; place it there")


def test_no_import_from_a_lower_layer_up():
    mods = _modules()
    up = sorted(f"{a} -> {b}" for a, bs in _edges(mods).items() for b in bs if _layer(b) > _layer(a))
    assert set(up) >= KNOWN_UP, f"gone, remove from KNOWN_UP: {sorted(KNOWN_UP - set(up))}"
    up = [e for e in up if e not in KNOWN_UP]
    assert not up, "imports from a lower layer up:\n" + "\n".join(up)


def test_no_import_cycle():
    mods = _modules()
    edges = {a: {b for b in bs if f"{a} -> {b}" not in KNOWN_UP | KNOWN_CYCLE} for a, bs in _edges(mods).items()}   # listed above
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

    for v in mods:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a planted lower -> upper import and a planted cycle are found."""
    mods = {"mars_bench.decode.x": tmp_path / "x.py", "mars_bench.decode.y": tmp_path / "y.py",
            "mars_bench.run.runner": tmp_path / "runner.py"}
    (tmp_path / "x.py").write_text("from . import y\n")
    (tmp_path / "y.py").write_text("def f():\n    from ..run.runner import run\n    from .x import g\n")
    (tmp_path / "runner.py").write_text("")
    edges = _edges(mods)
    assert edges["mars_bench.decode.x"] == {"mars_bench.decode.y"}
    assert edges["mars_bench.decode.y"] == {"mars_bench.run.runner", "mars_bench.decode.x"}
    assert _layer("mars_bench.decode.y") < _layer("mars_bench.run.runner")


def test_mars_bench_holds_packages_only():
    """The tree shows the layers: no flat module beside the packages, and every package is a layer."""
    flat = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert not flat, f"modules outside a package: {flat}; place each in the package of its layer"
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    layered = set().union(*LAYERS) - {"__init__"}
    assert packages == layered, f"packages not in LAYERS: {sorted(packages - layered)}; in LAYERS, no package: " \
                                f"{sorted(layered - packages)}"
