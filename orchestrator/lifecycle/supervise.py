"""Supervision: a version whose job died is restarted from its own checkpoint, with backoff and a bound.

A job dies in many ways: it crashes, it is killed (kill -9, the OOM killer), the machine restarts,
its heartbeat stops (a hung JVM), or it reports a failure (the Kafka source gave up on a broker
that stayed away longer than ``brokerOutageSeconds``). For every version in a running state
(starting, backfilling, caught_up, serving, standby) whose `inspect_version` says failed,
reconcile calls `supervise_version`, which decides one of:

- ``restart``: start the job again from its checkpoint now (`orchestrator.jobctl.start_version`,
  which takes the version's lease; the Delta commits are idempotent, so nothing is lost or doubled);
- ``restart_pending``: wait, the backoff since the last restart is not over (``in_seconds``);
- ``gave_up``: the bound is reached (`PipelineSpec.max_restarts` restarts within
  `restart_window_seconds`), or the job reported a deterministic failure: the version is marked
  failed (`mark_failed`; a serving version keeps serving with the error recorded) and the monitor
  raises a LifecycleError naming the pipeline, the version and what is wrong;
- ``busy``: another process holds the version's lease (it is being started), nothing done.

The serving version is supervised like any other: its readers keep the table, the job comes back.

Backoff: the first restart within the window is immediate, each later one waits
`restart_backoff_seconds` doubling per restart (at most `restart_backoff_max_seconds`) after the
previous one.

History lives in the registry, so it survives the orchestrator process (a monitor pass, an Airflow
task, `kappa supervise`, restarted or on another host): it is the audit log's entries of action
``restart`` for the version (outcome ``ok`` or ``failed`` for an attempt, ``gave_up`` once the
supervisor stopped trying), counted from the version's last start by anyone else (a deploy, a
rollback, an operator's start): such a start resets the count and lifts a give-up. The
supervisor's own starts carry the reason prefix `REASON` so that they do not.

Deterministic failures are not restarted in a loop: a job that reported state ``failed`` with an
error of kind (the ``Name:`` its status.json error starts with) in `DETERMINISTIC` (bad rules or
options, a SinkError refusal such as the key-order check, a SourceError about the input such as an
unknown topic or offsets the broker no longer has) would fail the same way again. A SourceError
that starts ``broker unavailable:`` (`jobs.lib.runtime.stream.broker_unavailable`) is not deterministic:
the broker may be back. A process that died without reporting, a hung one, or any other error
(the JVM, Py4J, an unexpected exception) is restarted, within the bound.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.context import VersionRef
from orchestrator.core.exceptions import ConflictError, KappaError
from orchestrator.core.states import RUNNING, RunState

__all__ = ["ACTION", "REASON", "DETERMINISTIC", "History", "restart_history", "failure_kind", "backoff_seconds",
           "supervise_version"]

log = logging.getLogger(__name__)

#: The audit action of every supervisor decision that counts (attempts and the give-up).
ACTION = "restart"
#: The reason prefix of the supervisor's own starts (a start without it resets the history).
REASON = "supervisor:"
#: Error kinds a restart would only repeat.
DETERMINISTIC = frozenset({"ConfigError", "RulesError", "SinkError", "SourceError", "NotFoundError"})
#: Kept in sync with `jobs.lib.runtime.stream.broker_unavailable` (not imported: the control plane does not
#: load the job's Kafka code).
BROKER_UNAVAILABLE = "broker unavailable:"
_REPORTED = "the job reported failure: "
#: A hung job (stale heartbeat) is asked to stop for this long before SIGTERM.
HUNG_STOP_SECONDS = 5.0


@dataclass
class History:
    """The supervisor's record of one version since its last start by anyone else."""

    attempts: list[float] = field(default_factory=list)   # times of restart attempts, oldest first
    gave_up: Any = None                                   # the AuditRecord of a give-up, if any
    since: float | None = None                            # the last start by anyone else

    def within(self, now: float, window: float) -> list[float]:
        return [t for t in self.attempts if t > now - window]


def restart_history(v: VersionRef, *, limit: int = 500) -> History:
    """The version's restart history from the audit log (see the module)."""
    entries = v.registry.audit_log(v.pipeline, limit=limit, version=v.version)
    h = History()
    for e in entries:  # oldest first
        if e.action == "start" and e.outcome == "ok" and not (e.reason or "").startswith(REASON):
            h = History(since=e.at)
        elif e.action == ACTION:
            if e.outcome == "gave_up":
                h.gave_up = e
            elif e.outcome in ("ok", "failed"):
                h.attempts.append(e.at)
    return h


def failure_kind(st: Any) -> tuple[str, bool]:
    """(kind, deterministic) of a failed job: ``died`` (exited without reporting), ``hung`` (alive,
    heartbeat stale or no status), ``broker_unavailable``, or the reported error's class name."""
    if st.state != RunState.FAILED:
        return ("hung" if st.alive else "died"), False
    error = (st.error or "").removeprefix(_REPORTED).strip()
    if BROKER_UNAVAILABLE in error:
        return "broker_unavailable", False
    m = re.match(r"^(\w+):\s", error)
    kind = m.group(1) if m else "failed"
    return kind, kind in DETERMINISTIC


