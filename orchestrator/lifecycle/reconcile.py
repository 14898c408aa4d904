"""Reconcile: make what readers see and what runs agree with what the registry says happened.

Two kinds of drift are repaired:
- an alias flipped in the registry (compare-and-swap done) whose pointer file was not published
  (the process died in between): the pointer is published from the registry;
- versions whose registry state says their job runs while the process is gone or failed: handed
  to the supervisor (`lifecycle/supervise.py`), which restarts the job from its checkpoint with
  backoff or, past the pipeline's bound, marks the version failed with the error and the log's
  tail (a job that stopped cleanly is marked stopped); versions the registry says are stopped or
  retired whose job still runs (the stop is finished, under the version's lease); an interrupted
  retire (finished).

A version whose lease is fresh is left alone: its job is being started or stopped. The serving
version keeps its state when its job gives up (the alias still points at it); the error is
recorded on it and `monitor` raises about it. Idempotent: a second run finds nothing.
`reconcile` returns one dict per repair (its `kind`, the version, what was found). A repair that
raises a KappaError is returned as kind `error` (with the alias, or the version and its state)
and logged; the other repairs still run.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from orchestrator.core.exceptions import ConflictError, KappaError
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import RUNNING, VersionState
from orchestrator.jobctl import inspect_version, stop_version
from orchestrator.jobctl.launch import LEASE_SECONDS, lease_owner
from orchestrator.lifecycle.supervise import supervise_version
from orchestrator.serving import publish_current, read_pointer, set_serving_states

__all__ = ["reconcile"]

log = logging.getLogger(__name__)

#: States whose job should not run: a live process in one of them is an orphan to stop.
_NOT_RUNNING = frozenset({VersionState.STOPPED, VersionState.RETIRED, VersionState.FAILED})
# (a retiring version's job is stopped by the retire that reconcile finishes)
#: Actions the supervisor audits itself (or that would add an entry every pass: pending, busy).
_SELF_AUDITED = frozenset({"mark_failed", "restart", "gave_up", "restart_pending", "busy", "restart_failed"})


def _reconcile_alias(k: Kappa, spec: PipelineSpec, actor: str) -> list[dict[str, Any]]:
    rec = k.registry.get_alias(spec.alias)
    if rec is None or rec.pipeline != spec.name:
        return []
    pointer = read_pointer(k.alias_file(spec.alias))
    table = str(k.paths(spec.name, rec.version).table)      # the alias record names it: no registry read
    in_sync = (pointer is not None and pointer.get("version") == rec.version and pointer.get("table") == table
               and rec.published_version == rec.version)
    if in_sync:
        return []
    was = None if pointer is None else pointer.get("version")
    new = publish_current(k, spec.alias)
    set_serving_states(k, spec, rec.version, rec.previous_version)
    action = {"kind": "publish", "pipeline": spec.name, "alias": spec.alias, "version": rec.version,
              "pointer_was": was, "registry_published_was": rec.published_version, "pointer": new}
    k.registry.audit("reconcile", actor=actor, pipeline=spec.name, version=rec.version,
                     reason=f"alias {spec.alias!r}: registry at v{rec.version}, pointer at {was}", details=action)
    return [action]


def _reconcile_versions(k: Kappa, spec: PipelineSpec, actor: str) -> list[dict[str, Any]]:
    out = []
    for v in k.versions(spec):
        rec = v.record
        try:
            action = _reconcile_version(v, actor)
        except KappaError as e:  # reported; the other versions are still repaired
            log.warning("reconcile of %s v%s: %s", spec.name, rec.version, e)
            action = {"kind": "error", "pipeline": spec.name, "version": rec.version, "state": rec.state,
                      "error": str(e)}
        if action is not None:
            out.append(action)
    return out


def _reconcile_version(v: VersionRef, actor: str) -> dict[str, Any] | None:
    k, spec, rec = v.k, v.spec, v.record
    if rec.lease_held():
        return None  # its job is being started or stopped right now: the lease holder finishes that
    if rec.state == VersionState.RETIRING:
        from orchestrator.lifecycle.retire import retire

        res = retire(v, actor=actor, reason="reconcile: finish an interrupted retire")
        action: dict[str, Any] | None = {"kind": "finish_retire", "done": res.done}
        return _audited(k, spec, rec, actor, action)
    st = inspect_version(v)
    action = None
    if rec.state in RUNNING:
        if st.failed:
            action = supervise_version(v, st, actor=actor)
        elif st.health == "not_started" and rec.state == VersionState.STARTING:
            # its starter died after taking the lease and before launching the job
            st = st.model_copy(update={"health": "failed", "error": "its start was interrupted before the job "
                                       "was launched (the starting process died); start it again"})
            action = supervise_version(v, st, actor=actor)
        elif st.health in ("stopped", "finished", "not_started") and rec.state != VersionState.SERVING:
            k.registry.set_state(spec.name, rec.version, VersionState.STOPPED, expected=rec.state, pid=None)
            action = {"kind": "mark_stopped", "was": rec.state, "job": st.health}
    elif rec.state in _NOT_RUNNING and st.alive:
        # Take the lease first: a start (a rollback restarting it) that got there first wins, and
        # one that comes later waits for this stop instead of having its new job killed.
        owner = lease_owner(actor)
        try:
            leased = k.registry.take_lease(spec.name, rec.version, owner=owner, expected=(rec.state,),
                                           ttl=LEASE_SECONDS)
        except ConflictError:
            return None
        try:
            if inspect_version(v).pid != st.pid:
                return None  # a new job was launched since this one was inspected
            res = stop_version(v, actor=actor, force=True, final_state=None,
                               reason=f"reconcile: the registry says {rec.state}, but its job was running")
        finally:
            k.registry.release_lease(spec.name, rec.version, owner=owner, epoch=leased.lease_epoch)
        action = {"kind": "stop_orphan_job", "state": rec.state, "pid": res.pid, "how": res.how}
    return _audited(k, spec, rec, actor, action)


def _audited(k: Kappa, spec: PipelineSpec, rec: Any, actor: str,
             action: dict[str, Any] | None) -> dict[str, Any] | None:
    if action is not None:
        action.update(pipeline=spec.name, version=rec.version, state=rec.state)
        if action["kind"] not in _SELF_AUDITED:
            k.registry.audit("reconcile", actor=actor, pipeline=spec.name, version=rec.version,
                             reason=action["kind"], details=action)
    return action


def reconcile(k: Kappa, *, actor: str, specs: Iterable[PipelineSpec] | None = None) -> list[dict[str, Any]]:
    """Repair interrupted publishes and registry states that disagree with the processes (of the
    pipelines `specs`, default all). A dead job of a running version is supervised: restarted from
    its checkpoint, or failed past its bound (`orchestrator.lifecycle.supervise`)."""
    actions: list[dict[str, Any]] = []
    for spec in (k.specs() if specs is None else specs):
        name = spec.name
        try:
            actions += _reconcile_alias(k, spec, actor)
        except KappaError as e:  # reported; the versions are still repaired
            log.warning("reconcile of alias %s of %s: %s", spec.alias, name, e)
            actions.append({"kind": "error", "pipeline": name, "alias": spec.alias, "error": str(e)})
        try:
            actions += _reconcile_versions(k, spec, actor)
        except KappaError as e:  # its versions could not be listed
            log.warning("reconcile of %s: %s", name, e)
            actions.append({"kind": "error", "pipeline": name, "error": str(e)})
    return actions
