"""Airflow's metadata database on PostgreSQL (`kappa airflow start --db-url postgresql+psycopg2://...`):
`airflow db migrate` with the environment kappa runs Airflow with creates the schema there."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from orchestrator.airflow.stack import airflow_env, check_db_url, migrate

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def test_migrate_on_postgresql(postgres_url, tmp_path):
    env = airflow_env(tmp_path / "airflow", db_url=check_db_url(postgres_url))
    migrate(env, tmp_path / "migrate.log")
    migrate(env, tmp_path / "migrate.log")  # idempotent: a restart migrates again
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as c:
            tables = set(sa.inspect(c).get_table_names())
            assert {"dag", "dag_run", "task_instance", "alembic_version"} <= tables
            assert c.execute(sa.text("select count(*) from alembic_version")).scalar() == 1
    finally:
        engine.dispose()
    assert not (tmp_path / "airflow" / "airflow.db").exists()  # nothing went to SQLite
