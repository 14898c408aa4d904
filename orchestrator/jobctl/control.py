"""Start, stop, restart and inspect the Spark job of one version.

Two ways to run a job, chosen by the `spark_master` setting, with the same job code:
- `local[...]` (the embedded default): `python -m jobs.<job>` is spawned as a local Spark
  process in its own session (process group), tracked by PID, its output in `<run_dir>/job.log`.
- anything else (`spark://host:7077`, `k8s://...`, `yarn`): pyspark's `bin/spark-submit` runs
  the job file against that cluster in client mode; the driver runs here, tracked the same way.

What was launched (command, PID, mode, time) is written to `<version_dir>/launch.json` and to
the registry (pid, run_dir, started_at); the job itself reports through `<run_dir>/status.json`
(state, heartbeat, progress). A job is healthy while its process lives and its heartbeat is
fresh. An exited process that did not report `stopped`/`finished`, a `failed` status, or a
heartbeat older than `STALE_HEARTBEAT_SECONDS` is a failed job, reported with its log's tail.

Stopping is graceful first (the STOP file: the job stops between micro-batches), then SIGTERM
to the job's process group, then SIGKILL, each after a timeout. A restart continues from the
version's own checkpoint: nothing here ever deletes a checkpoint.

Public API:
- `JobStatus` (`.health`: not_started|starting|running|stopping|stopped|finished|failed,
  `.healthy`, `.alive`, `.to_dict()`), `StartResult`, `StopResult`.
- `inspect_version(k, pipeline, version) -> JobStatus`
- `start_version(k, pipeline, version, *, actor, reason, trigger="continuous") -> StartResult`
- `stop_version(k, pipeline, version, *, actor, reason, force=False, ...) -> StopResult`
- `restart_version(k, pipeline, version, *, actor, reason) -> StartResult`
- `job_command(k, pipeline, version, *, trigger="continuous") -> list[str]`, `spark_submit_path()`
- `mark_failed(k, status)`, `log_tail(path, lines=40)`
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import KappaError, LifecycleError

log = logging.getLogger(__name__)

#: A running job writes a heartbeat every 2 s; this much silence means it hangs.
STALE_HEARTBEAT_SECONDS = 30.0
#: A live process that has not written status.json after this long is failing to start.
STARTUP_TIMEOUT_SECONDS = 180.0
#: Timeouts of the three stop steps: STOP file, SIGTERM, SIGKILL.
GRACEFUL_TIMEOUT = 60.0
TERM_TIMEOUT = 20.0
KILL_TIMEOUT = 10.0

HEALTHY = ("starting", "running")
# Popen objects of the jobs this process started: to reap them and read their exit codes.
_CHILDREN: dict[int, subprocess.Popen] = {}


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return _seconds(datetime.fromisoformat(str(value)))
    except ValueError:
        return None


def log_tail(path: Path, lines: int = 40, max_bytes: int = 64_000) -> str:
    """The last `lines` lines of a log file ('' if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, OSError):
        return None


