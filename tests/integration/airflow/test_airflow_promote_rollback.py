"""kappa_promote and kappa_rollback on the real Airflow stack, triggered through its REST API
(`kappa trigger promote|rollback` as a separate process, and the REST client), with the rollback
DAG's two refusals: nothing to roll back to, and a target without its checkpoint.

After every run the registry, the alias pointer file readers follow and the audit log are
checked; after a refusal, the exact message in the failed task's log, and that nothing changed.

Each serving alias is an Airflow Asset: the promote and the rollback each emit an event on the
alias's Asset, and `kappa_example_downstream` (scheduled on every declared alias's Asset, paused
when created) runs after each and sees, in the event's extra, the version now served with its
rules. A promote that flips nothing emits nothing.
"""

from __future__ import annotations

from pathlib import Path
import json
import os
import shutil
import subprocess
import sys

import time

import psutil
import pytest
from airflow_helpers import RUN_TIMEOUT

from orchestrator.airflow import client as trigger
from orchestrator.airflow.assets import kappa_alias_asset
from orchestrator.jobctl import inspect_version, stop_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.serving import read_pointer
from orchestrator.core.tables import read_table
from tests.shell import users_env

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

PIPELINE = "af_flip"
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
ACTOR = "ops:flip-test"
DOWNSTREAM = "kappa_example_downstream"


def kappa_cli(bed, *args: str) -> subprocess.CompletedProcess:
    """`kappa ...` as its own process with the test kappa home's settings (it finds the running Airflow there)."""
    env = {**users_env("AIRFLOW"), **bed.env()}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT + 60, env=env)


def table_rows(path):
    return read_table(str(path)).sort_by("member_id")


def state_of(bed) -> dict:
    """Everything a refused run must leave as it was: alias, pointer, versions, jobs, audit log."""
    with bed.kappa() as k:
        alias = bed.alias(PIPELINE)
        return {
            "alias": k.registry.get_alias(alias),
            "history": k.registry.alias_history(alias),
            "pointer": Path(k.alias_file(alias)).read_bytes(),
            "versions": [(r.version, str(r.state), r.pid) for r in k.registry.list_versions(PIPELINE)],
            "alive": {r.version: inspect_version(k.version(PIPELINE, r.version)).alive
                      for r in k.registry.list_versions(PIPELINE)},
            "audit": k.registry.audit_log(PIPELINE, limit=None),
        }


def assert_pointer(bed, version: int) -> None:
    """The pointer file names `version`'s table, and reading through it gives that table."""
    from orchestrator.serving import open_alias

    with bed.kappa() as k:
        pointer = read_pointer(k.alias_file(bed.alias(PIPELINE)))
        table = k.paths(PIPELINE, version).table
        assert (pointer["alias"], pointer["pipeline"], pointer["version"], pointer["table"]) == (
            bed.alias(PIPELINE), PIPELINE, version, str(table))
        assert read_table(open_alias(bed.alias(PIPELINE), k.settings)).sort_by("member_id").equals(
            table_rows(table))


def refused_rollback(airflow, conf: dict, message: str):
    """Trigger kappa_rollback, expect `prepare` to fail once with `message`, nothing after it to run."""
    outcome = trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_rollback",
                                         {"pipeline": PIPELINE, **conf}, timeout=RUN_TIMEOUT)
    assert outcome.state == "failed", outcome
    states = {t.task_id: t.state for t in outcome.tasks}
    assert states == {"prepare": "failed", "wait_ready": "upstream_failed", "flip": "upstream_failed"}
    prepare = next(t for t in outcome.tasks if t.task_id == "prepare")
    assert prepare.try_number == 1  # a refusal is not retried
    assert prepare.error == message
    events = trigger.AirflowClient(airflow.url, "admin", "admin").task_log("kappa_rollback", outcome.run_id,
                                                                          "prepare", 1)
    raised = [d.get("exc_value") for ev in events for d in ev.get("error_detail") or [] if isinstance(d, dict)]
    assert message in raised, events[-5:]   # the task's own log carries kappa's message, word for word
    assert outcome.error == f"task prepare failed: {message}"
    return outcome