def backoff_seconds(spec: Any, restarts_in_window: int) -> float:
    """How long after the previous restart the next one may start (0 for the first in the window)."""
    if restarts_in_window <= 0:
        return 0.0
    return float(min(spec.restart_backoff_max_seconds, spec.restart_backoff_seconds * 2 ** (restarts_in_window - 1)))


def _give_up(v: VersionRef, st, *, actor: str, why: str, kind: str, attempts: int) -> dict[str, Any]:
    from orchestrator.jobctl import mark_failed

    k, spec, rec = v.k, v.spec, v.record
    error = (f"{spec.name} v{rec.version}: {why}; last error: {st.error or 'none recorded'}. Fix the cause, then "
             f"start it again (`kappa rollback {spec.name} {rec.version}` for a version that served, or deploy)")
    try:
        mark_failed(k, st.model_copy(update={"error": error}), actor=actor)
    except ConflictError as e:  # another process moved it first; its decision stands
        return {"kind": "busy", "error": str(e)}
    k.registry.audit(ACTION, actor=actor, pipeline=spec.name, version=rec.version, reason=error, outcome="gave_up",
                     details={"failure": kind, "attempts_in_window": attempts, "state": rec.state,
                              "max_restarts": spec.max_restarts, "window_seconds": spec.restart_window_seconds,
                              "job_error": st.error, "log_tail": st.log_tail})
    log.error("%s", error)
    return {"kind": "gave_up", "error": error, "failure": kind}


def supervise_version(v: VersionRef, st, *, actor: str, now: float | None = None) -> dict[str, Any] | None:
    """Decide about one version whose job failed (see the module); None when there is nothing to do.

    `v.record` is its registry record as the pass read it, `st` its `JobStatus` (`st.failed`). The
    returned dict has a ``kind`` (restart, restart_pending, gave_up, busy, restart_failed) and what it
    was decided from.
    """
    spec, rec = v.spec, v.record
    if rec.state not in RUNNING or not st.failed:
        return None
    now = time.time() if now is None else now
    out: dict[str, Any] = {"pipeline": spec.name, "version": rec.version, "state": str(rec.state)}
    hist = restart_history(v)
    if hist.gave_up is not None:  # already given up (a serving version keeps its state): say it again
        return {**out, "kind": "gave_up", "error": hist.gave_up.reason, "since": hist.gave_up.at}
    kind, deterministic = failure_kind(st)
    recent = hist.within(now, spec.restart_window_seconds)
    n = len(recent)
    if deterministic:
        return {**out, **_give_up(v, st, actor=actor, kind=kind, attempts=n,
                                  why=f"its job reported a {kind}, which a restart would repeat; not restarting it")}
    if n >= spec.max_restarts:
        return {**out, **_give_up(v, st, actor=actor, kind=kind, attempts=n,
                                  why=(f"its job died again after {n} restarts within "
                                       f"{spec.restart_window_seconds:g} s (the bound is {spec.max_restarts} "
                                       f"restarts in restart_window_seconds={spec.restart_window_seconds:g}); "
                                       f"not restarting it"))}
    wait = backoff_seconds(spec, n)
    due = (recent[-1] + wait) if recent else now
    if now < due:
        return {**out, "kind": "restart_pending", "in_seconds": round(due - now, 3), "attempt": n + 1,
                "failure": kind, "error": st.error}
    return _restart(v, st, actor=actor, kind=kind, attempt=n + 1, out=out)


def _restart(v: VersionRef, st, *, actor: str, kind: str, attempt: int, out: dict[str, Any]) -> dict[str, Any]:
    from orchestrator.jobctl import read_launch, start_version, stop_version

    k, spec, rec = v.k, v.spec, v.record
    trigger = (read_launch(v) or {}).get("trigger") or "continuous"
    reason = (f"{REASON} restart {attempt} of at most {spec.max_restarts} in {spec.restart_window_seconds:g} s "
              f"after the job {kind}: {(st.error or '')[:300]}")
    details = {"attempt": attempt, "failure": kind, "job_error": st.error, "dead_pid": st.pid, "state": rec.state}
    try:
        if st.alive:  # hung: it will not stop between micro-batches, so it gets SIGTERM soon
            stop_version(v, actor=actor, reason=reason, force=True, final_state=None,
                         graceful_timeout=HUNG_STOP_SECONDS)
        # check_exit_seconds=0: a job that dies again at once is the next pass's decision (with
        # backoff), not a failure recorded here.
        res = start_version(v, actor=actor, reason=reason, trigger=trigger,
                            check_exit_seconds=0)
    except ConflictError as e:  # someone else holds the lease or moved the state: their decision stands
        return {**out, "kind": "busy", "error": str(e)}
    except KappaError as e:  # the start itself failed (no job spawned): an attempt, counted
        k.registry.audit(ACTION, actor=actor, pipeline=spec.name, version=rec.version, reason=reason,
                         outcome="failed", details={**details, "start_error": str(e)})
        return {**out, "kind": "restart_failed", "attempt": attempt, "failure": kind, "error": str(e)}
    if not res.started:
        return {**out, "kind": "busy", "message": res.message}
    k.registry.audit(ACTION, actor=actor, pipeline=spec.name, version=rec.version, reason=reason, outcome="ok",
                     details={**details, "pid": res.pid})
    log.warning("%s v%s: restarted its job (pid %s, attempt %d) after it %s", spec.name, rec.version, res.pid,
                attempt, kind)
    return {**out, "kind": "restart", "pid": res.pid, "attempt": attempt, "failure": kind, "error": st.error}
