"""A reprocess's catch-up sensor is not failed by Airflow's late executor report (apache/airflow#71172, open in
3.3): in "reschedule" mode each poke ends its task process, the LocalExecutor reports that success, and the
scheduler queues the next poke of the same try when the poke interval has passed. When it drains the report
only after that (a busy machine), it reads the queued poke as "finished with state success, but the task
instance's state attribute is queued" and fails the sensor. A run that waited out a backfill with two such
drains ended failed (`kappa up`'s walk in CI, the sensor's one retry used up).

The interleaving is forced by a hook in the stack's scheduler (`executor_hook/sitecustomize.py`): while the
test holds them, the report of a `wait_ready` workload reaches the scheduler only after the next poke of the
same try was queued. The version stays unready meanwhile: its backfill is held before its commit by the
jobs' hold hook (its environment handed to the start_version task by the same hook). Twice the reports are
held for at least three pokes; the run must end success, its sensor in its first try, and Airflow's event log
must hold no "state mismatch" for it. With the sensors in reschedule mode this test fails (the scheduler
logs the mismatch and the sensor goes on in its retry, or the run ends failed); kappa's sensors poke in one
task (orchestrator.airflow.params.SENSOR_MODE).
"""

from __future__ import annotations

import json

import pytest
from airflow_helpers import RUN_TIMEOUT

from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

PIPELINE = "af_race"


def sensor_of(client, run_id: str) -> dict:
    return next(t for t in client.task_instances("kappa_reprocess", run_id) if t["task_id"] == "wait_ready")


def mismatches(client, run_id: str) -> list[dict]:
    """Airflow's event log entries of the scheduler failing one of the run's tasks on a state mismatch."""
    events = client._request("GET", "/api/v2/eventLogs", params={"dag_id": "kappa_reprocess", "limit": 1000},
                             what="read the event log").json()["event_logs"]
    return [e for e in events if e.get("event") == "state mismatch" and e.get("run_id") == run_id]


def test_the_catch_up_sensor_survives_a_poke_s_report_drained_after_the_next_poke(airflow, executor_ctl,
                                                                                  stack_jobs_stopped, tmp_path):
    from orchestrator.airflow.client import follow, reprocess_conf

    bed = stack_jobs_stopped
    client = airflow.client()
    held = tmp_path / "held"
    env_file = executor_ctl / "env.json"
    hold_report, report_held = executor_ctl / "hold-report", executor_ctl / "report-held"
    hold_start, start_held = executor_ctl / "hold-start", executor_ctl / "start-held"
    env_file.write_text(json.dumps({HOLD_HOOK: "0", HOLD_FILE: str(held)}))
    try:
        run_id = client.trigger("kappa_reprocess", reprocess_conf(PIPELINE, reason="the sensor race",
                                                                  auto_promote=False))["dag_run_id"]
        wait_until(held.exists, "the version's backfill read and held before its commit", RUN_TIMEOUT, poll=0.5)
    finally:
        env_file.unlink(missing_ok=True)
    with bed.kappa() as k:
        version = max(v.version for v in k.registry.list_versions(PIPELINE))

        def samples() -> int:
            return len(k.registry.lag_samples(PIPELINE, version, limit=None))

        forced = 0
        for _ in range(2):
            before = samples()
            hold_report.touch()
            hold_start.touch()
            try:
                # a poke that ended has its report held (reschedule mode), or three pokes passed in one task
                wait_until(lambda: report_held.exists() or samples() >= before + 3,
                           "a poke's report held, or three pokes of the running sensor", 120, poll=0.2)
                if report_held.exists():
                    wait_until(start_held.exists, "the next poke of the same try queued, its report held", 60)
                    hold_report.unlink()   # the late report reaches the scheduler while the next poke is queued
                    wait_until(lambda: mismatches(client, run_id) or sensor_of(client, run_id)["state"] != "queued",
                               "the scheduler to drain the late report", 60, poll=0.2)
                    forced += 1
            finally:
                for f in (hold_report, hold_start, report_held, start_held):
                    f.unlink(missing_ok=True)
        sensor = sensor_of(client, run_id)
        held.unlink()   # the backfill commits; the version catches up
        assert sensor["state"] not in ("failed", "up_for_retry"), (
            f"the scheduler failed the sensor after {forced} late report(s) (apache/airflow#71172): {sensor}")

    outcome = follow(client, "kappa_reprocess", run_id, timeout=RUN_TIMEOUT, poll_seconds=2)
    assert outcome.ok, f"{outcome.error} (reports forced late: {forced})"
    sensor = next(t for t in outcome.tasks if t.task_id == "wait_ready")
    assert (sensor.state, sensor.try_number) == ("success", 1), sensor
    assert mismatches(client, run_id) == []
    with bed.kappa() as k:
        record = k.registry.get_version(PIPELINE, version)
        assert record.state == "caught_up", record
