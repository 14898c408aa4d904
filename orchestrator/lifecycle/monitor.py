"""Monitor: the periodic check (Airflow's kappa_monitor runs it every minute).

For every pipeline: reconcile (publish interrupted flips, restart dead jobs under supervision or
fail them past their bound: a give-up is a problem), then the watch of a promoted version
(`orchestrator.lifecycle.watch`: an automatic rollback is a problem, named with its cause), sample the lag of
every version whose job should run (which also moves states and records failures), and stop
standby versions whose grace period is over (keeping their table and checkpoint), and run one step
of the backfill share controller per version (`orchestrator.lifecycle.throttle`). Then, if a
serving version is failing, or lagging beyond its threshold for every one of its last N
samples (a sustained lag, not one busy sample), raise so that the scheduler's alerting fires;
everything else was done first: LifecycleError when a serving job fails, NotReadyError when a
serving version lags.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

from pydantic import BaseModel, Field

from orchestrator.core.exceptions import ConflictError, KappaError, LifecycleError, NotReadyError
from orchestrator.context import Kappa
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import RUNNING, VersionState
from orchestrator.jobctl import stop_version
from orchestrator.lifecycle.await_ready import Readiness, catchup_limits, readiness
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.lifecycle.throttle import throttle_pass
from orchestrator.lifecycle.standby import standby_expired, standby_grace, standby_since, standby_until

__all__ = ["MonitorReport", "monitor", "standby_since", "standby_until", "standby_expired", "watch_problems",
           "report_lines", "watch_lines", "alert"]

#: Reconcile's supervision actions: the version's job is being restarted (or was given up, which
#: is reported as its own problem), so its readiness this pass says nothing new.
_SUPERVISED = frozenset({"restart", "restart_pending", "busy", "restart_failed", "gave_up"})

log = logging.getLogger(__name__)


class MonitorReport(BaseModel):
    """One monitoring pass: each version's readiness, the repairs, the standbys stopped, the problems."""

    at: float
    versions: list[dict[str, Any]] = Field(default_factory=list)
    reconciled: list[dict[str, Any]] = Field(default_factory=list)
    stopped: list[dict[str, Any]] = Field(default_factory=list)
    watched: list[dict[str, Any]] = Field(default_factory=list)
    throttled: list[dict[str, Any]] = Field(default_factory=list)   # changes of a backfill's share
    problems: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    failing: bool = False      # a problem is a serving version failing (or given up, or rolled back)


def _lags(sample: dict[str, Any], threshold: int, max_seconds: float) -> bool:
    """A serving version's sample beyond its limits: records over the threshold (or unknown), or a lag in
    seconds known to be over catchup_seconds (an unknown one alone raises no alarm)."""
    total, seconds = sample.get("total"), sample.get("lag_seconds")
    return total is None or total > threshold or (seconds is not None and seconds > max_seconds)


def _serving_problem(k: Kappa, spec: PipelineSpec, r: Readiness, lag_threshold: int | None) -> str | None:
    if r.state == "failing":
        return f"{spec.name} v{r.version} serves alias {spec.alias!r} but is failing: {r.reason}"
    if r.state == "stopped":
        return (f"{spec.name} v{r.version} serves alias {spec.alias!r} but {r.reason}: readers see its table as "
                f"of that stop")
    threshold = r.threshold if lag_threshold is None else lag_threshold
    recent = k.registry.lag_samples(spec.name, r.version, limit=r.required_samples,
                                    since=r.at - k.settings.readiness_window_seconds)
    if len(recent) >= r.required_samples and all(
            _lags({"total": s.total, "lag_seconds": s.lag_seconds}, threshold, r.catchup_seconds) for s in recent):
        shown = ", ".join("unknown" if s.total is None else f"{s.total:,}" for s in reversed(recent))
        return (f"{spec.name} v{r.version} serves alias {spec.alias!r} and lags beyond its limits "
                f"({catchup_limits(threshold, r.catchup_seconds)}): last {len(recent)} samples {shown} records")
    return None


