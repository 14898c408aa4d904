"""The registry's schema: the head tables the queries use, and the numbered steps that build them.

A registry created by an older kappa is brought forward by applying the missing steps in order,
inside one transaction, each recorded in `schema_migrations`; Alembic runs them, one revision per
step (`orchestrator.registry.migrations`), and keeps its own `alembic_version`. A step is frozen once released:
step 1 declares its own snapshot of the first schema on purpose (the head tables below moved on
since), so an old registry is migrated through exactly the schema it once had. A new column or
table is a new step *and* a change to the head tables; the migration tests check they agree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestrator.core.exceptions import RegistryError

__all__ = ["HEAD", "MIGRATIONS", "Migration", "alembic_revision", "aliases", "alias_history", "apply_migrations",
           "apply_step", "audit_log",
           "lag_samples_table", "metadata", "pipelines", "schema_migrations", "schema_version", "versions"]

#: The advisory lock that serializes migrations of one PostgreSQL registry ("kappa").
_PG_MIGRATION_LOCK = 0x6B61707061

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
    sa.Column("lease_owner", sa.String(200)),   # step 3
    sa.Column("lease_epoch", sa.Integer),       # step 3
    sa.Column("lease_expires", sa.Double),      # step 3
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
    sa.Column("lag_seconds", sa.Double),        # step 4
    sa.Column("batches", sa.Integer),           # step 5
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


def _step3_leases(conn: Connection) -> None:
    """Job-start leases: who is starting (or stopping) a version's job, the epoch, until when.

    NULL everywhere means no lease, which is what every existing version has.
    """
    _add_column(conn, "versions", sa.Column("lease_owner", sa.String(200)))
    _add_column(conn, "versions", sa.Column("lease_epoch", sa.Integer))
    _add_column(conn, "versions", sa.Column("lease_expires", sa.Double))


def _step4_lag_seconds(conn: Connection) -> None:
    """Lag in time on lag samples: the age of the oldest record not yet processed, in seconds.

    NULL means unknown, which is what every sample taken before this step is.
    """
    _add_column(conn, "lag_samples", sa.Column("lag_seconds", sa.Double))


def _step5_sample_batches(conn: Connection) -> None:
    """On lag samples, the micro-batches the version's job had committed since it started when the
    sample was taken: the evidence readiness needs (`orchestrator.lifecycle.await_ready`).

    NULL means unknown, which is what every sample taken before this step is.
    """
    _add_column(conn, "lag_samples", sa.Column("batches", sa.Integer))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: pipelines, versions, aliases, alias history, audit log", _step1_initial),
    Migration(2, "publish tracking, served_at, rejects path, version details, lag samples",
              _step2_publish_and_lag),
    Migration(3, "job-start leases on versions (owner, epoch, expiry)", _step3_leases),
    Migration(4, "lag in seconds on lag samples", _step4_lag_seconds),
    Migration(5, "micro-batches committed since the job started, on lag samples", _step5_sample_batches),
)
HEAD = MIGRATIONS[-1].version


def schema_version(conn: Connection) -> int:
    """The highest migration step applied (0 for an empty database)."""
    if not sa.inspect(conn).has_table("schema_migrations"):
        return 0
    return conn.execute(sa.select(sa.func.max(schema_migrations.c.version))).scalar() or 0


def apply_step(conn: Connection, step: int) -> None:
    """Apply migration step `step` and record it in `schema_migrations` (an Alembic revision's body)."""
    m = MIGRATIONS[step - 1]
    m.apply(conn)
    conn.execute(schema_migrations.insert().values(version=m.version, name=m.name, applied_at=time.time()))


def _alembic(conn: Connection):
    from alembic.config import Config

    from orchestrator.registry.migrations import SCRIPT_LOCATION

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.attributes["connection"] = conn
    return cfg


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Alembic logs its dialect choice at INFO on every run; kappa's own output (CLI, task logs) stays clean."""
    logger = logging.getLogger("alembic")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def alembic_revision(conn: Connection) -> str | None:
    """The registry's Alembic revision (None: never run through Alembic)."""
    from alembic.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def apply_migrations(conn: Connection, *, dialect: str, url: str, target: int) -> list[int]:
    """Apply the steps missing up to `target` with Alembic, in the caller's transaction; the steps applied.

    On PostgreSQL an advisory lock makes concurrent migrators wait for each other, so each step
    runs once. A registry newer than this code is refused, naming both schema versions. A registry
    made before kappa used Alembic is stamped at the step it has, then upgraded in place.
    """
    from alembic import command

    from orchestrator.registry.migrations import revision_of

    if dialect == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
    schema_migrations.create(conn, checkfirst=True)
    current = schema_version(conn)
    if current > HEAD:
        raise RegistryError(
            f"registry {url} has schema version {current}, newer than this kappa knows "
            f"({HEAD}): upgrade kappa, or point KAPPA_REGISTRY_URL at another registry")
    cfg = _alembic(conn)
    with _quiet_alembic():
        if current > 0 and alembic_revision(conn) is None:
            command.stamp(cfg, revision_of(current))
        if current >= target:
            return []
        command.upgrade(cfg, revision_of(target))
    return list(range(current + 1, target + 1))
