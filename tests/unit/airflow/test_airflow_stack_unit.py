"""orchestrator.airflow.stack without Airflow running: its configuration, the settings it hands
to tasks, and stopping by recorded PID (never a process it did not start)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.airflow import stack as airflow_stack
from orchestrator.core.settings import Settings
from orchestrator.core.exceptions import AirflowError
from orchestrator.jobctl.process import create_time, group_running

pytestmark = pytest.mark.airflow


def test_airflow_env_defaults(tmp_path):
    env = airflow_stack.airflow_env(tmp_path, port=8123)
    assert env["AIRFLOW_HOME"] == str(tmp_path.resolve())
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path.resolve()}/airflow.db"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(airflow_stack.DAGS_FOLDER)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == \
        str(tmp_path.resolve() / "simple_auth_manager_passwords.json.generated")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:8123"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8123/execution/"
    assert env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "False"


def test_airflow_env_postgresql(tmp_path):
    url = "postgresql+psycopg2://airflow:pw@127.0.0.1:5432/airflow"
    env = airflow_stack.airflow_env(tmp_path, db_url=url, username="ops", paused_at_creation=True)
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == url
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "ops:admin"
    assert env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "True"
    assert "AIRFLOW__API__PORT" not in env


def test_tasks_get_the_resolved_settings(tmp_path):
    from orchestrator.core.settings import resolve_settings

    s = Settings(home=tmp_path / "home", bootstrap_servers="127.0.0.1:9092",
                 kafka_config={"security.protocol": "SASL_SSL", "sasl.password": "s3cret"})
    env = airflow_stack.kappa_env(s)
    assert env["KAPPA_HOME"] == str(tmp_path / "home")
    assert env["KAPPA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"
    assert json.loads(env["KAPPA_KAFKA_CONFIG"]) == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret"}
    again = resolve_settings(env=env, cwd=tmp_path / "elsewhere")
    assert again.model_dump() == s.model_dump()
    assert "KAPPA_BOOTSTRAP_SERVERS" not in airflow_stack.kappa_env(Settings(home=tmp_path))


def test_stop_without_a_stack_is_a_no_op(tmp_path):
    s = Settings(home=tmp_path)
    assert airflow_stack.running(s) is None
    assert airflow_stack.stop(s) == []


def test_unreadable_state_file_is_a_clear_error(tmp_path):
    s = Settings(home=tmp_path)
    (tmp_path / "airflow").mkdir()
    (tmp_path / "airflow" / "stack.json").write_text("{not json")
    with pytest.raises(AirflowError, match=r"stack.json is not a kappa Airflow state file .*delete it if no Airflow runs"):
        airflow_stack.stop(s)


def _record(home, procs: dict[str, subprocess.Popen], created=None):
    stack = airflow_stack.AirflowStack(home=home, port=1, username="admin", password="admin",
                                       db_url="sqlite:///x.db")
    for name, p in procs.items():
        stack.pids[name] = p.pid
        stack.created[name] = created if created is not None else create_time(p.pid)
    home.mkdir(parents=True, exist_ok=True)
    airflow_stack._write_state(stack)


def test_stop_ends_the_recorded_process_groups(tmp_path):
    s = Settings(home=tmp_path)
    # a component and a child of it (a LocalExecutor worker, say) in its process group
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"],
                            start_new_session=True)
    try:
        _record(airflow_stack.airflow_home(s), {"scheduler": proc})
        stack = airflow_stack.running(s)
        assert stack is not None and stack.already_running and stack.pids == {"scheduler": proc.pid}
        t0 = time.monotonic()
        assert airflow_stack.stop(s, timeout=10) == ["scheduler"]
        assert proc.wait(5) is not None and time.monotonic() - t0 < 10
        assert not group_running(proc.pid)  # the whole group is gone (an orphan's zombie is init's to reap)
        assert airflow_stack.running(s) is None
        assert not (airflow_stack.airflow_home(s) / "stack.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_returns_only_once_a_straggler_of_the_group_has_ended(tmp_path, monkeypatch):
    """CI: right after the stop a process of the stopped group was still there. Forced: the leader's child
    ignores SIGTERM and the SIGKILL that follows reaches the group only 0.5 s after it was sent (a loaded
    machine's slow death); the stop returns once nothing of the group runs."""
    ready = tmp_path / "child-ready"
    child = (f"import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                             f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(600)"],
                            start_new_session=True)
    real = airflow_stack.signal_group

    def slow_kill(pid, sig):
        if sig == signal.SIGKILL:
            threading.Timer(0.5, real, (pid, sig)).start()
        else:
            real(pid, sig)
    monkeypatch.setattr(airflow_stack, "signal_group", slow_kill)
    s = Settings(home=tmp_path / "home")
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the leader's child did not start"
        _record(airflow_stack.airflow_home(s), {"scheduler": proc})
        assert airflow_stack.stop(s, timeout=10) == ["scheduler"]
        assert not group_running(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        real(proc.pid, signal.SIGKILL)
        proc.wait(5)


def test_stop_signals_every_component_before_waiting(tmp_path):
    """Components that ignore SIGTERM are each killed `timeout` after their own signal, all at once:
    the stop takes about one timeout, not one per component."""
    s = Settings(home=tmp_path)
    ignore = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
    procs = {c: subprocess.Popen([sys.executable, "-c", ignore], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True) for c in ("scheduler", "triggerer", "api-server")}
    try:
        for p in procs.values():
            assert p.stdout.readline().strip() == "ready"
        _record(airflow_stack.airflow_home(s), procs)
        t0 = time.monotonic()
        assert airflow_stack.stop(s, timeout=1.5) == ["scheduler", "triggerer", "api-server"]
        elapsed = time.monotonic() - t0
        assert 1.4 < elapsed < 2.8, elapsed  # one after another would take 4.5 s
        for p in procs.values():
            assert p.wait(5) == -9  # SIGKILL after the timeout, since SIGTERM was ignored
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.stdout.close()


def test_stop_never_kills_a_reused_pid(tmp_path):
    s = Settings(home=tmp_path)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        # the recorded start time does not match: this PID now belongs to someone else
        _record(airflow_stack.airflow_home(s), {"scheduler": bystander}, created=1.0)
        assert airflow_stack.running(s) is None
        assert airflow_stack.stop(s, timeout=2) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_metadata_database_url_is_checked(monkeypatch):
    assert airflow_stack.check_db_url("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"
    with pytest.raises(AirflowError, match="not a database URL for Airflow's metadata: 'not a url'"):
        airflow_stack.check_db_url("not a url")
    with pytest.raises(AirflowError, match="SQLite or PostgreSQL, not mysql"):
        airflow_stack.check_db_url("mysql://u:secret@h/db")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "asyncpg" else real(name, *a))
    with pytest.raises(AirflowError, match="needs the asyncpg driver: run `pip install asyncpg`"):
        airflow_stack.check_db_url("postgresql+psycopg2://u@127.0.0.1:5432/airflow")


def test_the_json_form_and_the_state_file_hide_both_passwords(tmp_path):
    stack = airflow_stack.AirflowStack(home=tmp_path, port=8123, username="admin", password="login-pw",
                                       db_url="postgresql+psycopg2://airflow:db-pw@127.0.0.1:5432/airflow",
                                       pids={"scheduler": 4242}, created={"scheduler": 12.5})
    d = stack.model_dump(mode="json")
    assert d["url"] == "http://127.0.0.1:8123"
    assert d["db_url"] == "postgresql+psycopg2://airflow:***@127.0.0.1:5432/airflow"
    assert d["logs"] == {"scheduler": str(tmp_path / "logs" / "scheduler.log")}
    assert "login-pw" not in json.dumps(d) and "procs" not in d
    airflow_stack._write_state(stack)
    state = (tmp_path / "stack.json").read_text()
    assert "db-pw" not in state and "login-pw" not in state
    again = airflow_stack._load_state(tmp_path)
    assert (again.port, again.username, again.pids, again.created) == (8123, "admin", {"scheduler": 4242},
                                                                        {"scheduler": 12.5})
