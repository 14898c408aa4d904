"""The catalogue of KAPPA_* variables (`orchestrator.core.envvars`) stays the one place they are named.

Every `KAPPA_...` name in the strings of orchestrator/, jobs/ and dags/ (code, messages, docstrings,
READMEs) is a catalogued variable, and code reads a variable through its constant, not by spelling
its name. `KAPPA_TEST_*` are the jobs' crash and pause hooks for tests, not product settings.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from orchestrator.core.envvars import CATALOGUE, SETTINGS_VARS

ROOT = Path(__file__).resolve().parents[3]
TREES = ("orchestrator", "jobs", "dags")
CATALOGUE_MODULE = "orchestrator/core/envvars.py"
TEXT_SUFFIXES = {".md", ".toml", ".txt", ".sh", ".yaml", ".yml", ".json", ".cfg", ".ini"}
NAME = re.compile(r"(?<![A-Za-z0-9_])KAPPA_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_])")
TEST_HOOK = "KAPPA_TEST_"


def _files() -> list[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and (p.suffix == ".py" or p.suffix in TEXT_SUFFIXES))


def _strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string in a module (f-string parts and docstrings too), but the names in
    `__all__` (Python names such as KAPPA_DAG_IDS, not variables)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exported: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                exported |= {id(c) for c in ast.walk(node.value)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exported]


def _texts(path: Path) -> list[tuple[int, str]]:
    if path.suffix == ".py":
        return _strings(path)
    return list(enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_kappa_name_in_the_tree_is_catalogued():
    missing = [f"{_rel(p)}:{line}: {name}" for p in _files() for line, text in _texts(p)
               for name in NAME.findall(text) if name not in CATALOGUE and not name.startswith(TEST_HOOK)]
    assert missing == [], ("KAPPA_* names that orchestrator/core/envvars.py does not catalogue (add them there, "
                           "with a one-line description): " + "; ".join(missing))


def test_code_reads_variables_through_the_catalogue_constants():
    spelled = [f"{_rel(p)}:{line}: {text!r}" for p in _files() if p.suffix == ".py" and _rel(p) != CATALOGUE_MODULE
               for line, text in _strings(p)
               if NAME.fullmatch(text) and not text.startswith(TEST_HOOK)]
    assert spelled == [], ("a variable's name spelled out instead of imported from orchestrator.core.envvars: "
                           + "; ".join(spelled))


def test_the_scan_sees_names_in_code_messages_and_docs():
    """The scan is not vacuous: it finds the reads, messages and READMEs it polices."""
    found = {name for p in _files() for _, text in _texts(p) for name in NAME.findall(text)}
    assert {"KAPPA_REGISTRY_URL", "KAPPA_AIRFLOW_POKE_SECONDS", "KAPPA_TEST_CRASH_AFTER_COMMIT"} <= found
    assert "KAPPA_DAG_IDS" not in found  # a Python name in __all__, not a variable


def test_catalogue_is_well_formed():
    for name, var in CATALOGUE.items():
        assert var.name == name and NAME.fullmatch(name) and not name.startswith(TEST_HOOK)
        assert var.description and "\n" not in var.description
    assert all(v.setting and v.default for v in SETTINGS_VARS)
