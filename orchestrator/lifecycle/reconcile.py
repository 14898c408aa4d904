"""Reconcile: make what readers see and what runs agree with what the registry says happened.

Two kinds of drift are repaired:
- an alias flipped in the registry (compare-and-swap done) whose pointer file was not published
  (the process died in between): the pointer is published from the registry;
- versions whose registry state says their job runs while the process is gone or failed (marked
  failed, with the error and the log's tail; a job that stopped cleanly is marked stopped), and
  versions the registry says are stopped or retired whose job still runs (the stop is finished).

The serving version keeps its state when its job dies (the alias still points at it); the
error is recorded on it and `monitor` raises about it. Idempotent: a second run finds nothing.
`reconcile` returns one dict per repair (its `kind`, the version, what was found). A repair that
raises a KappaError is returned as kind `error` (with the alias, or the version and its state)
and logged; the other repairs still run.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from orchestrator.core.exceptions import KappaError
from orchestrator.core.kappa import Kappa
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import RUNNING, VersionState
from orchestrator.jobctl import inspect_version, mark_failed, stop_version
from orchestrator.serving import publish_current, read_pointer, set_serving_states

__all__ = ["reconcile"]

log = logging.getLogger(__name__)

#: States whose job should not run: a live process in one of them is an orphan to stop.
_NOT_RUNNING = frozenset({VersionState.STOPPED, VersionState.RETIRED, VersionState.FAILED})


def _reconcile_alias(k: Kappa, spec: PipelineSpec, actor: str) -> list[dict[str, Any]]:
    rec = k.registry.get_alias(spec.alias)
    if rec is None or rec.pipeline != spec.name:
        return []
    pointer = read_pointer(k.alias_file(spec.alias))
    table = str(k.paths(rec.pipeline, rec.version).table)
    in_sync = (pointer is not None and pointer.get("version") == rec.version and pointer.get("table") == table
               and rec.published_version == rec.version)
    if in_sync:
        return []
    was = None if pointer is None else pointer.get("version")
    new = publish_current(k, spec.alias)
    set_serving_states(k, rec.pipeline, rec.version, rec.previous_version)
    action = {"kind": "publish", "pipeline": spec.name, "alias": spec.alias, "version": rec.version,
              "pointer_was": was, "registry_published_was": rec.published_version, "pointer": new}
    k.registry.audit("reconcile", actor=actor, pipeline=spec.name, version=rec.version,
                     reason=f"alias {spec.alias!r}: registry at v{rec.version}, pointer at {was}", details=action)
    return [action]


def _reconcile_versions(k: Kappa, spec: PipelineSpec, actor: str) -> list[dict[str, Any]]:
    out = []
    for rec in k.registry.list_versions(spec.name):
        try:
            action = _reconcile_version(k, spec, rec, actor)
        except KappaError as e:  # reported; the other versions are still repaired
            log.warning("reconcile of %s v%s: %s", spec.name, rec.version, e)
            action = {"kind": "error", "pipeline": spec.name, "version": rec.version, "state": rec.state,
                      "error": str(e)}
        if action is not None:
            out.append(action)
    return out


def _reconcile_version(k: Kappa, spec: PipelineSpec, rec: Any, actor: str) -> dict[str, Any] | None:
    st = inspect_version(k, spec.name, rec.version)
    action: dict[str, Any] | None = None
    if rec.state in RUNNING:
        if st.failed:
            if mark_failed(k, st, actor=actor):
                action = {"kind": "mark_failed", "error": st.error}
            elif rec.state == VersionState.SERVING and rec.error != (st.error or "")[:2000]:
                action = {"kind": "serving_job_failed", "error": st.error}
        elif st.health in ("stopped", "finished", "not_started") and rec.state != VersionState.SERVING:
            k.registry.set_state(spec.name, rec.version, VersionState.STOPPED, expected=rec.state, pid=None)
            action = {"kind": "mark_stopped", "was": rec.state, "job": st.health}
    elif rec.state in _NOT_RUNNING and st.alive:
        res = stop_version(k, spec.name, rec.version, actor=actor, force=True, final_state=None,
                           reason=f"reconcile: the registry says {rec.state}, but its job was running")
        action = {"kind": "stop_orphan_job", "state": rec.state, "pid": res.pid, "how": res.how}
    if action is not None:
        action.update(pipeline=spec.name, version=rec.version, state=rec.state)
        if action["kind"] != "mark_failed":  # mark_failed audits itself
            k.registry.audit("reconcile", actor=actor, pipeline=spec.name, version=rec.version,
                             reason=action["kind"], details=action)
    return action


def reconcile(k: Kappa, *, actor: str, pipelines: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Repair interrupted publishes and registry states that disagree with the processes."""
    names = list(pipelines) if pipelines is not None else list(k.pipelines)
    actions: list[dict[str, Any]] = []
    for name in names:
        spec = k.pipeline(name)
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
