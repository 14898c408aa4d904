"""Run Airflow for kappa on one machine: api-server, scheduler, dag-processor and triggerer.

Everything binds to 127.0.0.1. AIRFLOW_HOME is `<kappa home>/airflow`, the dags folder is kappa's
(`orchestrator.core.resources.dags_folder()`: the checkout's `dags/` or an install's copy), the
executor is LocalExecutor, the login is SimpleAuthManager's (`admin:admin` unless told otherwise),
the metadata database is SQLite in AIRFLOW_HOME unless a PostgreSQL URL is given. The four
processes inherit kappa's settings as `KAPPA_*` environment variables, so the tasks they run see
the same registry, warehouse and broker as the CLI.

`start()` runs `airflow db migrate`, spawns the processes (each in its own process group), records
their PIDs and creation times in `<AIRFLOW_HOME>/stack.json`, and returns once the API answers,
every component heartbeats and the kappa DAGs are parsed. `stop()` (or `AirflowStack.stop()`)
stops exactly those process groups, and only while each PID is still the process started:
SIGTERM to all of them, then SIGKILL to each still there after a timeout. Version jobs that
tasks started are kappa's, not Airflow's: they run in their own sessions and survive a stop.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, field_serializer

from orchestrator.core.exceptions import AirflowError
from orchestrator.core.files import read_json, tail, write_json_atomic
from orchestrator.core.net import free_port
from orchestrator.core.resources import dags_folder as _dags_folder
from orchestrator.core.secrets import mask_url
from orchestrator.core.settings import Settings
from orchestrator.jobctl.process import create_time, group_alive, is_ours, signal_group, wait_gone, wait_group_ended

__all__ = ["AirflowStack", "DAGS_FOLDER", "KAPPA_DAG_IDS", "airflow_home", "sqlite_url", "check_db_url",
           "airflow_env", "kappa_env", "running", "migrate", "start", "stop"]

#: Where Airflow reads kappa's DAG files: the checkout's `dags/`, or the copy a regular install ships.
DAGS_FOLDER = _dags_folder()
#: The DAGs a started stack must have parsed before `start()` returns.
KAPPA_DAG_IDS = ("kappa_reprocess", "kappa_promote", "kappa_rollback", "kappa_monitor", "kappa_throttle")
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
STATE_FILE = "stack.json"
#: The scheduler goes first (nothing new is started), the api-server last (running tasks can report).
STOP_ORDER = ("scheduler", "triggerer", "dag-processor", "api-server")


def airflow_home(settings: Settings) -> Path:
    return Path(settings.home) / "airflow"


def sqlite_url(home: Path) -> str:
    return f"sqlite:///{Path(home).resolve() / 'airflow.db'}"


def check_db_url(db_url: str) -> str:
    """Airflow's metadata database URL, checked: SQLite, or PostgreSQL with the drivers Airflow needs."""
    from importlib.util import find_spec

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    hint = "expected sqlite:///<path> or postgresql+psycopg2://<user>[:<password>]@<host>:<port>/<db>"
    try:
        url = make_url(db_url)
    except ArgumentError:
        raise AirflowError(f"not a database URL for Airflow's metadata: {mask_url(db_url)!r}; {hint}") from None
    if url.drivername in ("postgresql", "postgres"):  # psycopg2 is installed; SQLAlchemy would pick psycopg 3
        url = url.set(drivername="postgresql+psycopg2")
        db_url = url.render_as_string(hide_password=False)
    backend = url.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise AirflowError(f"kappa runs Airflow's metadata database on SQLite or PostgreSQL, not {backend}; {hint}")
    if backend == "postgresql" and find_spec("asyncpg") is None:
        raise AirflowError("Airflow 3 opens an async connection to its PostgreSQL database too, which needs the "
                           "asyncpg driver: run `pip install asyncpg` in kappa's environment")
    return db_url


