"""`kappa airflow start | status | stop` for real, as separate processes, in a home of their own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.jobctl.process import is_ours
from tests.shell import users_env

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

COMPONENTS = {"api-server", "scheduler", "dag-processor", "triggerer"}


def kappa(home, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = users_env("AIRFLOW_")
    env["KAPPA_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_airflow_start_status_stop_through_the_cli(tmp_path):
    home = tmp_path / "home"
    started = kappa(home, "airflow", "start", "--json")
    assert started.returncode == 0, started.stderr
    stack = json.loads(started.stdout)
    pids, created = stack["pids"], stack["created"]
    try:
        assert set(pids) == COMPONENTS and stack["already_running"] is False
        assert stack["url"].startswith("http://127.0.0.1:")
        assert all(is_ours(pids[c], created[c]) for c in COMPONENTS), "every component runs after start"

        status = kappa(home, "airflow", "status", "--json")
        assert status.returncode == 0, status.stderr
        seen = json.loads(status.stdout)
        assert seen["running"] is True and seen["pids"] == pids
        assert seen["alive"] == {c: True for c in COMPONENTS}
    finally:
        stopped = kappa(home, "airflow", "stop", timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopped Airflow: ")
    assert set(stopped.stdout.split(": ", 1)[1].strip().split(", ")) == COMPONENTS
    assert not any(is_ours(pids[c], created[c]) for c in COMPONENTS), "no component outlives stop"

    after = json.loads(kappa(home, "airflow", "status", "--json").stdout)
    assert after["running"] is False
    again = kappa(home, "airflow", "stop")
    assert (again.returncode, again.stdout.strip()) == (0, "no Airflow runs for this kappa home")
