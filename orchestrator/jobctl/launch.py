"""Start and restart the Spark job of one version: its command line, its environment, the spawn.

Two ways to run a job, chosen by the `spark_master` setting, with the same job code:
- `local[...]` (the embedded default): `python -m jobs.run --job <module:function>` is spawned as a local Spark
  process in its own session (process group), tracked by PID, its output in `<run_dir>/job.log`.
- anything else (`spark://host:7077`, `k8s://...`, `yarn`): pyspark's `bin/spark-submit` runs
  the job file against that cluster in client mode; the driver runs here, tracked the same way.

What was launched (command, PID, the process's creation time, mode) is written to
`<version_dir>/launch.json` and to the registry (pid, run_dir, started_at), so that any later
process can tell the job from another process that reuses its PID. A restart continues from the
version's own checkpoint: nothing here ever deletes a checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from orchestrator.core import uris
from orchestrator.core.crashpoints import crashpoint
from orchestrator.core.envvars import KAPPA_KAFKA_CONFIG, KAPPA_REGISTRY_URL, KAPPA_SPARK_MASTER
from orchestrator.core.exceptions import ConflictError, LifecycleError
from orchestrator.core.files import tail, write_atomic, write_json_atomic
from orchestrator.core.secrets import mask_secrets
from orchestrator.core.states import VersionState
from orchestrator.jobctl.health import CHILDREN, inspect_version, mark_failed
from orchestrator.jobctl.process import LAUNCH_ENV, create_time, end_group
from orchestrator.jobctl.stop import stop_version

if TYPE_CHECKING:
    from orchestrator.context import VersionRef

__all__ = ["StartResult", "start_version", "restart_version", "job_command", "lease_owner", "LEASE_SECONDS",
           "STARTABLE", "reap_children"]


class StartResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    pipeline: str
    version: int
    started: bool                     # False: it was already running
    pid: int | None
    mode: str | None                  # local | spark-submit
    message: str
    command: list[str] = []
    log_file: str | None = None


# -- commands ----------------------------------------------------------------------------------

def _spark_submit_path() -> Path:
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    if not path.exists():
        raise LifecycleError(f"spark-submit not found at {path}: reinstall pyspark")
    return path


def _runner_file() -> Path:
    """`jobs/run.py`, the one entry point of every job (`jobs.lib.contract.runner`), for spark-submit."""
    spec = importlib.util.find_spec("jobs.run")
    if spec is None or not spec.origin:
        raise LifecycleError("kappa's job runner jobs/run.py is missing from the installation; reinstall kappa")
    return Path(spec.origin)


def _project_root() -> Path:
    import jobs

    return Path(jobs.__file__).resolve().parents[1]


#: The Kafka config of a version's job, secrets included: `<version_dir>/kafka.json`, mode 0600.
KAFKA_CONFIG_FILE = "kafka.json"


def _kafka_config_file(k, paths) -> Path | None:
    """Write the Kafka config for the job to a 0600 file (None, and no file, when there is none).

    Never on the command line: any user can read /proc/<pid>/cmdline, and kappa writes the
    command to job.log and launch.json. Rewritten at every start, so a changed setting applies.
    """
    path = paths.version_dir / KAFKA_CONFIG_FILE
    if not k.settings.kafka_config:
        path.unlink(missing_ok=True)
        return None
    write_atomic(path, k.settings.kafka_config_json() + "\n", mode=0o600)
    return path


def _job_args(v: VersionRef, *, trigger: str = "continuous",
              rules_file: str | Path | None = None, master: str | None = None) -> list[str]:
    """The job's command-line arguments (see jobs/lib/runtime/args.py); no secret among them."""
    k, spec, paths = v.k, v.spec, v.paths
    from orchestrator.core.jobref import resolve_job

    args = [
        "--job", resolve_job(spec.job), "--key", ",".join(spec.key_columns),
        "--pipeline", v.pipeline, "--version", str(v.version),
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
    kafka_file = _kafka_config_file(k, paths)
    if kafka_file is not None:
        args += ["--kafka-config-file", str(kafka_file)]
    if spec.options:
        args += ["--extra", json.dumps(spec.options, sort_keys=True)]
    return args


def job_command(v: VersionRef, *, trigger: str = "continuous",
                rules_file: str | Path | None = None, master: str | None = None) -> tuple[list[str], str]:
    """(argv, mode) that runs the version's job: `python -m jobs.run --job ...` or spark-submit of jobs/run.py."""
    k = v.k
    master = master or k.settings.spark_master
    from jobs.lib.runtime.session import connector_jars, driver_java_options, runs_tasks, spark_env

    args = _job_args(v, trigger=trigger, rules_file=rules_file, master=master)
    if runs_tasks(master):
        return [sys.executable, "-m", "jobs.run", *args], "local"

    env = spark_env()
    pythonpath = os.pathsep.join([*k.settings.job_folders, str(_project_root()), *sys.path[1:]])
    conf = {
        "spark.driver.host": "127.0.0.1" if master.startswith("spark://127.") else None,
        "spark.executorEnv.PYTHONPATH": pythonpath,
        "spark.pyspark.python": env["PYSPARK_PYTHON"],
        "spark.pyspark.driver.python": env["PYSPARK_DRIVER_PYTHON"],
        "spark.driver.extraJavaOptions": driver_java_options(),
    }
    # spark-submit starts the driver JVM before the job's Python: the connector JARs must be on its
    # command line to reach the driver's classpath (a session's own spark.jars only ships them)
    cmd = [str(_spark_submit_path()), "--master", master, "--deploy-mode", "client",
           "--name", f"kappa.{v.pipeline}.v{v.version}", "--jars", ",".join(connector_jars())]
    for key, value in conf.items():
        if value:
            cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(_runner_file()), *args], "spark-submit"


