"""orchestrator.airflow.client against a fake Airflow REST API on 127.0.0.1: every refusal is one clear
AirflowError line, and a followed run reports the failed task's own error."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.airflow import client as trigger
from orchestrator.core.net import free_port
from orchestrator.core.exceptions import AirflowError

pytestmark = pytest.mark.airflow

PARAM_ERROR = ("Invalid input for param rules_version: 'v9' is not one of [None, 'v1', 'v2']\n\n"
               "Failed validating 'enum' in schema:\n    {'type': ['null', 'string']}")


class FakeAirflow:
    """Just enough of Airflow 3's API: a token, one DAG, runs that advance one state per poll."""

    def __init__(self):
        self.password = "admin"
        self.paused = False
        self.run_states = ["queued", "running", "failed"]
        self.task_states = {"validate": ["running", "failed"], "start_version": [None, "upstream_failed"]}
        self.polls = 0
        self.triggered: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def body(self):
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def authorized(self):
                if self.headers.get("Authorization") != "Bearer tok":
                    self.reply(401, {"detail": "Invalid JWT token"})
                    return False
                return True

            def do_POST(self):
                if self.path == "/auth/token":
                    creds = self.body()
                    if creds.get("password") != fake.password:
                        return self.reply(401, {"detail": "Invalid credentials"})
                    return self.reply(201, {"access_token": "tok"})
                if not self.authorized():
                    return
                if self.path == "/api/v2/dags/kappa_reprocess/dagRuns":
                    body = self.body()
                    if body.get("conf", {}).get("rules_version") == "v9":
                        return self.reply(400, {"detail": PARAM_ERROR})
                    fake.triggered.append(body)
                    return self.reply(200, {"dag_run_id": "manual__1", "state": "queued"})
                self.reply(404, {"detail": f"no route {self.path}"})

            def do_GET(self):
                if not self.authorized():
                    return
                base = "/api/v2/dags/kappa_reprocess"
                path = self.path.split("?")[0]
                if path == base:
                    return self.reply(200, {"dag_id": "kappa_reprocess", "is_paused": fake.paused})
                if path.startswith("/api/v2/dags/") and path.count("/") == 4:
                    return self.reply(404, {"detail": f"The Dag with ID: `{path.rsplit('/', 1)[1]}` was not found"})
                if path == f"{base}/dagRuns/manual__1":
                    i = min(fake.polls, len(fake.run_states) - 1)
                    fake.polls += 1
                    return self.reply(200, {"dag_run_id": "manual__1", "state": fake.run_states[i],
                                            "conf": fake.triggered[-1]["conf"]})
                if path == f"{base}/dagRuns/manual__1/taskInstances":
                    i = 0 if fake.polls < len(fake.run_states) else 1
                    return self.reply(200, {"task_instances": [
                        {"task_id": t, "state": states[i], "try_number": 1 if states[i] else 0}
                        for t, states in fake.task_states.items()]})
                if path == f"{base}/dagRuns/manual__1/taskInstances/validate/logs/1":
                    assert self.headers.get("Accept") == "application/json"
                    return self.reply(200, {"content": [
                        {"timestamp": "2026-01-01T00:00:00Z", "level": "info", "event": "checking"},
                        {"timestamp": "2026-01-01T00:00:01Z", "level": "error", "event": "Task failed with exception",
                         "error_detail": [{"exc_type": "AirflowFailException",
                                           "exc_value": "ConflictError: pipeline 'std' already has v3 in flight"}]}]})
                if "/xcomEntries/" in path:
                    return self.reply(200, {"value": {"version": 2}})
                self.reply(404, {"detail": f"no route {path}"})

            do_PATCH = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = FakeAirflow()
    try:
        yield f
    finally:
        f.close()


def follow(fake, conf, password="admin", dag_id="kappa_reprocess", **kw):
    return trigger.trigger_and_follow(fake.url, "admin", password, dag_id, conf, timeout=10, poll_seconds=0.01, **kw)


def test_wrong_password_is_one_clear_line(fake):
    with pytest.raises(AirflowError) as e:
        follow(fake, {}, password="wrong")
    assert str(e.value) == (f"Airflow at {fake.url} refused the login of user 'admin' (401): wrong user name or "
                            f"password; pass --airflow-user/--airflow-password (`kappa airflow start` sets up admin:admin)")
    assert fake.triggered == []