def asset_events(client, run_id: str, dag_id: str) -> list[dict]:
    """The asset events a run of `dag_id` emitted (Airflow's own record, through its REST API)."""
    return client._request("GET", "/api/v2/assets/events", what="list asset events",
                           params={"source_dag_id": dag_id, "source_run_id": run_id}).json()["asset_events"]


def downstream_run_after(client, flip_run_id: str, seen: set[str], dag_id: str, timeout: float = 180):
    """The run of the downstream DAG that the flipping run's event triggered, followed to its end."""
    deadline = time.monotonic() + timeout
    while True:
        for run in client.list_runs(DOWNSTREAM)["dag_runs"]:
            if run["dag_run_id"] in seen:
                continue
            outcome = trigger.follow(client, DOWNSTREAM, run["dag_run_id"], timeout=RUN_TIMEOUT)
            seen.add(run["dag_run_id"])
            flips = outcome.xcom.get("log_flips") or []
            if not outcome.ok or any((f["source_dag_id"], f["source_run_id"]) == (dag_id, flip_run_id)
                                     for f in flips):
                return outcome
        if time.monotonic() > deadline:
            raise AssertionError(f"no {DOWNSTREAM} run after {dag_id} run {flip_run_id} in {timeout:.0f}s")
        time.sleep(1.0)


def assert_event_seen_downstream(client, alias: str, dag_id: str, run_id: str, extra: dict, seen: set[str]) -> None:
    """The flipping run's event reached the downstream DAG's run, with the same extra, and Airflow lists it."""
    asset = kappa_alias_asset(alias)
    downstream = downstream_run_after(client, run_id, seen, dag_id)
    assert downstream.ok, downstream.error
    # one run may also carry events queued while it was paused (the other tests' flips): this run's is one
    [flip] = [f for f in downstream.xcom["log_flips"] if (f["source_dag_id"], f["source_run_id"]) == (dag_id, run_id)]
    assert (flip["asset"], flip["uri"], flip["source_dag_id"], flip["source_run_id"]) == (
        asset.name, asset.uri, dag_id, run_id)
    assert flip["extra"] == extra
    # listed once the downstream run it created has started: Airflow answers 500 for an event whose
    # created run is still queued (start_date NULL; apache/airflow#71360, fixed by #71379)
    [event] = asset_events(client, run_id, dag_id)
    assert (event["name"], event["uri"], event["extra"]) == (asset.name, asset.uri, extra)


def test_promote_and_rollback_through_rest_and_the_rollback_refusals(airflow, stack_jobs_stopped):
    bed = stack_jobs_stopped
    alias = bed.alias(PIPELINE)
    client = airflow.client()
    client.wait_for_dags([DOWNSTREAM], timeout=120)
    assert client.get_dag(DOWNSTREAM)["is_paused"] is True
    with bed.kappa() as k:
        v1 = deploy(k, k.pipeline(PIPELINE), "v1", actor=ACTOR, reason="first build").version
        wait_ready(k.version(PIPELINE, v1), deadline_seconds=DEADLINE, poll_seconds=1)
        promote(k.version(PIPELINE, v1), actor=ACTOR, reason="first build")   # outside Airflow: no event
        v1_rows = table_rows(k.paths(PIPELINE, v1).table)
        v1_hash, v1_table = k.registry.get_version(PIPELINE, v1).rules_hash, str(k.paths(PIPELINE, v1).table)
    seen = {r["dag_run_id"] for r in client.list_runs(DOWNSTREAM)["dag_runs"]}
    client.set_paused(DOWNSTREAM, False)
    try:
        flips_through_airflow(airflow, bed, client, alias, v1, v1_rows, v1_hash, v1_table, seen)
    finally:
        # a new client: a connection the server dropped must not turn the pause into the reported failure
        airflow.client().set_paused(DOWNSTREAM, True)


