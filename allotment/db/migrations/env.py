"""Alembic environment: always run on a connection handed in by migrate.py.

Allotment's revisions are recorded in ``allotment_version``; Placement's own
``alembic_version`` is left to the reference's history (see
``allotment/db/reference_layout.py``).
"""

from alembic import context

from allotment.db import tables

VERSION_TABLE = "allotment_version"

config = context.config
connection = config.attributes["connection"]
context.configure(connection=connection, target_metadata=tables.metadata,
                  version_table=VERSION_TABLE,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
