"""Promote: point a pipeline's serving alias at a new version, after checking everything first.

Order, as in dbt-materialize's deploy_promote: every precondition is checked before anything
changes (the version is ready; its key count is within the pipeline's tolerance of the serving
version's; its reject rate is under the limit), the validation report is written beside the
version, then one compare-and-swap on the registry moves the alias ("from vN to vM, only if it
still points at vN"), then the pointer file readers follow is published, then who/when/why is
recorded. Of two concurrent promotes exactly one wins the swap; the other gets ConflictError.

The previous version stays running as standby for the grace period (instant rollback): the
promote's own `grace_seconds`, else the pipeline's. Its end is stored with the flip
(`standby_until`), so `monitor` stops it then, keeping its table and checkpoint, whoever promoted.

Resumable: a crash between the swap and the publish leaves the registry ahead of the pointer
(`published_version != version`); running promote again (or rollback, or reconcile) publishes
what the registry says before doing anything else.

Without a version, both front ends (`kappa promote P`, the kappa_promote DAG with an empty
version) promote `promote_target`: the newest caught-up version, the newest one that can pass
the readiness check. `flip` (compare-and-swap, publish, states, audit) is shared with rollback.
"""

from __future__ import annotations

import math
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.checks import CheckResult, result
from orchestrator.core.crashpoints import crashpoint
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.exceptions import ConfigError, ConflictError, KappaError, NotFoundError, NotReadyError
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import VersionState
from orchestrator.jobctl import inspect_version, mark_failed
from orchestrator.lifecycle.await_ready import Readiness, readiness
from orchestrator.lifecycle.report import Report
from orchestrator.serving import publish_current, set_serving_states

__all__ = ["PromoteResult", "promote", "promote_target", "flip", "finish_interrupted_flip"]

#: Checks `force` cannot override: a version that is not ready, or whose report could not be made.
UNFORCEABLE = ("ready", "report")


class PromoteResult(BaseModel):
    """What a promote did, or with `dry_run` would do (`actions`), and the checks it made."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    alias: str
    version: int
    previous_version: int | None
    dry_run: bool
    flipped: bool
    published: bool
    would_succeed: bool
    message: str
    checks: list[CheckResult] = Field(default_factory=list)
    forced: list[str] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list)
    report: Report | None = None
    report_path: str | None = None
    readiness: Readiness | None = None
    pointer: dict[str, Any] | None = None
    actor: str | None = None
    reason: str | None = None
    at: float = 0.0
    error: str | None = None


def promote_target(k: Kappa, pipeline: str) -> int:
    """The version a promote without a version serves: the newest caught-up version of `pipeline`."""
    versions = k.registry.list_versions(pipeline)
    caught_up = [r.version for r in versions if r.state == VersionState.CAUGHT_UP]
    if not caught_up:
        states = ", ".join(f"v{r.version} {r.state}" for r in versions) or "none"
        raise NotFoundError(f"{pipeline} has no caught-up version to promote (versions: {states}); name the "
                            f"version to promote, or deploy one and wait until it is caught up")
    return max(caught_up)


def _alias_versions(k: Kappa, alias: str) -> tuple[int | None, int | None, int | None]:
    rec = k.registry.get_alias(alias)
    if rec is None:
        return None, None, None
    return rec.version, rec.previous_version, rec.published_version


def finish_interrupted_flip(k: Kappa, spec: PipelineSpec, *, actor: str = "kappa") -> dict[str, Any] | None:
    """If the registry moved the pipeline's alias but the pointer was not published, publish it now."""
    alias = spec.alias
    current, _prev, published = _alias_versions(k, alias)
    if current is None or published == current:
        return None
    pointer = publish_current(k, alias)
    rec = k.registry.get_alias(alias)
    set_serving_states(k, spec, rec.version, rec.previous_version)
    k.registry.audit("publish", actor=actor, pipeline=pointer["pipeline"] if pointer else None,
                     version=current, reason="finish a flip interrupted before its publish",
                     details={"alias": alias, "published_before": published, "pointer": pointer})
    return pointer


