"""Rollback: point the alias back at the previous serving version (or a named one).

A standby version still runs, so rolling back to it is a flip. A version whose job was stopped
(after its grace period) is restarted from its own checkpoint, never from offset zero (a
version without a checkpoint is refused), and the flip waits until it is ready again. Like a
promote, the flip is a compare-and-swap, then a publish, then an audit entry.

Two halves, so that the Airflow DAG can wait in a sensor between them: `prepare_rollback` picks
the target and restarts its job if needed; `finish_rollback` waits until the target is ready and
flips. `rollback` runs both (the CLI).

What a rollback costs depends on when it comes: while the target is still a running standby (the
grace period after a promote) the flip is instant; after that its job was stopped, and the
rollback restarts it from its checkpoint and waits until it has caught up with what was written
since. The plan carries that estimate (`RestartEstimate`: records behind, when and by whom it was
stopped, how long the last such restart took) and says it in its message;
`restart_progress_line` renders the progress of the wait in one line.

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

A restarted target is ready by the same rule as any version (`lifecycle.await_ready`): a micro-batch
committed since the restart, its lag within the limits over spaced samples, not growing. One that
has not caught up by the deadline is not flipped to: the rollback says so (the lag, the rule) and
the current version keeps serving; with `force` (and a reason) the flip happens at the deadline
anyway, audited as forced with the readiness it overrode.

A running standby (nothing restarted) whose lag cannot be read because the broker is unreachable is
not waited for until the deadline: the rollback refuses at its first sample, in one line that says so
and that --force flips anyway; with `force` it flips at once, audited as forced. Its job is left
running either way (issue 33).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from orchestrator.core import uris
from orchestrator.core.crashpoints import crashpoint
from orchestrator.core.exceptions import ConfigError, KappaError, LifecycleError, NotFoundError, NotReadyError
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import FLIP_TARGETS, VersionState
from orchestrator.core.times import utc_clock
from orchestrator.jobctl import inspect_version, restart_version, start_version, stop_version
from orchestrator.jobctl.stop import stop_under_way, wait_stop_finished
from orchestrator.lifecycle.await_ready import ENDED, POLL_SECONDS, Readiness, wait_ready
from orchestrator.lifecycle.promote import finish_interrupted_flip, flip
from orchestrator.lifecycle.standby import standby_until
from orchestrator.lifecycle.throttle import full_share_until_it_serves
from orchestrator.observe import lag as lag_mod
from orchestrator.observe.lag import fmt_seconds
from orchestrator.serving import publish_current

__all__ = ["RollbackPlan", "RollbackResult", "RestartEstimate", "ROLLBACK_DEADLINE_SECONDS", "prepare_rollback",
           "finish_rollback", "rollback", "restart_estimate", "restart_progress_line"]

#: How long a restarted rollback target may take to catch up again (from its own checkpoint, so
#: only the records since it stopped) before the rollback fails and the current version keeps serving.
ROLLBACK_DEADLINE_SECONDS = 1800.0


class RestartEstimate(BaseModel):
    """What a rollback to `version` costs, known before it starts.

    `restart` False: its job runs, the flip is instant (for a standby until `standby_until`, the end of
    its grace period, `lifecycle.standby.standby_until`; None: not a standby). True: it is restarted from its
    checkpoint, `records_behind` records (the log end minus its checkpoint; None: unknown, see
    `lag_error`) to catch up. `stopped_at`/`stopped_by`/`stop_reason`: its last stop (None if it was
    started since, or never stopped). `last_restart_seconds`: how long the last rollback of the
    pipeline that restarted its target took, from the restart to the flip (None: none yet).
    """

    model_config = ConfigDict(frozen=True)

    version: int
    restart: bool
    records_behind: int | None = None
    lag_error: str | None = None
    stopped_at: float | None = None
    stopped_by: str | None = None
    stop_reason: str | None = None
    last_restart_seconds: float | None = None
    standby_until: float | None = None


class RollbackPlan(BaseModel):
    """The first half of a rollback: the target picked and, if its job was stopped, restarted.

    `done` means nothing is left to flip: the target serves already, or an interrupted flip was
    just published (`pointer` is the pointer published then). `estimate`: what the flip costs
    (None when nothing is left to flip); `restarted_at`: when the target's job was started.
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
    estimate: RestartEstimate | None = None
    restarted_at: float | None = None


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
    forced: bool = False              # flipped at the deadline although the target had not caught up


