"""`--json` of the read commands: valid JSON (no markup), and the shape scripts rely on."""

from __future__ import annotations

import json


def test_pipelines_json(run, home):
    result = run("pipelines", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["pipelines_file"].endswith("deploy/pipelines.toml")
    by_name = {p["name"]: p for p in data["pipelines"]}
    std = by_name["standardize"]
    assert std["job"] == "standardize"
    assert std["topics"] == ["member_profiles"]
    assert std["alias"] == "member_profiles_std"
    assert std["rules_versions"][:2] == ["v1", "v2"]
    assert std["serving_version"] is None and std["versions"] == 0
    assert {"pageviews_hourly", "profile_settings_join", "pageview_enrich", "ad_click_join"} <= set(by_name)


def test_pipelines_table(run):
    result = run("pipelines")
    assert result.exit_code == 0, result.output
    assert "standardize" in result.stdout and "member_profiles_std" in result.stdout


def test_status_json_without_versions(run):
    assert json.loads(run("status", "--json").stdout) == {"pipelines": []}
    data = json.loads(run("status", "--all", "--json").stdout)
    assert [p["versions"] for p in data["pipelines"]] == [[]] * len(data["pipelines"])
    assert "standardize" in [p["pipeline"] for p in data["pipelines"]]


def test_status_json_shape(run, seeded):
    result = run("status", "standardize", "--json")
    assert result.exit_code == 0, result.output
    (p,) = json.loads(result.stdout)["pipelines"]
    assert p["pipeline"] == "standardize" and p["alias"] == "member_profiles_std"
    assert p["serving_version"] is None
    assert [v["version"] for v in p["versions"]] == [1, 2]
    v1 = p["versions"][0]
    assert {"version", "state", "serving", "rules_version", "readiness", "lag", "partitions", "eta_seconds",
            "rejects", "job"} <= set(v1)
    assert v1["state"] == "stopped" and v1["serving"] is False and v1["rules_version"] == "v1"
    assert v1["job"]["health"] == "not_started" and v1["job"]["pid"] is None
    assert v1["readiness"] is None and v1["lag"] is None


def test_status_table(run, seeded):
    result = run("status")
    assert result.exit_code == 0, result.output
    assert "alias member_profiles_std serves nothing" in result.stdout
    assert "v1" in result.stdout and "v2" in result.stdout and "stopped" in result.stdout


def test_history_json_shape(run, seeded):
    result = run("history", "--json", "--limit", "5")
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)["entries"]
    assert [(e["action"], e["version"], e["actor"]) for e in entries] == [
        ("allocate_version", 1, "seeder"), ("allocate_version", 2, "seeder")]
    assert {"id", "at", "action", "actor", "pipeline", "version", "reason", "outcome", "details"} <= set(entries[0])
    assert entries[0]["reason"] == "seed v1" and entries[0]["outcome"] == "ok"


def test_history_table(run, seeded):
    result = run("history", "standardize")
    assert result.exit_code == 0, result.output
    assert "allocate_version" in result.stdout and "seed v2" in result.stdout


def test_history_table_keeps_the_airflow_tag_of_a_reason(run, seeded, monkeypatch):
    """Issue 30, item 10: "[airflow kappa_promote run manual__...]" was read as Rich markup and dropped."""
    tag = "[airflow kappa_promote run manual__2026-11-27T18:44:30+00:00]"
    seeded.registry.audit("promote", actor="airflow:admin", pipeline="standardize", version=2,
                          reason=f"reviewed the v2 report {tag}")
    monkeypatch.setenv("COLUMNS", "400")         # one row on one line
    result = run("history", "standardize")
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if "airflow:admin" in line]
    assert f"reviewed the v2 report {tag}" in row
    assert json.loads(run("history", "--json").stdout)["entries"][-1]["reason"] == f"reviewed the v2 report {tag}"


def test_broker_status_json_when_none_runs(run):
    result = run("broker", "status", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"running": False}


def test_airflow_status_when_none_runs(run):
    result = run("airflow", "status", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"running": False, "alive": {}}
    assert "no Airflow runs" in run("airflow", "status").stdout


def test_broker_status_trusts_only_a_record_of_a_live_process(run, home):
    """A broker.json whose PID now belongs to another process (other creation time) is stale."""
    import os

    from orchestrator.jobctl.process import create_time

    home.mkdir(parents=True)
    record = {"pid": os.getpid(), "port": 9, "bootstrap_servers": "127.0.0.1:9", "created": create_time(os.getpid())}
    (home / "broker.json").write_text(json.dumps({**record, "created": record["created"] - 3600}))
    assert json.loads(run("broker", "status", "--json").stdout) == {"running": False}
    (home / "broker.json").write_text(json.dumps(record))
    status = json.loads(run("broker", "status", "--json").stdout)
    assert status["running"] is True and status["pid"] == os.getpid()
