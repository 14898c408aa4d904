"""Stop the Spark job of one version: after its micro-batch in flight, within a bound.

The STOP file asks the job to stop (it names who asked, why, and the bound): the job finishes the
micro-batch in flight, starts no new one (`jobs.lib.runtime.stopping`) and ends. The bound is the
pipeline's `stop_timeout_seconds` (default 60 s), counted from the request: a job still running then
gets SIGTERM, which the job takes as "stop now" (the batch in flight is interrupted and runs again
from the checkpoint at the next start), then SIGKILL to its process group after `TERM_TIMEOUT`, and
whatever is left of the group (the JVM, Python workers) goes with it. A job ended at the bound is
recorded `stopped` all the same (its status says it was killed at the bound; the `stop` audit entry
says how), not failed: it was asked to stop. Only a process that is still the one launched
(`health.job_alive`) is ever signalled. The table and the checkpoint are kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from orchestrator.core.crashpoints import crashpoint
from orchestrator.core.exceptions import ConflictError, LifecycleError, RefusedError
from orchestrator.core.files import read_json, write_json_atomic
from orchestrator.core.states import RunState, VersionState
from orchestrator.jobctl.health import CHILDREN, inspect_version, launch_identity, read_status
from orchestrator.jobctl.process import end_group, signal_group, wait_gone

if TYPE_CHECKING:
    from orchestrator.context import VersionRef
    from orchestrator.core.pipelines import PipelineSpec

__all__ = ["StopResult", "StopRequest", "StopUnderWay", "stop_version", "request_stop", "finish_stop",
           "stop_under_way", "wait_stop_finished", "stop_bound", "TERM_TIMEOUT", "KILL_TIMEOUT",
           "stop_wait_seconds"]

#: Timeouts of the steps after the bound: SIGTERM (stop now), SIGKILL.
TERM_TIMEOUT = 20.0
KILL_TIMEOUT = 10.0


def stop_bound(spec: PipelineSpec) -> float:
    """The bound of a requested stop of the pipeline's jobs: its `stop_timeout_seconds`."""
    return float(spec.stop_timeout_seconds)


def stop_wait_seconds(spec: PipelineSpec) -> float:
    """How long one may wait for a stop someone else is carrying out: its bound, the steps after it,
    ending the job's process group, and a margin."""
    return stop_bound(spec) + TERM_TIMEOUT + KILL_TIMEOUT + TERM_TIMEOUT + 5.0


class StopResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    pipeline: str
    version: int
    stopped: bool                     # False: it was not running
    how: str                          # not-running | graceful | sigterm | sigkill
    pid: int | None
    seconds: float
    message: str
    final_state: str | None = None    # the job's own last state (stopped, failed, ...)
    bound_seconds: float | None = None  # the stop's bound (stop_timeout_seconds)

    @property
    def killed_at_bound(self) -> bool:
        return self.how in ("sigterm", "sigkill")


def _wait_dead(pid: int, launch: dict[str, Any], timeout: float) -> bool:
    """Wait until the launched process is gone; a child of this process is reaped on the way."""
    child = CHILDREN.get(pid)
    if child is not None:
        try:
            child.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    created, tolerance = launch_identity(launch)
    return wait_gone(pid, created, timeout, poll=0.2, tolerance=tolerance)


def stop_version(v: VersionRef, *, actor: str, reason: str | None = None,
                 force: bool = False, graceful_timeout: float | None = None,
                 term_timeout: float = TERM_TIMEOUT, kill_timeout: float = KILL_TIMEOUT,
                 final_state: str | None = VersionState.STOPPED,
                 expected_state: str | None = None) -> StopResult:
    """Stop the job: STOP file, then at the bound (`graceful_timeout`, None: the pipeline's
    `stop_timeout_seconds`) SIGTERM, then SIGKILL. Keeps table and checkpoint.

    Stopping the serving version's job freezes what readers see; that needs `force=True`.
    `final_state` is the registry state the version gets (None: leave it, as a restart does). It is
    written first, as a compare-and-swap from the state read here (`expected_state` if the caller
    decided on one) together with a `stop_requested` audit entry, and only then is the job signalled: a flip or start that lands in between
    either sees the new state and refuses, or wins and makes this stop refuse (ConflictError).

    It is `request_stop` then `finish_stop`; to stop several jobs at once, request each, then finish each.
    """
    req = request_stop(v, actor=actor, reason=reason, force=force, final_state=final_state,
                       expected_state=expected_state, bound=graceful_timeout)
    return finish_stop(req, term_timeout=term_timeout, kill_timeout=kill_timeout)


