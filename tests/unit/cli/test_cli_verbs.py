"""The changing commands through the CLI, with fake job processes and a fake log (no broker):
deploy, promote, rollback, stop, retire, retention --apply, reconcile, monitor, and their --json;
`trigger promote`'s request and --json (Airflow itself is faked here; the integration tests run it).

Each test sets up what it needs through the verbs' Python API on the same home, runs one
`kappa` command in-process, and checks its output, its exit code and what it changed.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from confluent_kafka import KafkaError, KafkaException
from typer.testing import CliRunner

from orchestrator.context import Kappa
from orchestrator.core.settings import resolve_settings
from orchestrator.jobctl import inspect_version, start_version
from orchestrator.lifecycle import deploy as deploy_mod
from orchestrator.lifecycle.promote import promote
from orchestrator.serving import read_pointer
from tests.unit.control.control_helpers import (ALIAS, PIPELINE, FakeLog, allocate, end_children, fake_running,
                                                install_fake_jobs, profiles, ready_version, wait_for, write_table)

PIPELINES = f"""
[pipelines.{PIPELINE}]
job = "standardize"
topics = ["orders"]
key = "member_id"
alias = "{ALIAS}"
catchup_threshold = 0
catchup_samples = 3
grace_period_seconds = 60
keep_versions = 2
key_count_tolerance = 0.1
max_reject_rate = 0.05
"""
ROWS = [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 2), ("m3", "sre", "SRE", "Alan", 3)]


class FakeAdmin:
    """The Kafka admin client's consumer-group deletion: records each call, answers each group."""

    def __init__(self):
        self.calls: list[tuple[list[str], float]] = []
        self.error: Exception | None = None

    def delete_consumer_groups(self, groups, request_timeout):
        self.calls.append((list(groups), request_timeout))
        out = {}
        for g in groups:
            out[g] = f = Future()
            f.set_exception(self.error) if self.error else f.set_result(None)
        return out


@dataclass
class Bed:
    k: Kappa
    home: Path
    pipelines_file: Path
    fake_log: FakeLog
    jobs: dict[int, str]
    admin: FakeAdmin

    def run(self, *args: str):
        from orchestrator.cli import app

        argv = ["--home", str(self.home), "--pipelines-file", str(self.pipelines_file),
                "--bootstrap-servers", "127.0.0.1:9", *args]
        return CliRunner().invoke(app, argv, catch_exceptions=False)

    def json(self, *args: str, exit_code: int = 0):
        result = self.run(*args, "--json")
        assert result.exit_code == exit_code, result.output
        return json.loads(result.stdout)

    def start(self, v: int) -> int:
        pid = start_version(self.k.version(PIPELINE, v), actor="t").pid
        wait_for(lambda: inspect_version(self.k.version(PIPELINE, v)).health == "running", 15, f"the fake job of v{v} to run")
        return pid


@pytest.fixture
def bed(tmp_path, clean_env, monkeypatch):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    home = tmp_path / "home"
    k = Kappa(resolve_settings(home=str(home), pipelines_file=str(pipelines), bootstrap_servers="127.0.0.1:9",
                               env={}))
    admin = FakeAdmin()
    monkeypatch.setattr(Kappa, "admin", lambda self: admin)
    monkeypatch.setattr(deploy_mod, "_topic_policies", lambda k, topics: {t: ("compact", False) for t in topics})
    try:
        yield Bed(k, home, pipelines, FakeLog({0: 100, 1: 50}).install(monkeypatch), install_fake_jobs(monkeypatch),
                  admin)
    finally:
        end_children()
        k.close()


def _files(k, v) -> dict[str, int]:
    """A table, a rejects table, a checkpoint file; the tables' sizes."""
    p = k.paths(PIPELINE, v)
    write_table(p.table, profiles(ROWS))
    write_table(p.rejects, profiles(ROWS[:1]))
    (Path(p.checkpoint) / "offsets").mkdir(parents=True, exist_ok=True)
    (Path(p.checkpoint) / "offsets" / "0").write_text("{}")
    return {what: sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
            for what, path in (("table", p.table), ("rejects", p.rejects))}


