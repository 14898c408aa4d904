"""The package layout issue 7 set: no import cycles, modules of a readable size, jobs found by place;
and issue 31's: imports go down the layers (LAYERS), never up, and no module imports another's private name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("orchestrator", "jobs")
#: Modules allowed over MAX_LINES, each with the reason splitting it would hurt the reader.
LONG_MODULES: dict[str, str] = {
    "orchestrator.registry.store": "the Registry class: one flip's transaction (lease check, both versions' states, "
                                   "the watch's end, audit) reads on one page; its mixins reached into each "
                                   "other's private methods (issue 31)",
}
MAX_LINES = 550

#: The layers of kappa, bottom to top; the packages of one layer side by side. A module's layer is its
#: first package under orchestrator (orchestrator.core.settings -> core, orchestrator.serving -> serving),
#: `jobs` for anything under jobs/, `dags` for the DAG files; `orchestrator` is the top-level package
#: module. A module imports from its own layer's package or from lower layers, never from a higher one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("registry", "jobs"),
    ("context",),
    ("jobctl", "observe", "serving"),
    ("lifecycle",),
    ("airflow",),
    ("dev",),
    ("cli",),
    ("orchestrator", "dags"),
)
#: Packages of one layer that may import each other: jobctl, observe and serving each read what the others
#: know about a version (observe.metrics takes a job's rejects from jobctl.health), so an import between them is fine
#: as long as the packages do not import each other both ways (no cycle between the packages, even when the
#: modules make none). Any other two packages of one layer (registry and jobs) are independent: no imports.
PEERS = frozenset({"jobctl", "observe", "serving"})
#: Where the layer check looks: the DAG files too (they sit on top; nothing may import them).
LAYERED = (*PACKAGES, "dags")


def _modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _from_base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` in module `name` (file `path`) imports from."""
    base = node.module or ""
    if node.level:
        anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    return base


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ours that `name` imports anywhere in its body (lazy imports, and those under
    `if TYPE_CHECKING:`, count too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(name, path, node)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            # `import a.b.c` imports a.b.c; count the deepest module of ours it names.
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    mods = _modules(packages)
    known = set(mods)
    graph = {m: _imports(m, p, known) for m, p in mods.items()}
    # A package's __init__ that only re-exports is not a dependency of its own submodules.
    for m in graph:
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_is_read_from_the_tree():
    graph = _graph()
    assert "orchestrator.core.settings" in graph
    assert "orchestrator.core.exceptions" in graph["orchestrator.core.settings"]


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles (lazy imports count): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "orchestrator" or len(parts) == 1:
        return parts[0]
    return parts[1]


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of `graph` that goes up a layer, or sideways where LAYERS and PEERS do not allow it."""
    rank = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
    out: list[str] = []
    peer_edges: dict[tuple[str, str], list[str]] = {}
    for m in sorted(graph):
        a = _layer_of(m)
        if a not in rank:
            out.append(f"{m}: its package {a} is in no layer; add it to LAYERS")
            continue
        for d in sorted(graph[m]):
            b = _layer_of(d)
            if b == a or b not in rank:
                continue    # its own package; a package in no layer is reported as an importer
            if rank[b] > rank[a]:
                out.append(f"{m} ({a}) imports {d} ({b}), a higher layer")
            elif rank[b] == rank[a]:
                if a in PEERS and b in PEERS:
                    peer_edges.setdefault((a, b), []).append(f"{m} -> {d}")
                else:
                    out.append(f"{m} ({a}) imports {d} ({b}), another package of its layer")
    packages: dict[str, set[str]] = {}
    for a, b in peer_edges:
        packages.setdefault(a, set()).add(b)
    for cycle in _cycles(packages):
        edges = [e for (a, b), es in sorted(peer_edges.items()) if a in cycle and b in cycle for e in es]
        out.append(f"packages {' <-> '.join(cycle)} of one layer import each other: {', '.join(edges)}")
    return out


def test_imports_go_down_the_layers():
    violations = _layer_violations(_graph(LAYERED))
    assert violations == [], ("imports against the layers (LAYERS, bottom to top: "
                              + " < ".join(", ".join(layer) for layer in LAYERS) + "):\n"
                              + "\n".join(violations))


def test_layer_checker_finds_violations():
    graph = {
        "orchestrator.core.settings": {"orchestrator.registry.engine", "orchestrator.core.secrets"},
        "orchestrator.registry.store": {"jobs.lib.rules", "orchestrator.core.states"},
        "orchestrator.observe.lag": {"orchestrator.jobctl.health", "orchestrator.core.states"},
        "orchestrator.jobctl.launch": {"orchestrator.observe.render"},
        "orchestrator.serving": {"orchestrator.jobctl.health", "orchestrator.context.kappa"},
        "orchestrator.cli.app": {"orchestrator.dev.up", "orchestrator.core.settings"},
        "orchestrator.gadgets.x": {"orchestrator.core.settings"},
        "jobs.run": {"orchestrator"},
        "dags.kappa_monitor": {"orchestrator.airflow.tasks"},
    }
    assert _layer_violations(graph) == [
        "jobs.run (jobs) imports orchestrator (orchestrator), a higher layer",
        "orchestrator.core.settings (core) imports orchestrator.registry.engine (registry), a higher layer",
        "orchestrator.gadgets.x: its package gadgets is in no layer; add it to LAYERS",
        "orchestrator.registry.store (registry) imports jobs.lib.rules (jobs), another package of its layer",
        "packages jobctl <-> observe of one layer import each other: "
        "orchestrator.jobctl.launch -> orchestrator.observe.render, "
        "orchestrator.observe.lag -> orchestrator.jobctl.health",
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` of an attribute chain on a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _private_uses(name: str, path: Path, known: set[str]) -> list[str]:
    """Private names of other modules that module `name` imports (`from x import _y`, any module `x`) or
    reaches through a module of ours it imported (`import x` ... `x._y`, `from p import x` ... `x._y`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[str] = []
    bound: dict[str, str] = {}   # a name this module binds to a module of ours -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _from_base(name, path, node)
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
                if _private(a.name) and base != name:
                    out.append(f"{name} imports {a.name} from {base}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in known:
                    bound[a.asname] = a.name
                elif not a.asname:
                    top = a.name.split(".")[0]
                    bound.setdefault(top, top)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        owner = _dotted(node.value)
        if owner is None:
            continue
        head, _, rest = owner.partition(".")
        if head not in bound:
            continue
        owner = ".".join([bound[head], *([rest] if rest else [])])
        if owner in known and owner != name:
            out.append(f"{name} uses {node.attr} of {owner}")
    return out


def test_no_module_imports_a_private_name_of_another():
    mods = _modules(LAYERED)
    known = set(mods)
    found = sorted({v for m, p in mods.items() for v in _private_uses(m, p, known)})
    assert found == [], ("private names used outside their module (make them public, or move the code that "
                         "needs them into that module):\n" + "\n".join(found))


def test_private_name_finder_finds_them(tmp_path):
    src = tmp_path / "b.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "from pkg.a import _helper, public, __version__\n"
                   "from pkg import a as mod\n"
                   "import pkg.a\n"
                   "if TYPE_CHECKING:\n"
                   "    from pkg.a import _Hidden\n"
                   "from pkg.b import _mine\n"
                   "def f(obj):\n"
                   "    return mod._kappa(), pkg.a._other, obj._fine, mod.__name__\n")
    assert sorted(_private_uses("pkg.b", src, {"pkg", "pkg.a", "pkg.b"})) == [
        "pkg.b imports _Hidden from pkg.a",
        "pkg.b imports _helper from pkg.a",
        "pkg.b uses _kappa of pkg.a",
        "pkg.b uses _other of pkg.a",
    ]


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_size(name):
    lines = len(_modules()[name].read_text(encoding="utf-8").splitlines())
    if name in LONG_MODULES:
        return
    assert lines <= MAX_LINES, (f"{name} has {lines} lines; split it along its seams, or list it in "
                                f"LONG_MODULES with the reason splitting would hurt the reader")


def test_jobs_are_the_modules_directly_in_jobs():
    """kappa's own jobs are the modules in jobs/ (besides the runner, jobs/run.py), each a shipped pipeline's."""
    from orchestrator.core.pipelines import jobs_directory, load_pipelines
    from orchestrator.jobctl.jobcheck import check_job_exists

    jobs_dir = jobs_directory()
    assert jobs_dir == ROOT / "jobs"
    jobs = sorted(p.stem for p in jobs_dir.glob("*.py") if not p.stem.startswith("_") and p.stem != "run")
    declared = load_pipelines(ROOT / "deploy" / "pipelines.toml")
    assert sorted({s.job for s in declared.values()}) == jobs
    for spec in declared.values():
        assert check_job_exists(spec) == f"jobs.{spec.job}:transform"


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (rootdir-relative, no packages): two files with one
    name stop the whole run at collection ("import file mismatch"), as happened twice."""
    tests = Path(__file__).resolve().parents[2]
    seen: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(tests)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each: {clashes}"
