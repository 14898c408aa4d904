"""Leases and retire on the registry: who may start or stop a version's job, and retiring safely.

A job start (or a stop that must not race a start) first takes the version's lease, a
compare-and-swap on its row: the state must be the one expected and nobody else may hold a
fresh lease. The lease names its owner, counts an epoch and expires, so a lease whose owner died
is taken over after its time-to-live; reconcile and monitor leave a version with a fresh lease
alone. `begin_retire` moves a version to `retiring` before anything of it is deleted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from orchestrator.core.exceptions import ConflictError
from orchestrator.core.states import VersionState
from orchestrator.core.times import utc_clock
from orchestrator.registry.records import VersionRecord
from orchestrator.registry.schema import aliases, versions
from orchestrator.registry.values import check_actor, check_state, field_values

__all__ = ["LeaseOps"]

S = VersionState


class LeaseOps:
    """Mixed into `Registry` (which provides `_tx`, `_missing_version`, `_insert_audit`, `dialect`)."""

    def take_lease(self, pipeline: str, n: int, *, owner: str, expected: Iterable[str], ttl: float,
                   to_state: str | None = None, audit: dict[str, Any] | None = None, **fields: Any
                   ) -> VersionRecord:
        """Take the lease on a version's job: only one owner starts (or stops) it at a time.

        One compare-and-swap: the version must be in one of the `expected` states and nobody else
        may hold a fresh lease (an expired one is taken over: its owner died). The epoch goes up
        by one; with `to_state` the state moves in the same update, and `audit` (as `set_state`
        takes it) is recorded in the same transaction. ConflictError otherwise, naming the holder.
        The returned record carries the new `lease_epoch`.
        """
        expected_states = tuple(check_state(st, "expected state") for st in expected)
        now = time.time()
        values: dict[str, Any] = {"lease_owner": check_actor(owner), "lease_expires": now + ttl, "updated_at": now,
                                  "lease_epoch": sa.func.coalesce(versions.c.lease_epoch, 0) + 1}
        if to_state is not None:
            values["state"] = check_state(to_state)
            if to_state == S.STARTING:
                values["started_at"] = now
        values.update(field_values(fields))
        free = sa.or_(versions.c.lease_owner.is_(None), versions.c.lease_expires.is_(None),
                      versions.c.lease_expires <= now, versions.c.lease_owner == owner)
        with self._tx(f"taking the lease of {pipeline} v{n}", write=True) as conn:
            count = conn.execute(versions.update().where(
                versions.c.pipeline == pipeline, versions.c.version == n,
                versions.c.state.in_(expected_states), free).values(**values)).rowcount
            row = conn.execute(sa.select(versions).where(versions.c.pipeline == pipeline,
                                                         versions.c.version == n)).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)
            if count == 1 and audit is not None:
                self._insert_audit_of(conn, pipeline, n, audit)
        rec = VersionRecord.from_row(row)
        if count != 1:
            if rec.lease_held(now) and rec.lease_owner != owner:
                raise ConflictError(
                    f"{pipeline} v{n}'s job is being started or stopped by {rec.lease_owner} (lease until "
                    f"{utc_clock(rec.lease_expires)}); nothing was done. Retry after that, or check kappa status "
                    f"{pipeline}")
            raise ConflictError(
                f"{pipeline} v{n} is {rec.state}, not {' or '.join(expected_states)} as expected: another operation "
                f"changed it since it was read; nothing was changed. Re-read it (kappa status {pipeline}) and retry "
                f"if the move still makes sense")
        return rec

    def release_lease(self, pipeline: str, n: int, *, owner: str, epoch: int, to_state: str | None = None,
                      expected: Iterable[str] | None = None, **fields: Any) -> VersionRecord | None:
        """Release a lease taken with `take_lease` (only by its owner and epoch), optionally moving the state.

        Returns None, changing nothing, when the lease was lost meanwhile (it expired and another
        owner took it) or the state is no longer one of `expected`.
        """
        now = time.time()
        values: dict[str, Any] = {"lease_owner": None, "lease_expires": None, "updated_at": now}
        if to_state is not None:
            values["state"] = check_state(to_state)
        values.update(field_values(fields))
        where = [versions.c.pipeline == pipeline, versions.c.version == n, versions.c.lease_owner == owner,
                 versions.c.lease_epoch == epoch]
        if expected is not None:
            where.append(versions.c.state.in_(tuple(check_state(st, "expected state") for st in expected)))
        with self._tx(f"releasing the lease of {pipeline} v{n}", write=True) as conn:
            count = conn.execute(versions.update().where(*where).values(**values)).rowcount
            row = conn.execute(sa.select(versions).where(versions.c.pipeline == pipeline,
                                                         versions.c.version == n)).first()
        return VersionRecord.from_row(row) if count == 1 and row is not None else None

    def _locked_version(self, conn: Any, pipeline: str, n: int) -> VersionRecord:
        """The version's row, locked for the rest of the transaction on PostgreSQL (SQLite's write
        transaction holds the whole database already); NotFoundError naming the versions there are."""
        q = sa.select(versions).where(versions.c.pipeline == pipeline, versions.c.version == n)
        if self.dialect == "postgresql":
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            raise self._missing_version(conn, pipeline, n)
        return VersionRecord.from_row(row)

    def begin_retire(self, pipeline: str, n: int, *, actor: str, reason: str | None) -> VersionRecord:
        """Move a version to `retiring` before anything of it is deleted (resumes a retiring one).

        In one transaction: the version must be stopped, failed or created (its job not running
        as far as the registry knows) or already retiring, nobody may hold its lease, and no alias
        may serve it, keep it as the rollback target, or have it published to readers. A flip to
        a retiring version is refused, so no alias can point at a table being deleted.
        """
        allowed = (S.STOPPED.value, S.FAILED.value, S.CREATED.value, S.RETIRING.value)
        now = time.time()
        with self._tx(f"retiring {pipeline} v{n}", write=True) as conn:
            rec = self._locked_version(conn, pipeline, n)
            for a in conn.execute(sa.select(aliases).where(aliases.c.pipeline == pipeline)).all():
                m = a._mapping
                why = ("serves" if m["version"] == n else "keeps as its rollback target"
                       if m["previous_version"] == n else "has published to readers"
                       if m["published_version"] == n else None)
                if why:
                    raise ConflictError(f"alias {m['alias']!r} {why} {pipeline} v{n}; it cannot be retired. "
                                        f"Promote or roll back to another version first")
            if rec.lease_held(now):
                raise ConflictError(f"{pipeline} v{n}'s job is being started or stopped by {rec.lease_owner}; "
                                    f"it cannot be retired now. Retry after that")
            if rec.state not in allowed:
                raise ConflictError(f"{pipeline} v{n} is {rec.state}: stop it first (kappa stop {pipeline} {n}), "
                                    f"then retire it")
            conn.execute(versions.update().where(versions.c.pipeline == pipeline, versions.c.version == n)
                         .values(state=S.RETIRING.value, updated_at=now))
            self._insert_audit(conn, "begin_retire", actor=check_actor(actor), pipeline=pipeline, version=n,
                               reason=reason, outcome="ok", details={"state_before": rec.state}, at=now)
            rec = self._locked_version(conn, pipeline, n)
        return rec

