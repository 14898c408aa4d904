"""The package layout issue 7 set: no import cycles, modules of a readable size, jobs found by place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("orchestrator", "jobs")
#: Modules allowed over MAX_LINES, each with the reason splitting it would hurt the reader.
LONG_MODULES: dict[str, str] = {}
MAX_LINES = 550


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ours that `name` imports anywhere in its body (lazy imports count too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
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


def _graph() -> dict[str, set[str]]:
    mods = _modules()
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
