"""A regular install carries what kappa reads at run time: pipelines file, DAGs, rulesets."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from orchestrator.core import resources
from orchestrator.core.pipelines import load_pipelines
from tests.wheel import build_wheel

ROOT = Path(__file__).resolve().parents[3]


def test_a_checkout_reads_deploy_and_dags_in_place():
    assert not (ROOT / "orchestrator" / "_data").exists(), "orchestrator/_data is made by the build, not kept"
    assert resources.default_pipelines_file() == ROOT / "deploy" / "pipelines.toml"
    assert resources.dags_folder() == ROOT / "dags"


def test_an_install_reads_the_shipped_copies(tmp_path, monkeypatch):
    (tmp_path / "dags").mkdir()
    (tmp_path / "pipelines.toml").write_text("")
    (tmp_path / "jars" / "kafka").mkdir(parents=True)
    (tmp_path / "jars" / "kafka" / "pom.xml").write_text("<project/>")
    monkeypatch.setattr(resources, "PACKAGE_DATA", tmp_path)
    assert resources.default_pipelines_file() == tmp_path / "pipelines.toml"
    assert resources.dags_folder() == tmp_path / "dags"
    assert resources.jars_pom("kafka") == tmp_path / "jars" / "kafka" / "pom.xml"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """A wheel built from a copy of the checkout."""
    built = build_wheel(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel"))
    return zipfile.ZipFile(built)


def test_the_wheel_ships_the_pipelines_file_the_dags_and_the_rulesets(wheel):
    names = set(wheel.namelist())
    assert wheel.read("orchestrator/_data/pipelines.toml") == (ROOT / "deploy" / "pipelines.toml").read_bytes()
    dags = sorted(p.name for p in (ROOT / "dags").glob("*.py"))
    assert dags and sorted(n.rpartition("/")[2] for n in names if n.startswith("orchestrator/_data/dags/")) == dags
    rules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "jobs" / "rules").rglob("*.toml")}
    assert rules and rules <= names
    jobs = {f"jobs/{spec.job}.py" for spec in load_pipelines(ROOT / "deploy" / "pipelines.toml").values()}
    assert jobs <= names
    poms = {p.parent.name for p in (ROOT / "deploy" / "jars").glob("*/pom.xml")}
    assert poms == {"kafka", "spark"}
    for name in poms:   # a regular install fetches the same JARs: `python -m orchestrator.core.jars fetch`
        assert wheel.read(f"orchestrator/_data/jars/{name}/pom.xml") == (ROOT / "deploy" / "jars" / name / "pom.xml").read_bytes()
