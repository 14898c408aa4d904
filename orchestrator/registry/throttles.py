"""A backfill's share, in the registry: the current one in the version's details, every change audited.

The share a running version's job gets (`orchestrator.core.shares`) and how it is set live in
`details["throttle"]` of the version: ``{"share", "mode" ("adaptive" | "fixed"), "changed_at", "by",
"why", "nice"}``, so that a supervisor restarted (or another one, on another host) continues from
it. No migration: details is the version's JSON column. `update_throttle` replaces it as a
compare-and-swap on the ``changed_at`` the caller read (two passes cannot both record a change)
and writes the change's audit entry (action `ACTION`) in the same transaction; it leaves every
other key of the details alone.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from orchestrator.core.exceptions import ConflictError
from orchestrator.registry.schema import versions
from orchestrator.registry.values import plain_json

__all__ = ["ACTION", "ThrottleOps"]

#: The audit action of every change of a backfill's share (from, to, why in its details).
ACTION = "throttle"


class ThrottleOps:
    """Mixed into `Registry` (which provides `_tx`, `_missing_version`, `_insert_audit_of`)."""

    def update_throttle(self, pipeline: str, n: int, *, expected_changed_at: float | None,
                        throttle: dict[str, Any], audit: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace `details["throttle"]` of `pipeline` v`n` if its ``changed_at`` is still
        `expected_changed_at` (None: no throttle recorded yet); ConflictError otherwise (another pass or
        an operator changed it meanwhile). `audit` (action, actor, reason, details) in the same transaction."""
        with self._tx(f"updating the share of {pipeline} v{n}", write=True) as conn:  # type: ignore[attr-defined]
            row = conn.execute(sa.select(versions.c.details).where(
                versions.c.pipeline == pipeline, versions.c.version == n).with_for_update()).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)  # type: ignore[attr-defined]
            details = dict(row.details or {})
            now_at = (details.get("throttle") or {}).get("changed_at")
            if now_at != expected_changed_at:
                raise ConflictError(f"the share of {pipeline} v{n} was changed meanwhile (at {now_at}); "
                                    f"this change is not made, the other stands")
            details["throttle"] = plain_json({**throttle, "changed_at": throttle.get("changed_at") or time.time()},
                                             "throttle")
            conn.execute(versions.update().where(versions.c.pipeline == pipeline, versions.c.version == n)
                         .values(details=details))
            if audit is not None:
                self._insert_audit_of(conn, pipeline, n, audit)  # type: ignore[attr-defined]
        return details["throttle"]