@dataclass
class JobStatus:
    """What a version's job is doing, from its process and its status.json."""

    pipeline: str
    version: int
    health: str                       # not_started|starting|running|stopping|stopped|finished|failed
    pid: int | None = None
    alive: bool = False
    mode: str | None = None           # local | spark-submit
    state: str | None = None          # the job's own state in status.json
    started_at: float | None = None
    heartbeat_age: float | None = None
    batch_id: int | None = None
    batches: int | None = None
    rows_in: int | None = None
    rows_out: int | None = None
    rejects: int | None = None
    end_offsets: dict[str, Any] | None = None
    rules_hash: str | None = None
    exit_code: int | None = None
    error: str | None = None
    log_file: str | None = None
    log_tail: str | None = None

    @property
    def healthy(self) -> bool:
        return self.health in HEALTHY

    @property
    def failed(self) -> bool:
        return self.health == "failed"

    def describe(self) -> str:
        """One line: 'running (pid 123, heartbeat 1.2 s ago, batch 7)' or the failure."""
        if self.health == "failed":
            return f"failed: {self.error}"
        bits = []
        if self.pid:
            bits.append(f"pid {self.pid}")
        if self.heartbeat_age is not None:
            bits.append(f"heartbeat {self.heartbeat_age:.1f} s ago")
        if self.batch_id is not None:
            bits.append(f"batch {self.batch_id}")
        return self.health + (f" ({', '.join(bits)})" if bits else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["healthy"] = self.healthy
        return d


@dataclass
class StartResult:
    pipeline: str
    version: int
    started: bool
    pid: int | None
    mode: str | None
    message: str
    command: list[str] = field(default_factory=list)
    log_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StopResult:
    pipeline: str
    version: int
    stopped: bool                     # False: it was not running
    how: str                          # not-running | graceful | sigterm | sigkill
    pid: int | None
    seconds: float
    message: str
    final_state: str | None = None    # the job's own last state (stopped, failed, ...)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- processes ---------------------------------------------------------------------------------

def _pid_alive(pid: int | None, started_at: float | None = None) -> tuple[bool, int | None]:
    """(alive, exit code if known). A zombie or a reused PID counts as dead."""
    if not pid:
        return False, None
    child = _CHILDREN.get(pid)
    if child is not None:
        code = child.poll()
        return code is None, code
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False, None
        if started_at is not None and abs(proc.create_time() - started_at) > 10:
            return False, None  # the PID now belongs to another process
        return True, None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False, None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_dead(pid: int, started_at: float | None, timeout: float, poll: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        alive, _ = _pid_alive(pid, started_at)
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


# -- commands ----------------------------------------------------------------------------------

def spark_submit_path() -> Path:
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    if not path.exists():
        raise LifecycleError(f"spark-submit not found at {path}: reinstall pyspark")
    return path


def _job_file(job: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(f"jobs.{job}")
    if spec is None or not spec.origin:
        raise LifecycleError(f"job module jobs.{job} not found; write jobs/{job}.py or fix 'job' "
                             f"in the pipelines file")
    return Path(spec.origin)


def _project_root() -> Path:
    import jobs

    return Path(jobs.__file__).resolve().parents[1]


def job_args(k, pipeline: str, version: int, *, trigger: str = "continuous",
             rules_file: str | Path | None = None, master: str | None = None) -> list[str]:
    """The job's command-line arguments (see jobs/runtime.py)."""
    spec = k.pipeline(pipeline)
    paths = k.paths(pipeline, version)
    args = [
        "--pipeline", pipeline, "--version", str(version),
        "--bootstrap-servers", k.bootstrap_servers,
        "--topics", ",".join(spec.topics),
        "--output", str(paths.table), "--rejects", str(paths.rejects),
        "--checkpoint", str(paths.checkpoint), "--run-dir", str(paths.run_dir),
        "--group-id", paths.group_id,
        "--max-records-per-batch", str(spec.max_records_per_batch),
        "--trigger", trigger,
        "--master", master or k.settings.spark_master,
    ]
    if rules_file is not None:
        args += ["--rules", str(rules_file)]
    if k.settings.kafka_config:
        args += ["--kafka-config", k.settings.kafka_config_json()]
    if spec.options:
        args += ["--extra", json.dumps(spec.options, sort_keys=True)]
    return args


def rules_file_for(k, pipeline: str, version_record: Any) -> Path | None:
    """The rules file a version was deployed with (None for a job without rules)."""
    spec = k.pipeline(pipeline)
    rules_version = getattr(version_record, "rules_version", None)
    if not spec.ruleset or not rules_version:
        return None
    from jobs.lib.rules import rules_path

    return Path(rules_path(spec.ruleset, rules_version))


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


def job_command(k, pipeline: str, version: int, *, trigger: str = "continuous",
                rules_file: str | Path | None = None, master: str | None = None) -> tuple[list[str], str]:
    """(argv, mode) that runs the version's job: `python -m jobs.<job>` or spark-submit."""
    spec = k.pipeline(pipeline)
    master = master or k.settings.spark_master
    args = job_args(k, pipeline, version, trigger=trigger, rules_file=rules_file, master=master)
    if is_local_master(master):
        return [sys.executable, "-m", f"jobs.{spec.job}", *args], "local"
    from jobs.lib.session import spark_env

    env = spark_env()
    pythonpath = os.pathsep.join([str(_project_root()), *sys.path[1:]])
    conf = {
        "spark.driver.host": "127.0.0.1" if master.startswith("spark://127.") else None,
        "spark.executorEnv.PYTHONPATH": pythonpath,
        "spark.pyspark.python": env["PYSPARK_PYTHON"],
        "spark.pyspark.driver.python": env["PYSPARK_DRIVER_PYTHON"],
    }
    cmd = [str(spark_submit_path()), "--master", master, "--deploy-mode", "client",
           "--name", f"kappa.{pipeline}.v{version}"]
    for key, value in conf.items():
        if value:
            cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(_job_file(spec.job)), *args], "spark-submit"


def _job_env(master: str) -> dict[str, str]:
    from jobs.lib.session import spark_env

    env = dict(os.environ)
    env.update(spark_env())
    env["KAPPA_SPARK_MASTER"] = master
    root = str(_project_root())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if not is_local_master(master):
        import pyspark

        env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    return env


# -- inspect -----------------------------------------------------------------------------------

def read_launch(k, pipeline: str, version: int) -> dict[str, Any] | None:
    return _read_json(k.paths(pipeline, version).launch_file)


def read_status(k, pipeline: str, version: int) -> dict[str, Any] | None:
    return _read_json(k.paths(pipeline, version).status_file)


def inspect_version(k, pipeline: str, version: int, *, now: float | None = None,
                    stale_after: float = STALE_HEARTBEAT_SECONDS,
                    startup_timeout: float = STARTUP_TIMEOUT_SECONDS) -> JobStatus:
    """The job's health from its process (by PID) and its status.json."""
    paths = k.paths(pipeline, version)
    now = time.time() if now is None else now
    launch = _read_json(paths.launch_file)
    status = _read_json(paths.status_file)
    js = JobStatus(pipeline, version, "not_started", log_file=str(paths.log_file))
    if launch is None and status is None:
        return js
    launch = launch or {}
    status = status or {}
    js.pid = launch.get("pid") or status.get("pid")
    js.mode = launch.get("mode")
    js.started_at = _seconds(launch.get("started_at")) or _seconds(status.get("started_at"))
    js.state = status.get("state")
    for name in ("batch_id", "batches", "rows_in", "rows_out", "rejects", "end_offsets", "rules_hash"):
        setattr(js, name, status.get(name))
    hb = _seconds(status.get("heartbeat_at"))
    js.heartbeat_age = None if hb is None else max(0.0, now - hb)
    js.alive, js.exit_code = _pid_alive(js.pid, _seconds(launch.get("started_at")) if launch else None)

    def fail(why: str) -> JobStatus:
        js.health = "failed"
        js.error = why
        js.log_tail = log_tail(paths.log_file)
        return js

    if js.state == "failed":
        return fail(f"the job reported failure: {status.get('error') or 'no error message'}")
    if not js.alive:
        if js.state in ("stopped", "finished"):
            js.health = js.state
            return js
        code = f" with code {js.exit_code}" if js.exit_code is not None else ""
        last = f" (last state {js.state!r})" if js.state else " before writing any status"
        return fail(f"the job process {js.pid} exited{code}{last}; see {paths.log_file}")
    if not status:
        age = now - (js.started_at or now)
        if age > startup_timeout:
            return fail(f"the job process {js.pid} has written no status in {age:.0f} s; "
                        f"see {paths.log_file}")
        js.health = "starting"
        return js
    if js.heartbeat_age is not None and js.heartbeat_age > stale_after:
        return fail(f"the job's heartbeat is {js.heartbeat_age:.0f} s old (limit {stale_after:.0f} s): "
                    f"process {js.pid} is alive but not making progress; see {paths.log_file}")
    if js.state in ("stopping", "stopped", "finished"):
        js.health = "stopping"
    elif js.state == "running":
        js.health = "running"
    else:
        js.health = "starting"
    return js


def mark_failed(k, status: JobStatus, *, actor: str = "kappa") -> bool:
    """Record a failed job in the registry (once); serving keeps its state, with the error."""
    reg = k.registry
    rec = reg.get_version(status.pipeline, status.version)
    if rec.state in ("failed", "retired", "stopped"):
        return False
    err = (status.error or "failed")[:2000]
    if rec.state in ("serving",):
        if getattr(rec, "error", None) != err:
            reg.set_state(status.pipeline, status.version, rec.state, error=err)
        return False
    reg.set_state(status.pipeline, status.version, "failed", expected=rec.state, error=err)
    reg.audit("job_failed", actor=actor, pipeline=status.pipeline, version=status.version,
              outcome="failed", reason=status.error,
              details={"log_tail": status.log_tail, "pid": status.pid, "state": rec.state})
    return True


# -- start / stop ------------------------------------------------------------------------------

def start_version(k, pipeline: str, version: int, *, actor: str, reason: str | None = None,
                  trigger: str = "continuous", master: str | None = None,
                  check_exit_seconds: float = 0.5) -> StartResult:
    """Start the version's job from its own checkpoint. A second start is a no-op that says so."""
    reg = k.registry
    rec = reg.get_version(pipeline, version)
    paths = k.paths(pipeline, version)
    if rec.state == "retired":
        raise LifecycleError(f"{pipeline} v{version} is retired (its table and checkpoint are deleted); "
                             f"deploy a new version with `kappa deploy {pipeline}`")
    current = inspect_version(k, pipeline, version)
    if current.alive and current.failed:
        raise LifecycleError(f"the job of {pipeline} v{version} (pid {current.pid}) is still alive but failing: "
                             f"{current.error}. Stop it first (`kappa stop {pipeline} {version} --force`) or "
                             f"restart it")
    if current.alive:
        msg = (f"{pipeline} v{version} is already running (pid {current.pid}, {current.health}); "
               f"not starting a second job")
        reg.audit("start", actor=actor, pipeline=pipeline, version=version, reason=reason,
                  outcome="noop", details={"pid": current.pid, "message": msg})
        return StartResult(pipeline, version, False, current.pid, current.mode, msg,
                           log_file=str(paths.log_file))
    master = master or k.settings.spark_master
    rules = rules_file_for(k, pipeline, rec)
    cmd, mode = job_command(k, pipeline, version, trigger=trigger, rules_file=rules, master=master)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    for stale in (paths.stop_file, paths.status_file):
        stale.unlink(missing_ok=True)
    resumed = paths.checkpoint.exists()
    with open(paths.log_file, "ab") as logf:
        logf.write(f"\n===== kappa: starting {pipeline} v{version} at {now_utc().isoformat()} "
                   f"({mode}, master {master}, {'resuming from its checkpoint' if resumed else 'from offset zero'})"
                   f"\n===== {' '.join(cmd)}\n".encode())
        logf.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=_job_env(master), cwd=paths.run_dir, start_new_session=True)
        except OSError as e:
            raise LifecycleError(f"cannot start the job of {pipeline} v{version} ({cmd[0]}): {e}") from None
    started = time.time()
    _CHILDREN[proc.pid] = proc
    launch = {"pid": proc.pid, "pgid": proc.pid, "mode": mode, "master": master, "command": cmd,
              "started_at": started, "trigger": trigger, "resumed": resumed, "actor": actor}
    from orchestrator.serving import write_pointer

    write_pointer(paths.launch_file, launch)
    fields = {"pid": proc.pid, "run_dir": str(paths.run_dir), "started_at": started, "error": None}
    state = rec.state if rec.state in ("serving", "standby") else "starting"
    reg.set_state(pipeline, version, state, **fields)
    reg.audit("start", actor=actor, pipeline=pipeline, version=version, reason=reason,
              details={"pid": proc.pid, "mode": mode, "master": master, "resumed": resumed,
                       "trigger": trigger})
    if check_exit_seconds:
        time.sleep(check_exit_seconds)
        if proc.poll() is not None:
            st = inspect_version(k, pipeline, version)
            if st.failed:
                mark_failed(k, st, actor=actor)
            raise LifecycleError(
                f"the job of {pipeline} v{version} exited at once with code {proc.returncode}; "
                f"see {paths.log_file}:\n{log_tail(paths.log_file, 15)}")
    how = "resumes from its checkpoint" if resumed else "reads from offset zero"
    return StartResult(pipeline, version, True, proc.pid, mode,
                       f"started {pipeline} v{version} (pid {proc.pid}, {mode}, {master}); it {how}",
                       cmd, str(paths.log_file))


def stop_version(k, pipeline: str, version: int, *, actor: str, reason: str | None = None,
                 force: bool = False, graceful_timeout: float = GRACEFUL_TIMEOUT,
                 term_timeout: float = TERM_TIMEOUT, kill_timeout: float = KILL_TIMEOUT,
                 final_state: str | None = "stopped") -> StopResult:
    """Stop the job: STOP file, then SIGTERM, then SIGKILL. Keeps table and checkpoint.

    Stopping the serving version's job freezes what readers see; that needs `force=True`.
    """
    reg = k.registry
    rec = reg.get_version(pipeline, version)
    if not force:
        alias_name = k.pipeline(pipeline).alias
        alias = reg.get_alias(alias_name)
        if alias is not None and alias.version == version and alias.pipeline == pipeline:
            raise LifecycleError(
                f"{pipeline} v{version} is serving alias {alias_name!r}: stopping its job would freeze "
                f"the served table; promote or roll back to another version first, or pass force")
    paths = k.paths(pipeline, version)
    st = inspect_version(k, pipeline, version)
    launch = _read_json(paths.launch_file) or {}
    t0 = time.monotonic()
    how = "not-running"
    if st.alive and st.pid == os.getpid():
        raise LifecycleError(f"the job of {pipeline} v{version} is recorded with this very process's PID "
                             f"({st.pid}); refusing to signal it. Check {paths.launch_file}")
    if st.alive and st.pid:
        started_at = _seconds(launch.get("started_at"))
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        paths.stop_file.write_text(f"stop requested by {actor} at {now_utc().isoformat()}: {reason or ''}\n")
        how = "graceful"
        if not _wait_dead(st.pid, started_at, graceful_timeout):
            how = "sigterm"  # to the job's Python driver only: it stops between micro-batches
            try:
                os.kill(st.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_dead(st.pid, started_at, term_timeout):
                how = "sigkill"
                _signal_group(st.pid, signal.SIGKILL)
                if not _wait_dead(st.pid, started_at, kill_timeout):
                    raise LifecycleError(f"the job of {pipeline} v{version} (pid {st.pid}) survived SIGKILL "
                                         f"for {kill_timeout:.0f} s; check the process by hand")
        # the JVM and Python workers share the job's process group: leave none behind
        if _group_alive(st.pid):
            _signal_group(st.pid, signal.SIGTERM)
            deadline = time.monotonic() + term_timeout
            while _group_alive(st.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _group_alive(st.pid):
                _signal_group(st.pid, signal.SIGKILL)
        _CHILDREN.pop(st.pid, None)
    paths.stop_file.unlink(missing_ok=True)
    seconds = time.monotonic() - t0
    after = read_status(k, pipeline, version) or {}
    job_state = after.get("state")
    if final_state and rec.state not in ("serving", "failed", "retired", final_state):
        reg.set_state(pipeline, version, final_state, pid=None)
    msg = (f"{pipeline} v{version} was not running" if how == "not-running" else
           f"stopped {pipeline} v{version} (pid {st.pid}) {'gracefully' if how == 'graceful' else 'with ' + how.upper()} "
           f"in {seconds:.1f} s; its table and checkpoint are kept")
    reg.audit("stop", actor=actor, pipeline=pipeline, version=version, reason=reason,
              outcome="ok" if how != "not-running" else "noop",
              details={"how": how, "pid": st.pid, "seconds": round(seconds, 3), "job_state": job_state})
    return StopResult(pipeline, version, how != "not-running", how, st.pid, seconds, msg, job_state)


def restart_version(k, pipeline: str, version: int, *, actor: str, reason: str | None = None,
                    trigger: str = "continuous") -> StartResult:
    """Stop (if running) and start again from the version's own checkpoint."""
    st = inspect_version(k, pipeline, version)
    if st.alive:
        stop_version(k, pipeline, version, actor=actor, reason=reason, force=True, final_state=None)
    return start_version(k, pipeline, version, actor=actor, reason=reason, trigger=trigger)


def ensure_failed_recorded(k, pipeline: str, version: int, *, actor: str = "kappa") -> JobStatus:
    """inspect_version, and record a failure in the registry if there is one."""
    st = inspect_version(k, pipeline, version)
    if st.failed:
        try:
            mark_failed(k, st, actor=actor)
        except KappaError as e:
            log.warning("cannot record failure of %s v%s: %s", pipeline, version, e)
    return st
