"""orchestrator.airflow.notes: what a run's note says, that it fits Airflow's 1,000 characters, and that it
reaches the run through the REST API (a fake one on 127.0.0.1) with the credentials of kappa's own stack."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.airflow import notes
from orchestrator.core.net import free_port

pytestmark = pytest.mark.airflow


def test_a_long_report_is_cut_to_airflows_limit_keeping_the_first_line():
    report = {"pipeline": "p", "version": 2, "serving_version": 1, "keys_new": 10, "keys_serving": 10,
              "key_delta_ratio": 0.0, "key_count_ok": True, "rejects": 0, "offsets_read": 10, "reject_rate": 0,
              "max_reject_rate": 0.01, "reject_rate_ok": True, "rows_compared": 10, "rows_changed": 10,
              "changed_by_column": {f"col{i}": 10 for i in range(8)},
              "top_changes": {f"col{i}": [{"old": "a" * 60, "new": "b" * 60, "count": 3}] * 3 for i in range(8)}}
    note = notes.compose("p v2 has caught up; its checks pass", notes.report_md(report), operator_note="mine")
    assert len(note) <= notes.NOTE_LIMIT
    assert note.splitlines()[0] == "**kappa:** p v2 has caught up; its checks pass"
    assert "cut to Airflow's 1,000-character note" in note
    assert note.endswith("\n---\nNote at trigger: mine")
    assert notes.operator_part(note) == "mine"
    assert notes.operator_part("the operator's own words") == "the operator's own words"
    assert notes.operator_part(notes.compose("only kappa")) is None


def test_without_credentials_the_note_is_only_logged(monkeypatch, caplog):
    for var in ("AIRFLOW__API__BASE_URL", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"):
        monkeypatch.delenv(var, raising=False)
    note = notes.set_run_note("p v2 is ready", ["body"], dag_id="kappa_reprocess", run_id="manual__1")
    assert note == "**kappa:** p v2 is ready\n\nbody"
    assert "the run's note is not set (no Airflow connection 'kappa_airflow_api'" in caplog.text


class FakeRuns:
    """A token and one run whose note can be read and patched."""

    def __init__(self, note):
        self.note, self.patches = note, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def body(self):
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def do_POST(self):
                assert self.body() == {"username": "admin", "password": "s3cret"}
                self.reply({"access_token": "tok"})

            def do_GET(self):
                assert self.headers["Authorization"] == "Bearer tok"
                self.reply({"dag_run_id": "manual__1", "note": fake.note})

            def do_PATCH(self):
                assert self.path == "/api/v2/dags/kappa_reprocess/dagRuns/manual__1?update_mask=note"
                fake.note = self.body()["note"]
                fake.patches.append(fake.note)
                self.reply({"dag_run_id": "manual__1", "note": fake.note})

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_note_is_patched_on_the_run_and_keeps_the_operators_note(tmp_path, monkeypatch):
    fake = FakeRuns(note="rolling out rules v2 for the EMEA launch")
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"admin": "s3cret"}))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", fake.url)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "kappa_reprocess")
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "manual__1")
    try:
        notes.set_run_note("p v2 has caught up", ["report"])
        notes.set_run_note("p v2 is ready and NOT promoted", ["next step"])
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    assert fake.patches == [
        "**kappa:** p v2 has caught up\n\nreport\n\n---\nNote at trigger: rolling out rules v2 for the EMEA launch",
        "**kappa:** p v2 is ready and NOT promoted\n\nnext step\n\n---\nNote at trigger: rolling out rules v2 for "
        "the EMEA launch"]


def test_a_cut_note_leaves_no_heading_without_what_it_heads():
    body = ["**Validation report of v2**: 1 rejects.", "", "Top changes of `title`:", "", "| rows | v1 | v2 |",
            "|---:|---|---|", "| 60 | " + "a" * 300 + " | b |"]
    note = notes.compose("p v2 is ready " + "x" * 700, body)
    assert len(note) <= notes.NOTE_LIMIT
    assert note.endswith("**Validation report of v2**: 1 rejects.\n… (cut to Airflow's 1,000-character note: the "
                         "task's log has it all)"), note
