"""Retention: keep the last K versions of a pipeline, retire the older ones.

Retiring a version first moves it to `retiring` (a compare-and-swap that also checks, in the same
transaction, that no alias serves it, keeps it for rollback or has it published, and that nobody
is starting it), so no flip can land on it while its files go; then it stops its job and deletes its output table, its rejects table, its
checkpoint and run directory, and its consumer group; the registry keeps the version's record
(state `retired`) and the audit log keeps its history. The version the alias serves and the
rollback target (the alias's previous version) are never retired. Every step is idempotent, so
a retire that died half-way is finished by running it again. `dry_run` lists what would go.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, Field

from orchestrator.core import uris
from orchestrator.core.crashpoints import crashpoint
from orchestrator.core.exceptions import BrokerError, KappaError, LifecycleError, RefusedError
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import VersionState
from orchestrator.jobctl import stop_version

__all__ = ["RetireResult", "RetentionPlan", "retire", "apply_retention", "protected_versions"]

log = logging.getLogger(__name__)


class RetireResult(BaseModel):
    """What retiring one version did (`done`), or with `dry_run` would do (`actions`)."""

    pipeline: str
    version: int
    dry_run: bool
    actions: list[str]
    done: list[str] = Field(default_factory=list)
    bytes_freed: int = 0
    message: str = ""


class RetentionPlan(BaseModel):
    """Which versions retention keeps, which it protects (and why), and each retire's result or error."""

    pipeline: str
    keep: int
    dry_run: bool
    kept: list[int]
    protected: dict[int, str]
    retire: list[int]
    results: list[dict[str, Any]] = Field(default_factory=list)
    message: str = ""


def protected_versions(k: Kappa, spec: PipelineSpec) -> dict[int, str]:
    """{version: why} for the versions of the pipeline that must not be retired."""
    pipeline = spec.name
    rec = k.registry.get_alias(spec.alias)
    out: dict[int, str] = {}
    if rec is not None and rec.pipeline == pipeline:
        if rec.version is not None:
            out[rec.version] = f"it serves alias {spec.alias!r}"
        prev = rec.previous_version
        if prev is not None and prev not in out:
            out[prev] = f"it is the rollback target of alias {spec.alias!r}"
        published = rec.published_version
        if published is not None and published not in out:
            out[published] = f"readers may still follow the published pointer of alias {spec.alias!r} to it"
    return out


def _locations(paths) -> list[tuple[str, str]]:
    """(what, location) of everything a retire deletes: the tables and the checkpoint are locations
    (`orchestrator.core.uris`, maybe on shared storage), the run dir is local; a checkpoint inside the
    run dir's version dir (the default) goes with it."""
    vdir = str(paths.version_dir)
    local = uris.local_path(paths.checkpoint)
    if local is not None and local.is_relative_to(paths.version_dir):
        return [("table", paths.table), ("rejects table", paths.rejects), ("checkpoint and run dir", vdir)]
    return [("table", paths.table), ("rejects table", paths.rejects), ("checkpoint", paths.checkpoint),
            ("run dir", vdir)]


def _delete_group(k: Kappa, group_id: str) -> str:
    from confluent_kafka import KafkaError

    try:
        fut = k.admin().delete_consumer_groups([group_id], request_timeout=10)[group_id]
        fut.result()
        return "deleted"
    except Exception as e:
        err = e.args[0] if e.args else None
        code = getattr(err, "code", lambda: None)()
        if code in (KafkaError.GROUP_ID_NOT_FOUND,):
            return "did not exist"
        raise BrokerError(f"cannot delete consumer group {group_id!r}: {e}; retry the retire, or delete it "
                          f"with kafka-consumer-groups --delete --group {group_id}") from None


