"""What kappa's Airflow DAGs run: one plain function per DAG task.

Each function takes plain values (the run's params) plus the Airflow user and run id, calls the
lifecycle verb the CLI calls too (same functions, same defaults, deadlines in seconds), logs what
an operator watching the task log wants to see, and returns the verb's result as JSON
(`model_dump(mode="json")`, the task's XCom). The DAG files in `dags/` wrap these calls (one per
task body), and tests call them directly; Airflow itself is only imported to fail a refused task
without retries (`refusals_are_final`) and, in the flip tasks, to announce the flip as an asset event
(`orchestrator.airflow.assets`). The forms' Params live in `orchestrator.airflow.params`.

Attribution: every change is made as actor `airflow:<user>` with the reason tagged
`[airflow <dag_id> run <run_id>]`, so the registry's audit log says who asked, in which run, and why.

Idempotent on retry: a task retried after its worker died continues from what the registry says
happened. The reprocess run finds the version it deployed by the run tag on the version's reason
(it resumes it, never allocates a second one); promote and rollback are no-ops once the alias
points where they wanted it; stopping the previous version checks it is still a standby first.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Any, Callable, TypeVar

from orchestrator.core.exceptions import ConfigError, ConflictError, KappaError, NotReadyError
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import VersionState
from orchestrator.lifecycle.await_ready import Readiness

__all__ = ["refusals_are_final", "task_kappa", "actor_for", "run_tag", "tagged_reason",
           "validate_reprocess", "preview_rules", "start_reprocess", "poke_ready", "report", "promote_if_asked",
           "check_promote", "promote", "stop_previous",
           "prepare_rollback", "poke_rollback_ready", "rollback"]

log = logging.getLogger("kappa.airflow")
F = TypeVar("F", bound=Callable[..., Any])
PokeResult = dict[str, Any]   # {"is_done": bool, "xcom_value": ...}: the kwargs of a PokeReturnValue
#: An auto-promote refused only because the version fell behind again waits this long for it, this often.
READY_AGAIN_SECONDS = 300.0
READY_AGAIN_TRIES = 3
BASE_URL_ENV = "AIRFLOW__API__BASE_URL"   # the UI's base URL, for links in run notes


def refusals_are_final(fn: F) -> F:
    """Inside an Airflow task, a KappaError fails the task without retries.

    A KappaError means kappa refused the request or the system is not in the state it needs
    (unknown pipeline, reprocess in flight, lost a promote race, job failed): retrying cannot help
    and, for a lost race, would be wrong. Anything else (a worker that died, a lost connection)
    is left to the task's retries. Called outside Airflow, the KappaError is raised as is.
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KappaError as e:
            if not os.environ.get("AIRFLOW_CTX_DAG_ID"):
                raise
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"{type(e).__name__}: {e}") from e
    return wrapper  # type: ignore[return-value]


# -- helpers ----------------------------------------------------------------------------------

def actor_for(user: str | None) -> str:
    """`airflow:<user>`; scheduled runs have no triggering user and act as `airflow:scheduler`."""
    return f"airflow:{user or 'scheduler'}"


def run_tag(dag_id: str, run_id: str) -> str:
    return f"[airflow {dag_id} run {run_id}]"


def tagged_reason(reason: str | None, dag_id: str, run_id: str, default: str) -> str:
    text = (reason or "").strip() or default
    return f"{text} {run_tag(dag_id, run_id)}"


def task_kappa() -> Kappa:
    """The `Kappa` a task body runs with (`with task_kappa() as k:`; `monitor_tasks` uses it too).

    Settings resolved from the environment `kappa airflow start` gave Airflow (KAPPA_*), the
    Variable `kappa_settings` over it and the Kafka settings of the Airflow connection
    `kafka_default` over both, when they are defined (`settings_var`, `kafka_conn`)."""
    from orchestrator.airflow.settings_var import airflow_settings

    return Kappa(airflow_settings())