def test_deploy_json_with_wait(bed):
    bed.fake_log.read_all()
    data = bed.json("deploy", PIPELINE, "--wait", "--poll", "0.2", "--deadline", "30", "--actor", "alice",
                    "--reason", "first")
    assert set(data) == {"version", "readiness"}
    p, pid = bed.k.paths(PIPELINE, 1), data["version"]["pid"]
    est = data["version"].pop("estimate")   # the backfill estimate the deploy stored (the fake log: 150 records)
    # a deploy samples the records' size (the dry run asks the broker's segment sizes)
    assert (est["known"], est["records"], est["bytes"], est["bytes_source"]) == (True, 150, 30_000, "sampled")
    assert "no earlier version measured" in est["rate_source"]
    assert data["version"] == {
        "pipeline": PIPELINE, "version": 1, "state": "starting", "rules_version": None, "rules_hash": None,
        "code_ref": deploy_mod.code_ref(), "threshold": 0, "table": str(p.table), "rejects": str(p.rejects),
        "checkpoint": str(p.checkpoint), "run_dir": str(p.run_dir), "group_id": f"kappa.{PIPELINE}.v1", "pid": pid,
        "job_started": True, "resumed": False, "warnings": [],
        "message": f"deployed {PIPELINE} v1 (rules -): started {PIPELINE} v1 (pid {pid}, local, {bed.k.settings.spark_master}); "
                   f"it reads from offset zero"}
    r = data["readiness"]
    assert (r["pipeline"], r["version"], r["state"], r["ready"], r["total_lag"], r["consecutive_ok"],
            r["required_samples"], r["threshold"], r["job_health"], r["registry_state"]) == \
        (PIPELINE, 1, "ready", True, 0, 3, 3, 0, "running", "caught_up")
    assert [s["total"] for s in r["samples"]] == [0, 0, 0]
    rec = bed.k.registry.get_version(PIPELINE, 1)
    assert (rec.state, rec.pid) == ("caught_up", pid) and psutil.pid_exists(pid)
    (entry,) = bed.k.registry.audit_log(PIPELINE, action="deploy")
    assert (entry.actor, entry.reason, entry.outcome) == ("alice", "first", "ok")


def test_promote_json(bed):
    v = ready_version(bed.k, bed.fake_log, ROWS)
    d = bed.json("promote", PIPELINE, str(v), "--actor", "alice", "--reason", "first")
    p = bed.k.paths(PIPELINE, v)
    assert set(d) == {"pipeline", "alias", "version", "previous_version", "dry_run", "flipped", "published",
                      "would_succeed", "message", "checks", "actions", "report", "report_path", "readiness",
                      "pointer", "actor", "reason", "at", "error", "forced"}
    assert {key: d[key] for key in ("pipeline", "alias", "version", "previous_version", "dry_run", "flipped",
                                    "published", "would_succeed", "message", "actor", "reason", "error",
                                    "report_path")} == {
        "pipeline": PIPELINE, "alias": ALIAS, "version": v, "previous_version": None, "dry_run": False,
        "flipped": True, "published": True, "would_succeed": True, "actor": "alice", "reason": "first",
        "message": f"promoted {PIPELINE} v{v}: alias '{ALIAS}' moved from nothing to v{v}", "error": None,
        "report_path": str(p.report_file)}
    assert [(c["name"], c["ok"]) for c in d["checks"]] == [("ready", True), ("key_count", True),
                                                           ("reject_rate", True)]
    assert d["actions"] == [
        f"write the validation report to {p.report_file}",
        f"flip alias '{ALIAS}' from nothing to v{v} (compare-and-swap in the registry)",
        f"publish pointer {bed.k.alias_file(ALIAS)} -> {p.table}",
        f"set {PIPELINE} v{v} to serving",
        "record the promote by 'alice': first"]
    assert d["report"]["keys_new"] == 3 and d["readiness"]["state"] == "ready"
    assert d["pointer"] == read_pointer(bed.k.alias_file(ALIAS)) and d["pointer"]["version"] == v
    assert bed.k.registry.get_version(PIPELINE, v).state == "serving"


