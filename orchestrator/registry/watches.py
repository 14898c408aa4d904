"""The watch of a promoted version, in the registry: it outlives the process that promoted.

A promote of a pipeline with `auto_rollback` stores the watch in the promoted version's details
(`details["watch"]`), in the flip's own transaction (`Registry.flip_alias(watch=...)`), so there is
never a flip without its watch. Every monitor pass (`orchestrator.lifecycle.watch`) samples it and
moves it with `update_watch`, a compare-and-swap on the watch's state and sample count, so two
passes cannot both record a decision.

States: ``watching`` -> ``passed`` (its grace period is over), ``ended`` (a promote or rollback by
someone moved the alias meanwhile), or ``rolling_back`` (a condition failed; decided and audited
before the flip) -> ``rolled_back`` (set by the rollback's flip itself, in its transaction). A
version whose watch is ``rolled_back`` is not promoted again without `--force` or a new deploy.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from orchestrator.core.exceptions import ConflictError
from orchestrator.registry.schema import versions
from orchestrator.registry.values import plain_json

__all__ = ["WatchOps", "ACTIVE", "end_watch_in_flip"]

#: The states of a watch that still has work to do.
ACTIVE = ("watching", "rolling_back")


def end_watch_in_flip(details: dict[str, Any], *, action: str | None, to_version: int,
                      now: float) -> dict[str, Any]:
    """A version flipped away from inside its watch: ``rolling_back`` becomes ``rolled_back`` when the
    flip is the decided rollback (a rollback to the watch's standby); otherwise the watch ``ended``
    (someone moved the alias elsewhere)."""
    watch = details.get("watch")
    if not isinstance(watch, dict) or watch.get("state") not in ACTIVE:
        return details
    decided = watch["state"] == "rolling_back" and action == "rollback" and watch.get("standby") == to_version
    done = "rolled_back" if decided else "ended"
    ended = {**watch, "state": done, "ended_at": now}
    if done == "ended":
        ended["ended_by"] = f"a {action or 'flip'} of the alias during the watch"
    return {**details, "watch": ended}


class WatchOps:
    """Mixed into `Registry` (which provides `_tx`, `_missing_version`, `_insert_audit_of`)."""

    def update_watch(self, pipeline: str, n: int, *, expected_state: str, expected_samples: int,
                     watch: dict[str, Any], audit: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace the watch of `pipeline` v`n` if it is still in `expected_state` with `expected_samples`
        samples (ConflictError otherwise: another pass or a flip moved it); `audit` in the same transaction."""
        with self._tx(f"updating the watch of {pipeline} v{n}", write=True) as conn:  # type: ignore[attr-defined]
            row = conn.execute(sa.select(versions.c.details).where(
                versions.c.pipeline == pipeline, versions.c.version == n).with_for_update()).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)  # type: ignore[attr-defined]
            details = dict(row.details or {})
            now_w = details.get("watch") or {}
            if now_w.get("state") != expected_state or int(now_w.get("samples", 0)) != expected_samples:
                raise ConflictError(f"the watch of {pipeline} v{n} moved meanwhile (now {now_w.get('state')!r}, "
                                    f"{now_w.get('samples', 0)} samples); this pass leaves it alone")
            details["watch"] = plain_json({**watch, "updated_at": time.time()}, "watch")
            conn.execute(versions.update().where(versions.c.pipeline == pipeline, versions.c.version == n)
                         .values(details=details))
            if audit is not None:
                self._insert_audit_of(conn, pipeline, n, audit)  # type: ignore[attr-defined]
        return details["watch"]
