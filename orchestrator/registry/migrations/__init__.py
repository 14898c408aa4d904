"""The registry's schema migrations as an Alembic script directory (what Airflow itself uses).

Each revision `NNNN` applies the frozen step NNNN of `orchestrator.registry.schema.MIGRATIONS`
and records it in `schema_migrations` too, so `schema_version()` and older kappas keep reading
the schema version they know. `orchestrator.registry.schema.apply_migrations` runs Alembic on
the registry's own connection, inside the caller's transaction. A registry made before Alembic
(steps in `schema_migrations`, no `alembic_version`) is stamped at its step first, then upgraded
in place. A new schema change is a new step in schema.py *and* a revision file here.
"""

from pathlib import Path

SCRIPT_LOCATION = Path(__file__).resolve().parent


def revision_of(step: int) -> str:
    """The Alembic revision id of migration step `step` (1 -> "0001")."""
    return f"{step:04d}"