def _lag_line(r: Readiness) -> str:
    from orchestrator.observe.lag import fmt_seconds, format_partitions

    eta = "unknown" if r.eta_seconds is None else f"{r.eta_seconds:.0f} s"
    parts = format_partitions(r.partitions) if r.partitions else "-"
    batches = "-" if r.batches is None else f"{r.batches:,}"
    lag = r.lag_text() if r.floored or r.total_lag is None else f"{r.total_lag:,} records"
    return (f"{r.pipeline} v{r.version}: {r.state}; lag {lag}, {fmt_seconds(r.lag_seconds)} behind "
            f"({r.limits()}); ETA {eta}; {r.consecutive_ok}/{r.required_samples} samples counted; "
            f"{batches} micro-batches since the job started; job {r.job_health}; partitions {parts}; {r.reason}")


# -- kappa_reprocess --------------------------------------------------------------------------

def _run_version(k: Kappa, pipeline: str, dag_id: str, run_id: str):
    """The newest version of `pipeline` this run deployed, by the run tag on its reason."""
    tag = run_tag(dag_id, run_id)
    mine = [r for r in k.registry.list_versions(pipeline) if tag in (r.reason or "")]
    return max(mine, key=lambda r: r.version) if mine else None


def _in_flight_elsewhere(k: Kappa, spec: PipelineSpec, dag_id: str, run_id: str, actor: str):
    """The version in flight for the pipeline that another request started (dead jobs are recorded first)."""
    from orchestrator.jobctl import ensure_failed_recorded

    reg, pipeline = k.registry, spec.name
    busy = reg.in_flight(pipeline)
    if busy is not None and busy.state != VersionState.CREATED:
        ensure_failed_recorded(VersionRef.of_record(k, spec, busy), actor=actor)
        busy = reg.in_flight(pipeline)
    if busy is None or run_tag(dag_id, run_id) in (busy.reason or ""):
        return None
    return busy


def _refuse_in_flight(pipeline: str, busy) -> ConflictError:
    err = ConflictError(
        f"pipeline {pipeline!r} already has v{busy.version} in flight (state {busy.state}, deployed by "
        f"{busy.actor}: {busy.reason or 'no reason'}); refusing a second reprocess. Promote it "
        f"(kappa_promote, or `kappa promote {pipeline} {busy.version}`) or stop it "
        f"(`kappa stop {pipeline} {busy.version}`) first")
    err.in_flight_version = busy.version  # type: ignore[attr-defined]
    return err


@refusals_are_final
def validate_reprocess(pipeline: str, rules_version: str | None = None, threshold: int | None = None, *,
                       user: str | None, run_id: str, dag_id: str = "kappa_reprocess") -> dict[str, Any]:
    """Check the request: pipeline, job code, rules, source topics, no other reprocess in flight.

    Changes nothing, except that an in-flight version whose job has died is recorded as failed
    (as a deploy would). Raises the orchestrator's error (NotFoundError, RulesError, SourceError,
    ConflictError) at once.
    """
    from orchestrator.lifecycle.deploy import check_request

    with task_kappa() as k:
        spec = k.pipeline(pipeline)
        plan = check_request(k, spec, rules_version, threshold=threshold)
        busy = _in_flight_elsewhere(k, spec, dag_id, run_id, actor_for(user))
        if busy is not None:
            raise _refuse_in_flight(pipeline, busy)
        resumed = _run_version(k, pipeline, dag_id, run_id)
        log.info("reprocess of %s with rules %s requested by %s: checks passed (job %s, topics %s, threshold %s)%s",
                 pipeline, plan.rules_version or "-", actor_for(user), plan.job, ", ".join(plan.topics),
                 plan.threshold, f"; this run already deployed v{resumed.version}" if resumed else "")
        for w in plan.warnings:
            log.warning("%s", w)
        return {**plan.model_dump(mode="json"), "resumes_version": resumed.version if resumed else None}


