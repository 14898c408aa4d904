"""Rollback: point the alias back at the previous serving version (or a named one).

A standby version still runs, so rolling back to it is a flip. A version whose job was stopped
(after its grace period) is restarted from its own checkpoint, never from offset zero (a
version without a checkpoint is refused), and the flip waits until it is ready again. Like a
promote, the flip is a compare-and-swap, then a publish, then an audit entry.

Resumable: if the previous attempt flipped the registry but died before publishing, running
rollback again publishes that flip and stops there; it never flips back a second time.

Public API:
- `RollbackResult` (`.to_dict()`)
- `rollback(k, pipeline, to_version=None, *, actor, reason, deadline_seconds=600, poll_seconds=2,
  on_sample=None) -> RollbackResult`
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from orchestrator.lifecycle.await_ready import Readiness, wait_ready
from orchestrator.core.exceptions import LifecycleError, NotFoundError, NotReadyError
from orchestrator.jobctl.control import inspect_version, restart_version, start_version
from orchestrator.lifecycle.promote import finish_interrupted_flip, flip
from orchestrator.serving import publish_current


@dataclass
class RollbackResult:
    pipeline: str
    alias: str
    from_version: int | None
    to_version: int
    flipped: bool
    restarted: bool
    waited_seconds: float
    message: str
    readiness: dict[str, Any] | None = None
    pointer: dict[str, Any] | None = None
    actor: str | None = None
    reason: str | None = None
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rollback(k, pipeline: str, to_version: int | None = None, *, actor: str, reason: str | None = None,
             deadline_seconds: float = 600.0, poll_seconds: float = 2.0,
             on_sample: Callable[[Readiness], None] | None = None) -> RollbackResult:
    """Flip the alias to `to_version` (default: the previous serving version), restarting it if needed."""
    spec = k.pipeline(pipeline)
    reg = k.registry
    alias = spec.alias
    now = time.time()
    rec = reg.get_alias(alias)
    if rec is None or rec.version is None:
        raise NotFoundError(f"alias {alias!r} of {pipeline} serves nothing yet: nothing to roll back; "
                            f"promote a version first")
    interrupted = finish_interrupted_flip(k, alias, actor=actor)
    if interrupted is not None and to_version is None:
        return RollbackResult(pipeline, alias, rec.published_version, rec.version, False, False, 0.0,
                              f"finished the interrupted flip of alias {alias!r} to v{rec.version} "
                              f"(published now); not flipping again", pointer=interrupted, actor=actor,
                              reason=reason, at=now)
    current = rec.version
    target = to_version if to_version is not None else getattr(rec, "previous_version", None)
    if target is None:
        raise NotFoundError(f"alias {alias!r} has no previous version to roll back to (it serves v{current}, "
                            f"its first); name a version with --to")
    if target == current:
        pointer = publish_current(k, alias)
        return RollbackResult(pipeline, alias, current, target, False, False, 0.0,
                              f"{pipeline} v{target} already serves alias {alias!r}; nothing to roll back",
                              pointer=pointer, actor=actor, reason=reason, at=now)
    trec = reg.get_version(pipeline, target)
    if trec.state == "retired":
        raise LifecycleError(f"cannot roll back to {pipeline} v{target}: it is retired (table and checkpoint "
                             f"deleted); pick another version or deploy a new one")
    paths = k.paths(pipeline, target)
    st = inspect_version(k, pipeline, target)
    restarted = False
    if not st.alive or st.failed:
        if not paths.checkpoint.exists():
            raise LifecycleError(f"cannot roll back to {pipeline} v{target}: its checkpoint {paths.checkpoint} is "
                                 f"missing, and a rollback never re-reads from offset zero; deploy a new version")
        why = f"rollback of alias {alias!r} to v{target}" + (f": {reason}" if reason else "")
        if st.alive:
            restart_version(k, pipeline, target, actor=actor, reason=why)
        else:
            start_version(k, pipeline, target, actor=actor, reason=why)
        restarted = True
    t0 = time.monotonic()
    try:
        r = wait_ready(k, pipeline, target, deadline_seconds=deadline_seconds, poll_seconds=poll_seconds,
                       on_sample=on_sample, actor=actor)
    except NotReadyError as e:
        reg.audit("rollback", actor=actor, pipeline=pipeline, version=target, reason=reason, outcome="failed",
                  details={"from_version": current, "error": str(e), "restarted": restarted})
        raise NotReadyError(f"rollback of alias {alias!r} to {pipeline} v{target} stopped before the flip "
                            f"(v{current} still serves): {e}") from None
    waited = time.monotonic() - t0
    pointer = flip(k, pipeline, expected_version=current, new_version=target, actor=actor, reason=reason,
                   action="rollback", details={"restarted": restarted, "samples": r.samples,
                                               "waited_seconds": round(waited, 3)})
    msg = (f"rolled back alias {alias!r} from v{current} to v{target}"
           + (" (restarted from its checkpoint, then waited until ready)" if restarted else ""))
    return RollbackResult(pipeline, alias, current, target, True, restarted, waited, msg, r.to_dict(), pointer,
                          actor, reason, now)
