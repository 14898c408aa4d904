"""The requests to Airflow's REST API (what `kappa trigger` does) on a real Airflow stack that
Airflow or kappa must refuse: a bad param, a wrong password, a second reprocess while one is in
flight. A whole reprocess through the REST API is test_airflow_kafka_connection's run."""

from __future__ import annotations

import pytest
from airflow_helpers import RUN_TIMEOUT

from orchestrator.airflow import client as trigger
from orchestrator.core.exceptions import AirflowError

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def test_param_validation_rejects_bad_conf_before_any_run(airflow, airflow_testbed):
    client = airflow.client()
    runs_before = client.list_runs("kappa_reprocess")["total_entries"]
    with pytest.raises(AirflowError) as e:
        trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_reprocess",
                                   {"pipeline": "af_busy", "rules_version": "v9", "reason": "typo in the version"},
                                   timeout=30)
    # the versions of every ruleset at the stack's rules location (the team's repo: titles v1, v2; plans v1-v3)
    assert str(e.value) == ("Airflow rejected the request to trigger kappa_reprocess: Invalid input for param "
                            "rules_version: 'v9' is not one of [None, 'v1', 'v2', 'v3']")
    with pytest.raises(AirflowError, match="Invalid input for param reason: No value passed"):
        trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_reprocess", {"pipeline": "af_busy"},
                                   timeout=30)
    assert client.list_runs("kappa_reprocess")["total_entries"] == runs_before
    with airflow_testbed.kappa() as k:
        assert k.registry.list_versions("af_busy") == []


def test_wrong_password_is_one_clear_error(airflow):
    with pytest.raises(AirflowError) as e:
        trigger.trigger_and_follow(airflow.url, "admin", "not-the-password", "kappa_reprocess",
                                   {"pipeline": "af_busy", "reason": "x y z"}, timeout=30)
    assert str(e.value) == (f"Airflow at {airflow.url} refused the login of user 'admin' (401): wrong user name or "
                            f"password; pass --airflow-user/--airflow-password (`kappa airflow start` sets up admin:admin)")


def test_reprocess_while_one_is_in_flight_fails_its_first_task(airflow, stack_jobs_stopped):
    from orchestrator.lifecycle.deploy import deploy

    bed = stack_jobs_stopped
    with bed.kappa() as k:
        busy = deploy(k, k.pipeline("af_busy"), "v1", actor="ops:carol", reason="manual backfill", start=False)
    assert busy.version == 1

    outcome = trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_reprocess",
                                         {"pipeline": "af_busy", "rules_version": "v2", "reason": "second one"},
                                         timeout=RUN_TIMEOUT)
    assert outcome.state == "failed"
    states = {t.task_id: t.state for t in outcome.tasks}
    assert states["validate"] == "failed"
    assert {s for t, s in states.items() if t != "validate"} == {"upstream_failed"}
    assert outcome.error.startswith("task validate failed: ConflictError: pipeline 'af_busy' already has v1 in "
                                    "flight (state created, deployed by ops:carol: manual backfill); refusing a "
                                    "second reprocess.")
    validate = next(t for t in outcome.tasks if t.task_id == "validate")
    assert validate.try_number == 1  # a refusal is not retried
    with bed.kappa() as k:
        assert [v.version for v in k.registry.list_versions("af_busy")] == [1]
        assert k.registry.get_version("af_busy", 1).state == "created"
        assert k.registry.get_alias(bed.alias("af_busy")) is None


def test_starting_again_returns_the_running_stack(airflow, airflow_testbed):
    from orchestrator.airflow import stack as airflow_stack

    again = airflow_stack.start(airflow_testbed.settings)
    assert again.already_running and again.url == airflow.url and again.pids == airflow.pids
    assert airflow_stack.running(airflow_testbed.settings).pids == airflow.pids