def flip(v: VersionRef, *, expected_version: int | None, actor: str,
         reason: str | None, action: str, details: dict[str, Any] | None = None,
         watch: dict[str, Any] | None = None, grace_seconds: float | None = None,
         forced: bool = False) -> dict[str, Any]:
    """Compare-and-swap the alias to `v`, publish the pointer, set serving/standby, audit. Returns the pointer.

    `watch` is stored with the flip, in its transaction (`Registry.flip_alias`), and so is
    the end of the replaced version's standby: after `grace_seconds` (None: the pipeline's grace period).
    `forced`: a rollback forced at its deadline, whose target's running job has not caught up."""
    k, spec, reg, pipeline, new_version = v.k, v.spec, v.registry, v.pipeline, v.version
    grace = spec.grace_period_seconds if grace_seconds is None else grace_seconds
    # The target's job must be healthy at flip time, not only when the checks ran: a job that
    # died since is recorded as failed (which the flip's own transaction then refuses).
    st = inspect_version(v)
    if st.failed or (not st.alive and v.reread().record.state != VersionState.SERVING):
        if st.failed:
            mark_failed(k, st, actor=actor)
        error = (f"{action} of {pipeline} v{new_version} refused at flip time: its job is {st.describe()}; "
                 f"nothing was changed (alias {spec.alias!r} still serves "
                 f"{'nothing' if expected_version is None else f'v{expected_version}'}). Restart it or roll back")
        reg.audit(action, actor=actor, pipeline=pipeline, version=new_version, reason=reason, outcome="refused",
                  details={"expected_version": expected_version, "error": error})
        raise NotReadyError(error)
    crashpoint(f"{action}.checked")
    t0 = time.perf_counter()
    try:
        reg.flip_alias(spec.alias, pipeline, expected_version=expected_version, new_version=new_version,
                       actor=actor, reason=reason, serve=True, action=action, watch=watch,
                       standby_grace_seconds=grace, forced=forced)
    except NotReadyError as e:
        reg.audit(action, actor=actor, pipeline=pipeline, version=new_version, reason=reason,
                  outcome="refused", details={"expected_version": expected_version, "error": str(e)})
        raise
    except ConflictError as e:
        now = reg.get_alias(spec.alias)
        reg.audit(action, actor=actor, pipeline=pipeline, version=new_version, reason=reason,
                  outcome="conflict", details={"expected_version": expected_version, "error": str(e)})
        raise ConflictError(
            f"{action} of {pipeline} v{new_version} lost the race: alias {spec.alias!r} no longer points at "
            f"{'nothing' if expected_version is None else f'v{expected_version}'} (it points at "
            f"v{now.version if now is not None else None} now, moved by another operation); check `kappa status "
            f"{pipeline}` and try again if still wanted ({e})") from None
    flipped = time.perf_counter()
    crashpoint(f"{action}.flipped")
    pointer = publish_current(k, spec.alias)
    published = time.perf_counter()
    crashpoint(f"{action}.published")
    reg.audit(action, actor=actor, pipeline=pipeline, version=new_version, reason=reason,
              details={"alias": spec.alias, "from_version": expected_version, "to_version": new_version,
                       "cas_ms": round((flipped - t0) * 1000, 3), "publish_ms": round((published - flipped) * 1000, 3),
                       "pointer": pointer, **(details or {})})
    return pointer or {}


def _checks(v: VersionRef, serving: VersionRef | None, *, record: bool,
            allow_schema_change: bool) -> tuple[list[CheckResult], Readiness, Report | None]:
    from orchestrator.lifecycle.report import validation_report

    version = v.version
    checks: list[CheckResult] = []
    r = readiness(v, record=record)
    checks.append(result("ready", r.ready, r.summary()))
    watch = (v.record.details or {}).get("watch") or {}
    if watch.get("state") == "rolled_back":
        checks.append(result("auto_rollback", False,
                             f"v{version} was rolled back automatically after its promote ({watch.get('cause')}); "
                             f"promote it again only with --force and a reason, or deploy a new version"))
    report = None
    try:
        report = validation_report(v, save=record, serving=serving)
    except KappaError as e:
        checks.append(result("report", False, str(e)))
    if report is not None:
        for c in report.checks:
            if c.name == "schema" and not c.ok and allow_schema_change:
                c = c.model_copy(update={"ok": True, "detail": f"allowed (--allow-schema-change): {c.detail}"})
            checks.append(c)
    return checks, r, report


def _new_watch(v: VersionRef, standby: int | None, now: float, grace: float,
               checks: list[CheckResult]) -> dict | None:
    """The watch a promote stores with its flip: over the grace period, while `standby` is standby.

    It ends by `now` + `grace`, before the standby's own end (the same grace from the later flip)."""
    spec = v.spec
    if not spec.auto_rollback or standby is None:
        return None
    return {"state": "watching", "standby": standby, "started_at": now, "until": now + grace,
            "samples": 0, "lag_over": 0, "last": None, "cause": None,
            "watched_checks": [c.name for c in spec.checks if c.watch],
            "reject_rate_at_promote": next((c.value for c in checks if c.name == "reject_rate"), None)}


