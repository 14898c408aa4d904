"""A backfill that yields: the share of a version that is not serving yet, set by hand or adaptively.

A new version's backfill and the serving version's live job share the machine. Each version
that runs but does not serve yet (`THROTTLED`: starting, backfilling, caught_up) has a share
(`orchestrator.core.shares`), applied to its running job as the nice value of every thread of its
processes on this host (`orchestrator.jobctl.priority.apply_share`). The backfill reads offset
zero to the deploy's end offsets in one Spark micro-batch, so a lever between micro-batches
(`maxOffsetsPerTrigger`, a pause) would not act on it; process priority acts at once.

Two modes, stored with the share in the version's details (`details["throttle"]`,
`Registry.update_throttle`):
- ``adaptive`` (the default, `PipelineSpec.backfill_adaptive`): every supervision pass
  (`throttle_pass`, from `orchestrator.lifecycle.monitor.monitor`: `kappa supervise`, `kappa
  metrics serve`, Airflow's kappa_monitor) runs one step of `orchestrator.observe.throttle.ShareController`
  against the serving version's newest lag in seconds: over `backfill_lag_bound` the share halves
  (never under `MIN_SHARE`), under half the bound it grows by 0.1 (never over `backfill_share`), at most
  one change per `backfill_interval_seconds`;
- ``fixed``: the share an operator set (`set_throttle`: `kappa throttle PIPELINE VERSION --share`,
  Airflow's kappa_throttle), kept until `--adaptive` or a new deploy.

Every change is a compare-and-swap in the registry with its audit entry (action ``throttle``: from,
to, why, who), and one log line. Every pass applies the share again (threads created since the last
pass inherit their creator's value, a restarted job starts at full share). A version that serves
(promoted) gets its full share back at the next pass: the job readers depend on never runs throttled.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from orchestrator.core.exceptions import ConfigError, ConflictError, RefusedError
from orchestrator.core.shares import check_share, share_to_nice
from orchestrator.core.states import VersionState
from orchestrator.core.times import utc_clock
from orchestrator.jobctl.priority import ReniceResult, apply_share
from orchestrator.observe.throttle import ShareController
from orchestrator.registry.store import THROTTLE_ACTION as ACTION

if TYPE_CHECKING:
    from orchestrator.context import Kappa, VersionRef
    from orchestrator.core.pipelines import PipelineSpec

__all__ = ["ACTION", "THROTTLED", "controller_of", "current_throttle", "full_share_until_it_serves", "serving_lag",
           "set_throttle", "step_version", "throttle_changes", "throttle_lines", "throttle_pass"]

log = logging.getLogger(__name__)

S = VersionState
#: States whose job runs with a share: it runs, and readers do not depend on it yet.
THROTTLED = frozenset({S.STARTING, S.BACKFILLING, S.CAUGHT_UP})
#: States whose job always gets the full share back (readers depend on it, or may again at once).
FULL = frozenset({S.SERVING, S.STANDBY})
#: A serving version's lag sample older than this many controller intervals (and at least
#: `_STALE_MIN` seconds) is no reading of now: the controller holds.
_STALE_INTERVALS, _STALE_MIN = 3, 120.0


def controller_of(spec: PipelineSpec) -> ShareController:
    """The pipeline's controller: its bound, interval and ceiling (`backfill_*` settings)."""
    return ShareController(bound_seconds=spec.backfill_lag_bound, interval_seconds=spec.backfill_interval_seconds,
                           ceiling=spec.backfill_share)


def current_throttle(v: VersionRef) -> dict[str, Any]:
    """The version's share and mode as recorded, or the pipeline's settings when nothing was recorded
    (``changed_at`` None): {"share", "mode", "changed_at", "by", "why", "nice"}."""
    t = dict((v.record.details or {}).get("throttle") or {})
    if not t:
        t = {"share": v.spec.backfill_share, "mode": "adaptive" if v.spec.backfill_adaptive else "fixed",
             "changed_at": None, "by": None, "why": "the pipeline's backfill_share"}
    t["nice"] = share_to_nice(float(t["share"]))
    return t