def airflow_env(home: Path, *, db_url: str | None = None, port: int | None = None,
                username: str = "admin", dags_folder: Path = DAGS_FOLDER,
                paused_at_creation: bool = False) -> dict[str, str]:
    """The Airflow configuration kappa runs with, as `AIRFLOW__*` environment variables.

    Used by `start()` for the four processes, and by the tests for an in-process Airflow
    (`dag.test()`), so both read the same DAGs the same way.
    """
    home = Path(home).resolve()
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags_folder).resolve()),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # LocalExecutor keeps one worker process per slot (forked, idle between tasks): 2 cores do not need
        # 32, but a catch-up sensor holds its slot while it waits (params.SENSOR_MODE), so that several
        # reprocesses and rollbacks waiting at once leave slots for promotes and kappa_monitor.
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(paused_at_creation),
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{username}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / PASSWORDS_FILE),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url or sqlite_url(home),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "60",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__HOST": "127.0.0.1",
    }
    if port:
        base = f"http://127.0.0.1:{port}"
        env.update({
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": base,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        })
    return env


def kappa_env(settings: Settings) -> dict[str, str]:
    """kappa's resolved settings as the environment variables `resolve_settings()` reads first.

    So Airflow's tasks see exactly the settings `kappa airflow start` resolved (flags, config
    file and the embedded broker included), whatever their working directory.
    """
    from orchestrator.core.settings import ENV_VARS

    env = {}
    for field_name, var in ENV_VARS.items():
        value = getattr(settings, field_name, None)
        if field_name == "kafka_config":
            if value:
                env[var] = settings.kafka_config_json()
        elif value is not None:
            env[var] = str(value)
    return env


def _commands(port: int) -> dict[str, list[str]]:
    airflow = [sys.executable, "-m", "airflow"]
    return {
        "api-server": [*airflow, "api-server", "-H", "127.0.0.1", "-p", str(port), "-w", "1"],
        "scheduler": [*airflow, "scheduler", "--skip-serve-logs"],
        "dag-processor": [*airflow, "dag-processor"],
        "triggerer": [*airflow, "triggerer", "--skip-serve-logs"],
    }


#: What `<AIRFLOW_HOME>/stack.json` records, so that another kappa process can find and stop the stack.
_STATE_FIELDS = {"port", "username", "db_url", "pids", "created", "started_at"}


class AirflowStack(BaseModel):
    """A running Airflow for kappa. `.url`, `.username`, `.password`; `.stop()` ends it.

    `pids` and `created` are each component's PID and creation time: a component counts as
    running only while its PID is still that process. `procs` are the processes this very
    process started (to learn their exit codes while starting); its JSON form masks the
    database password and leaves out the login password.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    home: Path
    port: int
    username: str
    password: str = Field(default="", exclude=True, repr=False)
    db_url: str
    pids: dict[str, int] = {}
    created: dict[str, float] = {}
    started_at: float | None = None
    procs: dict[str, subprocess.Popen] = Field(default_factory=dict, exclude=True, repr=False)
    already_running: bool = False

    @field_serializer("db_url")
    def _masked(self, url: str) -> str:
        return mask_url(url)

    @computed_field
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    def log_path(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    @computed_field
    @property
    def logs(self) -> dict[str, str]:
        return {c: str(self.log_path(c)) for c in self.pids}

    def alive(self) -> dict[str, bool]:
        return {c: c in self.created and is_ours(pid, self.created[c]) for c, pid in self.pids.items()}

    def client(self):
        from orchestrator.airflow.client import AirflowClient

        return AirflowClient(self.url, self.username, self.password)

    def _check_processes(self) -> None:
        for comp, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                raise AirflowError(
                    f"Airflow's {comp} exited with code {code} while starting; last lines of "
                    f"{self.log_path(comp)}:\n{tail(self.log_path(comp), 15)}"
                )

    def wait_ready(self, timeout: float = 180.0, dag_ids: tuple[str, ...] = KAPPA_DAG_IDS) -> None:
        """Return when the API answers, every component heartbeats and `dag_ids` are parsed."""
        import requests

        deadline = time.monotonic() + timeout
        health: dict = {}
        while True:
            self._check_processes()
            try:
                r = requests.get(f"{self.url}/api/v2/monitor/health", timeout=5)
                if r.ok:
                    health = r.json()
                    if all((health.get(c) or {}).get("status") == "healthy"
                           for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")):
                        break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise AirflowError(
                    f"Airflow at {self.url} is not healthy after {timeout:.0f}s (health: {health or 'no answer'}); "
                    f"see the logs in {self.log_dir}"
                )
            time.sleep(0.5)
        if dag_ids:
            self.client().wait_for_dags(dag_ids, timeout=max(5.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Stop the process groups this stack started, by PID. Returns the components stopped.

        SIGTERM goes to every component's group first (in STOP_ORDER, each only while its PID is still
        the process started), then each is waited for, up to `timeout` after its own signal; a
        component still there then gets SIGKILL to its group, and what is left of a group that
        outlived its leader goes with it (as `stop_group` does for one). It returns once no process of
        those groups runs (up to 5 s more each): a stop that returned while a worker was still dying left
        it to whoever came next (CI saw one still there right after the stop).
        """
        signalled: list[tuple[str, int, float, float]] = []
        for comp in STOP_ORDER:
            pid = self.pids.get(comp)
            if pid is None or comp not in self.created or not is_ours(pid, self.created[comp]):
                continue
            signal_group(pid, signal.SIGTERM)
            signalled.append((comp, pid, self.created[comp], time.monotonic() + timeout))
        stopped = []
        for comp, pid, created, deadline in signalled:
            if not wait_gone(pid, created, max(0.0, deadline - time.monotonic())):
                signal_group(pid, signal.SIGKILL)
                wait_gone(pid, created, 5.0)
            elif group_alive(pid):
                signal_group(pid, signal.SIGKILL)
            wait_group_ended(pid, 5.0)
            stopped.append(comp)
        for proc in self.procs.values():
            proc.poll()  # reap our own children
        self.procs.clear()
        state = self.home / STATE_FILE
        if state.exists():
            state.unlink()
        return stopped


def _load_state(home: Path) -> AirflowStack | None:
    path = home / STATE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        passwords = read_json(home / PASSWORDS_FILE) or {}
        stack = AirflowStack.model_validate({**{k: v for k, v in data.items() if k in _STATE_FIELDS}, "home": home})
    except ValidationError as e:
        raise AirflowError(f"{path} is not a kappa Airflow state file ({e.error_count()} bad fields: "
                           f"{', '.join(str(err['loc'][0]) for err in e.errors())}); delete it if no Airflow runs") from None
    except ValueError as e:
        raise AirflowError(f"{path} is not a kappa Airflow state file ({e}); delete it if no Airflow runs") from None
    stack.password = passwords.get(stack.username, "") if isinstance(passwords, dict) else ""
    return stack


def _write_state(stack: AirflowStack) -> None:
    stack.started_at = time.time()
    write_json_atomic(stack.home / STATE_FILE, stack.model_dump(mode="json", include=_STATE_FIELDS), indent=2)


def running(settings: Settings) -> AirflowStack | None:
    """The stack `start()` left running for these settings, or None (a stale state file is left for start to replace)."""
    home = airflow_home(settings)
    stack = _load_state(home)
    if stack is None:
        return None
    if not all(stack.alive().values()):
        return None
    stack.already_running = True
    return stack


def migrate(env: Mapping[str, str], log_path: Path, timeout: float = 600.0) -> None:
    """`airflow db migrate` with this environment (idempotent; creates the database on first use)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env={**os.environ, **env},
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AirflowError(f"`airflow db migrate` did not finish in {timeout:.0f}s; see {log_path}") from None
    if proc.returncode != 0:
        raise AirflowError(
            f"`airflow db migrate` failed on {mask_url(env['AIRFLOW__DATABASE__SQL_ALCHEMY_CONN'])} "
            f"(exit {proc.returncode}); last lines of {log_path}:\n{tail(log_path, 15)}"
        )


def start(settings: Settings, port: int | None = None, *, db_url: str | None = None, username: str = "admin",
          password: str = "admin", timeout: float = 180.0, paused_at_creation: bool = False,
          extra_env: Mapping[str, str] | None = None, dag_ids: tuple[str, ...] = KAPPA_DAG_IDS) -> AirflowStack:
    """Start Airflow for kappa, or return the one already running for these settings (`.already_running`).

    A stack recorded for these settings with a component gone is stopped first, then started afresh.

    `db_url`: PostgreSQL URL for the metadata database (default SQLite in AIRFLOW_HOME).
    `paused_at_creation`: new DAGs start paused (the tests use it to keep `kappa_monitor` off).
    Raises AirflowError naming the component and its log when something does not come up.
    """
    home = airflow_home(settings)
    previous = _load_state(home)
    if previous is not None:
        alive = previous.alive()
        if all(alive.values()):
            previous.already_running = True
            return previous
        previous.stop(timeout)  # a component died: stop what is left of that stack, then start afresh
    (home / "logs").mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    db_url = check_db_url(db_url or sqlite_url(home))
    write_json_atomic(home / PASSWORDS_FILE, {username: password}, mode=0o600)  # created 0600, never chmod-ed
    env = {
        **os.environ,
        **kappa_env(settings),
        **airflow_env(home, db_url=db_url, port=port, username=username, paused_at_creation=paused_at_creation),
        # Every component must sign and check the same tokens and sessions.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    migrate(env, home / "logs" / "migrate.log")
    stack = AirflowStack(home=home, port=port, username=username, password=password, db_url=db_url)
    try:
        for comp, cmd in _commands(port).items():
            with open(stack.log_path(comp), "ab") as log:
                proc = subprocess.Popen(cmd, env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            stack.procs[comp] = proc
            stack.pids[comp] = proc.pid
            stack.created[comp] = create_time(proc.pid) or 0.0
        _write_state(stack)
        stack.wait_ready(timeout, dag_ids=dag_ids)
    except BaseException:
        stack.stop()
        raise
    return stack


def stop(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Stop the stack `start()` recorded for these settings, by its PIDs. Returns the components stopped."""
    stack = _load_state(airflow_home(settings))
    if stack is None:
        return []
    return stack.stop(timeout)
