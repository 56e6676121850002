"""Schema migrations: ``allotment db sync`` / ``db version`` and start-up.

Two histories: Placement's (``alembic_version``, the reference's revisions,
brought to 16.0.0's by :mod:`allotment.db.reference_layout`) and then
Allotment's own (``allotment_version``, the Alembic scripts under
``migrations/``).  Both run in one migration transaction.

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

from allotment.db import reference_layout
from allotment.db.reference_layout import SchemaNotReady

__all__ = ["SchemaNotReady", "allotment_revision", "create_in", "current_revision", "head_revision",
           "is_known_revision", "placement_revision", "upgrade", "status"]

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


VERSION_TABLE = "allotment_version"


def allotment_revision(conn: Connection) -> str | None:
    """Allotment's revision (``allotment_version``) seen on ``conn``; None before the first sync."""
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def current_revision(engine: Engine) -> str | None:
    """Allotment's revision (``allotment_version``); None before the first sync."""
    with engine.connect() as conn:
        return allotment_revision(conn)


def is_known_revision(revision: str) -> bool:
    """Whether ``revision`` is one of this Allotment's (a newer Allotment's is not)."""
    try:
        return ScriptDirectory.from_config(_alembic_config()).get_revision(revision) is not None
    except Exception:  # alembic raises its own errors for unknown or malformed ids
        return False


def placement_revision(engine: Engine) -> str | None:
    """The revision in Placement's own ``alembic_version``."""
    with engine.connect() as conn:
        return reference_layout.placement_revision(conn)


def is_current(engine: Engine) -> bool:
    return (current_revision(engine) == head_revision()
            and placement_revision(engine) == reference_layout.HEAD)


def status(engine: Engine) -> tuple[bool, str]:
    """Which schema is there and what must run next: (ready, one line)."""
    head = head_revision()
    ours = current_revision(engine)
    with engine.connect() as conn:
        theirs = reference_layout.placement_revision(conn)
        found = reference_layout.state(conn)
        if found == "empty":
            return False, "the database is empty: run 'allotment db sync' to create the schema"
        if found == "unknown":
            return False, ("the database holds a schema Allotment does not know "
                           f"(alembic_version {theirs!r}); it will not touch it")
        if found == "legacy":
            return False, (f"schema created by an earlier Allotment (revision {theirs}): "
                           "run 'allotment db sync' to convert it to Placement 16.0.0's layout")
        if theirs != reference_layout.HEAD:
            pending = reference_layout.pending_online_migrations(conn)
            if pending:
                return False, f"Placement schema at revision {theirs} (older than 16.0.0): {pending}"
            return False, (f"Placement schema at revision {theirs} (older than 16.0.0): "
                           "run 'allotment db sync' to take it over")
    if ours is None:
        return False, (f"Placement 16.0.0 schema ({theirs}) not yet taken over by Allotment: "
                       "run 'allotment db sync'")
    if ours != head:
        return False, (f"Placement schema {theirs}, Allotment revision {ours}, latest is {head}: "
                       "run 'allotment db sync'")
    return True, f"Placement schema {theirs} (16.0.0), Allotment revision {head} (latest)"


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


def create_in(conn: Connection) -> None:
    """Bring the schema to head on ``conn``, inside the caller's transaction.

    What ``upgrade`` does once it holds the migration lock; ``allotment db
    copy`` lays out its empty target this way, in the transaction that then
    copies the rows.
    """
    adopted = reference_layout.adopt(conn)
    if adopted is not None and adopted != reference_layout.HEAD:
        LOG.info("Placement schema brought from %s to %s", adopted, reference_layout.HEAD)
    command.upgrade(_alembic_config(conn), "head")


def upgrade(engine: Engine) -> str:
    """Bring the schema to head; returns Allotment's revision now in place.

    Raises :class:`SchemaNotReady` (one-line reason, nothing changed) for a
    database that cannot be taken over yet or at all.
    """
    head = head_revision()
    if is_current(engine):
        return head
    try:
        with _migration_transaction(engine) as conn:
            create_in(conn)
    except SchemaNotReady:
        raise
    except Exception:
        # Another process may have migrated concurrently.
        if is_current(engine):
            LOG.info("schema was migrated concurrently by another process")
            return head
        raise
    return head
