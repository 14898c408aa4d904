"""The Registry: every query and change of the registry database, one transaction each.

The writes that decide something are serialized where it matters:

- a version number is allocated under a lock: `BEGIN IMMEDIATE` on SQLite (one writer at a
  time, others wait up to `busy_timeout`), `SELECT ... FOR UPDATE` of the pipeline's row on
  PostgreSQL. Numbers come from a per-pipeline counter and are never reused.
- an alias flip is a compare-and-swap: `UPDATE aliases ... WHERE alias = :a AND version = :expected`
  (`RETURNING` the row), and the row count says who won. Exactly one of two concurrent flips
  wins; the other gets a ConflictError naming where the alias points now, who moved it and why.

A version is *in flight* while it is created/starting/backfilling/caught_up and has never served
(no alias ever pointed at it); a deploy refuses to start a second one unless queued. `set_state`
fills timestamps: `started_at` on "starting", `stopped_at` on stopped/failed/retired,
`caught_up_at` the first time "caught_up", `served_at` the first time "serving" (a flip to the
version sets `served_at` too). A version an alias points at cannot be set to "retired", and a
flip to a retired version is refused (both ConflictError). `allocate_version` and `flip_alias`
write their own audit entries (actions "allocate_version", "flip_alias"; outcome
ok/conflict/noop/not_found) unless `audit=False`.

Methods that take a time accept unix seconds or an aware or naive-UTC `datetime`. A Registry
survives `fork()`: the child opens its own connections.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection

from orchestrator.core.exceptions import ConflictError, KappaError, NotFoundError, NotReadyError, RegistryError
from orchestrator.core.names import validate_alias_name, validate_pipeline_name, validate_version_number
from orchestrator.core.paths import VersionPaths
from orchestrator.core.states import FLIP_TARGETS, FORCED_FLIP_TARGETS, IN_FLIGHT, VersionState
from orchestrator.registry.engine import create_engine, transaction
from orchestrator.registry.details import DetailOps
from orchestrator.registry.lagsamples import LagSampleOps
from orchestrator.registry.leases import LeaseOps
from orchestrator.registry.throttles import ThrottleOps
from orchestrator.registry.watches import WatchOps, end_watch_in_flip
from orchestrator.registry.records import (AliasHistoryRecord, AliasRecord, AuditRecord,
                                           PipelineRecord, VersionRecord)
from orchestrator.registry.values import (SET_STATE_FIELDS, STANDBY_KEYS, changed_by, check_actor, check_state,
                                          field_values, plain_json, render_for_version)
from orchestrator.registry.schema import (HEAD, alias_history, aliases, apply_migrations, audit_log,
                                          pipelines, schema_version, versions)

__all__ = ["Registry", "SET_STATE_FIELDS"]

S = VersionState


class Registry(LeaseOps, LagSampleOps, WatchOps, ThrottleOps, DetailOps):
    """One registry database. Thread-safe: each call takes its own pooled connection.

    `Registry(url)` brings the schema to head (`migrate()`, idempotent) unless `auto_migrate=False`.
    `.url` is the URL with its password masked; `.dialect` is "sqlite" or "postgresql".
    """

    def __init__(self, url: str, *, auto_migrate: bool = True, busy_timeout: float = 30.0,
                 echo: bool = False, sqlite_synchronous: str = "NORMAL") -> None:
        self._engine, self.dialect, self.url = create_engine(
            url, busy_timeout=busy_timeout, echo=echo, sqlite_synchronous=sqlite_synchronous)
        self.busy_timeout = busy_timeout
        # A forked child (Airflow's task runner, multiprocessing "fork") must not reuse the
        # parent's pooled connections: it opens its own, and leaves the parent's alone.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (r := ref()) is not None and r._engine.dispose(close=False))
        if auto_migrate:
            self.migrate()

    def __repr__(self) -> str:
        return f"Registry({self.url!r})"

    @contextmanager
    def _tx(self, what: str, *, write: bool) -> Iterator[Connection]:
        with transaction(self._engine, what, write=write, url=self.url, busy_timeout=self.busy_timeout) as conn:
            yield conn

    def close(self) -> None:
        self._engine.dispose()

    dispose = close

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- migrations -----------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The highest migration step applied (0 for an empty database)."""
        with self._tx("reading the schema version", write=False) as conn:
            return schema_version(conn)

    def migrate(self, target: int | None = None) -> list[int]:
        """Apply the missing migration steps up to `target` (default: head), in one transaction."""
        target = HEAD if target is None else target
        if not 0 <= target <= HEAD:
            raise RegistryError(f"no schema version {target}: this kappa knows 1 to {HEAD}")
        with self._tx("migrating the schema", write=True) as conn:
            return apply_migrations(conn, dialect=self.dialect, url=self.url, target=target)

    # -- audit ----------------------------------------------------------------------------------

    @staticmethod
    def _insert_audit(conn: Connection, action: str, *, actor: str, pipeline: str | None,
                      version: int | None, reason: str | None, outcome: str, details: Any,
                      at: float | None = None) -> int:
        result = conn.execute(audit_log.insert().values(
            at=at if at is not None else time.time(), actor=check_actor(actor), action=action, pipeline=pipeline,
            version=version, reason=reason, outcome=outcome, details=plain_json(details or {}, "audit details")))
        return result.inserted_primary_key[0]

    @classmethod
    def _insert_audit_of(cls, conn: Connection, pipeline: str, n: int, audit: dict[str, Any]) -> int:
        """The audit entry of a state change, in the change's transaction (`audit`: action, actor,
        and optionally reason, outcome, details)."""
        return cls._insert_audit(conn, audit["action"], actor=audit["actor"], pipeline=pipeline, version=n,
                                 reason=audit.get("reason"), outcome=audit.get("outcome", "ok"),
                                 details=audit.get("details"))

    def audit(self, action: str, *, actor: str, pipeline: str | None = None, version: int | None = None,
              reason: str | None = None, outcome: str = "ok", details: dict[str, Any] | None = None
              ) -> AuditRecord:
        """Record one operation: who, when, what, on which pipeline/version, why, and how it ended."""
        if not isinstance(action, str) or not action.strip():
            raise RegistryError("an audit entry needs an action, e.g. 'deploy' or 'promote'")
        if not isinstance(outcome, str) or not outcome.strip():
            raise RegistryError("an audit entry needs an outcome, e.g. 'ok', 'refused', 'failed'")
        with self._tx(f"recording audit entry {action!r}", write=True) as conn:
            entry_id = self._insert_audit(conn, action.strip()[:100], actor=actor, pipeline=pipeline,
                                          version=version, reason=reason, outcome=outcome[:32],
                                          details=details)
            row = conn.execute(sa.select(audit_log).where(audit_log.c.id == entry_id)).one()
        return AuditRecord.from_row(row)

    def _audit_quietly(self, action: str, **kwargs: Any) -> None:
        """Record a refusal after its transaction rolled back; never hides the refusal itself."""
        try:
            self.audit(action, **kwargs)
        except KappaError:
            pass

    def audit_log(self, pipeline: str | None = None, limit: int | None = 100, *, version: int | None = None,
                  action: str | None = None) -> list[AuditRecord]:
        """The most recent `limit` entries (all if None), oldest first."""
        q = sa.select(audit_log)
        if pipeline is not None:
            q = q.where(audit_log.c.pipeline == pipeline)
        if version is not None:
            q = q.where(audit_log.c.version == version)
        if action is not None:
            q = q.where(audit_log.c.action == action)
        q = q.order_by(audit_log.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx("reading the audit log", write=False) as conn:
            rows = conn.execute(q).all()
        return [AuditRecord.from_row(r) for r in reversed(rows)]

    # -- pipelines and versions -----------------------------------------------------------------

    def list_pipelines(self) -> list[PipelineRecord]:
        with self._tx("listing pipelines", write=False) as conn:
            rows = conn.execute(sa.select(pipelines).order_by(pipelines.c.name)).all()
        return [PipelineRecord.from_row(r) for r in rows]

    def _ensure_pipeline(self, conn: Connection, pipeline: str) -> None:
        insert = (pg_dialect.insert if self.dialect == "postgresql" else sqlite_dialect.insert)(pipelines)
        conn.execute(insert.values(name=pipeline, last_version=0, created_at=time.time())
                     .on_conflict_do_nothing(index_elements=["name"]))

    @staticmethod
    def _in_flight(conn: Connection, pipeline: str) -> Any:
        return conn.execute(
            sa.select(versions)
            .where(versions.c.pipeline == pipeline, versions.c.state.in_(sorted(IN_FLIGHT)),
                   versions.c.served_at.is_(None))
            .order_by(versions.c.version)).first()

    def allocate_version(self, pipeline: str, *, rules_version: str | None, rules_hash: str | None,
                         code_ref: str | None, table_path: Any = None, checkpoint_path: Any = None,
                         group_id: Any = None, actor: str, reason: str | None, queue: bool = False,
                         paths: Callable[[int], VersionPaths] | None = None, run_dir: Any = None,
                         rejects_path: Any = None, details: dict[str, Any] | None = None,
                         audit: bool = True) -> VersionRecord:
        """Allocate the next version number of `pipeline` and record it in state "created".

        The number is only known inside the transaction, so `table_path`, `checkpoint_path`,
        `group_id`, `run_dir` and `rejects_path` may be strings holding `{n}` (or `{version}`), or
        callables `n -> str | Path`; or `paths=lambda n: k.paths(pipeline, n)` fills them all.
        A ConflictError for a version in flight carries its number as `.in_flight_version`.
        """
        validate_pipeline_name(pipeline)
        actor = check_actor(actor)
        if paths is None and (table_path is None or checkpoint_path is None or group_id is None):
            raise RegistryError("allocate_version needs table_path, checkpoint_path and group_id, or paths=")
        details = plain_json(details or {}, "version details")
        audit_details = {"rules_version": rules_version, "rules_hash": rules_hash, "code_ref": code_ref,
                         "queue": queue}
        try:
            with self._tx(f"allocating a version of {pipeline!r}", write=True) as conn:
                self._ensure_pipeline(conn, pipeline)
                last = conn.execute(sa.select(pipelines.c.last_version)
                                    .where(pipelines.c.name == pipeline).with_for_update()).scalar_one()
                if not queue:
                    busy = self._in_flight(conn, pipeline)
                    if busy is not None:
                        b = busy._mapping
                        err = ConflictError(
                            f"pipeline {pipeline!r} already has v{b['version']} in flight (state {b['state']}, "
                            f"deployed {changed_by(b['actor'], b['reason'], b['created_at'])}); refusing a second "
                            f"reprocess. Promote or stop v{b['version']} first "
                            f"(kappa stop {pipeline} {b['version']}), or queue this one (--queue)")
                        err.in_flight_version = b["version"]  # type: ignore[attr-defined]
                        raise err
                n = last + 1
                p = paths(n) if paths is not None else None
                values = {
                    "table_path": render_for_version(table_path if p is None else p.table, n, "table_path"),
                    "checkpoint_path": render_for_version(checkpoint_path if p is None else p.checkpoint, n,
                                               "checkpoint_path"),
                    "group_id": render_for_version(group_id if p is None else p.group_id, n, "group_id"),
                    "run_dir": render_for_version(run_dir if p is None else p.run_dir, n, "run_dir"),
                    "rejects_path": render_for_version(rejects_path if p is None else p.rejects, n, "rejects_path"),
                }
                now = time.time()
                conn.execute(pipelines.update().where(pipelines.c.name == pipeline).values(last_version=n))
                conn.execute(versions.insert().values(
                    pipeline=pipeline, version=n, state=S.CREATED.value, rules_version=rules_version,
                    rules_hash=rules_hash, code_ref=code_ref, actor=actor, reason=reason, created_at=now,
                    updated_at=now, details=details, **values))
                if audit:
                    self._insert_audit(conn, "allocate_version", actor=actor, pipeline=pipeline, version=n,
                                       reason=reason, outcome="ok", details={**audit_details, **values}, at=now)
                row = conn.execute(sa.select(versions).where(versions.c.pipeline == pipeline,
                                                             versions.c.version == n)).one()
        except ConflictError as e:
            if audit:
                self._audit_quietly("allocate_version", actor=actor, pipeline=pipeline, reason=reason,
                                    outcome="conflict", details={**audit_details, "error": str(e)})
            raise
        return VersionRecord.from_row(row)

    def _missing_version(self, conn: Connection, pipeline: str, n: int) -> NotFoundError:
        known = conn.execute(sa.select(versions.c.version).where(versions.c.pipeline == pipeline)
                             .order_by(versions.c.version)).scalars().all()
        if not known:
            return NotFoundError(f"pipeline {pipeline!r} has no versions in the registry {self.url}; "
                                 f"deploy one first (kappa deploy {pipeline})")
        return NotFoundError(f"pipeline {pipeline!r} has no version v{n} (versions: "
                             f"{', '.join(f'v{k}' for k in known)}); see kappa status {pipeline}")

    def get_version(self, pipeline: str, n: int) -> VersionRecord:
        with self._tx(f"reading {pipeline} v{n}", write=False) as conn:
            row = conn.execute(sa.select(versions).where(versions.c.pipeline == pipeline,
                                                         versions.c.version == n)).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)
        return VersionRecord.from_row(row)

    def list_versions(self, pipeline: str, states: Iterable[str] | None = None) -> list[VersionRecord]:
        """Versions of `pipeline` (only those in `states` if given), ascending."""
        q = sa.select(versions).where(versions.c.pipeline == pipeline)
        if states is not None:
            wanted = tuple(check_state(st) for st in ([states] if isinstance(states, str) else states))
            q = q.where(versions.c.state.in_(wanted))
        with self._tx(f"listing versions of {pipeline}", write=False) as conn:
            rows = conn.execute(q.order_by(versions.c.version)).all()
        return [VersionRecord.from_row(r) for r in rows]

    def in_flight(self, pipeline: str) -> VersionRecord | None:
        """The (oldest) version of `pipeline` in flight, which would make a deploy refuse."""
        with self._tx(f"reading versions of {pipeline}", write=False) as conn:
            row = self._in_flight(conn, pipeline)
        return None if row is None else VersionRecord.from_row(row)

    def set_state(self, pipeline: str, n: int, state: str, *, expected: str | Iterable[str] | None = None,
                  audit: dict[str, Any] | None = None, served_by: tuple[str, bool] | None = None,
                  **fields: Any) -> VersionRecord:
        """Move a version to `state`; with `expected`, only if it is in that state (or one of them).

        `audit` (the keyword arguments of `audit`: action, actor, reason, outcome, details) is
        recorded in the same transaction, so a crash cannot leave the move without its entry.
        `served_by` = (alias, True): only while `alias` points at the version; (alias, False): only
        while it does not. The alias is read (and on PostgreSQL locked) in the same transaction, so a
        flip that commits meanwhile cannot leave two versions serving or none (ConflictError instead).
        """
        state = check_state(state)
        expected_states: tuple[str, ...] | None = None
        if expected is not None:
            expected_states = tuple(check_state(s, "expected state")
                                    for s in ((expected,) if isinstance(expected, str) else expected))
        unknown = sorted(set(fields) - set(SET_STATE_FIELDS))
        if unknown:
            raise RegistryError(f"set_state cannot change {', '.join(unknown)}; it sets "
                                f"{', '.join(SET_STATE_FIELDS)}")
        now = time.time()
        values: dict[str, Any] = {"state": state, "updated_at": now, **field_values(fields)}
        if state == S.STARTING and "started_at" not in fields:
            values["started_at"] = now
        if state in (S.STOPPED, S.FAILED, S.RETIRED) and "stopped_at" not in fields:
            values["stopped_at"] = now
        if state == S.CAUGHT_UP and "caught_up_at" not in fields:
            values["caught_up_at"] = sa.func.coalesce(versions.c.caught_up_at, now)
        if state == S.SERVING:
            values["served_at"] = sa.func.coalesce(versions.c.served_at, now)
        where = [versions.c.pipeline == pipeline, versions.c.version == n]
        if expected_states is not None:
            where.append(versions.c.state.in_(expected_states))
        with self._tx(f"setting {pipeline} v{n} to {state}", write=True) as conn:
            if served_by is not None:
                alias_name, must = served_by
                points = conn.execute(sa.select(aliases.c.pipeline, aliases.c.version)
                                      .where(aliases.c.alias == alias_name).with_for_update()).first()
                serves = points is not None and points.pipeline == pipeline and points.version == n
                if serves != must:
                    raise ConflictError(
                        f"{pipeline} v{n} was not moved to {state}: alias {alias_name!r} "
                        f"{'no longer points' if must else 'points'} at it now (another flip meanwhile); "
                        f"that flip's states stand")
            count = conn.execute(versions.update().where(*where).values(**values)).rowcount
            row = conn.execute(sa.select(versions).where(versions.c.pipeline == pipeline,
                                                         versions.c.version == n)).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)
            if count == 1 and state == S.RETIRED:
                serving = conn.execute(sa.select(aliases.c.alias).where(
                    aliases.c.pipeline == pipeline, aliases.c.version == n)).scalar()
                if serving is not None:
                    raise ConflictError(
                        f"{pipeline} v{n} is served by alias {serving!r}; it cannot be retired. Flip the alias "
                        f"to another version first (kappa promote / kappa rollback)")
            if count != 1:
                want = " or ".join(expected_states or ())
                raise ConflictError(
                    f"{pipeline} v{n} is {row._mapping['state']}, not {want} as expected: another operation "
                    f"changed it since it was read; nothing was changed. Re-read it (kappa status {pipeline}) "
                    f"and retry if the move still makes sense")
            if audit is not None:
                self._insert_audit_of(conn, pipeline, n, audit)
        return VersionRecord.from_row(row)

    # -- aliases --------------------------------------------------------------------------------

    def get_alias(self, alias: str) -> AliasRecord | None:
        with self._tx(f"reading alias {alias!r}", write=False) as conn:
            row = conn.execute(sa.select(aliases).where(aliases.c.alias == alias)).first()
        return None if row is None else AliasRecord.from_row(row)

    def list_aliases(self) -> list[AliasRecord]:
        with self._tx("listing aliases", write=False) as conn:
            rows = conn.execute(sa.select(aliases).order_by(aliases.c.alias)).all()
        return [AliasRecord.from_row(r) for r in rows]

    def _alias_moved(self, alias: str, pipeline: str, expected: int | None, row: Any) -> ConflictError:
        if row is None:
            return ConflictError(f"alias {alias!r} does not exist (it was expected at v{expected}); nothing was "
                                 f"changed. Re-read it (kappa status) and retry")
        m = row._mapping
        if m["pipeline"] != pipeline:
            return ConflictError(f"alias {alias!r} belongs to pipeline {m['pipeline']!r}, not {pipeline!r}; "
                                 f"pick the alias declared for {pipeline!r}")
        if expected is None:
            return ConflictError(
                f"alias {alias!r} already exists and points at v{m['version']} (set "
                f"{changed_by(m['updated_by'], m['reason'], m['updated_at'])}); this flip expected to create it. "
                f"Nothing was changed. Re-read the alias (kappa status) and retry if the move still makes sense")
        return ConflictError(
            f"alias {alias!r} points at v{m['version']} now, not v{expected} as this flip expected: it was moved "
            f"{changed_by(m['updated_by'], m['reason'], m['updated_at'])}. Nothing was changed. Re-read the alias "
            f"(kappa status) and retry if the move still makes sense")

    def _refuse_flip_target(self, conn: Connection, alias: str, pipeline: str, n: int) -> None:
        state = conn.execute(sa.select(versions.c.state).where(
            versions.c.pipeline == pipeline, versions.c.version == n)).scalar()
        if state is None:
            raise self._missing_version(conn, pipeline, n)
        raise ConflictError(f"{pipeline} v{n} is {state} (its table may be deleted); alias {alias!r} cannot "
                            f"point at it. Deploy a new version instead")

    def flip_alias(self, alias: str, pipeline: str, *, expected_version: int | None, new_version: int,
                   actor: str, reason: str | None, audit: bool = True, serve: bool = False,
                   action: str | None = None, watch: dict[str, Any] | None = None,
                   standby_grace_seconds: float | None = None, forced: bool = False) -> AliasRecord:
        """Compare-and-swap `alias` from `expected_version` to `new_version` of `pipeline`.

        With `serve` (what promote and rollback use), the same transaction also checks that the
        target is healthy now (caught_up, standby or serving, no one holding its lease; else
        NotReadyError) and moves the states: the target to serving, the version it replaced from
        serving to standby (its grace period starts: `standby_since`, and `standby_until` after
        `standby_grace_seconds`, if given). So the alias and the states never disagree,
        whatever happens to the process after the commit. `action` (promote/rollback) is recorded
        in the audit entry, so that a later verb knows which verb made an unpublished flip. `watch`
        is stored as the target's watch (`orchestrator.registry.watches`); the watch of the version
        flipped away from ends here. `forced` (a rollback forced at its deadline) also takes a target
        whose restarted job runs but has not caught up (`FORCED_FLIP_TARGETS`).
        """
        validate_alias_name(alias)
        validate_pipeline_name(pipeline)
        validate_version_number(new_version, "new_version")
        if expected_version is not None:
            validate_version_number(expected_version, "expected_version")
        actor = check_actor(actor)
        details = {"alias": alias, "from_version": expected_version, "to_version": new_version}
        if action:
            details["action"] = action
        noop = False
        try:
            with self._tx(f"flipping alias {alias!r}", write=True) as conn:
                now = time.time()
                if serve:
                    self._check_flip_target(conn, alias, pipeline, new_version, now, forced=forced)
                # The target first: it must exist and not be retired. The UPDATE also locks its
                # row (PostgreSQL), so a concurrent retire waits for this flip and then sees it.
                marked = conn.execute(
                    versions.update()
                    .where(versions.c.pipeline == pipeline, versions.c.version == new_version,
                           versions.c.state.not_in([S.RETIRED.value, S.RETIRING.value]))
                    .values(served_at=sa.func.coalesce(versions.c.served_at, now))
                    .returning(versions.c.version)).first()
                if marked is None:
                    self._refuse_flip_target(conn, alias, pipeline, new_version)
                row = None
                if expected_version is None:
                    insert = (pg_dialect.insert if self.dialect == "postgresql"
                              else sqlite_dialect.insert)(aliases)
                    row = conn.execute(insert.values(
                        alias=alias, pipeline=pipeline, version=new_version, previous_version=None,
                        updated_at=now, updated_by=actor, reason=reason,
                    ).on_conflict_do_nothing(index_elements=["alias"]).returning(*aliases.c)).first()
                elif expected_version == new_version:
                    current = conn.execute(sa.select(aliases).where(aliases.c.alias == alias)).first()
                    if (current is not None and current.pipeline == pipeline
                            and current.version == new_version):
                        row, noop = current, True
                else:
                    # the compare-and-swap: the row count (here, the returned row) says who won
                    row = conn.execute(
                        aliases.update()
                        .where(aliases.c.alias == alias, aliases.c.pipeline == pipeline,
                               aliases.c.version == expected_version)
                        .values(version=new_version, previous_version=expected_version, updated_at=now,
                                updated_by=actor, reason=reason)
                        .returning(*aliases.c)).first()
                if row is None:
                    raise self._alias_moved(alias, pipeline, expected_version, conn.execute(
                        sa.select(aliases).where(aliases.c.alias == alias)).first())
                if serve:
                    self._serving_states(conn, pipeline, new_version, None if noop else expected_version, now,
                                         watch=watch, action=action, grace=standby_grace_seconds, forced=forced)
                if not noop:
                    conn.execute(alias_history.insert().values(
                        alias=alias, pipeline=pipeline, from_version=expected_version, to_version=new_version,
                        actor=actor, reason=reason, at=now))
                if audit:
                    self._insert_audit(conn, "flip_alias", actor=actor, pipeline=pipeline, version=new_version,
                                       reason=reason, outcome="noop" if noop else "ok", details=details, at=now)
        except (ConflictError, NotFoundError, NotReadyError) as e:
            if audit:
                outcome = {ConflictError: "conflict", NotFoundError: "not_found"}.get(type(e), "refused")
                self._audit_quietly("flip_alias", actor=actor, pipeline=pipeline, version=new_version,
                                    reason=reason, outcome=outcome, details={**details, "error": str(e)})
            raise
        return AliasRecord.from_row(row)

    def _check_flip_target(self, conn: Connection, alias: str, pipeline: str, n: int, now: float, *,
                           forced: bool = False) -> None:
        rec = self._locked_version(conn, pipeline, n)
        if rec.state in (S.RETIRED, S.RETIRING):
            self._refuse_flip_target(conn, alias, pipeline, n)
        if rec.state not in (FORCED_FLIP_TARGETS if forced else FLIP_TARGETS):
            raise NotReadyError(
                f"{pipeline} v{n} is {rec.state} now, not caught_up or standby: alias {alias!r} cannot be flipped "
                f"to it; nothing was changed. Wait until it is ready (kappa await {pipeline} {n}), or restart it")
        if rec.lease_held(now):
            raise NotReadyError(
                f"{pipeline} v{n}'s job is being started or stopped by {rec.lease_owner} right now: alias "
                f"{alias!r} cannot be flipped to it; nothing was changed. Retry once that is done")

    @staticmethod
    def _serving_states(conn: Connection, pipeline: str, new: int, old: int | None, now: float, *,
                        watch: dict[str, Any] | None = None, action: str | None = None,
                        grace: float | None = None, forced: bool = False) -> None:
        """In the flip's transaction: the target serves (with its watch, if any); the version it
        replaced is standby from now (until now + `grace`, if given), and its watch, if one was on, ends."""
        def update(n: int, state: str, expect: tuple[str, ...], standby_since: float | None) -> None:
            row = conn.execute(sa.select(versions.c.details, versions.c.state).where(
                versions.c.pipeline == pipeline, versions.c.version == n)).first()
            if row is None or row.state not in expect:
                return
            details = {kk: v for kk, v in (row.details or {}).items() if kk not in STANDBY_KEYS}
            if standby_since is not None:
                details["standby_since"] = standby_since
                if grace is not None:
                    details["standby_until"] = standby_since + grace
                details = end_watch_in_flip(details, action=action, to_version=new, now=now)
            elif watch is not None:
                details["watch"] = plain_json(watch, "watch")
            elif (details.get("watch") or {}).get("state") != "rolled_back":
                # a flip to it without a watch: an earlier one is history; a rolled_back one stays
                # (promote refuses the version without --force)
                details.pop("watch", None)
            conn.execute(versions.update().where(
                versions.c.pipeline == pipeline, versions.c.version == n, versions.c.state.in_(expect))
                .values(state=state, updated_at=now, details=details,
                        served_at=sa.func.coalesce(versions.c.served_at, now)))

        update(new, S.SERVING.value, tuple(FORCED_FLIP_TARGETS if forced else FLIP_TARGETS), None)
        if old is not None and old != new:
            update(old, S.STANDBY.value, (S.SERVING.value,), now)

    def mark_published(self, alias: str, version: int) -> AliasRecord:
        """Record that the pointer file of `alias` now holds `version` (called after writing it).

        No compare-and-swap: it records a fact about the file. If the alias has moved on since,
        `needs_publish` stays true and the next publish or reconcile catches up.
        """
        validate_version_number(version)
        now = time.time()
        with self._tx(f"marking alias {alias!r} published", write=True) as conn:
            row = conn.execute(aliases.update().where(aliases.c.alias == alias)
                               .values(published_version=version, published_at=now)
                               .returning(*aliases.c)).first()
            if row is None:
                raise NotFoundError(f"no alias {alias!r} in the registry {self.url}; promote a version first")
        return AliasRecord.from_row(row)

    def alias_history(self, alias: str, limit: int | None = None) -> list[AliasHistoryRecord]:
        """Every move of `alias` (the most recent `limit`), oldest first."""
        q = sa.select(alias_history).where(alias_history.c.alias == alias).order_by(alias_history.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx(f"reading the history of alias {alias!r}", write=False) as conn:
            rows = conn.execute(q).all()
        return [AliasHistoryRecord.from_row(r) for r in reversed(rows)]
