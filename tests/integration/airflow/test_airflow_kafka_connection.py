"""Kafka settings through an Airflow Connection, on the real Airflow stack.

`kafka_default` is created through Airflow's REST API with the session broker's SASL/SCRAM
listener in its extra and the SCRAM user's login and password (the broker checks them: a wrong
one fails the deploy). A kappa_reprocess run then deploys and promotes a version that reads
through that listener: the job got the password (in its 0600 kafka.json, the only place a job
reads it from), while the stack's own KAPPA_* environment has none. The password is in no task log, no job log, no registry row or
audit entry, and no process's command line or environment. The connection is deleted after the
test, so the other tests of the session keep the stack's settings.

The run is also the suite's check of a whole kappa_reprocess through the REST API (what `kappa
trigger` does): the states it went through, every task's end state, the validation report
against the oracle, the actor and reason in the registry and the audit log, and the served table.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import psutil
import pytest
from airflow_helpers import RUN_TIMEOUT, expected, served_diff

from orchestrator.airflow import client as trigger

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

PIPELINE = "af_conn"


def _proc_texts() -> list[str]:
    texts = []
    for proc in psutil.process_iter(["pid"]):
        try:
            texts.append(" ".join(proc.cmdline()))
            texts.append(json.dumps(proc.environ()))
        except psutil.Error:
            continue
    return texts


def test_reprocess_takes_kafka_settings_from_the_airflow_connection(airflow, stack_jobs_stopped, broker):
    from orchestrator.dev.broker import SCRAM_MECHANISM
    from tests.conftest import SCRAM_USER

    bed = stack_jobs_stopped
    secret = broker.scram_users[SCRAM_USER]
    assert secret not in json.dumps(bed.env())
    client = airflow.client()
    client.set_connection("kafka_default", "kafka", password=secret, login=SCRAM_USER,
                          extra={"bootstrap.servers": broker.sasl_bootstrap_servers,
                                 "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM_MECHANISM,
                                 "client.id": "kappa-from-connection"})
    run_states = []
    try:
        outcome = trigger.trigger_and_follow(airflow.url, "admin", "admin", "kappa_reprocess",
                                             {"pipeline": PIPELINE, "rules_version": "v1",
                                              "reason": "settings from the kafka_default connection"},
                                             timeout=RUN_TIMEOUT, on_state=lambda state, tasks: run_states.append(state))
        assert outcome.ok, f"{outcome.error}\n" + "\n".join(line for t in outcome.tasks for line in t.log_tail)
        version = outcome.xcom["start_version"]["version"]
        logs = [json.dumps(client.task_log("kappa_reprocess", outcome.run_id, t.task_id, max(t.try_number, 1)))
                for t in outcome.tasks]
        processes = _proc_texts()
    finally:
        client.delete_connection("kafka_default")

    # the whole run, as the REST API reports it
    assert run_states[-1] == "success" and "running" in run_states
    assert {t.task_id: t.state for t in outcome.tasks} == {
        "validate": "success", "preview_rules": "success", "start_version": "success", "wait_ready": "success",
        "validation_report": "success", "promote": "success", "stop_previous": "success"}
    assert version == 1 and outcome.xcom["promote"]["flipped"] is True
    exp = expected(bed, PIPELINE, "v1")
    assert exp.rejects, "the test data must hold malformed records"
    report = outcome.xcom["validation_report"]
    assert (report["keys_new"], report["rejects"]) == (exp.table.num_rows, len(exp.rejects))
    assert served_diff(bed, PIPELINE, "v1") is None

    with bed.kappa() as k:
        v1 = k.registry.get_version(PIPELINE, version)
        assert (v1.state, v1.rules_version, v1.actor) == ("serving", "v1", "airflow:admin")
        assert v1.reason == f"settings from the kafka_default connection [airflow kappa_reprocess run {outcome.run_id}]"
        promote = [e for e in k.registry.audit_log(PIPELINE, action="promote") if e.outcome == "ok"][-1]
        assert promote.actor == "airflow:admin" and outcome.run_id in promote.reason
        paths = k.paths(PIPELINE, version)
        kafka_file = paths.version_dir / "kafka.json"
        given = json.loads(kafka_file.read_text())
        assert (given["sasl.password"], given["sasl.username"], given["client.id"]) == (
            secret, SCRAM_USER, "kappa-from-connection")
        assert stat.S_IMODE(kafka_file.stat().st_mode) == 0o600
        assert k.registry.get_alias(bed.alias(PIPELINE)).version == version
        registry_text = json.dumps([r.model_dump(mode="json") for r in k.registry.list_versions(PIPELINE)]
                                   + [a.model_dump(mode="json") for a in k.registry.audit_log(PIPELINE, limit=None)])
        job_log = paths.log_file.read_text(errors="replace")
    assert any("Kafka settings from Airflow connection 'kafka_default'" in log for log in logs)
    for where, text in [("registry", registry_text), ("job log", job_log)] + \
                       [(f"task log {t.task_id}", log) for t, log in zip(outcome.tasks, logs)]:
        assert secret not in text, f"the connection's password shows in the {where}"
    assert not any(secret in text for text in processes), "the password is on a command line or in an environment"
    others = [p for p in Path(bed.settings.home).rglob("*") if p.is_file() and p != kafka_file
              and p.stat().st_size < 50_000_000 and secret in p.read_text(errors="ignore")]
    assert others == [], f"the password is in {others}"