def test_promote_dry_run_json_that_would_refuse_exits_3_and_changes_nothing(bed):
    v1 = ready_version(bed.k, bed.fake_log, ROWS)
    promote(bed.k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = allocate(bed.k).version
    bed.k.registry.set_state(PIPELINE, v2, "backfilling")
    fake_running(bed.k, v2)
    write_table(bed.k.paths(PIPELINE, v2).table, profiles(ROWS))
    bed.fake_log.ends = {tp: e + 7 for tp, e in bed.fake_log.ends.items()}
    audit_before = len(bed.k.registry.audit_log(None, limit=None))
    d = bed.json("promote", PIPELINE, str(v2), "--dry-run", exit_code=3)
    error = (f"cannot promote {PIPELINE} v{v2} to alias '{ALIAS}': ready: {PIPELINE} v{v2}: hydrating, lag 14, "
             f"2 s behind, 0/3 samples with lag <= 0 records and <= 60 s behind; lag 14 > threshold 0 records")
    assert (d["dry_run"], d["would_succeed"], d["flipped"], d["error"], d["message"], d["actions"]) == \
        (True, False, False, error, f"dry run: would refuse. {error}", [])
    assert bed.k.registry.get_alias(ALIAS).version == v1 and read_pointer(bed.k.alias_file(ALIAS))["version"] == v1
    assert len(bed.k.registry.audit_log(None, limit=None)) == audit_before
    assert bed.k.registry.lag_samples(PIPELINE, v2) == []


def test_rollback_json(bed):
    v1 = ready_version(bed.k, bed.fake_log, ROWS)
    promote(bed.k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(bed.k, bed.fake_log, ROWS)
    promote(bed.k.version(PIPELINE, v2), actor="alice", reason="second")
    d = bed.json("rollback", PIPELINE, "--actor", "bob", "--reason", "bad v2")
    assert set(d) == {"pipeline", "alias", "from_version", "to_version", "flipped", "restarted", "waited_seconds",
                      "message", "readiness", "pointer", "actor", "reason", "at", "forced"}
    assert {key: d[key] for key in ("pipeline", "alias", "from_version", "to_version", "flipped", "restarted",
                                    "message", "actor", "reason")} == {
        "pipeline": PIPELINE, "alias": ALIAS, "from_version": v2, "to_version": v1, "flipped": True,
        "restarted": False, "message": f"rolled back alias '{ALIAS}' from v{v2} to v{v1}", "actor": "bob",
        "reason": "bad v2"}
    assert (d["readiness"]["version"], d["readiness"]["state"]) == (v1, "ready")
    assert d["pointer"] == read_pointer(bed.k.alias_file(ALIAS)) and d["pointer"]["version"] == v1
    assert [bed.k.registry.get_version(PIPELINE, v).state for v in (v1, v2)] == ["serving", "standby"]


def test_stop_json(bed):
    v = allocate(bed.k).version
    pid = bed.start(v)
    bed.k.registry.set_state(PIPELINE, v, "backfilling")
    d = bed.json("stop", PIPELINE, str(v), "--actor", "alice", "--reason", "maintenance")
    assert d == {"pipeline": PIPELINE, "version": v, "stopped": True, "how": "graceful", "pid": pid,
                 "seconds": d["seconds"], "final_state": "stopped", "bound_seconds": 60.0,
                 "message": f"stopped {PIPELINE} v{v} (pid {pid}) in {d['seconds']:.1f} s, within its bound of 60 s "
                            f"(after its micro-batch in flight); its table and checkpoint are kept"}
    assert not psutil.pid_exists(pid)
    assert bed.k.registry.get_version(PIPELINE, v).state == "stopped"
    assert bed.json("stop", PIPELINE, str(v))["how"] == "not-running"


def test_stop_says_its_bound_before_it_waits(bed):
    v = allocate(bed.k).version
    pid = bed.start(v)
    bed.k.registry.set_state(PIPELINE, v, "backfilling")
    result = bed.run("stop", PIPELINE, str(v), "--reason", "maintenance")
    assert result.exit_code == 0, result.output
    first, second = result.stdout.splitlines()[:2]
    assert first == (f"stopping {PIPELINE} v{v}: its micro-batch in flight finishes and no new one starts; at most "
                     f"60 s (stop_timeout_seconds), then it is stopped at once")
    assert second.startswith(f"stopped {PIPELINE} v{v} (pid {pid}) in ")


def test_retire_json_stops_the_job_deletes_everything_and_deletes_the_group(bed):
    v1, v2 = allocate(bed.k).version, allocate(bed.k).version
    sizes = _files(bed.k, v1)
    _files(bed.k, v2)
    pid = bed.start(v1)
    bed.k.registry.set_state(PIPELINE, v1, "standby")
    p = bed.k.paths(PIPELINE, v1)
    d = bed.json("retire", PIPELINE, str(v1), "--yes", "--actor", "alice", "--reason", "old")
    assert set(d) == {"pipeline", "version", "dry_run", "actions", "done", "bytes_freed", "message"}
    assert (d["pipeline"], d["version"], d["dry_run"]) == (PIPELINE, v1, False)
    assert d["done"] == ["job stopped", f"deleted table {p.table}", f"deleted rejects table {p.rejects}",
                         f"deleted checkpoint and run dir {p.version_dir}",
                         f"consumer group kappa.{PIPELINE}.v{v1}: deleted"]
    assert d["bytes_freed"] > sizes["table"] + sizes["rejects"]   # and the checkpoint, log, status files
    assert d["message"] == f"retired {PIPELINE} v{v1}, freed {d['bytes_freed']} bytes"
    assert bed.admin.calls == [([f"kappa.{PIPELINE}.v{v1}"], 10)]
    assert not Path(p.table).exists() and not Path(p.rejects).exists() and not p.version_dir.exists()
    assert not psutil.pid_exists(pid)
    assert bed.k.registry.get_version(PIPELINE, v1).state == "retired"
    (entry,) = bed.k.registry.audit_log(PIPELINE, action="retire")
    assert (entry.actor, entry.reason, entry.details["state_before"]) == ("alice", "old", "standby")
    other = bed.k.paths(PIPELINE, v2)   # the other version is untouched
    assert Path(other.table).exists() and Path(other.rejects).exists() and (Path(other.checkpoint) / "offsets" / "0").exists()
    assert bed.k.registry.get_version(PIPELINE, v2).state == "created"


def test_retire_finishes_after_a_group_deletion_failed(bed):
    v = allocate(bed.k).version
    _files(bed.k, v)
    bed.admin.error = KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))
    result = bed.run("retire", PIPELINE, str(v), "--yes")
    assert result.exit_code == 1 and result.stdout == ""
    group = f"kappa.{PIPELINE}.v{v}"
    assert result.stderr.startswith(f"Error: cannot delete consumer group '{group}': ")
    assert result.stderr.endswith(f"retry the retire, or delete it with kafka-consumer-groups --delete "
                                  f"--group {group}\n")
    assert bed.k.registry.get_version(PIPELINE, v).state == "retiring"  # not retired while its group lives
    assert not Path(bed.k.paths(PIPELINE, v).table).exists()
    bed.admin.error = KafkaException(KafkaError(KafkaError.GROUP_ID_NOT_FOUND))  # deleted meanwhile
    d = bed.json("retire", PIPELINE, str(v), "--yes")
    assert d["done"] == ["job stopped", f"consumer group {group}: did not exist"] and d["bytes_freed"] == 0
    assert bed.k.registry.get_version(PIPELINE, v).state == "retired"
    assert bed.admin.calls == [([group], 10)] * 2


