"""Rollback: point the alias back at the previous serving version (or a named one).

A standby version still runs, so rolling back to it is a flip. A version whose job was stopped
(after its grace period) is restarted from its own checkpoint, never from offset zero (a
version without a checkpoint is refused), and the flip waits until it is ready again. Like a
promote, the flip is a compare-and-swap, then a publish, then an audit entry.

Two halves, so that the Airflow DAG can wait in a sensor between them: `prepare_rollback` picks
the target and restarts its job if needed; `finish_rollback` waits until the target is ready and
flips. `rollback` runs both (the CLI).

Resumable: if a previous *rollback* flipped the registry but died before publishing, running
rollback again publishes that flip and stops there; it never flips back a second time. If the
unpublished flip was a *promote*, it is published and then rolled back, as asked (the CLI and
the Airflow DAG decide the same way: the audit entry of the flip names the verb that made it).
The flip expects the alias where `prepare_rollback` found it, so a promote that lands while a
rollback waits is never silently undone: the rollback then stops with a ConflictError. A target
restarted for a rollback that then times out or loses is stopped again. A target whose job
someone else is stopping (the monitor, after the grace period) is started only once that stop has
ended and been recorded, so that the history lists the `stop` before the rollback's `start`; a
stop that does not end in time refuses the rollback, and the current version keeps serving.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from orchestrator.core import uris
from orchestrator.core.crashpoints import crashpoint
from orchestrator.core.exceptions import KappaError, LifecycleError, NotFoundError, NotReadyError
from orchestrator.core.kappa import Kappa
from orchestrator.core.states import FLIP_TARGETS, VersionState
from orchestrator.jobctl import inspect_version, restart_version, start_version, stop_version
from orchestrator.jobctl.stop import STOP_WAIT_SECONDS, stop_under_way, wait_stop_finished
from orchestrator.lifecycle.await_ready import POLL_SECONDS, Readiness, wait_ready
from orchestrator.lifecycle.promote import finish_interrupted_flip, flip
from orchestrator.serving import publish_current

__all__ = ["RollbackPlan", "RollbackResult", "ROLLBACK_DEADLINE_SECONDS", "prepare_rollback", "finish_rollback",
           "rollback"]

#: How long a restarted rollback target may take to catch up again (from its own checkpoint, so
#: only the records since it stopped) before the rollback fails and the current version keeps serving.
ROLLBACK_DEADLINE_SECONDS = 1800.0


class RollbackPlan(BaseModel):
    """The first half of a rollback: the target picked and, if its job was stopped, restarted.

    `done` means nothing is left to flip: the target serves already, or an interrupted flip was
    just published (`pointer` is the pointer published then).
    """

    model_config = ConfigDict(frozen=True)

    pipeline: str
    alias: str
    from_version: int | None
    to_version: int
    restarted: bool
    done: bool
    message: str
    pointer: dict[str, Any] | None = None


class RollbackResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    pipeline: str
    alias: str
    from_version: int | None
    to_version: int
    flipped: bool
    restarted: bool
    waited_seconds: float
    message: str
    readiness: Readiness | None = None
    pointer: dict[str, Any] | None = None
    actor: str | None = None
    reason: str | None = None
    at: float = 0.0


def _unpublished_flip_action(k: Kappa, alias: str) -> str | None:
    """The verb (promote/rollback) that made the alias's last successful flip, from its audit entry."""
    for entry in reversed(k.registry.audit_log(None, limit=200, action="flip_alias")):
        d = entry.details or {}
        if d.get("alias") == alias and entry.outcome == "ok":
            return d.get("action")
    return None


