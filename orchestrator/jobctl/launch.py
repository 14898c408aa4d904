"""Start and restart the Spark job of one version: its command line, its environment, the spawn.

Two ways to run a job, chosen by the `spark_master` setting, with the same job code:
- `local[...]` (the embedded default): `python -m jobs.<job>` is spawned as a local Spark
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
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from orchestrator.core.exceptions import LifecycleError
from orchestrator.core.files import tail, write_json_atomic
from orchestrator.core.states import VersionState
from orchestrator.jobctl.health import CHILDREN, inspect_version, mark_failed
from orchestrator.jobctl.process import create_time
from orchestrator.jobctl.stop import stop_version

if TYPE_CHECKING:
    from orchestrator.registry import VersionRecord

__all__ = ["StartResult", "start_version", "restart_version", "job_command"]


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


def _job_file(job: str) -> Path:
    spec = importlib.util.find_spec(f"jobs.{job}")
    if spec is None or not spec.origin:
        raise LifecycleError(f"job module jobs.{job} not found; write jobs/{job}.py or fix 'job' "
                             f"in the pipelines file")
    return Path(spec.origin)


def _project_root() -> Path:
    import jobs

    return Path(jobs.__file__).resolve().parents[1]


def _job_args(k, pipeline: str, version: int, *, trigger: str = "continuous",
             rules_file: str | Path | None = None, master: str | None = None) -> list[str]:
    """The job's command-line arguments (see jobs/lib/runtime.py)."""
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


def _rules_file(k, pipeline: str, version_record: VersionRecord) -> Path | None:
    """The rules file a version was deployed with (None for a job without rules)."""
    spec = k.pipeline(pipeline)
    if not spec.ruleset or not version_record.rules_version:
        return None
    from jobs.lib.rules import rules_path

    return Path(rules_path(spec.ruleset, version_record.rules_version))


def _is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


def job_command(k, pipeline: str, version: int, *, trigger: str = "continuous",
                rules_file: str | Path | None = None, master: str | None = None) -> tuple[list[str], str]:
    """(argv, mode) that runs the version's job: `python -m jobs.<job>` or spark-submit."""
    spec = k.pipeline(pipeline)
    master = master or k.settings.spark_master
    args = _job_args(k, pipeline, version, trigger=trigger, rules_file=rules_file, master=master)
    if _is_local_master(master):
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
    cmd = [str(_spark_submit_path()), "--master", master, "--deploy-mode", "client",
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
    if not _is_local_master(master):
        import pyspark

        env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    return env


# -- start / restart ---------------------------------------------------------------------------

def start_version(k, pipeline: str, version: int, *, actor: str, reason: str | None = None,
                  trigger: str = "continuous", master: str | None = None,
                  check_exit_seconds: float = 0.5) -> StartResult:
    """Start the version's job from its own checkpoint. A second start is a no-op that says so."""
    reg = k.registry
    rec = reg.get_version(pipeline, version)
    paths = k.paths(pipeline, version)
    if rec.state == VersionState.RETIRED:
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
        return StartResult(pipeline=pipeline, version=version, started=False, pid=current.pid, mode=current.mode,
                           message=msg, log_file=str(paths.log_file))
    master = master or k.settings.spark_master
    rules = _rules_file(k, pipeline, rec)
    cmd, mode = job_command(k, pipeline, version, trigger=trigger, rules_file=rules, master=master)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    for stale in (paths.stop_file, paths.status_file):
        stale.unlink(missing_ok=True)
    resumed = paths.checkpoint.exists()
    with open(paths.log_file, "ab") as logf:
        logf.write(f"\n===== kappa: starting {pipeline} v{version} at {datetime.now(timezone.utc).isoformat()} "
                   f"({mode}, master {master}, {'resuming from its checkpoint' if resumed else 'from offset zero'})"
                   f"\n===== {' '.join(cmd)}\n".encode())
        logf.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=_job_env(master), cwd=paths.run_dir, start_new_session=True)
        except OSError as e:
            raise LifecycleError(f"cannot start the job of {pipeline} v{version} ({cmd[0]}): {e}") from None
    CHILDREN[proc.pid] = proc
    # The kernel's creation time identifies this process for as long as it runs; None only if it
    # is already gone (a zombie), and then its exit code is what matters.
    created = create_time(proc.pid)
    started = created if created is not None else time.time()
    launch = {"pid": proc.pid, "pgid": proc.pid, "created": created, "mode": mode, "master": master,
              "command": cmd, "started_at": started, "trigger": trigger, "resumed": resumed, "actor": actor}
    write_json_atomic(paths.launch_file, launch, mode=0o600, indent=None)  # its command holds the Kafka config
    fields = {"pid": proc.pid, "run_dir": str(paths.run_dir), "started_at": started, "error": None}
    state = rec.state if rec.state in (VersionState.SERVING, VersionState.STANDBY) else VersionState.STARTING
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
                f"see {paths.log_file}:\n{tail(paths.log_file, 15)}")
    how = "resumes from its checkpoint" if resumed else "reads from offset zero"
    return StartResult(pipeline=pipeline, version=version, started=True, pid=proc.pid, mode=mode,
                       message=f"started {pipeline} v{version} (pid {proc.pid}, {mode}, {master}); it {how}",
                       command=cmd, log_file=str(paths.log_file))


def restart_version(k, pipeline: str, version: int, *, actor: str, reason: str | None = None,
                    trigger: str = "continuous") -> StartResult:
    """Stop (if running) and start again from the version's own checkpoint."""
    st = inspect_version(k, pipeline, version)
    if st.alive:
        stop_version(k, pipeline, version, actor=actor, reason=reason, force=True, final_state=None)
    return start_version(k, pipeline, version, actor=actor, reason=reason, trigger=trigger)
