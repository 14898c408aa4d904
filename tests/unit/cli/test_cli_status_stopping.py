"""`kappa status` while a requested stop is under way: the version is recorded `stopped`, its job
still finishes its micro-batch (health "stopping"). That is a stop in progress, not a failure."""

from __future__ import annotations

import json

from orchestrator.observe import lag as lag_mod
from tests.unit.control.control_helpers import fake_running

P = "standardize"


def _no_broker(monkeypatch):
    monkeypatch.setattr(lag_mod, "log_offsets", lambda k, topics, timeout=10.0: {("member_profiles", 0): (0, 90)})
    monkeypatch.setattr(lag_mod, "group_offsets", lambda k, g, topics, timeout=10.0: {})
    monkeypatch.setattr(lag_mod, "checkpoint_next_offsets", lambda path: ({("member_profiles", 0): 90}, 4))


def test_a_stopping_standby_shows_the_stop_in_progress_not_failing(run, seeded, monkeypatch):
    _no_broker(monkeypatch)
    seeded.registry.audit("stop_requested", actor="airflow:scheduler", pipeline=P, version=1,
                          reason="standby grace period of 60 s is over",
                          details={"from": "standby", "to": "stopped", "pid": None})
    fake_running(seeded, 1, P, state="stopping")          # a live process, fresh heartbeat, stopping

    d = json.loads(run("status", P, "--json").stdout)
    row = {v["version"]: v for v in d["pipelines"][0]["versions"]}[1]
    assert row["state"] == "stopped" and row["job"]["health"] == "stopping"
    assert row["readiness"] is None
    assert row["stopping"]["requested_by"] == "airflow:scheduler"
    assert row["stopping"]["requested_at"] > 0

    monkeypatch.setenv("COLUMNS", "250")                 # one line per row
    result = run("status", P)
    assert result.exit_code == 0, result.output
    assert "failing" not in result.stdout
    v1 = next(line for line in result.stdout.splitlines() if "v1" in line)
    assert "stopped" in v1 and "stopping (pid" in v1
    assert "stop requested by airflow:scheduler" in v1 and " s ago)" in v1


def test_a_live_version_whose_job_stops_is_still_failing(run, seeded, monkeypatch):
    _no_broker(monkeypatch)
    seeded.registry.set_state(P, 2, "caught_up")
    fake_running(seeded, 2, P, state="stopping")
    row = {v["version"]: v for v in json.loads(run("status", P, "--json").stdout)["pipelines"][0]["versions"]}[2]
    assert row["readiness"] == "failing" and row.get("stopping") is None


def test_a_serving_version_shut_down_on_purpose_is_stopped_not_failing(run, seeded, monkeypatch):
    """Issue 30, item 9: after Ctrl-C of `kappa up` the serving v2 showed "serving / failing / unknown"."""
    _no_broker(monkeypatch)
    monkeypatch.setattr(lag_mod, "oldest_unread_age", lambda k, details, *, now, timeout: 0.0)
    seeded.registry.set_state(P, 2, "caught_up")
    seeded.registry.flip_alias("member_profiles_std", P, expected_version=None, new_version=2, actor="kappa-up",
                               reason="v2 serves", serve=True)
    fake_running(seeded, 2, P, state="stopped")                      # its last word: stopped, as asked
    launch = seeded.paths(P, 2).launch_file                          # and its process is gone (no such PID)
    launch.write_text(json.dumps({**json.loads(launch.read_text()), "pid": 2 ** 22 + 7}))
    row = {v["version"]: v for v in json.loads(run("status", P, "--json").stdout)["pipelines"][0]["versions"]}[2]
    assert (row["state"], row["serving"], row["job"]["health"], row["readiness"]) == ("serving", True, "stopped",
                                                                                     "stopped")
    assert row["lag"] == 0 and "failing" not in row["reason"]
    monkeypatch.setenv("COLUMNS", "250")
    result = run("status", P)
    v2 = next(line for line in result.stdout.splitlines() if "v2 *" in line)
    assert "serving" in v2 and "stopped" in v2 and "failing" not in v2