def prepare_rollback(k: Kappa, pipeline: str, to_version: int | None = None, *, actor: str,
                     reason: str | None = None, stop_wait_seconds: float = STOP_WAIT_SECONDS) -> RollbackPlan:
    """Pick the target (default: the previous serving version); restart its job from its checkpoint if stopped.

    If someone else is stopping the target's job, wait (at most `stop_wait_seconds`) until that stop
    has ended, then start it: a LifecycleError past that."""
    spec = k.pipeline(pipeline)
    reg = k.registry
    alias = spec.alias
    rec = reg.get_alias(alias)
    if rec is None or rec.version is None:
        raise NotFoundError(f"alias {alias!r} of {pipeline} serves nothing yet: nothing to roll back; "
                            f"promote a version first")
    interrupted_by = _unpublished_flip_action(k, alias) if rec.needs_publish else None
    interrupted = finish_interrupted_flip(k, alias, actor=actor)
    if interrupted is not None and to_version is None and interrupted_by == "rollback":
        return RollbackPlan(pipeline=pipeline, alias=alias, from_version=rec.published_version,
                            to_version=rec.version, restarted=False, done=True, pointer=interrupted,
                            message=f"finished the interrupted flip of alias {alias!r} to v{rec.version} "
                                    f"(published now); not flipping again")
    current = rec.version
    target = to_version if to_version is not None else rec.previous_version
    if target is None:
        raise NotFoundError(f"alias {alias!r} has no previous version to roll back to (it serves v{current}, "
                            f"its first); name a version to roll back to (--to, or to_version in kappa_rollback)")
    if target == current:
        return RollbackPlan(pipeline=pipeline, alias=alias, from_version=current, to_version=target,
                            restarted=False, done=True, pointer=publish_current(k, alias),
                            message=f"{pipeline} v{target} already serves alias {alias!r}; nothing to roll back")
    target_state = reg.get_version(pipeline, target).state
    if target_state in (VersionState.RETIRED, VersionState.RETIRING):
        raise LifecycleError(f"cannot roll back to {pipeline} v{target}: it is retired (table and checkpoint "
                             f"deleted); pick another version or deploy a new one")
    st = inspect_version(k, pipeline, target)
    if st.alive and not st.failed and target_state in FLIP_TARGETS:
        return RollbackPlan(pipeline=pipeline, alias=alias, from_version=current, to_version=target,
                            restarted=False, done=False,
                            message=f"{pipeline} v{target} still runs: the flip needs no restart")
    checkpoint = k.paths(pipeline, target).checkpoint
    if not uris.exists(checkpoint):
        raise LifecycleError(f"cannot roll back to {pipeline} v{target}: its checkpoint {checkpoint} is "
                             f"missing, and a rollback never re-reads from offset zero; deploy a new version")
    waited = ""
    stop = stop_under_way(k, pipeline, target) if st.alive else None
    if stop is not None:
        crashpoint("rollback.awaiting_stop")
        stop = wait_stop_finished(k, stop, timeout=stop_wait_seconds)
        if not stop.finished:
            raise LifecycleError(f"cannot roll back alias {alias!r} to {pipeline} v{target} now: v{target} is still "
                                 f"being stopped by {stop.by}; retry the rollback (v{current} keeps serving)")
        waited = f"v{target} was being stopped by {stop.by}: waited {stop.waited:.1f} s for that stop to end; "
        st = inspect_version(k, pipeline, target)
    why = f"rollback of alias {alias!r} to v{target}" + (f": {reason}" if reason else "")
    res = (restart_version if st.alive else start_version)(k, pipeline, target, actor=actor, reason=why)
    crashpoint("rollback.restarted")
    return RollbackPlan(pipeline=pipeline, alias=alias, from_version=current, to_version=target, restarted=True,
                        done=False, message=f"{waited}restarted {pipeline} v{target} from its checkpoint: {res.message}")