def flips_through_airflow(airflow, bed, client, alias, v1, v1_rows, v1_hash, v1_table, seen):
    """The test's steps, with v1 serving and the downstream DAG unpaused."""
    # 1. refused: the alias serves its first version, there is nothing to roll back to
    before = state_of(bed)
    refused_rollback(airflow, {"reason": "undo the first build"},
                     f"NotFoundError: alias '{alias}' has no previous version to roll back to (it serves v1, its "
                     f"first); name a version to roll back to (--to, or to_version in kappa_rollback)")
    assert state_of(bed) == before

    # 2. `kappa trigger promote`: v2 serves, v1 is stopped at once (grace 0)
    with bed.kappa() as k:
        v2 = deploy(k, k.pipeline(PIPELINE), "v2", actor=ACTOR, reason="new titles").version
        wait_ready(k.version(PIPELINE, v2), deadline_seconds=DEADLINE, poll_seconds=1)
        v1_pid = k.registry.get_version(PIPELINE, v1).pid
    done = kappa_cli(bed, "trigger", "promote", PIPELINE, str(v2), "--grace", "0", "--reason", "reviewed v2",
                     "--actor", ACTOR, "--timeout", str(RUN_TIMEOUT), "--json")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    outcome = json.loads(done.stdout)
    run_id = outcome["run_id"]
    assert outcome["state"] == "success" and outcome["conf"] == {
        "pipeline": PIPELINE, "version": v2, "grace_period_seconds": 0, "reason": "reviewed v2"}
    assert {t["task_id"]: t["state"] for t in outcome["tasks"]} == {
        "check": "success", "promote": "success", "stop_previous": "success"}
    assert outcome["xcom"]["check"]["would_succeed"] is True
    assert (outcome["xcom"]["promote"]["flipped"], outcome["xcom"]["promote"]["previous_version"]) == (True, v1)
    stopped = outcome["xcom"]["stop_previous"]
    assert type(stopped["stopped"]) is int and stopped["stopped"] == v1, stopped  # the version, not a flag
    assert (stopped["version"], stopped["how"]) == (v1, "graceful")
    tag = f"[airflow kappa_promote run {run_id}]"
    with bed.kappa() as k:
        rec = k.registry.get_alias(alias)
        assert (rec.version, rec.previous_version, rec.published_version) == (v2, v1, v2)
        assert (rec.updated_by, rec.reason) == ("airflow:admin", f"reviewed v2 {tag}")
        assert [(str(r.state)) for r in k.registry.list_versions(PIPELINE)] == ["stopped", "serving"]
        assert not inspect_version(k.version(PIPELINE, v1)).alive and inspect_version(k.version(PIPELINE, v2)).alive
        new = [(e.action, e.version, e.actor, e.outcome, e.reason) for e in k.registry.audit_log(PIPELINE, limit=None)
               if tag in (e.reason or "")]
        assert new == [("flip_alias", v2, "airflow:admin", "ok", f"reviewed v2 {tag}"),
                       ("promote", v2, "airflow:admin", "ok", f"reviewed v2 {tag}"),
                       ("stop_requested", v1, "airflow:admin", "ok",
                        f"standby grace period of 0 s after promoting v{v2} is over {tag}"),
                       ("stop", v1, "airflow:admin", "ok",
                        f"standby grace period of 0 s after promoting v{v2} is over {tag}")]
    assert not psutil.pid_exists(v1_pid) or psutil.Process(v1_pid).status() == psutil.STATUS_ZOMBIE
    assert_pointer(bed, v2)
    with bed.kappa() as k:
        v2_hash, v2_table = k.registry.get_version(PIPELINE, v2).rules_hash, str(k.paths(PIPELINE, v2).table)
    assert v2_hash != v1_hash
    extra = outcome["xcom"]["promote"]["asset_event"]
    assert {key: value for key, value in extra.items() if key != "at"} == {
        "pipeline": PIPELINE, "alias": alias, "action": "promote", "version": v2, "previous_version": v1,
        "rules_version": "v2", "rules_hash": v2_hash, "table": v2_table, "actor": "airflow:admin",
        "reason": f"reviewed v2 {tag}"}
    assert_event_seen_downstream(client, alias, "kappa_promote", run_id, extra, seen)

    # 3. `kappa trigger rollback`: v1 restarts from its checkpoint, catches up, serves again
    done = kappa_cli(bed, "trigger", "rollback", PIPELINE, "--reason", "v2 titles look wrong", "--actor", ACTOR,
                     "--timeout", str(RUN_TIMEOUT), "--json")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    outcome = json.loads(done.stdout)
    run_id = outcome["run_id"]
    assert {t["task_id"]: t["state"] for t in outcome["tasks"]} == {
        "prepare": "success", "wait_ready": "success", "flip": "success"}
    assert (outcome["xcom"]["prepare"]["to_version"], outcome["xcom"]["prepare"]["restarted"]) == (v1, True)
    assert (outcome["xcom"]["flip"]["from_version"], outcome["xcom"]["flip"]["flipped"]) == (v2, True)
    tag = f"[airflow kappa_rollback run {run_id}]"
    with bed.kappa() as k:
        rec = k.registry.get_alias(alias)
        assert (rec.version, rec.previous_version, rec.published_version) == (v1, v2, v1)
        assert (rec.updated_by, rec.reason) == ("airflow:admin", f"v2 titles look wrong {tag}")
        assert [str(r.state) for r in k.registry.list_versions(PIPELINE)] == ["serving", "standby"]
        assert inspect_version(k.version(PIPELINE, v1)).alive and inspect_version(k.version(PIPELINE, v2)).alive
        rollbacks = [(e.version, e.actor, e.outcome, e.reason, e.details["from_version"])
                     for e in k.registry.audit_log(PIPELINE, action="rollback")]
        assert rollbacks == [(v1, "airflow:admin", "ok", f"v2 titles look wrong {tag}", v2)]
        assert [(h.from_version, h.to_version) for h in k.registry.alias_history(alias)] == [
            (None, v1), (v1, v2), (v2, v1)]
    assert_pointer(bed, v1)
    with bed.kappa() as k:
        assert table_rows(k.paths(PIPELINE, v1).table).equals(v1_rows)  # resumed from its checkpoint
        moved_at = k.registry.get_alias(alias).updated_at
    back = outcome["xcom"]["flip"]["asset_event"]
    assert back == {
        "pipeline": PIPELINE, "alias": alias, "action": "rollback", "version": v1, "previous_version": v2,
        "rules_version": "v1", "rules_hash": v1_hash, "table": v1_table, "actor": "airflow:admin",
        "reason": f"v2 titles look wrong {tag}", "at": moved_at}
    assert_event_seen_downstream(client, alias, "kappa_rollback", run_id, back, seen)

    # 4. refused: the rollback target v2 lost its checkpoint; a rollback never re-reads from zero
    with bed.kappa() as k:
        stop_version(k.version(PIPELINE, v2), actor=ACTOR, reason="maintenance")
        checkpoint = Path(k.paths(PIPELINE, v2).checkpoint)
        shutil.rmtree(checkpoint)
    before = state_of(bed)
    refused_rollback(airflow, {"reason": "back to v2"},
                     f"LifecycleError: cannot roll back to {PIPELINE} v{v2}: its checkpoint {checkpoint} is missing, "
                     f"and a rollback never re-reads from offset zero; deploy a new version")
    assert state_of(bed) == before
    assert not checkpoint.exists()
    assert_pointer(bed, v1)

    # promoting the version that serves already flips nothing: no asset event
    again = trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_promote",
                                       trigger.promote_conf(PIPELINE, v1, reason="serve v1 again",
                                                            grace_period_seconds=0), timeout=RUN_TIMEOUT)
    assert again.ok, again.error
    assert again.xcom["promote"]["flipped"] is False and again.xcom["promote"]["asset_event"] is None
    assert asset_events(client, again.run_id, "kappa_promote") == []


def test_kappa_airflow_start_and_status_find_the_running_stack(airflow, airflow_testbed):
    """`kappa airflow start` on a home whose Airflow runs starts nothing and says where it runs."""
    started = kappa_cli(airflow_testbed, "airflow", "start", "--json")
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert info["already_running"] is True and info["url"] == airflow.url and info["pids"] == airflow.pids
    status = kappa_cli(airflow_testbed, "airflow", "status", "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["running"] is True and info["pids"] == airflow.pids
    assert info["alive"] == {component: True for component in airflow.pids}
