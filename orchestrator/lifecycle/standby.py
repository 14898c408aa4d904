"""How long a version a flip replaced stays a running standby.

The flip that replaced it records `standby_since` and, with the promote's own grace period,
`standby_until` in the version's registry details (in the flip's transaction). Until then a
rollback to it is an instant flip; from then on the monitor stops it (`orchestrator.lifecycle.monitor`),
and a rollback restarts it from its checkpoint (`orchestrator.lifecycle.rollback`). Versions flipped
by an older kappa fall back to the alias history and the pipeline's grace period.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.context import Kappa
from orchestrator.core.states import VersionState

__all__ = ["standby_since", "standby_until", "standby_grace", "standby_expired"]


def standby_since(k: Kappa, pipeline: str, rec: Any) -> float | None:
    """When `rec` became a standby: its `standby_since`, else the alias history's flip away from it."""
    since = (rec.details or {}).get("standby_since")
    if since is not None:
        return float(since)
    spec = k.pipeline(pipeline)
    for h in reversed(k.registry.alias_history(spec.alias)):
        if h.from_version == rec.version:
            return h.at
    return None


def _until(k: Kappa, pipeline: str, rec: Any) -> float | None:
    """The end of `rec`'s grace period: the one its flip stored (the promote's own grace), else
    (a flip by an older kappa) when it became a standby plus the pipeline's grace period."""
    until = (rec.details or {}).get("standby_until")
    if until is not None:
        return float(until)
    since = standby_since(k, pipeline, rec)
    return None if since is None else since + k.pipeline(pipeline).grace_period_seconds


def standby_until(k: Kappa, pipeline: str, version: int) -> float | None:
    """Until when `pipeline` v`version` stays a running standby (unix seconds; None if it is not one).

    Until then a rollback to it is instant; the monitor stops it from then on."""
    rec = k.registry.get_version(pipeline, version)
    return _until(k, pipeline, rec) if rec.state == VersionState.STANDBY else None


def standby_grace(k: Kappa, pipeline: str, rec: Any) -> float:
    """The grace period `rec` was given as a standby (for the stop's reason)."""
    since, until = standby_since(k, pipeline, rec), _until(k, pipeline, rec)
    return k.pipeline(pipeline).grace_period_seconds if since is None or until is None else until - since


def standby_expired(k: Kappa, pipeline: str, rec: Any, now: float | None = None) -> float | None:
    """Seconds past the grace period of a standby version (None while within it)."""
    until = _until(k, pipeline, rec)
    if until is None:
        return None
    over = (time.time() if now is None else now) - until
    return over if over >= 0 else None
