"""Connections to the registry database: SQLite or PostgreSQL, and one transaction per call.

SQLite runs in WAL mode (readers never wait for the writer) with `synchronous=NORMAL` by
default: a commit survives the process crashing (what "resumable" needs), and costs no fsync,
which keeps a flip in the low milliseconds; only an OS crash or power loss may roll back the last
commits. `sqlite_synchronous="FULL"` fsyncs every commit. A write transaction is
`BEGIN IMMEDIATE` on SQLite: one writer at a time, the others wait up to `busy_timeout`.

PostgreSQL is the choice for anything shared (Airflow workers on several hosts). Its
connections get `lock_timeout` = `busy_timeout`, so a write waiting on a row lock gives up with a
RegistryError instead of hanging. kappa installs one PostgreSQL driver, psycopg2, and
`postgresql://` and `postgres://` (the forms most people type) mean it: left to itself, SQLAlchemy 2
would pick psycopg 3 for `postgresql://`, which is not installed. Any other driver is refused with
one line that says what to write instead (`registry_url`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from orchestrator.core.dburls import DRIVERS
from orchestrator.core.exceptions import ConfigError, KappaError, RegistryError
from orchestrator.core.secrets import mask_url

__all__ = ["SQLITE_SYNCHRONOUS", "create_engine", "registry_url", "transaction", "unreachable"]

SQLITE_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")


def registry_url(url: str | sa.URL) -> sa.URL:
    """`url` parsed, with the driver kappa connects with made explicit for PostgreSQL.

    `postgresql://` and `postgres://` become `postgresql+psycopg2://`. Raises ConfigError (one
    line, the URL's password masked) for a string that is not a database URL, a database other
    than SQLite or PostgreSQL, or a driver kappa does not install (psycopg 3, asyncpg, pg8000...).
    """
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise ConfigError(f"registry URL {mask_url(str(url))!r} is not a database URL; expected "
                          f"sqlite:///<path> or postgresql+psycopg2://<user>@<host>:5432/<db> "
                          f"(KAPPA_REGISTRY_URL)") from None
    backend, _, driver = parsed.drivername.partition("+")
    backend = "postgresql" if backend == "postgres" else backend
    masked = parsed.render_as_string(hide_password=True)
    if backend not in DRIVERS:
        raise ConfigError(f"registry URL {masked!r}: the registry runs on SQLite or PostgreSQL, not "
                          f"{backend} (KAPPA_REGISTRY_URL)")
    if driver and driver != DRIVERS[backend]:
        plain = parsed.set(drivername=backend).render_as_string(hide_password=True)
        raise ConfigError(f"registry URL {masked!r} names the driver {driver!r}, which kappa does not install "
                          f"or use; write {plain!r} (kappa connects with {DRIVERS[backend]}) (KAPPA_REGISTRY_URL)")
    return parsed.set(drivername="postgresql+psycopg2") if backend == "postgresql" else parsed


def create_engine(url: str, *, busy_timeout: float, echo: bool, sqlite_synchronous: str
                  ) -> tuple[Engine, str, str]:
    """The engine for `url`, its dialect ("sqlite" or "postgresql") and the URL with its password masked."""
    if sqlite_synchronous not in SQLITE_SYNCHRONOUS:
        raise ConfigError(f"sqlite_synchronous must be NORMAL, FULL or EXTRA, not {sqlite_synchronous!r}")
    parsed = registry_url(url)
    dialect = parsed.get_backend_name()
    masked = parsed.render_as_string(hide_password=True)
    try:
        if dialect == "sqlite":
            engine = _sqlite_engine(parsed, busy_timeout, echo, sqlite_synchronous)
        else:
            # lock_timeout: a flip or allocation waiting on a row lock gives up like SQLite's busy timeout
            engine = sa.create_engine(parsed, echo=echo, pool_pre_ping=True, connect_args={
                "connect_timeout": max(1, int(busy_timeout)),
                "options": f"-c lock_timeout={int(busy_timeout * 1000)}"})
    except ImportError as e:
        raise ConfigError(f"registry URL {masked!r}: its driver cannot be imported ({e}); reinstall kappa "
                          f"(`pip install psycopg2-binary` for PostgreSQL)") from None
    return engine, dialect, masked


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


#: PostgreSQL's SQLSTATEs of a lost server: connection exceptions (class 08), and the server shutting
#: down, crashed or starting up (57P01-57P03; not 57014, a statement cancelled by a timeout).
_LOST = ("08", "57P01", "57P02", "57P03")


def unreachable(e: sa.exc.DBAPIError) -> bool:
    """Whether a database error means the server could not be reached or went away (a restart, a network
    cut, a connection refused), rather than a refusal such as a lock timeout. PostgreSQL only: a SQLite
    registry is a file, never unreachable that way."""
    if e.connection_invalidated:
        return True
    orig = e.orig
    if not type(orig).__module__.startswith("psycopg2"):
        return False
    code = getattr(orig, "pgcode", None)
    return code is None or code.startswith(_LOST)


@contextmanager
def transaction(engine: Engine, what: str, *, write: bool, url: str, busy_timeout: float) -> Iterator[Connection]:
    """One transaction (a write one takes SQLite's write lock at BEGIN); database errors become RegistryError
    naming `what` failed on the registry at `url` (masked)."""
    try:
        with engine.connect() as conn:
            if write:
                conn.execution_options(kappa_write=True)
            with conn.begin():
                yield conn
    except KappaError:
        raise
    except sa.exc.OperationalError as e:
        cause = " ".join(part.strip() for part in str(e.orig).splitlines() if part.strip())
        if unreachable(e):
            raise RegistryError(
                f"registry {url} is unreachable: {what} failed ({cause}); retry the command once the database "
                f"answers (a retry, or `kappa reconcile`, finishes what this one left half done) (KAPPA_REGISTRY_URL)"
            ) from e
        raise RegistryError(
            f"registry {url}: {what} failed: {cause}; check that the database is "
            f"reachable and not locked for longer than {busy_timeout:.0f}s (KAPPA_REGISTRY_URL)"
        ) from e
    except sa.exc.SQLAlchemyError as e:
        orig = getattr(e, "orig", None) or e
        raise RegistryError(f"registry {url}: {what} failed: {str(orig).strip()}") from e
