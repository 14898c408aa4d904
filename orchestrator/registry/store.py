"""The Registry: every query and change of the registry database, one transaction each, in one class.

The class is in one module on purpose: a flip's transaction checks the target's lease, moves both
versions' states and ends the replaced version's watch, and a reader follows it on one page rather
than across mixins that reach into each other's private methods.

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

A job start (or a stop that must not race a start) first takes the version's lease (`take_lease`), a
compare-and-swap on its row: the state must be the one expected and nobody else may hold a fresh
lease. The lease names its owner, counts an epoch and expires, so a lease whose owner died is taken
over after its time-to-live. `begin_retire` moves a version to `retiring` before anything of it is
deleted.

Keys of a version's `details` written after its allocation are each one compare-and-swap on the row
(`_change_details`): a fact learned later, once (`set_detail_once`: the measured backfill), the
backfill's share (`update_throttle`, `details["throttle"]`, audited as `THROTTLE_ACTION`), and the watch
of a promoted version (`update_watch`; stored by the flip itself, ended by the flip away from it:
``watching`` -> ``passed``, ``ended``, or ``rolling_back`` -> ``rolled_back``, see `end_watch_in_flip`).

Lag samples carry their lag in seconds and the micro-batches the job had committed since it started
(`add_lag_sample`); `latest_lag_samples` and `audit_counts` are what the metrics endpoint reads.

Methods that take a time accept unix seconds or an aware or naive-UTC `datetime`. A Registry
survives `fork()`: the child opens its own connections.
"""

from __future__ import annotations

import math
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

from orchestrator.core.crashpoints import faultpoint
from orchestrator.core.exceptions import ConflictError, KappaError, NotFoundError, NotReadyError, RegistryError
from orchestrator.core.names import validate_alias_name, validate_pipeline_name, validate_version_number
from orchestrator.core.paths import VersionPaths
from orchestrator.core.states import FLIP_TARGETS, FORCED_FLIP_TARGETS, IN_FLIGHT, VersionState
from orchestrator.core.times import utc_clock
from orchestrator.registry.engine import create_engine, transaction
from orchestrator.registry.records import (AliasHistoryRecord, AliasRecord, AuditRecord, LagSampleRecord,
                                           PipelineRecord, VersionRecord)
from orchestrator.registry.values import (SET_STATE_FIELDS, STANDBY_KEYS, changed_by, check_actor, check_state,
                                          field_values, plain_json, render_for_version, unix_seconds)
from orchestrator.registry.schema import (HEAD, alias_history, aliases, apply_migrations, audit_log,
                                          lag_samples_table, pipelines, schema_version, versions)

__all__ = ["Registry", "SET_STATE_FIELDS", "THROTTLE_ACTION", "WATCH_ACTIVE", "end_watch_in_flip"]

S = VersionState
#: The audit action of every change of a backfill's share (from, to, why in its details).
THROTTLE_ACTION = "throttle"
#: The states of a watch that still have work to do.
WATCH_ACTIVE = ("watching", "rolling_back")


def end_watch_in_flip(details: dict[str, Any], *, action: str | None, to_version: int,
                      now: float) -> dict[str, Any]:
    """A version flipped away from inside its watch: ``rolling_back`` becomes ``rolled_back`` when the
    flip is the decided rollback (a rollback to the watch's standby); otherwise the watch ``ended``
    (someone moved the alias elsewhere)."""
    watch = details.get("watch")
    if not isinstance(watch, dict) or watch.get("state") not in WATCH_ACTIVE:
        return details
    decided = watch["state"] == "rolling_back" and action == "rollback" and watch.get("standby") == to_version
    done = "rolled_back" if decided else "ended"
    ended = {**watch, "state": done, "ended_at": now}
    if done == "ended":
        ended["ended_by"] = f"a {action or 'flip'} of the alias during the watch"
    return {**details, "watch": ended}