def test_param_error_keeps_the_first_line_naming_the_param(fake):
    with pytest.raises(AirflowError) as e:
        follow(fake, {"rules_version": "v9", "reason": "x"})
    assert str(e.value) == ("Airflow rejected the request to trigger kappa_reprocess: Invalid input for param "
                            "rules_version: 'v9' is not one of [None, 'v1', 'v2']")
    assert "\n" not in str(e.value) and fake.triggered == []


def test_unknown_dag_and_unreachable_server(fake):
    with pytest.raises(AirflowError, match=r"no such thing \(read DAG kappa_nope\): The Dag with ID: `kappa_nope`"):
        follow(fake, {}, dag_id="kappa_nope")
    port = free_port()
    with pytest.raises(AirflowError, match=rf"cannot reach Airflow at http://127.0.0.1:{port} to log in"):
        trigger.trigger_and_follow(f"http://127.0.0.1:{port}", "admin", "admin", "kappa_reprocess", {}, timeout=5)


def test_paused_dag_is_refused_before_triggering(fake):
    fake.paused = True
    with pytest.raises(AirflowError, match="DAG kappa_reprocess is paused"):
        follow(fake, {"reason": "x"})
    assert fake.triggered == []


def test_failed_run_reports_kappas_message(fake):
    seen = []
    outcome = follow(fake, {"pipeline": "std", "reason": "new rules"}, on_state=lambda s, t: seen.append((s, dict(t))))
    assert fake.triggered == [{"logical_date": None, "conf": {"pipeline": "std", "reason": "new rules"}}]
    assert not outcome.ok and outcome.state == "failed"
    assert outcome.error == "task validate failed: ConflictError: pipeline 'std' already has v3 in flight"
    assert [s for s, _ in seen] == ["queued", "running", "failed"]
    assert seen[-1][1] == {"validate": "failed", "start_version": "upstream_failed"}
    failed = next(t for t in outcome.tasks if t.task_id == "validate")
    assert failed.log_tail[-1].endswith("error Task failed with exception")
    assert outcome.url == f"{fake.url}/dags/kappa_reprocess/runs/manual__1"
    with pytest.raises(AirflowError, match="kappa_reprocess run manual__1 failed: task validate failed: ConflictError"):
        outcome.raise_for_state()
    assert json.loads(json.dumps(outcome.model_dump(mode="json")))["error"] == outcome.error


def test_successful_run_carries_task_results(fake):
    fake.run_states = ["queued", "success"]
    fake.task_states = {"validate": ["running", "success"]}
    outcome = follow(fake, {"reason": "x"}).raise_for_state()
    assert outcome.ok and outcome.error is None
    assert outcome.xcom == {"validate": {"version": 2}}


def test_a_run_that_does_not_finish_in_time_says_where_to_look(fake):
    fake.run_states = ["running"]
    with pytest.raises(AirflowError, match=r"kappa_reprocess run manual__1 is still running after 0s .*follow it at"):
        trigger.trigger_and_follow(fake.url, "admin", "admin", "kappa_reprocess", {"reason": "x"}, timeout=0.05,
                                   poll_seconds=0.01)


def test_conf_builders_use_the_dags_param_names(tmp_path, monkeypatch):
    """What `kappa trigger` sends is exactly what the DAG forms accept."""
    import copy

    from airflow.dag_processing.dagbag import DagBag

    from orchestrator.airflow.stack import DAGS_FOLDER

    for var in ("KAPPA_PIPELINES", "KAPPA_HOME", "KAPPA_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    dags = DagBag(dag_folder=str(DAGS_FOLDER)).dags
    confs = {
        "reprocess": trigger.reprocess_conf("standardize", "v2", reason="new rules", threshold=5, auto_promote=False,
                                            grace_period_seconds=60, catchup_deadline_minutes=30),
        "promote": trigger.promote_conf("standardize", 3, reason="reviewed", grace_period_seconds=0),
        "rollback": trigger.rollback_conf("standardize", 2, reason="bad titles", catchup_deadline_minutes=10),
    }
    for verb, conf in confs.items():
        params = copy.deepcopy(dags[f"kappa_{verb}"].params)
        params.update(conf)
        resolved = params.validate()
        assert {k: resolved[k] for k in conf} == conf
    assert trigger.reprocess_conf("standardize", reason="r") == {"pipeline": "standardize", "reason": "r"}
    assert trigger.rollback_conf("standardize", reason="r") == {"pipeline": "standardize", "reason": "r"}