def _unpublished_flip_action(k: Kappa, alias: str) -> str | None:
    """The verb (promote/rollback) that made the alias's last successful flip, from its audit entry."""
    for entry in reversed(k.registry.audit_log(None, limit=200, action="flip_alias")):
        d = entry.details or {}
        if d.get("alias") == alias and entry.outcome == "ok":
            return d.get("action")
    return None


def _records_behind(v: VersionRef) -> tuple[int | None, str | None]:
    """The records a stopped version has to catch up: the log end minus its checkpoint (the whole log
    when it has committed nothing), and why it is unknown when it is."""
    try:
        ckpt, _ = lag_mod.checkpoint_next_offsets(v.paths.checkpoint)
        logs = lag_mod.log_offsets(v.k, v.spec.topics)
    except KappaError as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a checkpoint being written or corrupt: the estimate says so
        return None, f"cannot read its checkpoint: {e}"
    reading = lag_mod.lag_from_offsets(v.pipeline, v.version, logs, ckpt)
    return reading.total, reading.error


def _last_restart_seconds(k: Kappa, pipeline: str) -> float | None:
    """From the newest flip of a rollback that restarted its target: the restart to the flip (the wait
    until ready, for a flip recorded before kappa stored that)."""
    for e in reversed(k.registry.audit_log(pipeline, limit=200, action="rollback")):
        d = e.details or {}
        if e.outcome == "ok" and d.get("restarted") and "to_version" in d:
            seconds = d.get("restart_seconds", d.get("waited_seconds"))
            if seconds is not None:
                return float(seconds)
    return None


def restart_estimate(v: VersionRef, *, restart: bool = True) -> RestartEstimate:
    """What a rollback to the version costs (`RestartEstimate`); `restart` False: its job runs, the flip is
    instant (nothing is measured then). Reads the Kafka log's end offsets for a restart."""
    k, pipeline, version = v.k, v.pipeline, v.version
    last = _last_restart_seconds(k, pipeline)
    if not restart:
        return RestartEstimate(version=version, restart=False, last_restart_seconds=last,
                               standby_until=standby_until(v))
    behind, error = _records_behind(v)
    stop = None
    for e in reversed(k.registry.audit_log(pipeline, limit=100, version=version)):
        if e.action == "start" and e.outcome == "ok":
            break  # started since its last stop: that stop does not explain why it is down now
        if e.action == "stop" and e.outcome == "ok":
            stop = e
            break
    return RestartEstimate(version=version, restart=True, records_behind=behind, lag_error=error,
                           last_restart_seconds=last, stopped_at=stop.at if stop else None,
                           stopped_by=stop.actor if stop else None, stop_reason=stop.reason if stop else None)


def _short_reason(reason: str | None) -> str | None:
    """A stop's reason for a one-line message: the Airflow run tag dropped, a grace period named."""
    text = re.sub(r"\s*\[airflow [^\]]*\]\s*$", "", reason or "").strip()
    if "grace period" in text and text.endswith("is over"):
        return "grace period over"
    return text[:77] + "..." if len(text) > 80 else text or None


def _restart_message(pipeline: str, target: int, current: int | None, est: RestartEstimate, *,
                     down: str, waited: float | None) -> str:
    notes = [n for n in (_short_reason(est.stop_reason),
                         None if waited is None else f"this rollback waited {waited:.1f} s for that stop to end") if n]
    if est.stopped_at is not None:
        head = (f"{pipeline} v{target} was stopped at {utc_clock(est.stopped_at, date='unless today')} by {est.stopped_by}"
                + (f" ({'; '.join(notes)})" if notes else ""))
    else:
        head = f"{pipeline} v{target} {down}"
    behind = (f"{est.records_behind:,} records to catch up" if est.records_behind is not None else
              "records to catch up unknown" + (f" ({est.lag_error})" if est.lag_error else ""))
    last = "" if est.last_restart_seconds is None else \
        f"; the last such restart took {fmt_seconds(est.last_restart_seconds)}"
    return (f"{head}: restarting it from its checkpoint, {behind}{last}. "
            f"{'Nothing' if current is None else f'v{current}'} serves until the flip.")