def preview_rules(pipeline: str, rules_version: str | None) -> dict[str, Any]:
    """Before the reprocess starts: what the rules would change in the served table (logged, and returned).

    Advisory: it never stops the reprocess. Nothing served yet, a pipeline without rules, or a
    served table the preview cannot read (the reprocess may be what repairs it) is logged and the
    run goes on; the XCom then says `previewed: false` and why.
    """
    from orchestrator.lifecycle.preview import preview_rules as preview_verb
    from orchestrator.observe.render import render_preview

    if not rules_version:
        log.info("pipeline %s takes no rules: nothing to preview", pipeline)
        return {"previewed": False, "reason": f"pipeline {pipeline!r} takes no rules"}
    try:
        with task_kappa() as k:
            p = preview_verb(k, k.pipeline(pipeline), rules_version)
    except KappaError as e:
        log.warning("no rules preview (the reprocess goes on): %s", e)
        return {"previewed": False, "reason": str(e)}
    d = p.model_dump(mode="json")
    for line in _text(render_preview, d):
        log.info("%s", line)
    return {"previewed": True, **d}


@refusals_are_final
def start_reprocess(pipeline: str, rules_version: str | None = None, threshold: int | None = None,
                    reason: str | None = None, *, user: str | None, run_id: str,
                    dag_id: str = "kappa_reprocess") -> dict[str, Any]:
    """Allocate the version and start its job from offset zero; on retry, resume this run's version."""
    from orchestrator.lifecycle.deploy import deploy

    actor = actor_for(user)
    with task_kappa() as k:
        mine = _run_version(k, pipeline, dag_id, run_id)
        if mine is not None and mine.state in (VersionState.SERVING, VersionState.STANDBY):
            log.info("this run already deployed %s v%s, now %s: nothing to start", pipeline, mine.version, mine.state)
            return {"pipeline": pipeline, "version": mine.version, "state": str(mine.state),
                    "rules_version": mine.rules_version, "resumed": True, "job_started": False,
                    "message": f"{pipeline} v{mine.version} is already {mine.state}"}
        spec = k.pipeline(pipeline)
        busy = _in_flight_elsewhere(k, spec, dag_id, run_id, actor)
        if busy is not None:
            raise _refuse_in_flight(pipeline, busy)
        info = deploy(k, spec, rules_version, actor=actor, threshold=threshold,
                      reason=tagged_reason(reason, dag_id, run_id, f"reprocess requested in Airflow by {user}"))
        log.info("%s", info.message)
        from orchestrator.airflow.estimates import note_start

        note_start(info.pipeline, info.version, info.estimate)   # the run's note: the backfill's estimate
        return info.model_dump(mode="json")


@refusals_are_final
def poke_ready(pipeline: str, version: int, *, deadline_at: float, user: str | None,
               on_sample: Callable[[Readiness], None] | None = None) -> PokeResult:
    """One sensor poke: sample lag, log it with the ETA, and say whether the version is ready.

    The sensor form of `lifecycle.await_ready.wait_ready`: one sample per poke (the rule counts
    samples a micro-batch apart, so samples a few seconds apart within one poke would add nothing).
    Raises NotReadyError when the job fails or stopped, or the deadline (unix time) passes, naming the
    partitions still lagging.
    """
    from orchestrator.lifecycle.await_ready import ENDED, failing_error, readiness

    with task_kappa() as k:
        v = k.version(pipeline, version)
        r = readiness(v, record=True, actor=actor_for(user))
        log.info("%s", _lag_line(r))
        if on_sample is not None:
            on_sample(r)
        if r.ready:
            return {"is_done": True, "xcom_value": r.model_dump(mode="json")}
        if r.state in ENDED:
            raise failing_error(v, r)
        if time.time() >= deadline_at:
            raise NotReadyError(
                f"{pipeline} v{version} is not ready by the deadline ({r.state}): {_lag_line(r)}. "
                f"Trigger again with a longer catch-up deadline, or check the job log "
                f"{v.paths.log_file}")
        return {"is_done": False, "xcom_value": None}