def watch_problems(actions: Iterable[dict[str, Any]]) -> list[str]:
    """The problems a watch pass reports: each automatic rollback (and a rollback that failed), with its cause."""
    out = []
    for a in actions:
        if a.get("kind") == "rolled_back":
            out.append(f"{a['pipeline']} v{a['version']} was rolled back automatically to v{a.get('to_version')}: "
                       f"{a.get('cause')}")
        elif a.get("kind") == "rollback_failed":
            out.append(f"{a['pipeline']} v{a['version']} degraded ({a.get('cause')}) but its automatic rollback "
                       f"failed: {a.get('error')}")
    return out


def monitor(k: Kappa, *, actor: str, pipelines: Iterable[str] | None = None, lag_threshold: int | None = None,
            raise_on_problem: bool = True, watched: list[dict[str, Any]] | None = None) -> MonitorReport:
    """One monitoring pass; raises (after doing everything) when a serving version is unhealthy.

    `watched`: the actions of a watch pass made already (Airflow's `watch` task); None runs it here."""
    from orchestrator.lifecycle.watch import watch_pass
    report = MonitorReport(at=time.time())
    specs = k.specs(pipelines)
    report.reconciled = reconcile(k, actor=actor, specs=specs)
    failing_serving = False
    supervised: set[tuple[str, int]] = set()
    for a in report.reconciled:
        if a.get("kind") in _SUPERVISED:
            supervised.add((a["pipeline"], a["version"]))
        if a.get("kind") == "gave_up":
            failing_serving = True
            report.problems.append(a.get("error") or f"{a['pipeline']} v{a['version']}: its job was given up")
    if watched is None:
        watched = []
        for spec in specs:
            try:
                watched += watch_pass(k, spec, actor=actor)
            except KappaError as e:
                report.errors.append(f"watch of {spec.name}: {e}")
    report.watched = watched
    rolled = watch_problems(watched)
    failing_serving |= bool(rolled)
    report.problems += rolled
    for spec in specs:
        name = spec.name
        alias = k.registry.get_alias(spec.alias)
        serving = alias.version if alias is not None and alias.pipeline == name else None
        for v in k.versions(spec):
            rec = v.record
            if rec.state not in RUNNING and rec.version != serving:
                continue
            try:
                r = readiness(v, record=True, actor=actor)
            except KappaError as e:
                report.errors.append(f"{name} v{rec.version}: {e}")
                continue
            report.versions.append({"pipeline": name, "version": rec.version, "state": rec.state,
                                    "readiness": r.state, "lag": r.total_lag, "eta_seconds": r.eta_seconds,
                                    "job": r.job_health, "reason": r.reason})
            if rec.version == serving and (name, rec.version) not in supervised:
                problem = _serving_problem(k, spec, r, lag_threshold)
                if problem:
                    failing_serving |= r.state == "failing"
                    report.problems.append(problem)
            elif rec.state == VersionState.STANDBY:
                over = standby_expired(v, report.at)
                if over is not None:
                    try:
                        # a compare-and-swap from standby, before the job is signalled: a rollback
                        # that made it serve again meanwhile wins, and this stop is skipped
                        res = stop_version(v, actor=actor, expected_state=VersionState.STANDBY,
                                           reason=f"standby grace period of {standby_grace(v):.0f} s is over")
                        report.stopped.append(res.model_dump(mode="json"))
                    except ConflictError as e:
                        log.info("standby %s v%s not stopped: %s", name, rec.version, e)
                    except KappaError as e:
                        report.errors.append(f"stopping standby {name} v{rec.version}: {e}")
        try:  # after the lag samples above: the controller reads the serving version's newest one
            report.throttled += throttle_pass(k, spec, actor=actor, serving=serving, now=time.time())
        except KappaError as e:
            report.errors.append(f"backfill share of {name}: {e}")
    report.failing = failing_serving
    if raise_on_problem:
        alert(k, report, actor=actor)
    return report


def alert(k: Kappa, report: MonitorReport, *, actor: str) -> None:
    """After a pass did everything: audit and raise its problems, so that the scheduler's alerting fires
    (LifecycleError when a serving version fails, NotReadyError when one lags); nothing without problems."""
    if not report.problems:
        return
    k.registry.audit("monitor", actor=actor, outcome="alert", details={"problems": report.problems})
    raise (LifecycleError if report.failing else NotReadyError)("; ".join(report.problems))


# -- what a pass did, in words: one line per action (the Airflow tasks' logs, `kappa monitor`) -----------

def _where(a: dict[str, Any]) -> str:
    v = a.get("version")
    return f"{a.get('pipeline')}" + ("" if v is None else f" v{v}")


