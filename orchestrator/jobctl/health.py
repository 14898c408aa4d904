"""What a version's job is doing: its process (by PID) and its own status.json, read together.

What was launched (command, PID, the process's creation time, mode) is in
`<version_dir>/launch.json`; the job reports through `<run_dir>/status.json` (state, heartbeat,
progress). A job is healthy while its process lives and its heartbeat is fresh. An exited
process that did not report `stopped`/`finished`, a `failed` status, or a heartbeat older than
`STALE_HEARTBEAT_SECONDS` is a failed job, reported with its log's tail.
"""

from __future__ import annotations

import logging
import subprocess
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, computed_field

from orchestrator.core.exceptions import KappaError
from orchestrator.core.files import read_json, tail
from orchestrator.core.secrets import mask_secrets
from orchestrator.core.states import ENDED_RUNS, RunState, VersionState
from orchestrator.core.times import to_seconds
from orchestrator.jobctl.process import CREATE_TIME_TOLERANCE, find_launched, is_ours

if TYPE_CHECKING:
    from orchestrator.context import VersionRef

__all__ = ["JobHealth", "JobStatus", "STALE_HEARTBEAT_SECONDS", "STARTUP_TIMEOUT_SECONDS", "LEGACY_START_TOLERANCE",
           "read_launch", "read_status", "inspect_version", "mark_failed", "ensure_failed_recorded",
           "launch_identity", "job_alive", "rejects_of"]

log = logging.getLogger(__name__)

#: A running job writes a heartbeat every 2 s; this much silence means it hangs.
STALE_HEARTBEAT_SECONDS = 30.0
#: A live process that has not written status.json after this long is failing to start.
STARTUP_TIMEOUT_SECONDS = 180.0
#: Launch files written before kappa recorded the process's creation time hold only the wall
#: clock after the spawn (`started_at`), which trails the creation time by the spawn itself.
LEGACY_START_TOLERANCE = 10.0


#: A job's health as kappa judges it. The job's own `state` in status.json (`RunState`:
#: starting, running, stopping, stopped, finished, failed) is one input.
JobHealth = Literal["not_started", "starting", "running", "stopping", "stopped", "finished", "failed"]
HEALTHY = frozenset({"starting", "running"})
#: Popen objects of the jobs this process started: the only way to reap them and learn their
#: exit codes. Another process (a later CLI call, an Airflow task) knows a job by PID alone.
CHILDREN: dict[int, subprocess.Popen] = {}


