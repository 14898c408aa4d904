"""The project `kappa init` writes: its own test of the job passes in a pytest of its own, in a local
Spark session, with kappa's helpers (`jobs.lib.testing`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

pytestmark = pytest.mark.integration


def test_the_new_project_s_own_test_passes(tmp_path):
    """The generated test runs the job in a local Spark session with kappa's helpers (jobs.lib.testing)."""
    root = tmp_path / "p"
    assert CliRunner().invoke(app, ["init", str(root)]).exit_code == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=root,
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
