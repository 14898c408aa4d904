"""Entries of a version's details written after its allocation, once each.

Most of a version's `details` are written with the change that owns them (its rules at allocation,
its watch with the flip). An entry that records a fact learned later, such as the measured backfill
(`details["backfill"]`, `orchestrator.observe.estimate`), is written by whichever process sees the
fact first: `set_detail_once` adds it only while the key is absent, in one transaction that reads
the row for update, so two processes that see it at once write it once and neither overwrites it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from orchestrator.registry.schema import versions
from orchestrator.registry.values import plain_json

__all__ = ["DetailOps"]


class DetailOps:
    """Mixed into `Registry` (which provides `_tx`, `_missing_version`, `_insert_audit_of`)."""

    def set_detail_once(self, pipeline: str, n: int, key: str, value: Any, *,
                        audit: dict[str, Any] | None = None) -> bool:
        """Store `value` as `details[key]` of `pipeline` v`n` unless the key is there already; True when it
        was written now (with `audit` in the same transaction), False when another write came first."""
        with self._tx(f"recording {key} of {pipeline} v{n}", write=True) as conn:  # type: ignore[attr-defined]
            row = conn.execute(sa.select(versions.c.details).where(
                versions.c.pipeline == pipeline, versions.c.version == n).with_for_update()).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)  # type: ignore[attr-defined]
            details = dict(row.details or {})
            if details.get(key) is not None:
                return False
            details[key] = plain_json(value, f"details[{key!r}]")
            conn.execute(versions.update().where(versions.c.pipeline == pipeline, versions.c.version == n)
                         .values(details=details))
            if audit is not None:
                self._insert_audit_of(conn, pipeline, n, audit)  # type: ignore[attr-defined]
        return True