def _reconciled_line(a: dict[str, Any]) -> str:
    kind, where = a.get("kind"), _where(a)
    if kind == "publish":
        return f"published alias {a.get('alias')!r} -> {where} (a flip had not been published)"
    if kind == "restart":
        return (f"restarted the dead job of {where} from its checkpoint (attempt {a.get('attempt')}, pid "
                f"{a.get('pid')}): {a.get('error')}")
    if kind == "restart_pending":
        return f"{where}: its job is dead; restart attempt {a.get('attempt')} in {a.get('in_seconds', 0):.0f} s (backoff)"
    if kind == "gave_up":
        return f"gave up restarting {where}: {a.get('error')}"
    if kind == "restart_failed":
        return f"could not restart {where} (attempt {a.get('attempt')}): {a.get('error')}"
    if kind == "mark_stopped":
        return f"recorded {where} as stopped: its job is {a.get('job')} (it was {a.get('was')})"
    if kind == "stop_orphan_job":
        return f"stopped the job of {where} (pid {a.get('pid')}, {a.get('how')}): the registry says {a.get('state')}"
    if kind == "finish_retire":
        return f"finished the interrupted retire of {where}"
    if kind == "busy":
        return f"{where}: left alone, {a.get('error') or a.get('message')}"
    return f"{kind} {where}: {a.get('error') or ''}".rstrip(": ")


def report_lines(report: MonitorReport) -> list[str]:
    """One line per thing a monitoring pass did or found, for a person reading a task log."""
    from orchestrator.observe.lag import fmt_seconds

    lines = [_reconciled_line(a) for a in report.reconciled]
    for v in report.versions:
        lag = "unknown" if v.get("lag") is None else f"{v['lag']:,}"
        eta = "" if v.get("eta_seconds") in (None, 0.0) else f", ETA {fmt_seconds(v['eta_seconds'])}"
        lines.append(f"{v['pipeline']} v{v['version']} ({v['state']}): {v['readiness']}, lag {lag} records{eta}, "
                     f"job {v['job']}; {v['reason']}")
    for s in report.stopped:
        lines.append(f"standby grace period over: {s.get('message')}")
    for t in report.throttled:
        lines.append(f"{_where(t)}: backfill share {t.get('from')} -> {t.get('to')} ({t.get('mode')}): "
                     f"{t.get('why') or t.get('error')}")
    lines += [f"problem: {p}" for p in report.problems]
    lines += [f"error: {e}" for e in report.errors]
    if not lines:
        lines.append("nothing to do: no version is running and nothing needed repair")
    return lines


def watch_lines(actions: Iterable[dict[str, Any]], pipelines: Iterable[str]) -> list[str]:
    """One line per action of a watch pass; one line saying so when no promoted version is under watch."""
    from orchestrator.observe.lag import fmt_seconds

    lines = []
    for a in actions:
        kind, where = a.get("kind"), _where(a)
        if kind == "sampled":
            s = a.get("sample") or {}
            rate = s.get("reject_rate")
            lines.append(f"watch {where}: healthy so far ({fmt_seconds(s.get('lag_seconds'))} behind"
                         + ("" if rate is None else f", reject rate {rate:.2%}") + ")")
        elif kind == "passed":
            lines.append(f"watch {where}: healthy through its grace period; the watch passed")
        elif kind == "ended":
            lines.append(f"watch {where}: ended ({a.get('reason')})")
        elif kind == "rolled_back":
            lines.append(f"watch {where}: degraded ({a.get('cause')}): rolled back to v{a.get('to_version')}"
                         + (f"; v{a.get('version')} {a['degraded']}" if a.get("degraded") else ""))
        elif kind == "rollback_failed":
            lines.append(f"watch {where}: degraded ({a.get('cause')}) but its automatic rollback failed: {a.get('error')}")
        elif kind == "abandoned":
            lines.append(f"watch {where}: automatic rollback abandoned: {a.get('reason')}")
        else:
            lines.append(f"watch {where}: {kind}: {a.get('error') or a.get('reason') or ''}".rstrip(": "))
    if not lines:
        names = ", ".join(pipelines) or "no pipeline"
        lines.append(f"watch: no promoted version is under watch ({names}: auto_rollback off, or no grace period "
                     f"running)")
    return lines
