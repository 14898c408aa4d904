"""Alembic's environment for the registry: always online, on the connection kappa passes in
(`config.attributes["connection"]`), inside the transaction kappa already began."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