def serving_lag(k: Kappa, spec: PipelineSpec, serving: int | None, now: float) -> tuple[float | None, str]:
    """(the serving version's newest lag in seconds, or None when unknown or stale; where it came from).
    No version serving: 0.0, nothing to yield to."""
    if serving is None:
        return 0.0, "no version serves: nothing to yield to"
    samples = k.registry.lag_samples(spec.name, serving, limit=1)
    if not samples:
        return None, f"v{serving} has no lag sample yet"
    s = samples[-1]
    stale = max(_STALE_MIN, _STALE_INTERVALS * spec.backfill_interval_seconds)
    if now - s.at > stale:
        return None, f"v{serving}'s newest lag sample is {now - s.at:.0f} s old"
    return s.lag_seconds, f"v{serving} at {s.at:.0f}"


def _record(v: VersionRef, t: dict[str, Any], *, share: float, mode: str, actor: str, why: str,
            now: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One change, as a compare-and-swap on the change time read (ConflictError: someone changed it)."""
    before = float(t["share"])
    new = {"share": share, "mode": mode, "changed_at": now, "by": actor, "why": why, "nice": share_to_nice(share)}
    details = {"from": before, "to": share, "from_mode": t["mode"], "mode": mode, "why": why,
               "nice": new["nice"], **(extra or {})}
    return v.registry.update_throttle(v.pipeline, v.version, expected_changed_at=t.get("changed_at"), throttle=new,
                                      audit={"action": ACTION, "actor": actor, "reason": why, "details": details})


def _applied(v: VersionRef, share: float) -> ReniceResult:
    res = apply_share(v, share)
    if res.refused:
        log.warning("%s: the kernel refused to raise the priority of pid %s back to nice %d (it needs CAP_SYS_NICE); "
                    "the share %g is recorded and applies once the job restarts", v,
                    ", ".join(map(str, res.refused)), res.nice, share)
    return res


def _applied_dict(res: ReniceResult) -> dict[str, Any]:
    return {"nice": res.nice, "processes": len(res.processes), "threads": res.threads,
            "refused": res.refused or None, "errors": res.errors or None}


def set_throttle(v: VersionRef, *, actor: str, share: float | None = None, adaptive: bool = False,
                 reason: str | None = None, now: float | None = None) -> dict[str, Any]:
    """An operator sets the share of a running, not yet serving version (fixed mode), or gives it back
    to the controller (`adaptive`); recorded, audited and applied to its job at once."""
    if (share is None) == (not adaptive):
        raise ConfigError("give either a share (--share 0.3: fixed) or --adaptive (the controller decides), "
                          "not both and not neither")
    if share is not None:
        try:
            share = check_share(share)
        except ValueError as e:
            raise ConfigError(f"{v}: {e}") from None
    v = v.reread()
    if v.record.state not in THROTTLED:
        raise RefusedError(f"{v} is {v.record.state}: only a version that runs and does not serve yet "
                           f"({', '.join(sorted(THROTTLED))}) has a share to change")
    now = time.time() if now is None else now
    t = current_throttle(v)
    mode = "adaptive" if adaptive else "fixed"
    new_share = float(t["share"]) if adaptive else float(share)
    why = "operator" + (f": {reason}" if reason else "")
    try:
        _record(v, t, share=new_share, mode=mode, actor=actor, why=why, now=now)
    except ConflictError:  # a supervisor pass changed it meanwhile: the operator's word comes after it
        v = v.reread()
        t = current_throttle(v)
        new_share = float(t["share"]) if adaptive else float(share)
        _record(v, t, share=new_share, mode=mode, actor=actor, why=why, now=now)
    res = _applied(v, new_share)
    msg = (f"{v}: share {float(t['share']):g} -> {new_share:g} (nice {res.nice}), {mode}"
           + (", the controller decides from now on" if adaptive else "") + f"; by {actor}")
    if not res.processes:
        msg += "; its job is not running here, the share applies when it runs"
    log.info("%s", msg)
    return {"pipeline": v.pipeline, "version": v.version, "from": float(t["share"]), "to": new_share,
            "mode": mode, "message": msg, "applied": _applied_dict(res)}


def full_share_until_it_serves(v: VersionRef, *, actor: str, why: str, now: float | None = None) -> None:
    """The version's share fixed at 1 (recorded and audited; nothing when it is so already): a rollback's
    target, restarted to serve again. Its readers are waiting for it, and the version that serves
    meanwhile is the one being rolled back from: its lag is no reason for the target to yield (under
    the adaptive mode a loaded machine starved a restarted target at nice 19, CI 2026-11-30)."""
    now = time.time() if now is None else now
    for attempt in (1, 2):
        v = v.reread()
        t = current_throttle(v)
        if t["mode"] == "fixed" and float(t["share"]) >= 1.0:
            return
        try:
            _record(v, t, share=1.0, mode="fixed", actor=actor, why=why, now=now)
            return
        except ConflictError:   # a supervision pass changed it meanwhile: this comes after it
            if attempt == 2:
                raise


def step_version(v: VersionRef, *, actor: str, lag_seconds: float | None, lag_from: str,
                 now: float) -> dict[str, Any] | None:
    """One pass over one version: a controller step (adaptive, not serving), the full share back for a
    serving or standby version, then the share applied to its job. A dict for a change, else None."""
    state = v.record.state
    stored = (v.record.details or {}).get("throttle")
    if state in FULL:
        if not stored or float(stored.get("share", 1.0)) >= 1.0:
            return None
        t = current_throttle(v)
        share, mode, why, extra = 1.0, "fixed", f"{state}: its job runs at full share", {}
    elif state in THROTTLED:
        t = current_throttle(v)
        share, mode, why, extra = float(t["share"]), t["mode"], None, {}
        if t["mode"] == "adaptive":
            d = controller_of(v.spec).step(now, lag_seconds, share, t.get("changed_at"))
            if d.changed:
                share, why = d.share, d.why
                extra = {"lag_seconds": lag_seconds, "bound_seconds": v.spec.backfill_lag_bound, "lag_from": lag_from}
        if why is None:  # no change: the share in force, applied again for the threads made since
            if share < 1.0:   # (at full share there is nothing to re-apply: a job starts at nice 0)
                apply_share(v, share)
            return None
    else:
        return None
    try:
        _record(v, t, share=share, mode=mode, actor=actor, why=why, now=now, extra=extra)
    except ConflictError as e:
        return {"kind": "throttle_busy", "pipeline": v.pipeline, "version": v.version, "error": str(e)}
    res = _applied(v, share)
    log.info("%s: share %g -> %g (nice %d): %s", v, float(t["share"]), share, res.nice, why)
    return {"kind": "throttle", "pipeline": v.pipeline, "version": v.version, "from": float(t["share"]), "to": share,
            "mode": mode, "why": why, "applied": _applied_dict(res)}


def throttle_pass(k: Kappa, spec: PipelineSpec, *, actor: str, serving: int | None,
                  versions: list[VersionRef] | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """One controller step for every version of `spec` (see the module); the changes made."""
    now = time.time() if now is None else now
    lag, lag_from = serving_lag(k, spec, serving, now)
    out = []
    for v in (k.versions(spec) if versions is None else versions):
        a = step_version(v, actor=actor, lag_seconds=lag, lag_from=lag_from, now=now)
        if a is not None:
            out.append(a)
    return out


def throttle_changes(v: VersionRef, limit: int = 3) -> list[dict[str, Any]]:
    """The version's last `limit` changes of share, oldest first: at, by, from, to, mode, why."""
    return [{"at": e.at, "by": e.actor, "from": e.details.get("from"), "to": e.details.get("to"),
             "mode": e.details.get("mode"), "why": e.reason}
            for e in v.registry.audit_log(v.pipeline, limit=limit, version=v.version, action=ACTION)]


def throttle_lines(version: int, throttle: dict[str, Any] | None, changes: list[dict[str, Any]]) -> list[str]:
    """`kappa status`'s lines about a version's share: the share in force and its last changes."""
    if not throttle:
        return []
    def when(at: float | None) -> str:
        return "-" if at is None else utc_clock(at, date="never")

    head = (f"v{version} share {float(throttle['share']):g} (nice {throttle.get('nice')}), {throttle.get('mode')}"
            + ("" if throttle.get("changed_at") is None else f", since {when(throttle['changed_at'])} by {throttle.get('by')}")
            + f": {throttle.get('why')}")
    return [head] + [f"  {when(c['at'])} {c['from']:g} -> {c['to']:g} ({c['mode']}, {c['by']}): {c['why']}"
                     for c in reversed(changes) if c.get("from") is not None and c.get("to") is not None]
