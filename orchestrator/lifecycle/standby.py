"""How long a version a flip replaced stays a running standby.

The flip that replaced it records `standby_since` and, with the promote's own grace period,
`standby_until` in the version's registry details (in the flip's transaction). Until then a
rollback to it is an instant flip; from then on the monitor stops it (`orchestrator.lifecycle.monitor`),
and a rollback restarts it from its checkpoint (`orchestrator.lifecycle.rollback`). Versions flipped
by an older kappa fall back to the alias history and the pipeline's grace period.
"""

from __future__ import annotations

import time

from orchestrator.context import VersionRef
from orchestrator.core.states import VersionState

__all__ = ["standby_since", "standby_until", "standby_grace", "standby_expired"]


def standby_since(v: VersionRef) -> float | None:
    """When the version (as its record was read) became a standby: its `standby_since`, else the alias
    history's flip away from it."""
    since = (v.record.details or {}).get("standby_since")
    if since is not None:
        return float(since)
    for h in reversed(v.registry.alias_history(v.alias)):
        if h.from_version == v.version:
            return h.at
    return None


def _until(v: VersionRef) -> float | None:
    """The end of its grace period: the one its flip stored (the promote's own grace), else (a flip by
    an older kappa) when it became a standby plus the pipeline's grace period."""
    until = (v.record.details or {}).get("standby_until")
    if until is not None:
        return float(until)
    since = standby_since(v)
    return None if since is None else since + v.spec.grace_period_seconds


def standby_until(v: VersionRef) -> float | None:
    """Until when the version stays a running standby (unix seconds; None if it is not one).

    Until then a rollback to it is instant; the monitor stops it from then on."""
    return _until(v) if v.record.state == VersionState.STANDBY else None


def standby_grace(v: VersionRef) -> float:
    """The grace period the version was given as a standby (for the stop's reason)."""
    since, until = standby_since(v), _until(v)
    return v.spec.grace_period_seconds if since is None or until is None else until - since


def standby_expired(v: VersionRef, now: float | None = None) -> float | None:
    """Seconds past the grace period of a standby version (None while within it)."""
    until = _until(v)
    if until is None:
        return None
    over = (time.time() if now is None else now) - until
    return over if over >= 0 else None