@dataclass(frozen=True)
class StopRequest:
    """A stop `request_stop` asked for (the STOP file written if the job runs); `finish_stop` ends it."""

    v: VersionRef
    actor: str
    reason: str | None
    st: Any                           # the job's health when the stop was requested
    launch: dict[str, Any]
    t0: float                         # time.monotonic() when the stop was requested
    bound: float                      # seconds from the request to SIGTERM

    @property
    def pipeline(self) -> str:
        return self.v.pipeline

    @property
    def version(self) -> int:
        return self.v.version


def request_stop(v: VersionRef, *, actor: str, reason: str | None = None, force: bool = False,
                 final_state: str | None = VersionState.STOPPED,
                 expected_state: str | None = None, bound: float | None = None) -> StopRequest:
    """The first half of `stop_version`: the checks, the registry state and `stop_requested`, the STOP file.
    `bound`: seconds until the job is stopped at once (None: the pipeline's `stop_timeout_seconds`).
    It decides on the registry as it is now (`v.reread()`): its state change is a compare-and-swap."""
    v = v.reread()
    reg, rec, pipeline, version = v.registry, v.record, v.pipeline, v.version
    bound = stop_bound(v.spec) if bound is None else float(bound)
    if expected_state is not None and rec.state != expected_state:
        raise ConflictError(f"{pipeline} v{version} is {rec.state} now, not {expected_state}: another operation "
                            f"changed it; not stopping it")
    if not force:
        alias_name = v.alias
        alias = reg.get_alias(alias_name)
        if alias is not None and alias.version == version and alias.pipeline == pipeline:
            raise RefusedError(
                f"{pipeline} v{version} is serving alias {alias_name!r}: stopping its job would freeze "
                f"the served table; promote or roll back to another version first, or pass force")
    if final_state and rec.state not in (VersionState.SERVING, VersionState.FAILED, VersionState.RETIRED,
                                         VersionState.RETIRING, final_state):
        # the state and its audit entry in one transaction: a crash before the signal leaves both
        reg.set_state(pipeline, version, final_state, expected=rec.state, pid=None,
                      audit={"action": "stop_requested", "actor": actor, "reason": reason,
                             "details": {"from": rec.state, "to": final_state, "pid": rec.pid,
                                         "bound_seconds": bound}})
        crashpoint("stop.marked")
    paths = v.paths
    st = inspect_version(v)
    launch = read_json(paths.launch_file) or {}
    t0 = time.monotonic()
    if st.alive and st.pid == os.getpid():
        raise LifecycleError(f"the job of {pipeline} v{version} is recorded with this very process's PID "
                             f"({st.pid}); refusing to signal it. Check {paths.launch_file}")
    if st.alive and st.pid:
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        paths.stop_file.write_text(f"stop requested by {actor} at {datetime.now(timezone.utc).isoformat()}, bound "
                                   f"{bound:g} s: {reason or 'no reason given'}\n")
    return StopRequest(v=v, actor=actor, reason=reason, st=st, launch=launch, t0=t0, bound=bound)


def _record_killed(paths: Any, how: str, bound: float) -> None:
    """The status of a job ended at its stop's bound: `stopped`, killed at the bound (the job may not have
    written a last status itself: SIGKILL leaves it `stopping`)."""
    status = read_json(paths.status_file) or {}
    if status.get("state") in (RunState.STOPPED, RunState.FINISHED) and how == "sigterm":
        return      # it stopped itself on the SIGTERM, interrupting its batch, and said so
    status.update(state=RunState.STOPPED, stopped=f"killed at the stop's bound of {bound:g} s ({how.upper()})",
                  heartbeat_at=time.time())
    write_json_atomic(paths.status_file, status)