def test_retention_apply_json(bed):
    vs = [allocate(bed.k).version for _ in range(4)]
    for v in vs[:2]:
        _files(bed.k, v)
    pid = bed.start(vs[1])
    bed.k.registry.set_state(PIPELINE, vs[1], "standby")
    bed.k.registry.set_state(PIPELINE, vs[2], "stopped")  # ran and stopped: not in flight
    bed.k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=vs[0], actor="t", reason="r")
    bed.k.registry.flip_alias(ALIAS, PIPELINE, expected_version=vs[0], new_version=vs[3], actor="t", reason="r")
    d = bed.json("retention", PIPELINE, "--apply", "--actor", "cron")
    p = bed.k.paths(PIPELINE, vs[1])
    assert {key: d[key] for key in d if key != "results"} == {
        "pipeline": PIPELINE, "keep": 2, "dry_run": False, "kept": vs[2:], "retire": [vs[1]],
        "protected": {str(vs[0]): f"it is the rollback target of alias '{ALIAS}'"},
        "message": f"{PIPELINE}: keep {vs[2:]}; retired {[vs[1]]}; protected {[vs[0]]}"}
    (res,) = d["results"]
    assert (res["version"], res["dry_run"], res["done"][0], res["done"][-1]) == \
        (vs[1], False, "job stopped", f"consumer group kappa.{PIPELINE}.v{vs[1]}: deleted")
    assert bed.admin.calls == [([f"kappa.{PIPELINE}.v{vs[1]}"], 10)]
    assert not Path(p.table).exists() and not p.version_dir.exists() and not psutil.pid_exists(pid)
    assert [bed.k.registry.get_version(PIPELINE, v).state for v in vs] == ["created", "retired", "stopped",
                                                                           "created"]
    assert Path(bed.k.paths(PIPELINE, vs[0]).table).exists()   # protected: kept whole
    assert [e.reason for e in bed.k.registry.audit_log(PIPELINE, action="retire")] == ["retention: keep the last 2"]


