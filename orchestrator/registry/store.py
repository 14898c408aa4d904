"""The registry: the durable record of pipelines, versions, aliases, lag samples and the audit log.

SQLAlchemy Core on SQLite (the embedded default, one file) or PostgreSQL (anything shared, such
as Airflow workers on several hosts). Every method is one transaction. The writes that decide
something are serialized where it matters:

- a version number is allocated under a lock: `BEGIN IMMEDIATE` on SQLite (one writer at a
  time, others wait up to `busy_timeout`), `SELECT ... FOR UPDATE` of the pipeline's row on
  PostgreSQL. Numbers come from a per-pipeline counter and are never reused.
- an alias flip is a compare-and-swap: `UPDATE aliases ... WHERE alias = :a AND version = :expected`
  (`RETURNING` the row),
  and the row count says who won. Exactly one of two concurrent flips wins; the other gets a
  ConflictError naming where the alias points now, who moved it and why.

Schema migrations are numbered steps (`MIGRATIONS`) applied in order inside one transaction and
recorded in `schema_migrations`, so a registry created by an older kappa is brought forward by
`migrate()` (idempotent; `Registry(url)` runs it unless `auto_migrate=False`). A registry newer
than this code is refused with a message naming both schema versions.

SQLite runs in WAL mode (readers never wait for the writer) with `synchronous=NORMAL` by
default: a commit survives the process crashing (what "resumable" needs), and costs no fsync,
which keeps a flip in the low milliseconds; only an OS crash or power loss may roll back the last
commits. Pass `sqlite_synchronous="FULL"` to fsync every commit. PostgreSQL is the choice for
anything shared.

Times are unix seconds (float, UTC) in the database and in the records; methods that take a
time also accept an aware or naive-UTC `datetime`.

Version states: created, starting, backfilling, caught_up, serving, standby, stopped, failed,
retired. A version is *in flight* while it is created/starting/backfilling/caught_up and has
never served (no alias ever pointed at it); a deploy refuses to start a second one unless
queued. `set_state` fills timestamps: `started_at` on "starting", `stopped_at` on
stopped/failed/retired, `caught_up_at` the first time "caught_up", `served_at` the first time
"serving" (a flip to the version sets `served_at` too). A version an alias points at cannot
be set to "retired", and a flip to a retired version is refused (both ConflictError).

Public API (records are frozen dataclasses with `.to_dict()`):
- `Registry(url, *, auto_migrate=True, busy_timeout=30.0, echo=False, sqlite_synchronous="NORMAL")`; `.url` (password masked),
  `.dialect`, `.migrate(target=None) -> list[int]` (steps applied), `.schema_version() -> int`,
  `.close()` / `.dispose()`, context manager.
- `allocate_version(pipeline, *, rules_version, rules_hash, code_ref, table_path=None,
  checkpoint_path=None, group_id=None, actor, reason, queue=False, paths=None, run_dir=None,
  rejects_path=None, details=None, audit=True) -> VersionRecord`.
  The number is only known inside the transaction, so `table_path`, `checkpoint_path`,
  `group_id`, `run_dir`, `rejects_path` may be strings containing `{n}` (or `{version}`), or
  callables `n -> str|Path`; or pass `paths=lambda n: version_paths(settings, pipeline, n)`
  (anything with .table/.checkpoint/.group_id/.run_dir/.rejects) to fill them all.
  ConflictError for an in-flight version has `.in_flight_version`.
- `get_version(pipeline, n)` (NotFoundError), `list_versions(pipeline, states=None) -> list` (ascending),
  `in_flight(pipeline) -> VersionRecord | None`,
  `set_state(pipeline, n, state, *, expected=None, **fields) -> VersionRecord` (CAS when
  `expected`, a state or a collection of states, is given; fields: pid, run_dir, rejects_path,
  error, started_at, stopped_at, caught_up_at, details).
- `list_pipelines() -> list[PipelineRecord]`.
- `get_alias(alias) -> AliasRecord | None`, `list_aliases() -> list[AliasRecord]`,
  `flip_alias(alias, pipeline, *, expected_version, new_version, actor, reason, audit=True) -> AliasRecord`
  (`expected_version=None` creates the alias; flipping to the version it already points at, with
  that as expected, is a logged no-op), `mark_published(alias, version) -> AliasRecord` (records
  what the pointer file now holds: no CAS; `AliasRecord.needs_publish` tells reconcile to act),
  `alias_history(alias, limit=None) -> list[AliasHistoryRecord]` (oldest first).
- `add_lag_sample(pipeline, n, total, partitions, at=None) -> LagSampleRecord`,
  `lag_samples(pipeline, n, limit=None, since=None) -> list` (oldest first, the most recent `limit`).
- `audit(action, *, actor, pipeline=None, version=None, reason=None, outcome="ok", details=None) -> AuditRecord`,
  `audit_log(pipeline=None, limit=100, *, version=None, action=None) -> list` (oldest first, the
  most recent `limit`). `allocate_version` and `flip_alias` write their own audit entries
  (actions "allocate_version", "flip_alias"; outcome ok/conflict/noop/not_found) unless `audit=False`.

PostgreSQL connections get `lock_timeout` = `busy_timeout`, so a write waiting on a row lock
gives up with a RegistryError instead of hanging. A Registry survives `fork()`: the child opens
its own connections.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from orchestrator.core.settings import mask_url
from orchestrator.core.exceptions import (ConfigError, ConflictError, KappaError, NotFoundError, RegistryError)
from orchestrator.core.names import validate_alias_name, validate_pipeline_name, validate_version_number

STATES = ("created", "starting", "backfilling", "caught_up", "serving", "standby", "stopped", "failed",
          "retired")
IN_FLIGHT_STATES = ("created", "starting", "backfilling", "caught_up")
SET_STATE_FIELDS = ("pid", "run_dir", "rejects_path", "error", "started_at", "stopped_at", "caught_up_at",
                    "details")
_TIME_FIELDS = ("started_at", "stopped_at", "caught_up_at")
_PG_MIGRATION_LOCK = 0x6B61707061  # "kappa"

# -- head schema (what the queries use; MIGRATIONS must build exactly this) -----------------------

metadata = sa.MetaData()

schema_migrations = sa.Table(
    "schema_migrations", metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("applied_at", sa.Double, nullable=False),
)

pipelines = sa.Table(
    "pipelines", metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("last_version", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

versions = sa.Table(
    "versions", metadata,
    sa.Column("pipeline", sa.String(63), sa.ForeignKey("pipelines.name"), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("rules_version", sa.String(100)),
    sa.Column("rules_hash", sa.String(128)),
    sa.Column("code_ref", sa.String(200)),
    sa.Column("table_path", sa.Text, nullable=False),
    sa.Column("checkpoint_path", sa.Text, nullable=False),
    sa.Column("group_id", sa.String(255), nullable=False),
    sa.Column("run_dir", sa.Text),
    sa.Column("pid", sa.Integer),
    sa.Column("error", sa.Text),
    sa.Column("actor", sa.String(200), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("started_at", sa.Double),
    sa.Column("stopped_at", sa.Double),
    sa.Column("caught_up_at", sa.Double),
    sa.Column("served_at", sa.Double),          # step 2
    sa.Column("rejects_path", sa.Text),         # step 2
    sa.Column("details", sa.JSON),              # step 2
)

aliases = sa.Table(
    "aliases", metadata,
    sa.Column("alias", sa.String(63), primary_key=True),
    sa.Column("pipeline", sa.String(63), sa.ForeignKey("pipelines.name"), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("previous_version", sa.Integer),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("updated_by", sa.String(200), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("published_version", sa.Integer),  # step 2
    sa.Column("published_at", sa.Double),        # step 2
)

alias_history = sa.Table(
    "alias_history", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("alias", sa.String(63), nullable=False),
    sa.Column("pipeline", sa.String(63), nullable=False),
    sa.Column("from_version", sa.Integer),
    sa.Column("to_version", sa.Integer, nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("at", sa.Double, nullable=False),
    sa.Index("ix_alias_history_alias", "alias", "id"),
)

audit_log = sa.Table(
    "audit_log", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),
    sa.Column("action", sa.String(100), nullable=False),
    sa.Column("pipeline", sa.String(63)),
    sa.Column("version", sa.Integer),
    sa.Column("reason", sa.Text),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("details", sa.JSON),
    sa.Index("ix_audit_log_pipeline", "pipeline", "id"),
)

lag_samples_table = sa.Table(  # step 2
    "lag_samples", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("pipeline", sa.String(63), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("total", sa.BigInteger),
    sa.Column("partitions", sa.JSON, nullable=False),
    sa.ForeignKeyConstraint(["pipeline", "version"], ["versions.pipeline", "versions.version"]),
    sa.Index("ix_lag_samples_version", "pipeline", "version", "at"),
)


# -- migrations ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[Connection], None]


def _step1_initial(conn: Connection) -> None:
    """The first released schema: pipelines, versions, aliases, alias history, audit log."""
    m = sa.MetaData()
    sa.Table("pipelines", m,
             sa.Column("name", sa.String(63), primary_key=True),
             sa.Column("last_version", sa.Integer, nullable=False),
             sa.Column("created_at", sa.Double, nullable=False))
    sa.Table("versions", m,
             sa.Column("pipeline", sa.String(63), sa.ForeignKey("pipelines.name"), primary_key=True),
             sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
             sa.Column("state", sa.String(16), nullable=False),
             sa.Column("rules_version", sa.String(100)),
             sa.Column("rules_hash", sa.String(128)),
             sa.Column("code_ref", sa.String(200)),
             sa.Column("table_path", sa.Text, nullable=False),
             sa.Column("checkpoint_path", sa.Text, nullable=False),
             sa.Column("group_id", sa.String(255), nullable=False),
             sa.Column("run_dir", sa.Text),
             sa.Column("pid", sa.Integer),
             sa.Column("error", sa.Text),
             sa.Column("actor", sa.String(200), nullable=False),
             sa.Column("reason", sa.Text),
             sa.Column("created_at", sa.Double, nullable=False),
             sa.Column("updated_at", sa.Double, nullable=False),
             sa.Column("started_at", sa.Double),
             sa.Column("stopped_at", sa.Double),
             sa.Column("caught_up_at", sa.Double))
    sa.Table("aliases", m,
             sa.Column("alias", sa.String(63), primary_key=True),
             sa.Column("pipeline", sa.String(63), sa.ForeignKey("pipelines.name"), nullable=False),
             sa.Column("version", sa.Integer, nullable=False),
             sa.Column("previous_version", sa.Integer),
             sa.Column("updated_at", sa.Double, nullable=False),
             sa.Column("updated_by", sa.String(200), nullable=False),
             sa.Column("reason", sa.Text))
    sa.Table("alias_history", m,
             sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
             sa.Column("alias", sa.String(63), nullable=False),
             sa.Column("pipeline", sa.String(63), nullable=False),
             sa.Column("from_version", sa.Integer),
             sa.Column("to_version", sa.Integer, nullable=False),
             sa.Column("actor", sa.String(200), nullable=False),
             sa.Column("reason", sa.Text),
             sa.Column("at", sa.Double, nullable=False),
             sa.Index("ix_alias_history_alias", "alias", "id"))
    sa.Table("audit_log", m,
             sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
             sa.Column("at", sa.Double, nullable=False),
             sa.Column("actor", sa.String(200), nullable=False),
             sa.Column("action", sa.String(100), nullable=False),
             sa.Column("pipeline", sa.String(63)),
             sa.Column("version", sa.Integer),
             sa.Column("reason", sa.Text),
             sa.Column("outcome", sa.String(32), nullable=False),
             sa.Column("details", sa.JSON),
             sa.Index("ix_audit_log_pipeline", "pipeline", "id"))
    m.create_all(conn)


def _add_column(conn: Connection, table: str, column: sa.Column) -> None:
    ddl_type = column.type.compile(dialect=conn.dialect)
    conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {ddl_type}")


def _step2_publish_and_lag(conn: Connection) -> None:
    """Publish tracking (reconcile), first-served time, rejects path, details, lag samples.

    Versions an alias ever pointed at get `served_at` from the alias history, so a version
    served under the old schema does not count as in flight. `published_version` stays NULL:
    unknown, so the next reconcile republishes (which is idempotent).
    """
    _add_column(conn, "versions", sa.Column("served_at", sa.Double))
    _add_column(conn, "versions", sa.Column("rejects_path", sa.Text))
    _add_column(conn, "versions", sa.Column("details", sa.JSON))
    _add_column(conn, "aliases", sa.Column("published_version", sa.Integer))
    _add_column(conn, "aliases", sa.Column("published_at", sa.Double))
    conn.exec_driver_sql(
        "UPDATE versions SET served_at = (SELECT MIN(h.at) FROM alias_history h "
        "WHERE h.pipeline = versions.pipeline AND h.to_version = versions.version) "
        "WHERE served_at IS NULL")
    conn.exec_driver_sql(
        "UPDATE versions SET served_at = updated_at WHERE served_at IS NULL AND state = 'serving'")
    m = sa.MetaData()
    sa.Table("versions", m, sa.Column("pipeline", sa.String(63), primary_key=True),
             sa.Column("version", sa.Integer, primary_key=True, autoincrement=False))
    sa.Table("lag_samples", m,
             sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
             sa.Column("pipeline", sa.String(63), nullable=False),
             sa.Column("version", sa.Integer, nullable=False),
             sa.Column("at", sa.Double, nullable=False),
             sa.Column("total", sa.BigInteger),
             sa.Column("partitions", sa.JSON, nullable=False),
             sa.ForeignKeyConstraint(["pipeline", "version"], ["versions.pipeline", "versions.version"]),
             sa.Index("ix_lag_samples_version", "pipeline", "version", "at"))
    m.tables["lag_samples"].create(conn)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: pipelines, versions, aliases, alias history, audit log", _step1_initial),
    Migration(2, "publish tracking, served_at, rejects path, version details, lag samples",
              _step2_publish_and_lag),
)
HEAD = MIGRATIONS[-1].version


# -- records ------------------------------------------------------------------------------------

class _Record:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class PipelineRecord(_Record):
    name: str
    last_version: int
    created_at: float


@dataclass(frozen=True)
class VersionRecord(_Record):
    pipeline: str
    version: int
    state: str
    rules_version: str | None
    rules_hash: str | None
    code_ref: str | None
    table_path: str
    checkpoint_path: str
    group_id: str
    run_dir: str | None
    rejects_path: str | None
    pid: int | None
    error: str | None
    actor: str
    reason: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    stopped_at: float | None
    caught_up_at: float | None
    served_at: float | None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ever_served(self) -> bool:
        return self.served_at is not None

    @property
    def in_flight(self) -> bool:
        return self.state in IN_FLIGHT_STATES and self.served_at is None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["in_flight"] = self.in_flight
        return d


@dataclass(frozen=True)
class AliasRecord(_Record):
    alias: str
    pipeline: str
    version: int
    previous_version: int | None
    updated_at: float
    updated_by: str
    reason: str | None
    published_version: int | None
    published_at: float | None

    @property
    def needs_publish(self) -> bool:
        """The CAS is done but the pointer file does not (knowingly) hold this version yet."""
        return self.published_version != self.version


@dataclass(frozen=True)
class AliasHistoryRecord(_Record):
    id: int
    alias: str
    pipeline: str
    from_version: int | None
    to_version: int
    actor: str
    reason: str | None
    at: float


@dataclass(frozen=True)
class LagSampleRecord(_Record):
    id: int
    pipeline: str
    version: int
    at: float
    total: int | None
    partitions: dict[str, Any]


@dataclass(frozen=True)
class AuditRecord(_Record):
    id: int
    at: float
    actor: str
    action: str
    pipeline: str | None
    version: int | None
    reason: str | None
    outcome: str
    details: dict[str, Any]


def _version_record(row: Any) -> VersionRecord:
    m = row._mapping
    return VersionRecord(**{f: m[f] for f in VersionRecord.__dataclass_fields__ if f != "details"},
                         details=m["details"] or {})


def _alias_record(row: Any) -> AliasRecord:
    m = row._mapping
    return AliasRecord(**{f: m[f] for f in AliasRecord.__dataclass_fields__})


def _history_record(row: Any) -> AliasHistoryRecord:
    m = row._mapping
    return AliasHistoryRecord(**{f: m[f] for f in AliasHistoryRecord.__dataclass_fields__})


def _lag_record(row: Any) -> LagSampleRecord:
    m = row._mapping
    return LagSampleRecord(id=m["id"], pipeline=m["pipeline"], version=m["version"], at=m["at"],
                           total=m["total"], partitions=m["partitions"] or {})


def _audit_record(row: Any) -> AuditRecord:
    m = row._mapping
    return AuditRecord(**{f: m[f] for f in AuditRecord.__dataclass_fields__ if f != "details"},
                       details=m["details"] or {})


# -- helpers ------------------------------------------------------------------------------------

def _ts(value: Any, what: str) -> float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise RegistryError(f"{what} must be unix seconds or a datetime, got {value!r}")


def _iso(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _json(value: Any, what: str) -> Any:
    """Round-trip through JSON so the database gets plain data (datetimes and paths become text)."""
    if value is None:
        return None
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError) as e:
        raise RegistryError(f"{what} must be JSON-serializable: {e}") from None


def _actor(actor: Any) -> str:
    if not isinstance(actor, str) or not actor.strip():
        raise RegistryError("every registry change needs an actor (who asked for it), e.g. a user name "
                            "or 'airflow:<dag>/<run>'")
    return actor.strip()[:200]


def _check_state(state: Any, what: str = "state") -> str:
    if state not in STATES:
        raise RegistryError(f"unknown version {what} {state!r}; states are {', '.join(STATES)}")
    return state


def _render(value: Any, n: int, what: str) -> str | None:
    if value is None:
        return None
    if callable(value):
        value = value(n)
    text = str(value)
    return text.replace("{n}", str(n)).replace("{version}", str(n))


def _by(actor: str | None, reason: str | None, at: float | None) -> str:
    text = f"by {actor or '?'} at {_iso(at)}"
    return f"{text} (reason: {reason!r})" if reason else text


def _use_wal(cur: Any, timeout: float) -> None:
    """Switch a SQLite database to WAL once (the mode persists in the file).

    Connections opened at the same moment on a fresh file race for the switch, and SQLite answers
    the losers "database is locked" at once, without its busy handler: retry until `timeout`.
    """
    import sqlite3

    deadline = time.monotonic() + timeout
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Registry:
    """One registry database. Thread-safe: each call takes its own pooled connection."""

    def __init__(self, url: str, *, auto_migrate: bool = True, busy_timeout: float = 30.0,
                 echo: bool = False, sqlite_synchronous: str = "NORMAL") -> None:
        if sqlite_synchronous not in ("NORMAL", "FULL", "EXTRA"):
            raise ConfigError(f"sqlite_synchronous must be NORMAL, FULL or EXTRA, not {sqlite_synchronous!r}")
        try:
            parsed = make_url(url)
        except sa.exc.ArgumentError:
            raise ConfigError(f"registry URL {mask_url(str(url))!r} is not a database URL; expected "
                              f"sqlite:///<path> or postgresql+psycopg2://<user>@<host>:5432/<db> "
                              f"(KAPPA_REGISTRY_URL)") from None
        self.dialect = parsed.get_backend_name()
        self.url = parsed.render_as_string(hide_password=True)
        self.busy_timeout = busy_timeout
        if self.dialect == "sqlite":
            self._engine = self._sqlite_engine(parsed, busy_timeout, echo, sqlite_synchronous)
        elif self.dialect == "postgresql":
            # lock_timeout: a flip or allocation waiting on a row lock gives up like SQLite's busy timeout
            self._engine = sa.create_engine(parsed, echo=echo, pool_pre_ping=True, connect_args={
                "connect_timeout": max(1, int(busy_timeout)),
                "options": f"-c lock_timeout={int(busy_timeout * 1000)}"})
        else:
            raise ConfigError(f"registry URL {self.url!r}: the registry runs on SQLite or PostgreSQL, not "
                              f"{self.dialect} (KAPPA_REGISTRY_URL)")
        # A forked child (Airflow's task runner, multiprocessing "fork") must not reuse the
        # parent's pooled connections: it opens its own, and leaves the parent's alone.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (r := ref()) is not None and r._engine.dispose(close=False))
        if auto_migrate:
            self.migrate()

    def __repr__(self) -> str:
        return f"Registry({self.url!r})"

    @staticmethod
    def _sqlite_engine(url: sa.URL, busy_timeout: float, echo: bool, synchronous: str) -> Engine:
        database = url.database
        memory = database in (None, "", ":memory:")
        kwargs: dict[str, Any] = {"echo": echo,
                                  "connect_args": {"timeout": busy_timeout, "check_same_thread": False}}
        if memory:
            kwargs["poolclass"] = StaticPool
        else:
            try:
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise RegistryError(f"cannot create the directory of the SQLite registry {database}: "
                                    f"{e.strerror}; set KAPPA_HOME or KAPPA_REGISTRY_URL to a writable "
                                    f"place") from None
        engine = sa.create_engine(url, **kwargs)

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            # Let us emit BEGIN ourselves (pysqlite would defer it, and never IMMEDIATE).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            cur.execute("PRAGMA foreign_keys = ON")
            if not memory:
                _use_wal(cur, busy_timeout)
                cur.execute(f"PRAGMA synchronous = {synchronous}")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn):
            write = conn.get_execution_options().get("kappa_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    # -- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _tx(self, what: str, *, write: bool) -> Iterator[Connection]:
        try:
            with self._engine.connect() as conn:
                if write:
                    conn.execution_options(kappa_write=True)
                with conn.begin():
                    yield conn
        except KappaError:
            raise
        except sa.exc.OperationalError as e:
            raise RegistryError(
                f"registry {self.url}: {what} failed: {str(e.orig).strip()}; check that the database is "
                f"reachable and not locked for longer than {self.busy_timeout:.0f}s (KAPPA_REGISTRY_URL)"
            ) from e
        except sa.exc.SQLAlchemyError as e:
            orig = getattr(e, "orig", None) or e
            raise RegistryError(f"registry {self.url}: {what} failed: {str(orig).strip()}") from e

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
            return self._schema_version(conn)

    @staticmethod
    def _schema_version(conn: Connection) -> int:
        if not sa.inspect(conn).has_table("schema_migrations"):
            return 0
        return conn.execute(sa.select(sa.func.max(schema_migrations.c.version))).scalar() or 0

    def migrate(self, target: int | None = None) -> list[int]:
        """Apply the missing migration steps up to `target` (default: head), in one transaction."""
        target = HEAD if target is None else target
        if not 0 <= target <= HEAD:
            raise RegistryError(f"no schema version {target}: this kappa knows 1 to {HEAD}")
        applied: list[int] = []
        with self._tx("migrating the schema", write=True) as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
            schema_migrations.create(conn, checkfirst=True)
            current = self._schema_version(conn)
            if current > HEAD:
                raise RegistryError(
                    f"registry {self.url} has schema version {current}, newer than this kappa knows "
                    f"({HEAD}): upgrade kappa, or point KAPPA_REGISTRY_URL at another registry")
            for step in MIGRATIONS:
                if current < step.version <= target:
                    step.apply(conn)
                    conn.execute(schema_migrations.insert().values(
                        version=step.version, name=step.name, applied_at=time.time()))
                    applied.append(step.version)
        return applied

    # -- audit ----------------------------------------------------------------------------------

    @staticmethod
    def _insert_audit(conn: Connection, action: str, *, actor: str, pipeline: str | None,
                      version: int | None, reason: str | None, outcome: str, details: Any,
                      at: float | None = None) -> int:
        result = conn.execute(audit_log.insert().values(
            at=at if at is not None else time.time(), actor=_actor(actor), action=action, pipeline=pipeline,
            version=version, reason=reason, outcome=outcome, details=_json(details or {}, "audit details")))
        return result.inserted_primary_key[0]

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
        return _audit_record(row)

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
        return [_audit_record(r) for r in reversed(rows)]

    # -- pipelines and versions -----------------------------------------------------------------

    def list_pipelines(self) -> list[PipelineRecord]:
        with self._tx("listing pipelines", write=False) as conn:
            rows = conn.execute(sa.select(pipelines).order_by(pipelines.c.name)).all()
        return [PipelineRecord(**r._mapping) for r in rows]

    def _ensure_pipeline(self, conn: Connection, pipeline: str) -> None:
        insert = (pg_dialect.insert if self.dialect == "postgresql" else sqlite_dialect.insert)(pipelines)
        conn.execute(insert.values(name=pipeline, last_version=0, created_at=time.time())
                     .on_conflict_do_nothing(index_elements=["name"]))

    @staticmethod
    def _in_flight(conn: Connection, pipeline: str) -> Any:
        return conn.execute(
            sa.select(versions)
            .where(versions.c.pipeline == pipeline, versions.c.state.in_(IN_FLIGHT_STATES),
                   versions.c.served_at.is_(None))
            .order_by(versions.c.version)).first()

    def allocate_version(self, pipeline: str, *, rules_version: str | None, rules_hash: str | None,
                         code_ref: str | None, table_path: Any = None, checkpoint_path: Any = None,
                         group_id: Any = None, actor: str, reason: str | None, queue: bool = False,
                         paths: Callable[[int], Any] | None = None, run_dir: Any = None,
                         rejects_path: Any = None, details: dict[str, Any] | None = None,
                         audit: bool = True) -> VersionRecord:
        """Allocate the next version number of `pipeline` and record it in state "created"."""
        validate_pipeline_name(pipeline)
        actor = _actor(actor)
        if paths is None and (table_path is None or checkpoint_path is None or group_id is None):
            raise RegistryError("allocate_version needs table_path, checkpoint_path and group_id, or paths=")
        details = _json(details or {}, "version details")
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
                            f"deployed {_by(b['actor'], b['reason'], b['created_at'])}); refusing a second "
                            f"reprocess. Promote or stop v{b['version']} first "
                            f"(kappa stop {pipeline} {b['version']}), or queue this one (--queue)")
                        err.in_flight_version = b["version"]  # type: ignore[attr-defined]
                        raise err
                n = last + 1
                p = paths(n) if paths is not None else None
                values = {
                    "table_path": _render(table_path if p is None else p.table, n, "table_path"),
                    "checkpoint_path": _render(checkpoint_path if p is None else p.checkpoint, n,
                                               "checkpoint_path"),
                    "group_id": _render(group_id if p is None else p.group_id, n, "group_id"),
                    "run_dir": _render(run_dir if p is None else getattr(p, "run_dir", run_dir), n, "run_dir"),
                    "rejects_path": _render(rejects_path if p is None else getattr(p, "rejects", rejects_path),
                                            n, "rejects_path"),
                }
                now = time.time()
                conn.execute(pipelines.update().where(pipelines.c.name == pipeline).values(last_version=n))
                conn.execute(versions.insert().values(
                    pipeline=pipeline, version=n, state="created", rules_version=rules_version,
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
        return _version_record(row)

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
        return _version_record(row)

    def list_versions(self, pipeline: str, states: Iterable[str] | None = None) -> list[VersionRecord]:
        """Versions of `pipeline` (only those in `states` if given), ascending."""
        q = sa.select(versions).where(versions.c.pipeline == pipeline)
        if states is not None:
            wanted = tuple(_check_state(st) for st in ([states] if isinstance(states, str) else states))
            q = q.where(versions.c.state.in_(wanted))
        with self._tx(f"listing versions of {pipeline}", write=False) as conn:
            rows = conn.execute(q.order_by(versions.c.version)).all()
        return [_version_record(r) for r in rows]

    def in_flight(self, pipeline: str) -> VersionRecord | None:
        """The (oldest) version of `pipeline` in flight, which would make a deploy refuse."""
        with self._tx(f"reading versions of {pipeline}", write=False) as conn:
            row = self._in_flight(conn, pipeline)
        return None if row is None else _version_record(row)

    def set_state(self, pipeline: str, n: int, state: str, *, expected: str | Iterable[str] | None = None,
                  **fields: Any) -> VersionRecord:
        """Move a version to `state`; with `expected`, only if it is in that state (or one of them)."""
        _check_state(state)
        expected_states: tuple[str, ...] | None = None
        if expected is not None:
            expected_states = (expected,) if isinstance(expected, str) else tuple(expected)
            for s in expected_states:
                _check_state(s, "expected state")
        unknown = sorted(set(fields) - set(SET_STATE_FIELDS))
        if unknown:
            raise RegistryError(f"set_state cannot change {', '.join(unknown)}; it sets "
                                f"{', '.join(SET_STATE_FIELDS)}")
        now = time.time()
        values: dict[str, Any] = {"state": state, "updated_at": now}
        for name, value in fields.items():
            if name in _TIME_FIELDS and value is not None:
                value = _ts(value, name)
            elif name == "details":
                value = _json(value or {}, "version details")
            elif name in ("run_dir", "rejects_path") and value is not None:
                value = str(value)
            values[name] = value
        if state == "starting" and "started_at" not in fields:
            values["started_at"] = now
        if state in ("stopped", "failed", "retired") and "stopped_at" not in fields:
            values["stopped_at"] = now
        if state == "caught_up" and "caught_up_at" not in fields:
            values["caught_up_at"] = sa.func.coalesce(versions.c.caught_up_at, now)
        if state == "serving":
            values["served_at"] = sa.func.coalesce(versions.c.served_at, now)
        where = [versions.c.pipeline == pipeline, versions.c.version == n]
        if expected_states is not None:
            where.append(versions.c.state.in_(expected_states))
        with self._tx(f"setting {pipeline} v{n} to {state}", write=True) as conn:
            count = conn.execute(versions.update().where(*where).values(**values)).rowcount
            row = conn.execute(sa.select(versions).where(versions.c.pipeline == pipeline,
                                                         versions.c.version == n)).first()
            if row is None:
                raise self._missing_version(conn, pipeline, n)
            if count == 1 and state == "retired":
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
        return _version_record(row)

    # -- aliases --------------------------------------------------------------------------------

    def get_alias(self, alias: str) -> AliasRecord | None:
        with self._tx(f"reading alias {alias!r}", write=False) as conn:
            row = conn.execute(sa.select(aliases).where(aliases.c.alias == alias)).first()
        return None if row is None else _alias_record(row)

    def list_aliases(self) -> list[AliasRecord]:
        with self._tx("listing aliases", write=False) as conn:
            rows = conn.execute(sa.select(aliases).order_by(aliases.c.alias)).all()
        return [_alias_record(r) for r in rows]

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
                f"{_by(m['updated_by'], m['reason'], m['updated_at'])}); this flip expected to create it. "
                f"Nothing was changed. Re-read the alias (kappa status) and retry if the move still makes sense")
        return ConflictError(
            f"alias {alias!r} points at v{m['version']} now, not v{expected} as this flip expected: it was moved "
            f"{_by(m['updated_by'], m['reason'], m['updated_at'])}. Nothing was changed. Re-read the alias "
            f"(kappa status) and retry if the move still makes sense")

    def _refuse_flip_target(self, conn: Connection, alias: str, pipeline: str, n: int) -> None:
        state = conn.execute(sa.select(versions.c.state).where(
            versions.c.pipeline == pipeline, versions.c.version == n)).scalar()
        if state is None:
            raise self._missing_version(conn, pipeline, n)
        raise ConflictError(f"{pipeline} v{n} is retired (its table may be deleted); alias {alias!r} cannot "
                            f"point at it. Deploy a new version instead")

    def flip_alias(self, alias: str, pipeline: str, *, expected_version: int | None, new_version: int,
                   actor: str, reason: str | None, audit: bool = True) -> AliasRecord:
        """Compare-and-swap `alias` from `expected_version` to `new_version` of `pipeline`."""
        validate_alias_name(alias)
        validate_pipeline_name(pipeline)
        validate_version_number(new_version, "new_version")
        if expected_version is not None:
            validate_version_number(expected_version, "expected_version")
        actor = _actor(actor)
        details = {"alias": alias, "from_version": expected_version, "to_version": new_version}
        noop = False
        try:
            with self._tx(f"flipping alias {alias!r}", write=True) as conn:
                now = time.time()
                # The target first: it must exist and not be retired. The UPDATE also locks its
                # row (PostgreSQL), so a concurrent retire waits for this flip and then sees it.
                marked = conn.execute(
                    versions.update()
                    .where(versions.c.pipeline == pipeline, versions.c.version == new_version,
                           versions.c.state != "retired")
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
                if not noop:
                    conn.execute(alias_history.insert().values(
                        alias=alias, pipeline=pipeline, from_version=expected_version, to_version=new_version,
                        actor=actor, reason=reason, at=now))
                if audit:
                    self._insert_audit(conn, "flip_alias", actor=actor, pipeline=pipeline, version=new_version,
                                       reason=reason, outcome="noop" if noop else "ok", details=details, at=now)
        except (ConflictError, NotFoundError) as e:
            if audit:
                outcome = "conflict" if isinstance(e, ConflictError) else "not_found"
                self._audit_quietly("flip_alias", actor=actor, pipeline=pipeline, version=new_version,
                                    reason=reason, outcome=outcome, details={**details, "error": str(e)})
            raise
        return _alias_record(row)

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
        return _alias_record(row)

    def alias_history(self, alias: str, limit: int | None = None) -> list[AliasHistoryRecord]:
        """Every move of `alias` (the most recent `limit`), oldest first."""
        q = sa.select(alias_history).where(alias_history.c.alias == alias).order_by(alias_history.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx(f"reading the history of alias {alias!r}", write=False) as conn:
            rows = conn.execute(q).all()
        return [_history_record(r) for r in reversed(rows)]

    # -- lag samples ----------------------------------------------------------------------------

    def add_lag_sample(self, pipeline: str, n: int, total: int | None, partitions: dict[str, Any],
                       at: Any = None) -> LagSampleRecord:
        """Store one lag reading; `total` None means unknown (never zero)."""
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise RegistryError(f"lag total must be an integer or None (unknown), got {total!r}")
        at_ts = time.time() if at is None else _ts(at, "at")
        parts = _json(partitions or {}, "lag partitions")
        with self._tx(f"recording a lag sample of {pipeline} v{n}", write=True) as conn:
            exists = conn.execute(sa.select(versions.c.version).where(
                versions.c.pipeline == pipeline, versions.c.version == n)).first()
            if exists is None:
                raise self._missing_version(conn, pipeline, n)
            sample_id = conn.execute(lag_samples_table.insert().values(
                pipeline=pipeline, version=n, at=at_ts, total=total, partitions=parts)).inserted_primary_key[0]
        return LagSampleRecord(id=sample_id, pipeline=pipeline, version=n, at=at_ts, total=total, partitions=parts)

    def lag_samples(self, pipeline: str, n: int, limit: int | None = None, since: Any = None
                    ) -> list[LagSampleRecord]:
        """The most recent `limit` samples (all if None) at or after `since`, oldest first."""
        q = sa.select(lag_samples_table).where(lag_samples_table.c.pipeline == pipeline,
                                               lag_samples_table.c.version == n)
        if since is not None:
            q = q.where(lag_samples_table.c.at >= _ts(since, "since"))
        q = q.order_by(lag_samples_table.c.at.desc(), lag_samples_table.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx(f"reading lag samples of {pipeline} v{n}", write=False) as conn:
            rows = conn.execute(q).all()
        return [_lag_record(r) for r in reversed(rows)]
