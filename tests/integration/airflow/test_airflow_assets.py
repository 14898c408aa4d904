"""Each serving alias is an Airflow Asset, on the real Airflow stack: a promote through the
kappa_promote DAG, and a rollback through the kappa_rollback DAG, each emit an event on the alias's
Asset, and `kappa_example_downstream` (scheduled on every declared alias's Asset, paused when
created) runs after each and sees, in the event's extra, the version now served with its rules.
A promote that flips nothing emits nothing."""

from __future__ import annotations

import os
import time

import pytest
from airflow_helpers import RUN_TIMEOUT

from orchestrator.airflow import client as trigger
from orchestrator.airflow.assets import kappa_alias_asset
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

PIPELINE = "af_asset"
DOWNSTREAM = "kappa_example_downstream"
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))


def asset_events(client, run_id: str, dag_id: str = "kappa_promote") -> list[dict]:
    """The asset events a run of `dag_id` emitted (Airflow's own record, through its REST API)."""
    return client._request("GET", "/api/v2/assets/events", what="list asset events",
                           params={"source_dag_id": dag_id, "source_run_id": run_id}).json()["asset_events"]


def downstream_run_after(client, flip_run_id: str, seen: set[str], timeout: float,
                         dag_id: str = "kappa_promote") -> trigger.RunOutcome:
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


def test_a_dag_scheduled_on_the_alias_asset_runs_after_a_promote_and_a_rollback_and_sees_the_version(
        airflow, stack_jobs_stopped):
    bed = stack_jobs_stopped
    alias = bed.alias(PIPELINE)
    client = airflow.client()
    client.wait_for_dags([DOWNSTREAM], timeout=120)
    assert client.get_dag(DOWNSTREAM)["is_paused"] is True
    with bed.kappa() as k:
        v1 = deploy(k, PIPELINE, "v2", actor="tests", reason="first build").version
        wait_ready(k, PIPELINE, v1, deadline_seconds=DEADLINE, poll_seconds=1)
        rules_hash = k.registry.get_version(PIPELINE, v1).rules_hash
        table = str(k.paths(PIPELINE, v1).table)
    seen = {r["dag_run_id"] for r in client.list_runs(DOWNSTREAM)["dag_runs"]}
    client.set_paused(DOWNSTREAM, False)
    try:
        promoted = trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_promote",
                                              trigger.promote_conf(PIPELINE, v1, reason="serve v1",
                                                                   grace_period_seconds=0), timeout=RUN_TIMEOUT)
        assert promoted.ok, promoted.error
        extra = promoted.xcom["promote"]["asset_event"]
        assert {k: v for k, v in extra.items() if k != "at"} == {
            "pipeline": PIPELINE, "alias": alias, "action": "promote", "version": v1, "previous_version": None,
            "rules_version": "v2", "rules_hash": rules_hash, "table": table, "actor": "airflow:admin",
            "reason": f"serve v1 [airflow kappa_promote run {promoted.run_id}]"}
        asset = kappa_alias_asset(alias)
        downstream = downstream_run_after(client, promoted.run_id, seen, timeout=180)
        assert downstream.ok, downstream.error
        [flip] = downstream.xcom["log_flips"]
        assert (flip["asset"], flip["uri"], flip["source_dag_id"], flip["source_run_id"]) == (
            asset.name, asset.uri, "kappa_promote", promoted.run_id)
        assert flip["extra"] == extra and flip["extra"]["version"] == v1
        # listed once the downstream run it created has started: Airflow answers 500 for an event whose
        # created run is still queued (start_date NULL; apache/airflow#71360, fixed by #71379)
        [event] = asset_events(client, promoted.run_id)
        assert (event["name"], event["uri"], event["extra"]) == (asset.name, asset.uri, extra)

        # promoting the version that serves already flips nothing: no asset event
        again = trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_promote",
                                           trigger.promote_conf(PIPELINE, v1, reason="serve v1 again",
                                                                grace_period_seconds=0), timeout=RUN_TIMEOUT)
        assert again.ok, again.error
        assert again.xcom["promote"]["flipped"] is False and again.xcom["promote"]["asset_event"] is None
        assert asset_events(client, again.run_id) == []

        # v2 (other rules) serves, promoted outside Airflow (no event); kappa_rollback flips back to v1
        with bed.kappa() as k:
            v2 = deploy(k, PIPELINE, "v1", actor="tests", reason="second build").version
            wait_ready(k, PIPELINE, v2, deadline_seconds=DEADLINE, poll_seconds=1)
            promote(k, PIPELINE, v2, actor="tests", reason="serve v2")
            assert k.registry.get_version(PIPELINE, v2).rules_hash != rules_hash
        rolled = trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_rollback",
                                            trigger.rollback_conf(PIPELINE, reason="v2 titles look wrong"),
                                            timeout=RUN_TIMEOUT)
        assert rolled.ok, rolled.error
        assert (rolled.xcom["flip"]["flipped"], rolled.xcom["flip"]["to_version"]) == (True, v1)
        back = rolled.xcom["flip"]["asset_event"]
        with bed.kappa() as k:
            moved_at = k.registry.get_alias(alias).updated_at
        assert back == {
            "pipeline": PIPELINE, "alias": alias, "action": "rollback", "version": v1, "previous_version": v2,
            "rules_version": "v2", "rules_hash": rules_hash, "table": table, "actor": "airflow:admin",
            "reason": f"v2 titles look wrong [airflow kappa_rollback run {rolled.run_id}]", "at": moved_at}
        downstream = downstream_run_after(client, rolled.run_id, seen, timeout=180, dag_id="kappa_rollback")
        assert downstream.ok, downstream.error
        [flip] = downstream.xcom["log_flips"]
        assert (flip["asset"], flip["uri"], flip["source_dag_id"], flip["source_run_id"]) == (
            asset.name, asset.uri, "kappa_rollback", rolled.run_id)
        assert flip["extra"] == back and flip["extra"]["version"] == v1
        [event] = asset_events(client, rolled.run_id, "kappa_rollback")
        assert (event["name"], event["uri"], event["extra"]) == (asset.name, asset.uri, back)
    finally:
        # a new client: a connection the server dropped must not turn the pause into the reported failure
        airflow.client().set_paused(DOWNSTREAM, True)