class Registry:
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
        return AuditRecord.model_validate(row)

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
        return [AuditRecord.model_validate(r) for r in reversed(rows)]

    # -- pipelines and versions -----------------------------------------------------------------

    def list_pipelines(self) -> list[PipelineRecord]:
        with self._tx("listing pipelines", write=False) as conn:
            rows = conn.execute(sa.select(pipelines).order_by(pipelines.c.name)).all()
        return [PipelineRecord.model_validate(r) for r in rows]

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
        return VersionRecord.model_validate(row)

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
        return VersionRecord.model_validate(row)

    def list_versions(self, pipeline: str, states: Iterable[str] | None = None) -> list[VersionRecord]:
        """Versions of `pipeline` (only those in `states` if given), ascending."""
        q = sa.select(versions).where(versions.c.pipeline == pipeline)
        if states is not None:
            wanted = tuple(check_state(st) for st in ([states] if isinstance(states, str) else states))
            q = q.where(versions.c.state.in_(wanted))
        with self._tx(f"listing versions of {pipeline}", write=False) as conn:
            rows = conn.execute(q.order_by(versions.c.version)).all()
        return [VersionRecord.model_validate(r) for r in rows]

    def in_flight(self, pipeline: str) -> VersionRecord | None:
        """The (oldest) version of `pipeline` in flight, which would make a deploy refuse."""
        with self._tx(f"reading versions of {pipeline}", write=False) as conn:
            row = self._in_flight(conn, pipeline)
        return None if row is None else VersionRecord.model_validate(row)

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
        return VersionRecord.model_validate(row)

    # -- aliases --------------------------------------------------------------------------------

    def get_alias(self, alias: str) -> AliasRecord | None:
        with self._tx(f"reading alias {alias!r}", write=False) as conn:
            row = conn.execute(sa.select(aliases).where(aliases.c.alias == alias)).first()
        return None if row is None else AliasRecord.model_validate(row)

    def list_aliases(self) -> list[AliasRecord]:
        with self._tx("listing aliases", write=False) as conn:
            rows = conn.execute(sa.select(aliases).order_by(aliases.c.alias)).all()
        return [AliasRecord.model_validate(r) for r in rows]

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
        is stored as the target's watch (`end_watch_in_flip`); the watch of the version
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
        return AliasRecord.model_validate(row)

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
        return AliasRecord.model_validate(row)

    def alias_history(self, alias: str, limit: int | None = None) -> list[AliasHistoryRecord]:
        """Every move of `alias` (the most recent `limit`), oldest first."""
        q = sa.select(alias_history).where(alias_history.c.alias == alias).order_by(alias_history.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx(f"reading the history of alias {alias!r}", write=False) as conn:
            rows = conn.execute(q).all()
        return [AliasHistoryRecord.model_validate(r) for r in reversed(rows)]

    # -- leases and retire --------------------------------------------------------------------------


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
        rec = VersionRecord.model_validate(row)
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
        return VersionRecord.model_validate(row) if count == 1 and row is not None else None

    def _locked_version(self, conn: Any, pipeline: str, n: int) -> VersionRecord:
        """The version's row, locked for the rest of the transaction on PostgreSQL (SQLite's write
        transaction holds the whole database already); NotFoundError naming the versions there are."""
        q = sa.select(versions).where(versions.c.pipeline == pipeline, versions.c.version == n)
        if self.dialect == "postgresql":
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            raise self._missing_version(conn, pipeline, n)
        return VersionRecord.model_validate(row)

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

    # -- details written after the allocation, each a compare-and-swap ------------------------------

    def _change_details(self, pipeline: str, n: int, what: str, change: Callable[[dict[str, Any]], Any],
                        audit: dict[str, Any] | None) -> Any:
        """One compare-and-swap on the version's details, in one transaction that reads its row for update:
        `change(details)` checks what it expects (raising ConflictError otherwise) and changes `details` in
        place; the row is written only when it returns something other than None (its return value), with
        `audit` in the same transaction."""
        with self._tx(f"{what} of {pipeline} v{n}", write=True) as conn:
            row = conn.execute(sa.select(versions.c.details).where(
                versions.c.pipeline == pipeline, versions.c.version == n).with_for_update()).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)
            details = dict(row.details or {})
            out = change(details)
            if out is None:
                return None
            conn.execute(versions.update().where(versions.c.pipeline == pipeline, versions.c.version == n)
                         .values(details=details))
            if audit is not None:
                self._insert_audit_of(conn, pipeline, n, audit)
        return out

    def set_detail_once(self, pipeline: str, n: int, key: str, value: Any, *,
                        audit: dict[str, Any] | None = None) -> bool:
        """Store `value` as `details[key]` of `pipeline` v`n` unless the key is there already: a fact learned
        after the allocation (the measured backfill), written by whichever process sees it first. True when it
        was written now (with `audit` in the same transaction), False when another write came first."""
        def once(details: dict[str, Any]) -> bool | None:
            if details.get(key) is not None:
                return None
            details[key] = plain_json(value, f"details[{key!r}]")
            return True

        return bool(self._change_details(pipeline, n, f"recording {key}", once, audit))

    def update_throttle(self, pipeline: str, n: int, *, expected_changed_at: float | None,
                        throttle: dict[str, Any], audit: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace `details["throttle"]` of `pipeline` v`n` (the share its job gets, `orchestrator.core.shares`)
        if its ``changed_at`` is still `expected_changed_at` (None: no throttle recorded yet); ConflictError
        otherwise (another pass or an operator changed it meanwhile). `audit` (action `THROTTLE_ACTION`) in
        the same transaction; every other key of the details is left alone."""
        def swap(details: dict[str, Any]) -> dict[str, Any]:
            now_at = (details.get("throttle") or {}).get("changed_at")
            if now_at != expected_changed_at:
                raise ConflictError(f"the share of {pipeline} v{n} was changed meanwhile (at {now_at}); "
                                    f"this change is not made, the other stands")
            details["throttle"] = plain_json({**throttle, "changed_at": throttle.get("changed_at") or time.time()},
                                             "throttle")
            return details["throttle"]

        return self._change_details(pipeline, n, "updating the share", swap, audit)

    def update_watch(self, pipeline: str, n: int, *, expected_state: str, expected_samples: int,
                     watch: dict[str, Any], audit: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace the watch of `pipeline` v`n` if it is still in `expected_state` with `expected_samples`
        samples (ConflictError otherwise: another pass or a flip moved it); `audit` in the same transaction."""
        def swap(details: dict[str, Any]) -> dict[str, Any]:
            now_w = details.get("watch") or {}
            if now_w.get("state") != expected_state or int(now_w.get("samples", 0)) != expected_samples:
                raise ConflictError(f"the watch of {pipeline} v{n} moved meanwhile (now {now_w.get('state')!r}, "
                                    f"{now_w.get('samples', 0)} samples); this pass leaves it alone")
            details["watch"] = plain_json({**watch, "updated_at": time.time()}, "watch")
            return details["watch"]

        return self._change_details(pipeline, n, "updating the watch", swap, audit)

    # -- lag samples, and the figures the metrics endpoint reads ------------------------------------

    def add_lag_sample(self, pipeline: str, n: int, total: int | None, partitions: dict[str, Any], *,
                       at: Any = None, lag_seconds: float | None = None, batches: int | None = None) -> LagSampleRecord:
        """Store one lag reading; `total`, `lag_seconds` and `batches` None mean unknown (never zero).

        `batches`: the micro-batches the version's job had committed since it started when the reading
        was taken (its status's count)."""
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise RegistryError(f"lag total must be an integer or None (unknown), got {total!r}")
        if lag_seconds is not None:
            if isinstance(lag_seconds, bool) or not isinstance(lag_seconds, (int, float)) \
                    or not math.isfinite(lag_seconds) or lag_seconds < 0:
                raise RegistryError(f"lag in seconds must be a finite number >= 0 or None (unknown), "
                                    f"got {lag_seconds!r}")
            lag_seconds = float(lag_seconds)
        if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int) or batches < 0):
            raise RegistryError(f"batches of a lag sample must be an integer >= 0 or None (unknown), got {batches!r}")
        at_ts = time.time() if at is None else unix_seconds(at, "at")
        parts = plain_json(partitions or {}, "lag partitions")
        with self._tx(f"recording a lag sample of {pipeline} v{n}", write=True) as conn:
            exists = conn.execute(sa.select(versions.c.version).where(
                versions.c.pipeline == pipeline, versions.c.version == n)).first()
            if exists is None:
                raise self._missing_version(conn, pipeline, n)
            # each only when known: a registry not yet at step 4 or 5 (auto_migrate=False) takes the rest
            known = {name: value for name, value in (("lag_seconds", lag_seconds), ("batches", batches))
                     if value is not None}
            sample_id = conn.execute(lag_samples_table.insert().values(
                pipeline=pipeline, version=n, at=at_ts, total=total, partitions=parts, **known)).inserted_primary_key[0]
            faultpoint("lag_sample.inserted")   # a fault test loses the database here: before the commit
        return LagSampleRecord(id=sample_id, pipeline=pipeline, version=n, at=at_ts, total=total, partitions=parts,
                               lag_seconds=lag_seconds, batches=batches)

    def lag_samples(self, pipeline: str, n: int, limit: int | None = None, since: Any = None
                    ) -> list[LagSampleRecord]:
        """The most recent `limit` samples (all if None) at or after `since`, oldest first."""
        t = lag_samples_table
        q = sa.select(t).where(t.c.pipeline == pipeline, t.c.version == n)
        if since is not None:
            q = q.where(t.c.at >= unix_seconds(since, "since"))
        q = q.order_by(t.c.at.desc(), t.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx(f"reading lag samples of {pipeline} v{n}", write=False) as conn:
            rows = conn.execute(q).all()
        return [LagSampleRecord.model_validate(r) for r in reversed(rows)]

    def prune_lag_samples(self, older_than: Any) -> int:
        """Delete every lag sample taken before `older_than` (all pipelines); the number deleted."""
        cutoff = unix_seconds(older_than, "older_than")
        with self._tx("pruning old lag samples", write=True) as conn:
            return conn.execute(lag_samples_table.delete().where(lag_samples_table.c.at < cutoff)).rowcount or 0

    def latest_lag_samples(self, pipelines: Iterable[str] | None = None) -> dict[tuple[str, int], LagSampleRecord]:
        """{(pipeline, version): its newest lag sample} (newest by registry id, as readiness orders them)."""
        t = lag_samples_table
        newest = sa.select(sa.func.max(t.c.id).label("id")).group_by(t.c.pipeline, t.c.version)
        if pipelines is not None:
            newest = newest.where(t.c.pipeline.in_(list(pipelines)))
        q = sa.select(t).where(t.c.id.in_(newest.scalar_subquery())).order_by(t.c.pipeline, t.c.version)
        with self._tx("reading the newest lag samples", write=False) as conn:
            rows = conn.execute(q).all()
        return {(r.pipeline, r.version): LagSampleRecord.model_validate(r) for r in rows}

    def audit_counts(self, actions: Iterable[str]) -> dict[tuple[str, str, str | None], int]:
        """{(action, outcome, pipeline): number of audit entries} for the given actions."""
        a = audit_log
        q = (sa.select(a.c.action, a.c.outcome, a.c.pipeline, sa.func.count().label("n"))
             .where(a.c.action.in_(list(actions))).group_by(a.c.action, a.c.outcome, a.c.pipeline))
        with self._tx("counting audit entries", write=False) as conn:
            return {(r.action, r.outcome, r.pipeline): int(r.n) for r in conn.execute(q).all()}