def finish_stop(req: StopRequest, *, term_timeout: float = TERM_TIMEOUT,
                kill_timeout: float = KILL_TIMEOUT) -> StopResult:
    """The second half of `stop_version`: wait for the job (until the request's bound, counted from the
    request), escalate to SIGTERM and SIGKILL, end its process group, audit the `stop`."""
    reg, pipeline, version, actor, reason = req.v.registry, req.pipeline, req.version, req.actor, req.reason
    st, launch, paths, t0 = req.st, req.launch, req.v.paths, req.t0
    how = "not-running"
    if st.alive and st.pid:
        how = "graceful"
        if not _wait_dead(st.pid, launch, max(0.0, req.bound - (time.monotonic() - t0))):
            how = "sigterm"  # to the job's Python driver only: after the request it means "stop now"
            try:
                os.kill(st.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_dead(st.pid, launch, term_timeout):
                how = "sigkill"
                signal_group(st.pid, signal.SIGKILL)
                if not _wait_dead(st.pid, launch, kill_timeout):
                    raise LifecycleError(f"the job of {pipeline} v{version} (pid {st.pid}) survived SIGKILL "
                                         f"for {kill_timeout:.0f} s; check the process by hand")
        # the JVM and Python workers share the job's process group: leave none behind
        end_group(st.pid, term_timeout)
        CHILDREN.pop(st.pid, None)
        if how != "graceful":
            _record_killed(paths, how, req.bound)
    ended_at = time.time()  # the audit entry may come later (a slow registry): when the job had ended
    paths.stop_file.unlink(missing_ok=True)
    seconds = time.monotonic() - t0
    after = read_status(req.v) or {}
    job_state = after.get("state")
    if how == "not-running":
        msg = f"{pipeline} v{version} was not running"
    elif how == "graceful":
        msg = (f"stopped {pipeline} v{version} (pid {st.pid}) in {seconds:.1f} s, within its bound of "
               f"{req.bound:g} s ({after.get('stopped') or 'after its micro-batch in flight'}); its table and "
               f"checkpoint are kept")
    else:
        msg = (f"stopped {pipeline} v{version} (pid {st.pid}) at its bound of {req.bound:g} s: killed with "
               f"{how.upper()} after {seconds:.1f} s (stop_timeout_seconds); its micro-batch in flight runs again "
               f"from the checkpoint at the next start; its table and checkpoint are kept")
    reg.audit("stop", actor=actor, pipeline=pipeline, version=version, reason=reason,
              outcome="ok" if how != "not-running" else "noop",
              details={"how": how, "pid": st.pid, "seconds": round(seconds, 3), "job_state": job_state,
                       "ended_at": ended_at, "bound_seconds": req.bound,
                       "killed_at_bound": how in ("sigterm", "sigkill"), "ended": after.get("stopped")})
    return StopResult(pipeline=pipeline, version=version, stopped=how != "not-running", how=how, pid=st.pid,
                      seconds=seconds, message=msg, final_state=job_state, bound_seconds=req.bound)


@dataclass(frozen=True)
class StopUnderWay:
    """A stop another actor is carrying out: the STOP file is written, the job has not ended yet."""

    v: VersionRef
    by: str                           # the actor of the last `stop_requested` (or the STOP file's)
    after_id: int                     # the audit id its `stop` entry will come after
    waited: float = 0.0               # seconds `wait_stop_finished` waited
    finished: bool = False            # the job ended and the stopper audited its `stop`


def stop_under_way(v: VersionRef) -> StopUnderWay | None:
    """The stop under way of the version's job (its STOP file exists and the job still runs), or None.

    Whoever restarts or starts the job meanwhile would stop it a second time, and its `start` would
    be audited before the first stopper's `stop`: wait for it instead (`wait_stop_finished`)."""
    paths = v.paths
    if not paths.stop_file.exists() or not inspect_version(v).alive:
        return None
    entries = v.registry.audit_log(v.pipeline, limit=50, version=v.version)
    by = next((e.actor for e in reversed(entries) if e.action == "stop_requested"), None)
    if by is None:
        try:
            text = paths.stop_file.read_text()
        except OSError:
            text = ""
        by = text.split(" at ", 1)[0].removeprefix("stop requested by ").strip() or "another operation"
    return StopUnderWay(v=v, by=by, after_id=entries[-1].id if entries else 0)


def wait_stop_finished(stop: StopUnderWay, *, timeout: float | None = None,
                       poll: float = 0.2) -> StopUnderWay:
    """Wait until the stop under way has ended: the job gone and its stopper's `stop` audited.

    Returns `stop` with `waited` and `finished` (False: not within `timeout` seconds, None:
    `stop_wait_seconds`); raises nothing.
    """
    v = stop.v
    timeout = stop_wait_seconds(v.spec) if timeout is None else timeout
    t0 = time.monotonic()
    while True:
        gone = not inspect_version(v).alive
        if gone and any(e.id > stop.after_id for e in v.registry.audit_log(v.pipeline, limit=20,
                                                                          version=v.version, action="stop")):
            return replace(stop, waited=time.monotonic() - t0, finished=True)
        if time.monotonic() - t0 >= timeout:
            return replace(stop, waited=time.monotonic() - t0, finished=False)
        time.sleep(poll)