def _instant_message(pipeline: str, est: RestartEstimate) -> str:
    until = est.standby_until
    if until is None:
        return f"{pipeline} v{est.version} still runs: the flip is instant"
    when = (f"until {utc_clock(until, date='unless today')}, when its grace period ends" if until > time.time() else
            f"its grace period ended at {utc_clock(until, date='unless today')}: the monitor stops it at its next pass")
    return f"{pipeline} v{est.version} still runs as a standby: the flip is instant ({when})"


def restart_progress_line(version: int, lag: int | None, *, eta_seconds: float | None = None,
                          rate: float | None = None, job_health: str | None = None,
                          now: float | None = None) -> str:
    """One line on the catch-up of a restarted rollback target, for a run note or a log.

    `lag`: records behind (None: unknown yet); `rate`: records per second worked off; `eta_seconds`:
    until caught up; `job_health`: the job's health (anything but 'running' says it is still
    starting); `now`: the clock the ETA is added to (default: now). From a `Readiness` r:
    `restart_progress_line(v, r.total_lag, eta_seconds=r.eta_seconds, job_health=r.job_health, now=r.at)`.
    'restarting v1: job starting...', 'restarting v1: lag 312 records (40 records/s), ETA 8 s (12:06:40 UTC)'.
    """
    head = f"restarting v{version}: "
    if job_health is not None and job_health != "running":
        return f"{head}job {job_health}..."
    if lag is None:
        return f"{head}job running, lag not known yet"
    line = f"{head}lag {lag:,} record{'' if lag == 1 else 's'}"
    if rate is not None and rate > 0:
        line += f" ({rate:,.0f} records/s)"
    if eta_seconds is not None:
        at = (time.time() if now is None else now) + eta_seconds
        line += f", ETA {fmt_seconds(eta_seconds)} ({utc_clock(at, date='unless today', now=now)})"
    return line


def prepare_rollback(k: Kappa, spec: PipelineSpec, to_version: int | None = None, *, actor: str,
                     reason: str | None = None, stop_wait_seconds: float | None = None) -> RollbackPlan:
    """Pick the target (default: the previous serving version); restart its job from its checkpoint if stopped.

    If someone else is stopping the target's job, wait (at most `stop_wait_seconds`) until that stop
    has ended, then start it: a LifecycleError past that."""
    pipeline, reg = spec.name, k.registry
    alias = spec.alias
    rec = reg.get_alias(alias)
    if rec is None or rec.version is None:
        raise NotFoundError(f"alias {alias!r} of {pipeline} serves nothing yet: nothing to roll back; "
                            f"promote a version first")
    interrupted_by = _unpublished_flip_action(k, alias) if rec.needs_publish else None
    interrupted = finish_interrupted_flip(k, spec, actor=actor)
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
    tv = k.version(spec, target)         # the target, resolved once
    target_state = tv.record.state
    if target_state in (VersionState.RETIRED, VersionState.RETIRING):
        raise LifecycleError(f"cannot roll back to {pipeline} v{target}: it is retired (table and checkpoint "
                             f"deleted); pick another version or deploy a new one")
    st = inspect_version(tv)
    if st.alive and not st.failed and target_state in FLIP_TARGETS:
        est = restart_estimate(tv, restart=False)
        return RollbackPlan(pipeline=pipeline, alias=alias, from_version=current, to_version=target,
                            restarted=False, done=False, estimate=est, message=_instant_message(pipeline, est))
    checkpoint = tv.paths.checkpoint
    if not uris.exists(checkpoint):
        raise LifecycleError(f"cannot roll back to {pipeline} v{target}: its checkpoint {checkpoint} is "
                             f"missing, and a rollback never re-reads from offset zero; deploy a new version")
    waited = None
    stop = stop_under_way(tv) if st.alive else None
    if stop is not None:
        crashpoint("rollback.awaiting_stop")
        stop = wait_stop_finished(stop, timeout=stop_wait_seconds)
        if not stop.finished:
            raise LifecycleError(f"cannot roll back alias {alias!r} to {pipeline} v{target} now: v{target} is still "
                                 f"being stopped by {stop.by}; retry the rollback (v{current} keeps serving)")
        waited = stop.waited
        st = inspect_version(tv)
    est = restart_estimate(tv)
    down = f"has a failing job ({st.error or st.health})" if st.alive else f"is not running (it is {target_state})"
    message = _restart_message(pipeline, target, current, est, down=down, waited=waited)
    why = f"rollback of alias {alias!r} to v{target}" + (f": {reason}" if reason else "")
    # before its job starts, so that no supervision pass throttles it meanwhile
    full_share_until_it_serves(tv, actor=actor, why=f"{why}: the rollback's target runs at full share")
    restarted_at = time.time()
    (restart_version if st.alive else start_version)(tv, actor=actor, reason=why)
    crashpoint("rollback.restarted")
    return RollbackPlan(pipeline=pipeline, alias=alias, from_version=current, to_version=target, restarted=True,
                        done=False, message=message, estimate=est, restarted_at=restarted_at)