def _text(render, *args) -> list[str]:
    """What a `observe.render` function prints, as plain lines for a task log: one log line per printed line,
    never a sentence hard-wrapped into two (the console is as wide as the longest line; tables keep their
    natural width)."""
    import io

    from rich.console import Console

    console = Console(width=10_000, soft_wrap=True, record=True, file=io.StringIO(), color_system=None)
    render(console, *args)
    return [line.rstrip() for line in console.export_text().rstrip("\n").splitlines()]


def _report_head(report: dict[str, Any] | None, dag_id: str, run_id: str) -> str:
    """What a note's first line says of the report: a link to its whole text (the report task's log, in a
    kappa_reprocess run) and its figures in one line; '' without a report."""
    from orchestrator.airflow import notes

    if not report:
        return ""
    link = (f"[full report]({notes.report_link(os.environ.get(BASE_URL_ENV), dag_id, run_id)}): "
            if dag_id == "kappa_reprocess" else "report: ")
    return f" · {link}{notes.report_summary(report)}"


@refusals_are_final
def report(pipeline: str, version: int, *, dag_id: str = "kappa_reprocess", run_id: str = "") -> dict[str, Any]:
    """The validation report of the version against the one serving now: logged as text, set on the run's
    note as Markdown (`orchestrator.airflow.notes`: its first line sums it up and links to this task's log),
    and returned."""
    from orchestrator.airflow import notes
    from orchestrator.airflow.estimates import backfill_md
    from orchestrator.lifecycle.report import validation_report
    from orchestrator.observe.render import render_report

    with task_kappa() as k:
        rep = validation_report(v := k.version(pipeline, version))
    d = rep.model_dump(mode="json")
    for line in _text(render_report, d):
        log.info("%s", line)
    for p in rep.problems:
        log.warning("promote would refuse: %s", p)
    verdict = f"promote would refuse: {'; '.join(rep.problems)}" if rep.problems else "its checks pass"
    notes.set_run_note(f"{pipeline} v{version} has caught up; {verdict}{_report_head(d, dag_id, run_id)}",
                       [*backfill_md(v.record.details), *notes.report_md(d)])
    return d


def _in_airflow() -> bool:
    return bool(os.environ.get("AIRFLOW_CTX_DAG_ID"))


def _skip(message: str) -> None:
    """End the task skipped inside Airflow (what the run's page shows: nothing was done); outside, return."""
    log.info("%s", message)
    if _in_airflow():
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(message)