def test_reconcile_json_and_text(bed):
    v1, v2 = allocate(bed.k).version, allocate(bed.k).version
    bed.jobs[v1] = "fail"   # reports a RulesError: a restart would repeat it, so it is failed at once
    start_version(bed.k.version(PIPELINE, v1), actor="t", check_exit_seconds=0)
    bed.k.registry.set_state(PIPELINE, v1, "backfilling")
    wait_for(lambda: not inspect_version(bed.k.version(PIPELINE, v1)).alive, 10, "the fake job to fail")
    bed.k.registry.set_state(PIPELINE, v2, "standby")   # its job never started
    d = bed.json("reconcile", "--actor", "cron")
    gave_up, stopped = d["actions"]
    assert (gave_up["kind"], gave_up["version"], gave_up["state"], gave_up["failure"]) == \
        ("gave_up", v1, "backfilling", "RulesError")
    assert gave_up["error"].startswith(f"{PIPELINE} v{v1}: its job reported a RulesError, which a restart would "
                                       f"repeat; not restarting it; last error: the job reported failure: "
                                       f"RulesError: bad rule")
    assert stopped == {"kind": "mark_stopped", "was": "standby", "job": "not_started", "pipeline": PIPELINE,
                       "version": v2, "state": "standby"}
    assert [bed.k.registry.get_version(PIPELINE, v).state for v in (v1, v2)] == ["failed", "stopped"]
    result = bed.run("reconcile")
    assert result.exit_code == 0, result.output
    assert result.stdout == "nothing to reconcile: the registry, the published aliases and the jobs agree\n"
    v3 = allocate(bed.k).version
    bed.k.registry.set_state(PIPELINE, v3, "caught_up")
    result = bed.run("reconcile")
    assert result.exit_code == 0, result.output
    assert result.stdout == (f'mark_stopped: {PIPELINE} v{v3} {{"was": "caught_up", "job": "not_started", '
                             f'"state": "caught_up"}}\n')


def _serving(bed) -> int:
    v = ready_version(bed.k, bed.fake_log, ROWS)
    promote(bed.k.version(PIPELINE, v), actor="alice", reason="first")
    return v


