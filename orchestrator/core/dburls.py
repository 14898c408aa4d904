"""The registry's database URLs: SQLite or PostgreSQL, each with the one driver kappa installs.

Here, below the settings and the registry, so that `Settings` checks `registry_url` when it is
read without importing the registry; `orchestrator.registry.engine` connects with the same drivers.
"""

from __future__ import annotations

__all__ = ["DRIVERS", "check_registry_url"]

#: The one driver kappa installs and connects with, per database.
DRIVERS = {"sqlite": "pysqlite", "postgresql": "psycopg2"}

_REGISTRY_URL_HINT = "expected sqlite:///<path> or postgresql+psycopg2://<user>[:<password>]@<host>:<port>/<db>"


def check_registry_url(v: str) -> str:
    """The registry URL a setting gives, with the driver kappa uses (ValueError saying what is wrong,
    for the settings' one-line error)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(v)
    except ArgumentError:
        raise ValueError(f"not a database URL; {_REGISTRY_URL_HINT}") from None
    backend, _, driver = url.drivername.partition("+")
    backend = "postgresql" if backend == "postgres" else backend
    if backend not in DRIVERS:
        raise ValueError(f"the registry runs on SQLite or PostgreSQL, not {backend}; {_REGISTRY_URL_HINT}")
    if driver and driver != DRIVERS[backend]:
        plain = url.set(drivername=backend).render_as_string(hide_password=True)
        raise ValueError(f"kappa connects to {backend} with {DRIVERS[backend]} and does not install the "
                         f"driver {driver!r}; write {plain}")
    if backend == "postgresql":  # postgresql:// and postgres:// mean psycopg2, not SQLAlchemy's psycopg 3
        return url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    return v
