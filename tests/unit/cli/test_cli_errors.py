"""Error handling of `kappa`: a KappaError is one line on stderr and exit 1 (3 for a refusal, see
test_cli_terminal_exits.py); usage errors exit 2.

The fakes here stand in for a verb only to make it fail in a chosen way; every other test in
this file goes through the real settings, registry and verbs.
"""

from __future__ import annotations

import getpass
import json

import pytest

from orchestrator.core.exceptions import AirflowError, LifecycleError


def _one_error_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "Traceback" not in result.output
    return lines[0]


def test_kappa_error_from_a_verb_is_one_line_and_exit_1(run, monkeypatch):
    def refuse(*args, **kwargs):
        raise LifecycleError("standardize v2 failed: total lag 1200\nlast lines of the job log:\nboom")

    monkeypatch.setattr("orchestrator.lifecycle.deploy.deploy", refuse)
    result = run("deploy", "standardize", "--rules", "v2")
    assert result.exit_code == 1
    line = _one_error_line(result)
    assert line == "Error: standardize v2 failed: total lag 1200 last lines of the job log: boom"
    assert result.stdout == ""


def test_a_bug_is_not_disguised_as_a_user_error(run, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("orchestrator.lifecycle.deploy.deploy", broken)
    with pytest.raises(ZeroDivisionError):
        run("deploy", "standardize")


def test_unknown_pipeline_names_the_declared_ones(run):
    result = run("status", "nosuch")
    assert result.exit_code == 1
    line = _one_error_line(result)
    assert "unknown pipeline 'nosuch'" in line
    assert "standardize" in line


def test_unknown_version_is_one_line(run, seeded):
    result = run("promote", "standardize", "7")
    assert result.exit_code == 1
    line = _one_error_line(result)
    assert "no version v7" in line and "v1, v2" in line


def test_rollback_without_a_served_alias_says_so(run, seeded):
    result = run("rollback", "standardize")
    assert result.exit_code == 1
    assert "serves nothing yet" in _one_error_line(result)


def test_invalid_setting_from_a_flag_names_the_flag(run):
    result = run("--registry-url", "mysql://u@h/db", "history")
    assert result.exit_code == 1
    line = _one_error_line(result)
    assert "--registry-url" in line and "SQLite or PostgreSQL" in line


def test_flag_beats_a_bad_environment_variable(run, home, monkeypatch):
    monkeypatch.setenv("KAPPA_REGISTRY_URL", "mysql://u@h/db")
    bad = run("history")
    assert bad.exit_code == 1
    assert "KAPPA_REGISTRY_URL" in _one_error_line(bad)
    good = run("--registry-url", f"sqlite:///{home / 'other.db'}", "history")
    assert good.exit_code == 0, good.output
    assert "audit log is empty" in good.stdout


@pytest.mark.parametrize("argv", [
    ["nosuchcommand"],
    ["promote"],
    ["deploy", "standardize", "--threshold", "-1"],
    ["stop", "standardize", "zero"],
    ["status", "--watch", "--json"],
    ["history", "--limit", "0"],
])
def test_usage_errors_exit_2(run, argv):
    result = run(*argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_airflow_unreachable_is_one_line(run):
    from orchestrator.core.net import free_port

    result = run("trigger", "reprocess", "standardize", "--airflow-url", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 1
    assert "cannot reach Airflow" in _one_error_line(result)


def test_trigger_without_airflow_says_how_to_start_it(run):
    result = run("trigger", "rollback", "standardize")
    assert result.exit_code == 1
    assert "kappa airflow start" in _one_error_line(result)


def test_changing_commands_record_the_os_user_by_default(run, seeded):
    result = run("stop", "standardize", "1")
    assert result.exit_code == 0, result.output
    assert "was not running" in result.stdout
    result = run("stop", "standardize", "2", "--actor", "alice", "--reason", "maintenance")
    assert result.exit_code == 0, result.output
    entries = json.loads(run("history", "standardize", "--json").stdout)["entries"]
    stops = [(e["version"], e["actor"], e["reason"]) for e in entries if e["action"] == "stop"]
    assert stops == [(1, getpass.getuser(), None), (2, "alice", "maintenance")]


def test_retire_dry_run_changes_nothing(run, seeded):
    result = run("retire", "standardize", "1", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "dry run: would retire standardize v1" in result.stdout
    assert "would: delete consumer group kappa.standardize.v1" in result.stdout
    assert [r.state for r in seeded.registry.list_versions("standardize")] == ["stopped", "stopped"]
    assert not [e for e in seeded.registry.audit_log("standardize") if e.action == "retire"]


def test_retention_defaults_to_a_dry_run(run, seeded):
    result = run("retention", "standardize", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["dry_run"] is True and plan["keep"] == 3 and plan["retire"] == []
    assert [r.state for r in seeded.registry.list_versions("standardize")] == ["stopped", "stopped"]


def test_bench_flip_needs_a_served_alias(run, seeded):
    result = run("bench", "flip", "standardize", "--readers", "0")
    assert result.exit_code == 1
    assert "serves nothing yet" in _one_error_line(result)


def test_bench_flip_versions_must_be_a_pair(run):
    result = run("bench", "flip", "--versions", "1")
    assert result.exit_code == 2
    assert "expected two version numbers" in result.output


def test_deploy_without_any_broker_says_how_to_get_one(run, kappa):
    result = run("deploy", "standardize", "--rules", "v2")
    assert result.exit_code == 1
    line = _one_error_line(result)
    assert "no Kafka bootstrap servers are configured" in line and "KAPPA_BOOTSTRAP_SERVERS" in line
    assert kappa.registry.list_versions("standardize") == []


def test_trigger_sends_a_default_reason_the_dags_accept(run, monkeypatch):
    """The DAGs refuse a reason under 3 characters; `kappa trigger` without --reason names the actor."""
    from orchestrator.core.net import free_port

    seen = {}

    def follow(url, user, password, dag_id, conf, **kwargs):
        seen.update(dag_id=dag_id, conf=conf)
        raise AirflowError("stop here")

    monkeypatch.setattr("orchestrator.airflow.client.trigger_and_follow", follow)
    url = f"http://127.0.0.1:{free_port()}"
    result = run("trigger", "reprocess", "standardize", "--rules", "v2", "--actor", "ana", "--airflow-url", url)
    assert result.exit_code == 1
    assert seen["dag_id"] == "kappa_reprocess"
    assert seen["conf"]["reason"] == "requested by ana with kappa trigger"
    assert seen["conf"]["rules_version"] == "v2" and "catchup_threshold" not in seen["conf"]
    result = run("trigger", "rollback", "standardize", "--reason", "bad titles in v2", "--airflow-url", url)
    assert seen["dag_id"] == "kappa_rollback" and seen["conf"] == {"pipeline": "standardize",
                                                                  "reason": "bad titles in v2"}
