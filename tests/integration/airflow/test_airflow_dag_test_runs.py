"""`dag.test()` runs of kappa_reprocess, kappa_promote and kappa_rollback against the embedded stack
(real broker, real Spark jobs, real Delta tables, the registry), checking the registry, the whole
served table and the served version's rejects (the topic holds malformed records) after each run."""

from __future__ import annotations

import os
from unittest import mock

import pytest
from airflow_helpers import expected, pipelines_toml, served_diff

from orchestrator.airflow import tasks
from orchestrator.airflow.stack import DAGS_FOLDER
from orchestrator.core.exceptions import ConflictError

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

PIPELINE = "af_dagtest"


def run_dag(dag_id: str, conf: dict):
    """Parse dags/ as the dag-processor would (with this test's settings) and run one DagRun in-process."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    with mock.patch.dict(os.environ):  # the task runner exports AIRFLOW_CTX_* into this process
        dr = bag.dags[dag_id].test(run_conf=conf)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    return dr, states


def xcom(dr, task_id: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(select(XComModel).where(XComModel.dag_id == dr.dag_id, XComModel.run_id == dr.run_id,
                                                      XComModel.task_id == task_id,
                                                      XComModel.key == "return_value")).first()
        return XComModel.deserialize_value(row) if row is not None else None


def test_reprocess_promote_rollback_monitor_through_dag_test(airflow_db, in_process_kappa, tmp_path, monkeypatch):
    bed = in_process_kappa
    alias = bed.alias(PIPELINE)
    exp_v1, exp_v2 = expected(bed, PIPELINE, "v1"), expected(bed, PIPELINE, "v2")
    assert exp_v1.table["title"].to_pylist() != exp_v2.table["title"].to_pylist(), \
        "the test data must show what the v2 rules change"
    assert exp_v1.rejects, "the test data must hold malformed records"

    # 1. reprocess with rules v1, auto-promote: v1 serves
    dr, states = run_dag("kappa_reprocess", {"pipeline": PIPELINE, "rules_version": "v1", "reason": "first build"})
    assert dr.state == "success", states
    assert states == {"validate": "success", "preview_rules": "success", "start_version": "success",
                      "wait_ready": "success", "validation_report": "success", "promote": "success",
                      "stop_previous": "success"}
    assert xcom(dr, "preview_rules")["previewed"] is False  # nothing served yet: the run goes on
    with bed.kappa() as k:
        assert k.registry.get_alias(alias).version == 1
        v1 = k.registry.get_version(PIPELINE, 1)
        assert v1.state == "serving" and v1.rules_version == "v1"
        assert v1.actor == "airflow:dag_test" and f"first build [airflow kappa_reprocess run {dr.run_id}]" == v1.reason
    assert served_diff(bed, PIPELINE, "v1") is None
    report = xcom(dr, "validation_report")
    assert report["version"] == 1 and report["keys_new"] == exp_v1.table.num_rows and report["serving_version"] is None
    assert report["rejects"] == len(exp_v1.rejects)

    # 2. reprocess with rules v2, auto-promote off: v2 ready, v1 still serves
    dr, states = run_dag("kappa_reprocess", {"pipeline": PIPELINE, "rules_version": "v2", "auto_promote": False,
                                             "reason": "merge title spellings"})
    assert dr.state == "success", states
    # the promote task ends skipped (it promoted nothing), and so does stop_previous after it
    assert states["promote"] == "skipped" and states["stop_previous"] == "skipped"
    report = xcom(dr, "validation_report")
    assert report["version"] == 2 and report["serving_version"] == 1 and report["rows_changed"] > 0
    # the preview before the rebuild saw the same changes in the served v1 that the rebuilt v2 shows
    preview = xcom(dr, "preview_rules")
    assert preview["previewed"] is True and (preview["serving_version"], preview["rules_version"]) == (1, "v2")
    assert preview["changed_by_column"] == report["changed_by_column"]
    with bed.kappa() as k:
        assert k.registry.get_alias(alias).version == 1
        assert k.registry.get_version(PIPELINE, 2).state == "caught_up"
    assert served_diff(bed, PIPELINE, "v1") is None

    # a retry of this run's tasks (say its worker died after the deploy) continues with v2: no second
    # version, no second job; any other run is refused while v2 is in flight
    again = tasks.start_reprocess(PIPELINE, "v2", None, "merge title spellings", user="dag_test", run_id=dr.run_id)
    assert again["version"] == 2 and again["resumed"] is True and again["job_started"] is False
    assert tasks.validate_reprocess(PIPELINE, "v2", user="dag_test", run_id=dr.run_id)["resumes_version"] == 2
    with pytest.raises(ConflictError, match=f"pipeline '{PIPELINE}' already has v2 in flight"):
        tasks.validate_reprocess(PIPELINE, "v2", user="bob", run_id="manual__another_run")
    with bed.kappa() as k:
        assert [v.version for v in k.registry.list_versions(PIPELINE)] == [1, 2]

    # 3. kappa_promote (newest caught-up version): v2 serves, v1 is stopped after the (zero) grace period
    dr, states = run_dag("kappa_promote", {"pipeline": PIPELINE, "reason": "reviewed the report"})
    assert dr.state == "success", states
    assert xcom(dr, "check")["would_succeed"] is True
    assert xcom(dr, "promote")["previous_version"] == 1
    assert xcom(dr, "stop_previous")["stopped"] == 1
    with bed.kappa() as k:
        assert k.registry.get_alias(alias).version == 2
        assert k.registry.get_version(PIPELINE, 2).state == "serving"
        assert k.registry.get_version(PIPELINE, 1).state == "stopped"
        flips = [e for e in k.registry.audit_log(PIPELINE, action="promote") if e.outcome == "ok"]
        assert flips[-1].actor == "airflow:dag_test" and f"[airflow kappa_promote run {dr.run_id}]" in flips[-1].reason
    assert served_diff(bed, PIPELINE, "v2") is None
    # a retried promote task after the flip: a no-op that still knows which version it replaced
    retried = tasks.promote(PIPELINE, 2, "reviewed the report", user="dag_test", run_id=dr.run_id)
    assert retried["flipped"] is False and retried["previous_version"] == 1

    # 4. kappa_rollback: v1 restarts from its checkpoint, catches up, serves again
    dr, states = run_dag("kappa_rollback", {"pipeline": PIPELINE, "reason": "v2 titles look wrong"})
    assert dr.state == "success", states
    prepared = xcom(dr, "prepare")
    assert {key: v for key, v in prepared.items() if key not in ("message", "estimate", "restarted_at")} == {
        "pipeline": PIPELINE, "alias": alias, "from_version": 2, "to_version": 1, "restarted": True, "done": False,
        "pointer": None}
    assert "restarting it from its checkpoint" in prepared["message"], prepared["message"]
    assert prepared["estimate"]["restart"] is True and prepared["estimate"]["stopped_by"] == "airflow:dag_test"
    with bed.kappa() as k:
        assert k.registry.get_alias(alias).version == 1
        assert k.registry.get_version(PIPELINE, 1).state == "serving"
        assert k.registry.get_version(PIPELINE, 2).state == "standby"
        starts = k.registry.audit_log(PIPELINE, action="start", version=1)
        assert starts[-1].details["resumed"] is True  # from its checkpoint, not from offset zero
    assert served_diff(bed, PIPELINE, "v1") is None

    # 5. the same rollback again is a no-op: nothing restarted, nothing flipped
    dr, states = run_dag("kappa_rollback", {"pipeline": PIPELINE, "to_version": 1, "reason": "again"})
    assert dr.state == "success", states
    assert xcom(dr, "prepare")["restarted"] is False and xcom(dr, "prepare")["done"] is True
    assert xcom(dr, "flip")["flipped"] is False
    with bed.kappa() as k:
        assert k.registry.get_alias(alias).version == 1

    # 6. kappa_monitor (only this pipeline declared, so other tests' versions do not count): the standby
    #    v2 is past its (zero) grace period and gets stopped; v1 serves healthily, so the run succeeds
    only_this = tmp_path / "pipelines.toml"
    only_this.write_text(pipelines_toml({PIPELINE: bed.topics[PIPELINE]}))
    monkeypatch.setenv("KAPPA_PIPELINES", str(only_this))
    dr, states = run_dag("kappa_monitor", {})
    assert dr.state == "success", states
    report = xcom(dr, "monitor")
    assert [s["version"] for s in report["stopped"]] == [2] and report["problems"] == []
    assert {(v["version"], v["state"], v["readiness"]) for v in report["versions"]} == {(1, "serving", "ready"),
                                                                                      (2, "standby", "ready")}

    # 7. the serving version's job is stopped (forced, as a crash would leave the alias): kappa_monitor fails
    # loudly, naming it and saying it was a stop, not a failure of the job
    from orchestrator.jobctl import stop_version

    with bed.kappa() as k:
        stop_version(k.version(PIPELINE, 1), actor="tests", reason="simulate a crash", force=True, final_state=None)
    dr, states = run_dag("kappa_monitor", {})
    assert dr.state == "failed" and states == {"watch": "success", "monitor": "failed"}
    with bed.kappa() as k:
        alert = k.registry.audit_log(action="monitor")[-1]
        assert alert.outcome == "alert" and alert.actor == "airflow:dag_test"
        assert alert.details["problems"][0].startswith(f"{PIPELINE} v1 serves alias '{alias}' but its job stopped "
                                                       f"on a request")