def test_monitor_json_exit_0_without_problems(bed):
    v = _serving(bed)
    d = bed.json("monitor", "--actor", "cron")
    assert set(d) == {"at", "versions", "reconciled", "stopped", "watched", "throttled", "problems", "errors", "failing"}
    assert d["versions"] == [{"pipeline": PIPELINE, "version": v, "state": "serving", "readiness": "ready", "lag": 0,
                              "eta_seconds": 0.0, "job": "running",
                              "reason": "lag <= 0 records and <= 60 s behind in 3 samples a micro-batch apart, "
                                        "not growing, 4 micro-batches since the job started, job running"}]
    assert (d["reconciled"], d["stopped"], d["watched"], d["problems"], d["errors"]) == ([], [], [], [], [])
    result = bed.run("monitor", "--actor", "cron")
    assert (result.exit_code, result.stderr) == (0, "")
    # one line in words per version; 3/3 however many samples there are: never "5 consecutive"
    assert result.stdout.splitlines() == [
        f"{PIPELINE} v{v} (serving): ready, lag 0 records, job running; lag <= 0 records and <= 60 s behind in 3 "
        f"samples a micro-batch apart, not growing, 4 micro-batches since the job started, job running"]


def test_monitor_exits_1_on_a_problem_json_and_text(bed):
    v = _serving(bed)
    fake_running(bed.k, v, state="failed", error="SinkError: disk full")
    problem = (f"{PIPELINE} v{v}: its job reported a SinkError, which a restart would repeat; not restarting it; "
               f"last error: the job reported failure: SinkError: disk full. Fix the cause, then start it again "
               f"(`kappa rollback {PIPELINE} {v}` for a version that served, or deploy)")
    d = bed.json("monitor", "--actor", "cron", exit_code=1)
    assert d["problems"] == [problem]
    assert [(a["kind"], a["version"]) for a in d["reconciled"]] == [("gave_up", v)]
    assert [(x["version"], x["readiness"]) for x in d["versions"]] == [(v, "failing")]
    result = bed.run("monitor", "--actor", "cron")
    assert result.exit_code == 1
    assert result.stderr == f"problem: {problem}\n"
    assert bed.k.registry.get_version(PIPELINE, v).state == "serving"   # still serving: the alias points at it


@pytest.mark.parametrize("state", ["success", "failed"])
def test_trigger_promote_request_and_json(run, monkeypatch, state):
    from orchestrator.airflow.client import RunOutcome, TaskOutcome

    seen = []
    outcome = RunOutcome(dag_id="kappa_promote", run_id="manual__1", state=state, url="http://127.0.0.1:1/run",
                         conf={}, tasks=[TaskOutcome(task_id="promote", state=state, try_number=1,
                                                     error=None if state == "success" else "NotReadyError: lag 7")],
                         xcom={"promote": {"message": "promoted"}} if state == "success" else {})

    def follow(url, user, password, dag_id, conf, **kwargs):
        seen.append((url, user, password, dag_id, conf, kwargs["timeout"], kwargs["note"]))
        return outcome

    monkeypatch.setattr("orchestrator.airflow.client.trigger_and_follow", follow)
    result = run("trigger", "promote", "standardize", "3", "--grace", "0", "--actor", "ana", "--airflow-url",
                 "http://127.0.0.1:1", "--airflow-user", "ops", "--airflow-password", "pw", "--timeout", "60",
                 "--json")
    assert seen == [("http://127.0.0.1:1", "ops", "pw", "kappa_promote",
                     {"pipeline": "standardize", "version": 3, "reason": "requested by ana with kappa trigger",
                      "grace_period_seconds": 0}, 60.0, "triggered by ana with `kappa trigger`")]
    assert json.loads(result.stdout) == outcome.model_dump(mode="json")
    if state == "success":
        assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True
    else:
        assert result.exit_code == 1
        assert result.stderr == ("Error: kappa_promote run manual__1 failed: task promote failed: NotReadyError: "
                                 "lag 7 (http://127.0.0.1:1/run)\n")
    seen.clear()
    run("trigger", "promote", "standardize", "--airflow-url", "http://127.0.0.1:1", "--reason", "reviewed")
    assert seen[0][3:5] == ("kappa_promote", {"pipeline": "standardize", "reason": "reviewed"})
