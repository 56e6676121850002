"""Schema migrations: ``allotment db sync`` / ``db version`` and start-up.

Several API processes may start at once against one empty database; each
runs the upgrade, and a loser of the race that finds the schema already at
head afterwards carries on instead of failing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

import sqlalchemy as sa

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

LOG = logging.getLogger(__name__)
_HERE = os.path.join(os.path.dirname(__file__), "migrations")


def _alembic_config(connection=None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", _HERE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


# Held while migrating so that processes starting together take turns; the
# second then finds the schema at head.  (Only schema changes take a lock:
# request handling never does.)
MIGRATION_LOCK_NAME = "allotment_schema_migration"
MIGRATION_LOCK_TIMEOUT_S = 300


@contextlib.contextmanager
def _migration_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that only one process at a time may run migrations in.

    SQLite: ``BEGIN IMMEDIATE`` (the engine's write option) waits for the
    write lock, so the version table is read after the other process
    committed.  PostgreSQL: a transaction-scoped advisory lock.  MySQL and
    MariaDB, whose DDL commits as it goes: a named session lock around the
    whole upgrade.
    """
    with engine.connect() as conn:
        conn = conn.execution_options(allotment_write=True)
        backend = conn.dialect.name
        if backend == "mysql":
            got = conn.exec_driver_sql("SELECT GET_LOCK(%s, %s)",
                                       (MIGRATION_LOCK_NAME, MIGRATION_LOCK_TIMEOUT_S)).scalar()
            conn.commit()
            if got != 1:
                raise RuntimeError("timed out waiting for another process's schema migration")
        try:
            with conn.begin():
                if backend == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
                                 {"name": MIGRATION_LOCK_NAME})
                yield conn
        finally:
            if backend == "mysql":
                conn.exec_driver_sql("SELECT RELEASE_LOCK(%s)", (MIGRATION_LOCK_NAME,))
                conn.commit()


def upgrade(engine: Engine) -> str:
    """Bring the schema to head; returns the revision now in place."""
    head = head_revision()
    if current_revision(engine) == head:
        return head
    try:
        with _migration_transaction(engine) as conn:
            command.upgrade(_alembic_config(conn), "head")
    except Exception:
        # Another process may have migrated concurrently.
        if current_revision(engine) == head:
            LOG.info("schema was migrated concurrently by another process")
            return head
        raise
    return head