def _stop_restarted(k: Kappa, plan: RollbackPlan, *, actor: str, why: str) -> None:
    """A target restarted for this rollback, which will not serve after all, is stopped again."""
    if not plan.restarted:
        return
    rec = k.registry.get_version(plan.pipeline, plan.to_version)
    if rec.state in (VersionState.SERVING, VersionState.STANDBY):
        return  # someone else made it serve (or keep) meanwhile: not ours to stop
    try:
        stop_version(k, plan.pipeline, plan.to_version, actor=actor, expected_state=rec.state,
                     reason=f"rollback of alias {plan.alias!r} to v{plan.to_version} abandoned: {why}")
    except KappaError as e:
        k.registry.audit("rollback", actor=actor, pipeline=plan.pipeline, version=plan.to_version,
                         outcome="failed", details={"error": f"could not stop the restarted target: {e}"})


def finish_rollback(k: Kappa, plan: RollbackPlan, *, actor: str, reason: str | None = None,
                    deadline_seconds: float = ROLLBACK_DEADLINE_SECONDS, poll_seconds: float = POLL_SECONDS,
                    on_sample: Callable[[Readiness], None] | None = None) -> RollbackResult:
    """Wait until the plan's target is ready, then flip the alias to it (CAS, publish, audit)."""
    now = time.time()
    pipeline, alias, current, target = plan.pipeline, plan.alias, plan.from_version, plan.to_version
    if plan.done:
        return RollbackResult(pipeline=pipeline, alias=alias, from_version=current, to_version=target,
                              flipped=False, restarted=False, waited_seconds=0.0, message=plan.message,
                              pointer=plan.pointer, actor=actor, reason=reason, at=now)
    t0 = time.monotonic()
    try:
        r = wait_ready(k, pipeline, target, deadline_seconds=deadline_seconds, poll_seconds=poll_seconds,
                       on_sample=on_sample, actor=actor)
    except NotReadyError as e:
        k.registry.audit("rollback", actor=actor, pipeline=pipeline, version=target, reason=reason,
                         outcome="failed",
                         details={"from_version": current, "error": str(e), "restarted": plan.restarted})
        _stop_restarted(k, plan, actor=actor, why="it did not become ready in time")
        raise NotReadyError(f"rollback of alias {alias!r} to {pipeline} v{target} stopped before the flip "
                            f"(v{current} still serves): {e}") from None
    waited = time.monotonic() - t0
    now_alias = k.registry.get_alias(alias)
    if now_alias is not None and now_alias.version == target and now_alias.previous_version == current:
        return RollbackResult(pipeline=pipeline, alias=alias, from_version=current, to_version=target,
                              flipped=False, restarted=plan.restarted, waited_seconds=waited, readiness=r,
                              pointer=publish_current(k, alias), actor=actor, reason=reason, at=now,
                              message=f"alias {alias!r} already serves v{target} (rolled back before); published")
    try:
        pointer = flip(k, pipeline, expected_version=current, new_version=target, actor=actor, reason=reason,
                       action="rollback", details={"restarted": plan.restarted, "samples": r.samples,
                                                   "waited_seconds": round(waited, 3)})
    except KappaError:
        _stop_restarted(k, plan, actor=actor, why="the flip was refused")
        raise
    msg = (f"rolled back alias {alias!r} from v{current} to v{target}"
           + (" (restarted from its checkpoint, then waited until ready)" if plan.restarted else ""))
    return RollbackResult(pipeline=pipeline, alias=alias, from_version=current, to_version=target, flipped=True,
                          restarted=plan.restarted, waited_seconds=waited, message=msg, readiness=r,
                          pointer=pointer, actor=actor, reason=reason, at=now)


def rollback(k: Kappa, pipeline: str, to_version: int | None = None, *, actor: str, reason: str | None = None,
             deadline_seconds: float = ROLLBACK_DEADLINE_SECONDS, poll_seconds: float = POLL_SECONDS,
             on_sample: Callable[[Readiness], None] | None = None) -> RollbackResult:
    """Flip the alias to `to_version` (default: the previous serving version), restarting it if needed."""
    plan = prepare_rollback(k, pipeline, to_version, actor=actor, reason=reason)
    return finish_rollback(k, plan, actor=actor, reason=reason, deadline_seconds=deadline_seconds,
                           poll_seconds=poll_seconds, on_sample=on_sample)