class JobStatus(BaseModel):
    """What a version's job is doing, from its process and its status.json."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    version: int
    health: JobHealth
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
    rejects: int | None = None        # since this process started (0 after a restart)
    rejects_total: int | None = None  # the rejects table's rows, reported from the first micro-batch on
    end_offsets: dict[str, Any] | None = None
    rules_hash: str | None = None
    #: While a long micro-batch (the backfill) runs: {"batch_id", "records_read", "records_total"}.
    #: The checkpoint and the consumer group move only when the batch commits; this moves meanwhile.
    reading: dict[str, Any] | None = None
    #: The last micro-batch the job wrote: {"batch_id", "records", "spark_jobs", and seconds per stage:
    #: "read_transform_count", "rejects", "write", "upkeep"} (`jobs.lib.sink.batches`).
    last_batch: dict[str, Any] | None = None
    #: The version's backfill batch as this run of the job wrote it: {"batch_id", "records", "offsets",
    #: "end_offsets", "seconds", "committed_at"} (`jobs.lib.runtime.context`); kept as the measured backfill.
    backfill: dict[str, Any] | None = None
    exit_code: int | None = None
    error: str | None = None
    log_file: str | None = None
    log_tail: str | None = None

    @computed_field
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


def read_launch(v: VersionRef) -> dict[str, Any] | None:
    return read_json(v.paths.launch_file)


def read_status(v: VersionRef) -> dict[str, Any] | None:
    return read_json(v.paths.status_file)


def launch_identity(launch: dict[str, Any] | None) -> tuple[float | None, float]:
    """(creation time, tolerance) that tells the launched process from a later owner of its PID.

    kappa records the process's creation time as `created`; a launch file from before that has
    only `started_at`, checked with `LEGACY_START_TOLERANCE`; with neither, any live process
    with the PID counts (None).
    """
    launch = launch or {}
    created = to_seconds(launch.get("created"))
    if created is not None:
        return created, CREATE_TIME_TOLERANCE
    return to_seconds(launch.get("started_at")), LEGACY_START_TOLERANCE


def job_alive(pid: int | None, launch: dict[str, Any] | None) -> tuple[bool, int | None]:
    """(alive, exit code if known). A zombie or a PID that now belongs to another process is dead."""
    if not pid:
        return False, None
    child = CHILDREN.get(pid)
    if child is not None:
        code = child.poll()
        return code is None, code
    created, tolerance = launch_identity(launch)
    return is_ours(pid, created, tolerance=tolerance), None


def inspect_version(v: VersionRef, *, now: float | None = None,
                    stale_after: float = STALE_HEARTBEAT_SECONDS,
                    startup_timeout: float = STARTUP_TIMEOUT_SECONDS) -> JobStatus:
    """The job's health from its process (by PID) and its status.json."""
    paths = v.paths
    now = time.time() if now is None else now
    launch = read_json(paths.launch_file)
    status = read_json(paths.status_file)
    base: dict[str, Any] = {"pipeline": v.pipeline, "version": v.version, "log_file": str(paths.log_file)}
    if launch is None and status is None:
        return JobStatus(health="not_started", **base)
    status = status or {}
    if launch is not None and not launch.get("pid") and launch.get("launch_id"):
        # A start that died between spawning the job and recording its PID: find the job by the
        # launch id in its environment, so that it can be seen, stopped and supervised like any.
        found = find_launched(launch["launch_id"])
        if found is not None:
            launch = {**launch, "pid": found[0], "pgid": found[0], "created": found[1]}
        elif not status:
            return JobStatus(health="not_started", **base)
    pid = (launch or {}).get("pid") or status.get("pid")
    hb = to_seconds(status.get("heartbeat_at"))
    alive, exit_code = job_alive(pid, launch)
    state = status.get("state")
    base.update(
        pid=pid, alive=alive, exit_code=exit_code, mode=(launch or {}).get("mode"), state=state,
        started_at=to_seconds((launch or {}).get("started_at")) or to_seconds(status.get("started_at")),
        heartbeat_age=None if hb is None else max(0.0, now - hb),
        **{name: status.get(name) for name in
           ("batch_id", "batches", "rows_in", "rows_out", "rejects", "rejects_total", "end_offsets", "rules_hash",
            "reading", "last_batch", "backfill")},
    )

    def fail(why: str) -> JobStatus:
        # The job's error and log are not kappa's text: mask any secret of the settings in them,
        # since they go on into the registry, the audit log, statuses and error messages.
        settings = v.settings
        return JobStatus(health="failed", error=mask_secrets(why, settings),
                         log_tail=mask_secrets(tail(paths.log_file), settings), **base)

    if state == RunState.FAILED:
        return fail(f"the job reported failure: {status.get('error') or 'no error message'}")
    if not alive:
        if state in ENDED_RUNS:
            return JobStatus(health=state, **base)
        code = f" with code {exit_code}" if exit_code is not None else ""
        last = f" (last state {state!r})" if state else " before writing any status"
        return fail(f"the job process {pid} exited{code}{last}; see {paths.log_file}")
    if not status:
        age = now - (base["started_at"] or now)
        if age > startup_timeout:
            return fail(f"the job process {pid} has written no status in {age:.0f} s; see {paths.log_file}")
        return JobStatus(health="starting", **base)
    age = base["heartbeat_age"]
    if age is not None and age > stale_after:
        return fail(f"the job's heartbeat is {age:.0f} s old (limit {stale_after:.0f} s): "
                    f"process {pid} is alive but not making progress; see {paths.log_file}")
    if state == RunState.STOPPING or state in ENDED_RUNS:
        return JobStatus(health="stopping", **base)
    return JobStatus(health="running" if state == RunState.RUNNING else "starting", **base)


def rejects_of(v: VersionRef, job: JobStatus | None = None) -> tuple[int | None, str | None]:
    """A version's rejects, the rows of its rejects table, as (count, "job" | "table").

    A running job that reports `rejects_total` keeps that count up to date. Otherwise (a job just
    restarted, before its first micro-batch; a stopped job, whose last report may miss a batch it
    wrote before it died) the table's own count from its Delta log: 0 with no table yet, and
    (None, None) if the table cannot be read (logged), so a status still shows everything else.
    """
    from deltalake.exceptions import DeltaError

    from orchestrator.core.tables import count_rows_from_log

    job = inspect_version(v) if job is None else job
    if job.alive and job.rejects_total is not None:
        return job.rejects_total, "job"
    uri = v.paths.rejects
    try:
        return count_rows_from_log(uri), "table"
    except (DeltaError, OSError) as e:
        log.warning("cannot count the rejects of %s in %s: %s", v, uri, e)
        return None, None


def mark_failed(k, status: JobStatus, *, actor: str = "kappa") -> bool:
    """Record a failed job in the registry (once); serving keeps its state, with the error."""
    reg = k.registry
    rec = reg.get_version(status.pipeline, status.version)
    if rec.state in (VersionState.FAILED, VersionState.RETIRED, VersionState.RETIRING, VersionState.STOPPED):
        return False
    err = (status.error or "failed")[:2000]
    if rec.state == VersionState.SERVING:
        if rec.error != err:
            reg.set_state(status.pipeline, status.version, rec.state, expected=rec.state, error=err)
        return False
    reg.set_state(status.pipeline, status.version, VersionState.FAILED, expected=rec.state, error=err)
    reg.audit("job_failed", actor=actor, pipeline=status.pipeline, version=status.version,
              outcome="failed", reason=status.error,
              details={"log_tail": status.log_tail, "pid": status.pid, "state": rec.state})
    return True


def ensure_failed_recorded(v: VersionRef, *, actor: str = "kappa") -> JobStatus:
    """inspect_version, and record a failure in the registry if there is one."""
    st = inspect_version(v)
    if st.failed:
        try:
            mark_failed(v.k, st, actor=actor)
        except KappaError as e:
            log.warning("cannot record failure of %s: %s", v, e)
    return st
