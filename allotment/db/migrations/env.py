"""Alembic environment: always run on a connection handed in by migrate.py."""

from alembic import context

from allotment.db import tables

config = context.config
connection = config.attributes["connection"]
context.configure(connection=connection, target_metadata=tables.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