def _stop_restarted(tv: VersionRef, plan: RollbackPlan, *, actor: str, why: str) -> None:
    """A target restarted for this rollback, which will not serve after all, is stopped again."""
    if not plan.restarted:
        return
    k, rec = tv.k, tv.reread().record      # as it is now: someone may have made it serve meanwhile
    if rec.state in (VersionState.SERVING, VersionState.STANDBY):
        return  # someone else made it serve (or keep) meanwhile: not ours to stop
    try:
        stop_version(tv, actor=actor, expected_state=rec.state,
                     reason=f"rollback of alias {plan.alias!r} to v{plan.to_version} abandoned: {why}")
    except KappaError as e:
        k.registry.audit("rollback", actor=actor, pipeline=plan.pipeline, version=plan.to_version,
                         outcome="failed", details={"error": f"could not stop the restarted target: {e}"})


class _LagUnreachable(Exception):
    """Ends the wait for a running standby at the first sample whose lag the broker's absence left unknown."""

    def __init__(self, readiness: Readiness):
        super().__init__(readiness.lag_error)
        self.readiness = readiness


def finish_rollback(k: Kappa, plan: RollbackPlan, *, actor: str, reason: str | None = None,
                    deadline_seconds: float = ROLLBACK_DEADLINE_SECONDS, poll_seconds: float = POLL_SECONDS,
                    on_sample: Callable[[Readiness], None] | None = None, force: bool = False) -> RollbackResult:
    """Wait until the plan's target is ready, then flip the alias to it (CAS, publish, audit).

    The entry of a rollback's second half (an Airflow task of its own): it resolves the plan's target
    once (`k.version`) and passes it down.

    A target that has not caught up by the deadline is not flipped to: NotReadyError saying so (the
    current version keeps serving, a restarted target is stopped again). With `force` (and a reason)
    the flip happens at the deadline anyway, recorded as forced with the readiness it overrode; a
    target whose job failed or stopped is never flipped to."""
    now = time.time()
    pipeline, alias, current, target = plan.pipeline, plan.alias, plan.from_version, plan.to_version
    if force and not (reason or "").strip():
        raise ConfigError(f"rollback of {pipeline} with --force needs a reason (--reason \"...\"): it is recorded in "
                          f"the audit log with the readiness it overrode")
    if plan.done:
        return RollbackResult(pipeline=pipeline, alias=alias, from_version=current, to_version=target,
                              flipped=False, restarted=False, waited_seconds=0.0, message=plan.message,
                              pointer=plan.pointer, actor=actor, reason=reason, at=now)
    tv = k.version(pipeline, target)
    t0 = time.monotonic()
    seen: list[Readiness] = []

    def sampled(r: Readiness) -> None:
        seen[:] = [r]
        if on_sample is not None:
            on_sample(r)
        if not plan.restarted and r.lag_unreachable and r.state not in ENDED:
            raise _LagUnreachable(r)
    forced = unreachable = False
    try:
        r = wait_ready(tv, deadline_seconds=deadline_seconds, poll_seconds=poll_seconds,
                       on_sample=sampled, actor=actor)
    except _LagUnreachable as u:
        # A running standby whose lag cannot be read: waiting for the broker until the deadline would hang
        # the rollback (the alias unchanged meanwhile), and the job is left alone either way.
        r, unreachable = u.readiness, True
        if not force:
            why = " ".join((r.lag_error or "no answer").split())
            error = (f"rollback of alias {alias!r} to {pipeline} v{target} refused (v{current} still serves): the lag "
                     f"of v{target} is unknown because the Kafka broker is unreachable ({why}); unknown lag never "
                     f"counts as caught up; retry once the broker is back, or flip now with --force and a reason "
                     f"(audited).")
            k.registry.audit("rollback", actor=actor, pipeline=pipeline, version=target, reason=reason,
                             outcome="failed", details={"from_version": current, "error": error,
                                                        "restarted": False, "readiness": r.decision()})
            raise NotReadyError(error) from None
        forced = True
    except NotReadyError as e:
        last = seen[0] if seen else None
        if force and last is not None and last.state not in ENDED:
            r, forced = last, True
        else:
            k.registry.audit("rollback", actor=actor, pipeline=pipeline, version=target, reason=reason,
                             outcome="failed", details={"from_version": current, "error": str(e),
                                                        "restarted": plan.restarted,
                                                        "readiness": last.decision() if last else None})
            _stop_restarted(tv, plan, actor=actor, why="it did not become ready in time")
            ended = last is not None and last.state in ENDED
            hint = "" if ended else (f" Raise the deadline (--deadline, the form's catch-up deadline; it was "
                                     f"{deadline_seconds:.0f} s), or flip anyway with --force and a reason (audited).")
            raise NotReadyError(f"rollback of alias {alias!r} to {pipeline} v{target} stopped before the flip "
                                f"(v{current} still serves): {e}{hint}") from None
    waited = time.monotonic() - t0
    now_alias = k.registry.get_alias(alias)
    if now_alias is not None and now_alias.version == target and now_alias.previous_version == current:
        return RollbackResult(pipeline=pipeline, alias=alias, from_version=current, to_version=target,
                              flipped=False, restarted=plan.restarted, waited_seconds=waited, readiness=r,
                              pointer=publish_current(k, alias), actor=actor, reason=reason, at=now,
                              message=f"alias {alias!r} already serves v{target} (rolled back before); published")
    restart = None if plan.restarted_at is None else max(0.0, time.time() - plan.restarted_at)
    try:
        pointer = flip(tv, expected_version=current, actor=actor, reason=reason,
                       action="rollback", forced=forced, details={"restarted": plan.restarted, "readiness": r.decision(),
                                                   "forced": ["ready"] if forced else [],
                                                   "waited_seconds": round(waited, 3),
                                                   **({} if restart is None else {"restart_seconds": round(restart, 3)})})
    except KappaError:
        _stop_restarted(tv, plan, actor=actor, why="the flip was refused")
        raise
    if unreachable:
        msg = (f"rolled back alias {alias!r} from v{current} to v{target} although the lag of v{target} is unknown "
               f"(the Kafka broker is unreachable; --force): {r.summary()}")
    elif forced:
        msg = (f"rolled back alias {alias!r} from v{current} to v{target} at the deadline although v{target} had not "
               f"caught up (--force): {r.summary()}")
    else:
        msg = (f"rolled back alias {alias!r} from v{current} to v{target}"
               + (f" (restarted from its checkpoint, caught up in {fmt_seconds(restart if restart is not None else waited)})"
                  if plan.restarted else ""))
    return RollbackResult(pipeline=pipeline, alias=alias, from_version=current, to_version=target, flipped=True,
                          restarted=plan.restarted, waited_seconds=waited, message=msg, readiness=r,
                          pointer=pointer, actor=actor, reason=reason, at=now, forced=forced)


def rollback(k: Kappa, spec: PipelineSpec, to_version: int | None = None, *, actor: str, reason: str | None = None,
             deadline_seconds: float = ROLLBACK_DEADLINE_SECONDS, poll_seconds: float = POLL_SECONDS,
             on_sample: Callable[[Readiness], None] | None = None, force: bool = False) -> RollbackResult:
    """Flip the alias to `to_version` (default: the previous serving version), restarting it if needed."""
    if force and not (reason or "").strip():
        raise ConfigError(f"rollback of {spec.name} with --force needs a reason (--reason \"...\"): it is recorded in "
                          f"the audit log with the readiness it overrode")
    plan = prepare_rollback(k, spec, to_version, actor=actor, reason=reason)
    return finish_rollback(k, plan, actor=actor, reason=reason, deadline_seconds=deadline_seconds,
                           poll_seconds=poll_seconds, on_sample=on_sample, force=force)

