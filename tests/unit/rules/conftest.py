"""Fixtures of the rules tests: a clean environment, a kappa home with the repo's pipelines file
(SQLite registry, no broker, no Spark), and `kappa` invoked in-process on it."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner


@pytest.fixture
def home(tmp_path, monkeypatch):
    for var in list(os.environ):
        if var.startswith("KAPPA_") or var == "AIRFLOW_CTX_DAG_ID":
            monkeypatch.delenv(var)
    return tmp_path / "home"


@pytest.fixture
def k(home):
    from orchestrator.context import Kappa
    from orchestrator.core.settings import resolve_settings

    kk = Kappa(resolve_settings(home=str(home), env={}))
    yield kk
    kk.close()


@pytest.fixture
def run(home):
    """`kappa --home <home> ARGS...` in-process; click's Result with stdout and stderr apart."""
    from orchestrator.cli import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["--home", str(home), *args], catch_exceptions=False)