@refusals_are_final
def promote_if_asked(pipeline: str, version: int, auto_promote: bool, reason: str | None = None, *,
                     user: str | None, run_id: str, dag_id: str = "kappa_reprocess", outlet_events: Any = None,
                     report: dict[str, Any] | None = None, grace_seconds: float | None = None) -> dict[str, Any] | None:
    """Promote when auto-promote is on; otherwise end skipped, the run's note saying how to promote.

    With auto-promote off the task ends *skipped* inside Airflow (so is `stop_previous` after it) and
    the run's note links to kappa_promote with the configuration JSON to paste; outside Airflow it
    returns None. The sensor found the version ready; live updates may push its lag over the threshold
    again before the promote's own readiness check. Such a refusal (readiness alone failed) is waited
    out: the task waits until the version is ready again (at most `READY_AGAIN_SECONDS`) and
    promotes then, up to `READY_AGAIN_TRIES` times. Any other refusal fails the task at once."""
    from orchestrator.airflow import notes
    from orchestrator.lifecycle.await_ready import wait_ready

    if not auto_promote:
        conf = json.dumps({"pipeline": pipeline, "version": version})
        step = notes.next_step_md(pipeline, version, os.environ.get(BASE_URL_ENV))
        notes.set_run_note(f"{pipeline} v{version} is ready and NOT promoted (auto-promote is off): promote it with "
                           f"kappa_promote{_report_head(report, dag_id, run_id)}",
                           [*step, "", *notes.report_md(report)] if report else step)
        _skip(f"{pipeline} v{version} is ready and NOT promoted (auto-promote is off). To promote it, trigger "
              f"kappa_promote with this configuration JSON: {conf}, or run `kappa promote {pipeline} {version}` or "
              f"`kappa trigger promote {pipeline} {version}`.")
        return None
    for attempt in range(1, READY_AGAIN_TRIES + 1):
        try:
            return promote.__wrapped__(pipeline, version, reason, user=user, run_id=run_id, dag_id=dag_id,
                                       outlet_events=outlet_events, grace_seconds=grace_seconds, report=report)
        except NotReadyError as e:
            if e.failed_checks != ("ready",) or attempt == READY_AGAIN_TRIES:
                raise
            log.warning("the promote was refused: %s v%s fell behind again since the sensor found it ready (%s); "
                        "waiting until it has caught up again (attempt %d of %d)", pipeline, version, e, attempt,
                        READY_AGAIN_TRIES)
            with task_kappa() as k:
                wait_ready(k.version(pipeline, version), deadline_seconds=READY_AGAIN_SECONDS, poll_seconds=2.0,
                           actor=actor_for(user))
    raise AssertionError("unreachable")


# -- kappa_promote ----------------------------------------------------------------------------

@refusals_are_final
def _override(pipeline: str, reason: str | None, force: bool) -> None:
    if force and not (reason or "").strip():
        raise ConfigError(f"promote of {pipeline} with force needs a reason: fill in the form's Reason, it is "
                          f"recorded in the audit log with the checks it overrode")


@refusals_are_final
def check_promote(pipeline: str, version: int | None = None, reason: str | None = None, *,
                  user: str | None, run_id: str, dag_id: str = "kappa_promote", force: bool = False,
                  allow_schema_change: bool = False) -> dict[str, Any]:
    """A dry run of the promote: every check, and exactly what would happen. Fails if it would refuse.

    Without a version, the verb's `promote_target`: the newest caught-up version.
    """
    from orchestrator.lifecycle.promote import promote as promote_verb, promote_target

    _override(pipeline, reason, force)
    with task_kappa() as k:
        v = k.version(pipeline, version if version is not None else promote_target(k, pipeline))
        res = promote_verb(v, actor=actor_for(user), dry_run=True, force=force,
                           allow_schema_change=allow_schema_change,
                           reason=tagged_reason(reason, dag_id, run_id, f"promote requested in Airflow by {user}"))
    log.info("%s", res.message)
    for c in res.checks:
        log.info("  check %s: %s (%s)", c.name, "ok" if c.ok else "FAILED", c.detail)
    for a in res.actions:
        log.info("  would: %s", a)
    if not res.would_succeed:
        raise NotReadyError(res.error or res.message)
    return res.model_dump(mode="json")


def _standby(v: VersionRef) -> tuple[float, float] | None:
    """(until when, grace period) of a standby version, as its flip recorded them; None if not a standby."""
    from orchestrator.lifecycle.standby import standby_grace, standby_until

    until = standby_until(v)
    return None if until is None else (until, standby_grace(v))