def promote(v: VersionRef, *, actor: str, reason: str | None = None,
            dry_run: bool = False, force: bool = False, allow_schema_change: bool = False,
            grace_seconds: float | None = None) -> PromoteResult:
    """Check, report, flip (CAS), publish, record. `dry_run` says exactly what would happen.

    The version replaced stays a running standby for `grace_seconds` (None: the pipeline's
    `grace_period_seconds`; 0: the monitor stops it at its next pass), stored with the flip.

    A front end without a version promotes `promote_target(k, pipeline)`. `force` (with a reason, audited) promotes
    although checks failed (not `ready` nor `report`); `allow_schema_change` lets a version whose
    columns were removed or retyped pass the `schema` check. With `auto_rollback`, the flip stores
    the watch of the promoted version (`orchestrator.lifecycle.watch`).
    """
    k, spec, pipeline, version = v.k, v.spec, v.pipeline, v.version
    if force and not (reason or "").strip():
        raise ConfigError(f"promote of {pipeline} with --force needs a reason (--reason \"...\"): it is recorded "
                          f"in the audit log with the checks it overrode")
    grace = spec.grace_period_seconds if grace_seconds is None else float(grace_seconds)
    if not (math.isfinite(grace) and grace >= 0):
        raise ConfigError(f"promote of {pipeline}: the standby grace period must be 0 or more seconds, not "
                          f"{grace_seconds!r} (--grace; empty for the pipeline's {spec.grace_period_seconds:.0f} s)")
    reg = k.registry
    alias = spec.alias
    now = time.time()
    current, _prev, published = _alias_versions(k, alias)
    actions: list[str] = []
    pointer_file = str(k.alias_file(alias))
    if current is not None and published != current:
        actions.append(f"publish the interrupted flip to v{current} first (pointer {pointer_file})")
        if not dry_run:
            finish_interrupted_flip(k, spec, actor=actor)

    if current == version:
        msg = f"{pipeline} v{version} already serves alias {alias!r}; nothing to promote"
        if not dry_run:
            pointer = publish_current(k, alias)
            set_serving_states(k, spec, version, None)
            reg.audit("promote", actor=actor, pipeline=pipeline, version=version, reason=reason,
                      outcome="noop", details={"message": msg})
        else:
            pointer = None
        return PromoteResult(pipeline=pipeline, alias=alias, version=version, previous_version=current,
                             dry_run=dry_run, flipped=False, published=not dry_run, would_succeed=True, message=msg,
                             actions=actions, pointer=pointer, actor=actor, reason=reason, at=now)

    serving = None if current is None else v.sibling(current)
    checks, r, report = _checks(v, serving, record=not dry_run, allow_schema_change=allow_schema_change)
    failed = [c for c in checks if not c.ok]
    forced: list[str] = []
    if force and failed and not any(c.name in UNFORCEABLE for c in failed):
        forced = [c.name for c in failed]
        failed = []
    error = None
    if failed:
        error = (f"cannot promote {pipeline} v{version} to alias {alias!r}: "
                 + "; ".join(f"{c.name}: {c.detail}" for c in failed))
    from_txt = "nothing" if current is None else f"v{current}"
    if report is not None:
        actions.append(f"write the validation report to {v.paths.report_file}")
    actions += [
        f"flip alias {alias!r} from {from_txt} to v{version} (compare-and-swap in the registry)",
        f"publish pointer {pointer_file} -> {v.paths.table}",
        f"set {pipeline} v{version} to serving",
    ]
    if current is not None:
        actions.append(f"keep v{current} running as standby for {grace:.0f} s, then stop "
                       f"its job (table and checkpoint kept)")
    watch = _new_watch(v, current, now, grace, checks)
    if watch is not None:
        actions.append(f"watch v{version} for {grace:.0f} s (auto_rollback): roll back to "
                       f"v{current} if it degrades")
    if forced:
        actions.append(f"override the failed check(s) {', '.join(forced)} (--force), recorded with the reason")
    actions.append(f"record the promote by {actor!r}: {reason or '(no reason given)'}")
    base = dict(pipeline=pipeline, alias=alias, version=version, previous_version=current, checks=checks,
                report=report, report_path=report.path if report else None, readiness=r, actor=actor,
                reason=reason, at=now, forced=forced)
    audited_checks = [c.model_dump(mode="json") for c in checks]
    if dry_run:
        msg = (f"dry run: would refuse. {error}" if error else
               f"dry run: would promote {pipeline} v{version} (alias {alias!r} from {from_txt})")
        return PromoteResult(dry_run=True, flipped=False, published=False, would_succeed=not failed,
                             message=msg, actions=[] if failed else actions, error=error, **base)
    if failed:
        reg.audit("promote", actor=actor, pipeline=pipeline, version=version, reason=reason, outcome="refused",
                  details={"error": error, "checks": audited_checks, "readiness": r.decision()})
        raise NotReadyError(error, failed_checks=[c.name for c in failed])
    pointer = flip(v, expected_version=current, actor=actor, reason=reason,
                   action="promote", watch=watch, grace_seconds=grace,
                   details={"checks": audited_checks, "readiness": r.decision(), "forced": forced,
                            "report": report.model_dump(mode="json", exclude={"top_changes"}) if report else {}})
    msg = f"promoted {pipeline} v{version}: alias {alias!r} moved from {from_txt} to v{version}"
    if current is not None:
        msg += f"; v{current} is standby for {grace:.0f} s"
        if watch is not None:
            msg += f", while v{version} is watched (auto_rollback)"
    if forced:
        msg += f" (forced past failed check(s): {', '.join(forced)})"
    return PromoteResult(dry_run=False, flipped=True, published=True, would_succeed=True, message=msg,
                         actions=actions, pointer=pointer, **base)
