"""The terminal's background broker, found by later commands, and `deploy --dry-run` against it, each
command a separate `kappa` process. The workflow of deploy --wait, promote (--dry-run), a refused
stop, stop, rollback and history, from an installed kappa, is `test_cli_team_project.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.shell import users_env

KAPPA = [sys.executable, "-m", "orchestrator.cli"]


def _env() -> dict[str, str]:
    return users_env()


def kappa(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*KAPPA, "--home", str(home), *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


@pytest.mark.integration
def test_background_broker_round_trip(tmp_path):
    """start, start again (a no-op), status, stop, then start again: the broker keeps its data."""
    from orchestrator.dev.datagen import ensure_topic, generate_changelog, iter_log, produce

    home = tmp_path / "home"
    started = kappa(home, "broker", "start", "--json")
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    pid = info["pid"]
    try:
        assert info["started"] is True
        assert psutil.Process(pid).is_running()
        assert json.loads((home / "broker.json").read_text())["bootstrap_servers"] == info["bootstrap_servers"]

        again = kappa(home, "broker", "start", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["started"] is False and json.loads(again.stdout)["pid"] == pid

        status = json.loads(kappa(home, "broker", "status", "--json").stdout)
        assert status["running"] is True and status["pid"] == pid

        # A command that needs Kafka finds the broker through the home when nothing else names one.
        from orchestrator.cli.app import Cli

        cli = Cli({"home": home})
        os_env = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("KAPPA_")}
        try:
            assert cli.settings().bootstrap_servers == info["bootstrap_servers"]
        finally:
            os.environ.update(os_env)
        from orchestrator.dev.broker import wait_for_broker

        wait_for_broker(info["bootstrap_servers"], timeout=10)
        ensure_topic(info["bootstrap_servers"], "kept", 2)
        sent = produce(info["bootstrap_servers"], "kept", generate_changelog(500, 100, seed=1))
    finally:
        stopped = kappa(home, "broker", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"pid {pid}" in stopped.stdout and f"stay in {home / 'broker'}" in stopped.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not (home / "broker.json").exists()
    after = json.loads(kappa(home, "broker", "status", "--json").stdout)
    assert after == {"running": False}

    # started again on the same home: the same address, the topic and every record are still there
    restarted = kappa(home, "broker", "start", "--json")
    assert restarted.returncode == 0, restarted.stderr
    again = json.loads(restarted.stdout)
    try:
        assert again["started"] is True and again["pid"] != pid
        assert again["bootstrap_servers"] == info["bootstrap_servers"]
        kept = list(iter_log(again["bootstrap_servers"], "kept"))
        assert len(kept) == sent.records == 500
    finally:
        assert kappa(home, "broker", "stop").returncode == 0


PLAIN_PIPELINES = """
[pipelines.std]
job = "standardize"
topics = ["member_profiles"]
key = "member_id"
alias = "std_live"

[pipelines.plain]
job = "standardize"
topics = ["plain_events"]
key = "member_id"
alias = "plain_live"

[pipelines.missing]
job = "standardize"
topics = ["no_such_topic"]
key = "member_id"
alias = "missing_live"
"""


@pytest.mark.integration
def test_deploy_dry_run_asks_the_broker_and_writes_nothing(tmp_path):
    """deploy --dry-run against a real broker: a compacted topic would go (0), a delete-policy one is refused
    (3), a missing one is an error (1); no registry, version directory or job is created."""
    from orchestrator.dev.datagen import ensure_topic

    home = tmp_path / "home"
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PLAIN_PIPELINES)
    started = kappa(home, "broker", "start", "--json")
    assert started.returncode == 0, started.stderr
    broker = json.loads(started.stdout)
    try:
        ensure_topic(broker["bootstrap_servers"], "member_profiles", 2)
        ensure_topic(broker["bootstrap_servers"], "plain_events", 1, compact=False)

        go = kappa(home, "--pipelines-file", str(pipelines), "deploy", "std", "--dry-run", "--json")
        assert go.returncode == 0, go.stdout + go.stderr
        d = json.loads(go.stdout)
        assert (d["would_succeed"], d["version"], d["error"]) == (True, 1, None)
        assert {c["name"]: c["ok"] for c in d["checks"]} == {"pipeline": True, "rules": True, "topics": True,
                                                            "in_flight": True}

        refused = kappa(home, "--pipelines-file", str(pipelines), "deploy", "plain", "--dry-run")
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "check topics: FAILED - source topic 'plain_events' of pipeline 'plain' has" in refused.stdout

        missing = kappa(home, "--pipelines-file", str(pipelines), "deploy", "missing", "--dry-run")
        assert missing.returncode == 1, missing.stdout + missing.stderr
        assert missing.stderr.startswith("Error: ") and "no_such_topic" in missing.stderr
        assert len(missing.stderr.splitlines()) == 1
    finally:
        kappa(home, "broker", "stop")
    assert not (home / "registry.db").exists()
    assert not [p for p in home.rglob("*") if p.name in ("v1", "job.log", "launch.json")]