@refusals_are_final
def promote(pipeline: str, version: int | None, reason: str | None = None, *, user: str | None, run_id: str,
            dag_id: str = "kappa_promote", outlet_events: Any = None, force: bool = False,
            allow_schema_change: bool = False, grace_seconds: float | None = None,
            report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check everything, flip the alias (CAS), publish, record. A no-op once the alias points at it.

    A flip adds the alias's asset event to `outlet_events` (`orchestrator.airflow.assets`); the
    XCom's `asset_event` is its extra, None when nothing flipped. The run's note says what was
    promoted and until when the version it replaced stays a standby. `grace_seconds` None: the
    pipeline's `grace_period_seconds`.
    """
    from orchestrator.airflow import notes
    from orchestrator.airflow.assets import announce_flip
    from orchestrator.lifecycle.promote import promote as promote_verb, promote_target

    with task_kappa() as k:
        _override(pipeline, reason, force)
        v = k.version(pipeline, version if version is not None else promote_target(k, pipeline))
        res = promote_verb(v, actor=actor_for(user), force=force,
                           allow_schema_change=allow_schema_change, grace_seconds=grace_seconds,
                           reason=tagged_reason(reason, dag_id, run_id, f"promote requested in Airflow by {user}"))
        log.info("%s", res.message)
        d = res.model_dump(mode="json")
        if not res.flipped and res.previous_version == res.version:
            # a retry after the flip: the version it replaced is in the alias history
            d["previous_version"] = k.registry.get_alias(res.alias).previous_version
        d["asset_event"] = announce_flip(k, outlet_events, action="promote", pipeline=pipeline, alias=res.alias,
                                         version=res.version, previous_version=res.previous_version,
                                         flipped=res.flipped, run_tag=run_tag(dag_id, run_id), actor=res.actor or "",
                                         reason=res.reason, at=res.at)
        prev = d.get("previous_version")
        standby = _standby(v.sibling(prev)) if prev is not None and prev != res.version else None
    body = [notes.standby_md(pipeline, prev, *standby)] if standby is not None else []
    notes.set_run_note(f"promoted {pipeline} v{res.version}: alias {res.alias} serves it"
                       + (f" (was v{prev})" if prev is not None and prev != res.version else "")
                       + _report_head(report, dag_id, run_id),
                       [*body, "", *notes.report_md(report)] if report else body)
    return d


@refusals_are_final
def stop_previous(pipeline: str, promoted: dict[str, Any] | None, *, user: str | None, run_id: str,
                  dag_id: str) -> dict[str, Any]:
    """Stop the version the promote replaced if its standby grace period is already over (grace 0).

    Otherwise it stays a running standby (an instant rollback with kappa_rollback) until the time its
    flip recorded (`lifecycle.standby.standby_until`), and `kappa_monitor` stops it then: the task ends
    *skipped* inside Airflow, saying until when, so that the promote's run ends at the flip. Leaves
    alone a version that serves again (a rollback happened meanwhile) or is no longer a standby.
    """
    from orchestrator.airflow import notes
    from orchestrator.jobctl import stop_version

    previous = (promoted or {}).get("previous_version")
    version = (promoted or {}).get("version")
    if not promoted or previous is None or previous == version:
        log.info("no previous version to stop")
        return {"stopped": None}
    with task_kappa() as k:
        v = k.version(pipeline, previous)
        standby = _standby(v)
        alias = k.registry.get_alias(v.alias)
        if standby is None or (alias is not None and alias.version == previous):
            msg = f"{pipeline} v{previous} is {v.record.state} now, not a standby: leaving it alone"
            log.info("%s", msg)
            return {"stopped": None, "message": msg}
        until, grace = standby
        if until > time.time():
            _skip(notes.standby_md(pipeline, previous, until, grace))
            return {"stopped": None, "standby_until": until}
        res = stop_version(v, actor=actor_for(user),
                           reason=tagged_reason(None, dag_id, run_id,
                                                f"standby grace period of {grace:.0f} s after promoting v{version} is over"))
        log.info("%s", res.message)
        return {**res.model_dump(mode="json"), "stopped": previous}


# -- kappa_rollback ---------------------------------------------------------------------------

def _rollback_reason(reason: str | None, user: str | None, dag_id: str, run_id: str) -> str:
    return tagged_reason(reason, dag_id, run_id, f"rollback requested in Airflow by {user}")


@refusals_are_final
def prepare_rollback(pipeline: str, to_version: int | None = None, reason: str | None = None, *,
                     user: str | None, run_id: str, dag_id: str = "kappa_rollback") -> dict[str, Any]:
    """The verb's first half: pick the target, restart its job from its checkpoint if it was stopped.
    The run's note says what the rollback costs: an instant flip, or a restart (records to catch up)."""
    from orchestrator.airflow import notes
    from orchestrator.lifecycle.rollback import prepare_rollback as prepare_verb

    with task_kappa() as k:
        plan = prepare_verb(k, k.pipeline(pipeline), to_version, actor=actor_for(user),
                            reason=_rollback_reason(reason, user, dag_id, run_id))
    log.info("%s", plan.message)
    head, _, rest = plan.message.partition("\n")
    notes.set_run_note(head, [rest] if rest else [])
    return plan.model_dump(mode="json")


@refusals_are_final
def poke_rollback_ready(prepared: dict[str, Any], *, deadline_at: float, user: str | None,
                        force: bool = False) -> PokeResult:
    """Sensor poke of the rollback: is the target ready for the flip? (At once when nothing is to flip.)
    A restarted target's catch-up (lag, ETA) heads the run's note at every poke. At the deadline the run
    fails (nothing flipped), or with `force` goes on to the flip task, which flips anyway."""
    from orchestrator.airflow import notes
    from orchestrator.lifecycle.rollback import restart_progress_line

    if prepared["done"]:
        return {"is_done": True, "xcom_value": None}
    n = prepared["to_version"]

    def progress(r: Readiness) -> None:
        if prepared.get("restarted"):
            line = restart_progress_line(n, r.total_lag, eta_seconds=r.eta_seconds, job_health=r.job_health, now=r.at)
            notes.set_run_note(f"rolling back {prepared['pipeline']} to v{n}, {line}", [prepared["message"]])
    if force and time.time() >= deadline_at:
        log.warning("the deadline has passed: flipping to v%s anyway (force), recorded with its readiness", n)
        return {"is_done": True, "xcom_value": None}
    # with force, the deadline ends the wait (above, at the next poke) rather than failing the run
    return poke_ready(prepared["pipeline"], n, deadline_at=float("inf") if force else deadline_at, user=user,
                      on_sample=progress)


@refusals_are_final
def rollback(prepared: dict[str, Any], reason: str | None = None, *, deadline_at: float, user: str | None,
             run_id: str, dag_id: str = "kappa_rollback", outlet_events: Any = None,
             force: bool = False) -> dict[str, Any]:
    """Flip the alias back to the prepared target (ready by now): CAS, publish, record.

    The flip expects the alias where the prepare task found it (`prepared["from_version"]`), so a
    promote that lands while the sensor waits is not silently undone: the flip is refused instead.
    A retry after the flip finds the alias serving the target and only publishes. A flip adds the
    alias's asset event to `outlet_events`, as `promote` does (XCom `asset_event`).
    """
    from orchestrator.airflow import notes
    from orchestrator.airflow.assets import announce_flip
    from orchestrator.lifecycle.rollback import RollbackPlan, finish_rollback

    plan = RollbackPlan.model_validate(prepared)
    with task_kappa() as k:
        res = finish_rollback(k, plan, actor=actor_for(user), deadline_seconds=max(0.0, deadline_at - time.time()),
                              reason=_rollback_reason(reason, user, dag_id, run_id), force=force)
        log.info("%s", res.message)
        event = announce_flip(k, outlet_events, action="rollback", pipeline=res.pipeline, alias=res.alias,
                              version=res.to_version, previous_version=res.from_version, flipped=res.flipped,
                              run_tag=run_tag(dag_id, run_id), actor=res.actor or "", reason=res.reason, at=res.at)
    notes.set_run_note(res.message, [prepared["message"]])
    return {**res.model_dump(mode="json"), "asset_event": event}