def retire(v: VersionRef, *, actor: str, reason: str | None = None, dry_run: bool = False) -> RetireResult:
    """Stop the job and delete table, rejects, checkpoint, run dir and consumer group of a version
    (decided on its record as resolved: its state changes below are compare-and-swaps from it)."""
    k, reg, rec, pipeline, version = v.k, v.registry, v.record, v.pipeline, v.version
    protected = protected_versions(k, v.spec)
    if version in protected:
        msg = (f"cannot retire {pipeline} v{version}: {protected[version]}; promote or roll back to another "
               f"version first")
        if not dry_run:
            reg.audit("retire", actor=actor, pipeline=pipeline, version=version, reason=reason,
                      outcome="refused", details={"error": msg})
        raise RefusedError(msg)
    paths = v.paths
    dirs = _locations(paths)
    actions = [f"stop the job of v{version} (if running)"]
    actions += [f"delete {what} {p} ({uris.size(p)} bytes)" for what, p in dirs if uris.exists(p)]
    actions += [f"delete consumer group {paths.group_id}", f"set {pipeline} v{version} to retired"]
    result = RetireResult(pipeline=pipeline, version=version, dry_run=dry_run, actions=actions)
    if dry_run:
        result.message = f"dry run: would retire {pipeline} v{version} ({rec.state})"
        return result
    why = f"retire: {reason or ''}".strip()
    if rec.state not in (VersionState.STOPPED, VersionState.FAILED, VersionState.CREATED, VersionState.RETIRING,
                         VersionState.RETIRED):
        # a running version that serves nothing: stopped first (a compare-and-swap from its state)
        stop_version(v, actor=actor, reason=why, expected_state=rec.state)
    if rec.state != VersionState.RETIRED:
        # From here no alias can be flipped to it: the registry refuses a retiring target.
        reg.begin_retire(pipeline, version, actor=actor, reason=reason)
        crashpoint("retire.marked")
    stop_version(v, actor=actor, reason=why, force=True, final_state=None)
    result.done.append("job stopped")
    for what, p in dirs:
        if uris.exists(p):
            result.bytes_freed += uris.size(p)
            try:  # a second retire (or reconcile) of the same version may be deleting it too: that is fine
                uris.delete_tree(p)
            except OSError as e:
                raise LifecycleError(f"could not delete {what} {p} while retiring {pipeline} v{version} ({e}); "
                                     f"check its permissions, then run kappa retire {pipeline} {version} --yes "
                                     f"again") from None
            result.done.append(f"deleted {what} {p}")
            crashpoint("retire.deleted")
    result.done.append(f"consumer group {paths.group_id}: {_delete_group(k, paths.group_id)}")
    if rec.state != VersionState.RETIRED:
        # (already retired: a concurrent retire of the same version finished first)
        reg.set_state(pipeline, version, VersionState.RETIRED, expected=(VersionState.RETIRING, VersionState.RETIRED),
                      pid=None)
    reg.audit("retire", actor=actor, pipeline=pipeline, version=version, reason=reason,
              details={"done": result.done, "bytes_freed": result.bytes_freed, "state_before": rec.state})
    result.message = f"retired {pipeline} v{version}, freed {result.bytes_freed} bytes"
    return result


def apply_retention(k: Kappa, spec: PipelineSpec, *, actor: str, dry_run: bool = True, keep: int | None = None,
                    reason: str | None = None) -> RetentionPlan:
    """Retire every version older than the last `keep` (default: the pipeline's keep_versions)."""
    pipeline = spec.name
    keep = spec.keep_versions if keep is None else keep
    refs = {v.version: v for v in k.versions(spec)}
    versions = [refs[n].record for n in sorted(refs)]
    live = [r for r in versions if r.state not in (VersionState.RETIRED, VersionState.RETIRING)]
    # Versions in flight (deployed, not yet served) are kept on top of the last `keep`: they do not
    # count among them, or a reprocess in progress would push a finished version out under it.
    settled = [r for r in live if not r.in_flight]
    kept = [r.version for r in settled[-keep:]] if keep > 0 else []
    protected = protected_versions(k, spec)
    for r in live:
        if r.in_flight and r.version not in protected:
            protected[r.version] = f"it is in flight ({r.state}): deployed and not yet served"
    candidates = [r.version for r in live if r.version not in kept]
    to_retire = [v for v in candidates if v not in protected]
    plan = RetentionPlan(pipeline=pipeline, keep=keep, dry_run=dry_run, kept=kept, retire=to_retire,
                         protected={v: why for v, why in protected.items() if v in candidates})
    for n in to_retire:
        try:
            res = retire(refs[n], actor=actor, reason=reason or f"retention: keep the last {keep}",
                         dry_run=dry_run)
            plan.results.append(res.model_dump(mode="json"))
        except KappaError as e:
            plan.results.append({"pipeline": pipeline, "version": n, "error": str(e)})
    verb = "would retire" if dry_run else "retired"
    plan.message = (f"{pipeline}: keep {kept}; {verb} {to_retire or 'nothing'}"
                    + (f"; protected {sorted(plan.protected)}" if plan.protected else ""))
    return plan
