"""Fixtures of the CLI unit tests: a clean environment, a fresh kappa home, a runner, a seeded registry.

No services: the registry is SQLite in the test's home, no broker runs (commands that would
need one get unknown lag, which is what they must show then).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner


@pytest.fixture
def clean_env(monkeypatch):
    """No KAPPA_* variable of the machine leaks into a test."""
    for var in list(os.environ):
        if var.startswith("KAPPA_"):
            monkeypatch.delenv(var)


@pytest.fixture
def home(tmp_path, clean_env) -> Path:
    return tmp_path / "home"


@pytest.fixture
def run(home):
    """Invoke `kappa --home <home> ...` in-process; returns click's Result (stdout, stderr apart)."""
    from orchestrator.cli import app

    runner = CliRunner()

    def _run(*args: str, home_flag: bool = True):
        argv = (["--home", str(home)] if home_flag else []) + list(args)
        return runner.invoke(app, argv, catch_exceptions=False)

    return _run


@pytest.fixture
def kappa(home):
    from orchestrator.core.settings import resolve_settings
    from orchestrator.context import Kappa

    k = Kappa(resolve_settings(home=str(home), env={}))
    yield k
    k.close()


@pytest.fixture
def seeded(kappa):
    """Two stopped versions of `standardize` in the registry (no jobs, no tables)."""
    reg = kappa.registry
    for rules in ("v1", "v2"):
        rec = reg.allocate_version(
            "standardize", rules_version=rules, rules_hash=f"hash-{rules}", code_ref="test",
            table_path=str(Path(kappa.settings.warehouse) / "standardize" / "v{n}"),
            checkpoint_path=str(kappa.settings.state_dir / "standardize" / "v{n}" / "checkpoint"),
            group_id="kappa.standardize.v{n}", actor="seeder", reason=f"seed {rules}")
        reg.set_state("standardize", rec.version, "stopped")
    return kappa


@pytest.fixture(autouse=True)
def _quick_estimate(monkeypatch):
    """A deploy estimates its backfill from the broker's log offsets; where a test fakes the topic checks and no
    broker listens (127.0.0.1:9), that ask would wait its whole timeout before the estimate says unknown."""
    from orchestrator.observe import estimate

    monkeypatch.setattr(estimate, "ESTIMATE_TIMEOUT", 0.3)
    # the fake jobs' pid is this test process: a deploy would sample pytest's own CPU for a second
    monkeypatch.setattr(estimate, "running_cores", lambda records, seconds=None: (None, None))