#: Variables of kappa's own environment that may hold secrets and that a job does not read.
_SECRET_ENV = (KAPPA_KAFKA_CONFIG, KAPPA_REGISTRY_URL)


def _job_env(master: str, job_folders: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The job's environment: this process's, without the secrets a job does not need
    (`_SECRET_ENV`: the job gets the Kafka config from its file), plus Spark's; the job path first on
    PYTHONPATH, so that the job's modules import in the driver and in Spark's Python workers."""
    from jobs.lib.runtime.session import runs_tasks, spark_env

    env = {name: value for name, value in os.environ.items() if name not in _SECRET_ENV}
    env.update(spark_env())
    env[KAPPA_SPARK_MASTER] = master
    root = str(_project_root())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*job_folders, root, env.get("PYTHONPATH")) if p)
    if not runs_tasks(master):
        import pyspark

        env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    return env


# -- start / restart ---------------------------------------------------------------------------

#: How long a start may hold the version's lease (spawn, launch.json, registry update). A lease
#: older than this belongs to a starter that died; the next start or reconcile takes it over.
LEASE_SECONDS = 120.0
#: States from which a version's job may be started (retiring and retired versions have lost
#: their table and checkpoint, or are about to).
STARTABLE = tuple(s for s in VersionState if s not in (VersionState.RETIRING, VersionState.RETIRED))


def lease_owner(actor: str) -> str:
    """A lease owner name that tells this process's start from any other, for messages and the registry."""
    return f"{actor} (pid {os.getpid()} on {socket.gethostname()}, {uuid.uuid4().hex[:8]})"[:200]


def _noop(v: VersionRef, *, actor: str, reason: str | None, msg: str, pid: int | None,
          mode: str | None) -> StartResult:
    v.registry.audit("start", actor=actor, pipeline=v.pipeline, version=v.version, reason=reason,
                     outcome="noop", details={"pid": pid, "message": msg})
    return StartResult(pipeline=v.pipeline, version=v.version, started=False, pid=pid, mode=mode, message=msg,
                       log_file=str(v.paths.log_file))


def start_version(v: VersionRef, *, actor: str, reason: str | None = None,
                  trigger: str = "continuous", master: str | None = None,
                  check_exit_seconds: float = 0.5, restart: bool = False) -> StartResult:
    """Start the version's job from its own checkpoint. A second start is a no-op that says so.

    The start takes the version's lease first (one compare-and-swap that also moves the state
    to `starting`, except for a serving or standby version, which keeps its state), so of two
    concurrent starts exactly one spawns a job; the other returns a no-op naming the first. The
    lease is released, with the job's PID, only once launch.json is written; if the state was
    changed meanwhile (a stop, a retire), the job just spawned is stopped again. With `restart`,
    a running job is stopped first, under the same lease. The start decides on the registry as it
    is now (`v.reread()`), not as the verb that called it found it, and looks for a running job again
    once it holds the lease (a start that finished in between is not doubled).
    """
    v = v.reread()
    reg, rec, pipeline, version = v.registry, v.record, v.pipeline, v.version
    if rec.state in (VersionState.RETIRED, VersionState.RETIRING):
        raise LifecycleError(f"{pipeline} v{version} is {rec.state} (its table and checkpoint are deleted); "
                             f"deploy a new version with `kappa deploy {pipeline}`")
    current = inspect_version(v)
    if current.alive and current.failed and not restart:
        raise LifecycleError(f"the job of {pipeline} v{version} (pid {current.pid}) is still alive but failing: "
                             f"{current.error}. Stop it first (`kappa stop {pipeline} {version} --force`) or "
                             f"restart it")
    if current.alive and not restart:
        return _noop(v, actor=actor, reason=reason, pid=current.pid, mode=current.mode,
                     msg=f"{pipeline} v{version} is already running (pid {current.pid}, {current.health}); "
                         f"not starting a second job")
    owner = lease_owner(actor)
    keep = rec.state in (VersionState.SERVING, VersionState.STANDBY)
    try:
        moves = not keep and rec.state != VersionState.STARTING
        leased = reg.take_lease(pipeline, version, owner=owner, expected=(rec.state,), ttl=LEASE_SECONDS,
                                to_state=None if keep else VersionState.STARTING,
                                audit={"action": "start_requested", "actor": actor, "reason": reason,
                                       "details": {"from": rec.state, "restart": restart}} if moves else None)
    except ConflictError as e:
        now = reg.get_version(pipeline, version)
        if now.lease_held():
            return _noop(v, actor=actor, reason=reason, pid=now.pid, mode=None,
                         msg=f"{pipeline} v{version}'s job is being started by {now.lease_owner}; not starting "
                             f"a second job")
        raise LifecycleError(f"cannot start {pipeline} v{version}: {e}") from None
    crashpoint("start.leased")
    try:
        # Under the lease nobody else starts it: a start that landed between the check above and the
        # lease (it spawned its job and released the lease, leaving a state a start keeps, so this
        # lease's compare-and-swap passed) is seen here, and its job is not doubled.
        now = inspect_version(v)
        if now.alive and now.pid != current.pid:
            reg.release_lease(pipeline, version, owner=owner, epoch=leased.lease_epoch)
            return _noop(v, actor=actor, reason=reason, pid=now.pid, mode=now.mode,
                         msg=f"{pipeline} v{version} was started by another operation meanwhile (pid {now.pid}); "
                             f"not starting a second job")
        return _spawn(v, leased, owner=owner, actor=actor, reason=reason, trigger=trigger,
                      master=master, check_exit_seconds=check_exit_seconds, stop_first=now.alive)
    except Exception:
        reg.release_lease(pipeline, version, owner=owner, epoch=leased.lease_epoch)
        raise


def _spawn(v: VersionRef, rec, *, owner: str, actor: str, reason: str | None, trigger: str,
           master: str | None, check_exit_seconds: float, stop_first: bool) -> StartResult:
    """Under the lease (`rec`, the record the lease was taken with): (stop the old job,) spawn the
    job, write launch.json, release the lease."""
    from orchestrator.jobctl.version_rules import materialize

    k, reg, pipeline, version, paths = v.k, v.registry, v.pipeline, v.version, v.paths
    if stop_first:
        stop_version(v, actor=actor, reason=reason, force=True, final_state=None)
    master = master or k.settings.spark_master
    rules = materialize(v)      # the rules stored at its deploy, written to its run dir
    cmd, mode = job_command(v, trigger=trigger, rules_file=rules, master=master)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    for stale in (paths.stop_file, paths.status_file):
        stale.unlink(missing_ok=True)
    resumed = uris.exists(paths.checkpoint)
    # Recorded before the spawn, with the launch id the job's processes carry in their
    # environment: if this process dies before it records the PID, the job is still found.
    launch_id = uuid.uuid4().hex
    env = {**_job_env(master, k.settings.job_folders), LAUNCH_ENV: launch_id}
    if mode == "spark-submit":  # executors on this host carry it too: a share reaches them (jobctl.priority)
        cmd = [cmd[0], "--conf", f"spark.executorEnv.{LAUNCH_ENV}={launch_id}", *cmd[1:]]
    write_json_atomic(paths.launch_file, {"launch_id": launch_id, "pid": None, "mode": mode, "master": master,
                                          "started_at": time.time(), "trigger": trigger, "actor": actor,
                                          "owner": owner}, mode=0o600, indent=None)
    with open(paths.log_file, "ab") as logf:
        logf.write(f"\n===== kappa: starting {pipeline} v{version} at {datetime.now(timezone.utc).isoformat()} "
                   f"({mode}, master {master}, {'resuming from its checkpoint' if resumed else 'from offset zero'})"
                   f"\n===== {mask_secrets(' '.join(cmd), k.settings)}\n".encode())
        logf.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=paths.run_dir, start_new_session=True)
        except OSError as e:
            raise LifecycleError(f"cannot start the job of {pipeline} v{version} ({cmd[0]}): {e}") from None
    CHILDREN[proc.pid] = proc
    # The kernel's creation time identifies this process for as long as it runs; None only if it
    # is already gone (a zombie), and then its exit code is what matters.
    created = create_time(proc.pid)
    started = created if created is not None else time.time()
    launch = {"pid": proc.pid, "pgid": proc.pid, "created": created, "mode": mode, "master": master,
              "command": cmd, "started_at": started, "trigger": trigger, "resumed": resumed, "actor": actor,
              "launch_id": launch_id}
    crashpoint("start.spawned")
    write_json_atomic(paths.launch_file, launch, mode=0o600, indent=None)  # kappa's own; no secret in it
    crashpoint("start.launched")
    fields = {"pid": proc.pid, "run_dir": str(paths.run_dir), "started_at": started, "error": None}
    if reg.release_lease(pipeline, version, owner=owner, epoch=rec.lease_epoch, expected=(rec.state,),
                         **fields) is None:
        # A stop or retire changed the state meanwhile (or the lease expired and was taken over):
        # this job must not run. Stop it; the registry keeps what the other operation decided.
        CHILDREN.pop(proc.pid, None)
        end_group(proc.pid, 10.0)
        proc.wait(10)
        now = reg.get_version(pipeline, version)
        raise ConflictError(f"{pipeline} v{version} changed while its job was starting (it is {now.state} now, "
                            f"lease {now.lease_owner or 'free'}); the job just started was stopped again. "
                            f"Check kappa status {pipeline} and retry if still wanted")
    reg.audit("start", actor=actor, pipeline=pipeline, version=version, reason=reason,
              details={"pid": proc.pid, "mode": mode, "master": master, "resumed": resumed,
                       "trigger": trigger})
    if check_exit_seconds:
        time.sleep(check_exit_seconds)
        if proc.poll() is not None:
            st = inspect_version(v)
            if st.failed:
                mark_failed(k, st, actor=actor)
            raise LifecycleError(
                f"the job of {pipeline} v{version} exited at once with code {proc.returncode}; "
                f"see {paths.log_file}:\n{mask_secrets(tail(paths.log_file, 15), k.settings)}")
    how = "resumes from its checkpoint" if resumed else "reads from offset zero"
    return StartResult(pipeline=pipeline, version=version, started=True, pid=proc.pid, mode=mode,
                       message=f"started {pipeline} v{version} (pid {proc.pid}, {mode}, {master}); it {how}",
                       command=cmd, log_file=str(paths.log_file))


def restart_version(v: VersionRef, *, actor: str, reason: str | None = None,
                    trigger: str = "continuous") -> StartResult:
    """Stop (if running) and start again from the version's own checkpoint, under one lease."""
    return start_version(v, actor=actor, reason=reason, trigger=trigger, restart=True)


def reap_children() -> list[int]:
    """Reap the jobs this process started that have ended, and forget them; returns their PIDs.

    A job this process spawned and another process stopped (Airflow's monitor, a `kappa stop`) stays
    a zombie until its parent polls it: it holds its PID and its process group, so a check by PID
    would count it as still running. A long-running parent (`kappa up`) calls this now and then.
    """
    ended = [pid for pid, proc in list(CHILDREN.items()) if proc.poll() is not None]
    for pid in ended:
        CHILDREN.pop(pid, None)
    return ended
