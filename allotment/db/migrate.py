"""Schema migrations: ``allotment db sync`` / ``db version`` and start-up.

Two histories: Placement's (``alembic_version``, the reference's revisions,
brought to 16.0.0's by :mod:`allotment.db.reference_layout`) and then
Allotment's own (``allotment_version``, the Alembic scripts under
``migrations/``).  Both run in one migration transaction.

Several API processes may start at once against one empty database, on
several hosts and through different nodes of a Galera cluster: they take
turns under a lock every server agrees on (``_migration_transaction``),
and the later ones find the schema at head and carry on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Iterator

import sqlalchemy as sa

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from allotment.db import reference_layout
from allotment.db.engine import is_transient, one_line, set_wsrep_sync_wait
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


def why_unavailable(error: BaseException) -> str:
    """One line on why the database cannot be served, for a log or a
    terminal: a schema refusal as it is, any other error as ``database
    error:`` and the driver's first line."""
    if isinstance(error, SchemaNotReady):
        return str(error)
    return f"database error: {one_line(error)}"


# Held while migrating so that processes starting together take turns; the
# second then finds the schema at head.  (Only schema changes take a lock:
# request handling never does.)
MIGRATION_LOCK_NAME = "allotment_schema_migration"
MIGRATION_LOCK_TIMEOUT_S = 300
#: MySQL/MariaDB: the table of the lease (see :class:`_Lease`); never dropped.
LOCK_TABLE = "allotment_migration_lock"
#: How long a lease lasts unless its holder renews it (a holder that died
#: blocks the others this long at most), and how often the holder renews it.
LEASE_SECONDS = 120
RENEW_SECONDS = 5
#: Galera: every read of a migrating session waits until the node has
#: applied everything the cluster committed before it (wsrep_sync_wait's
#: bits for reads, updates and deletes, inserts, SHOW).
MIGRATION_SYNC_WAIT = 15


class _Lease:
    """A lock every MySQL/MariaDB server of a deployment agrees on: a row.

    ``GET_LOCK`` is held by one server only, and the nodes of a Galera
    cluster do not share it: three migrators through three nodes all got
    it, and two of them failed on tables the first had just made.  A row
    is what the cluster does agree on: the migrator whose ``INSERT`` of
    the lock's row commits holds it (on Galera two nodes' inserts of the
    same key cannot both be certified: the loser gets a deadlock error at
    commit); the others wait for the row to be deleted.  The holder renews
    the lease every :data:`RENEW_SECONDS` from a thread of its own; one
    that died leaves a lease that others take over once it has expired.
    Times are the database's (``UTC_TIMESTAMP()``), so the clocks of the
    API hosts do not matter.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, conn: Connection, timeout: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {LOCK_TABLE} (name VARCHAR(64) NOT NULL PRIMARY KEY, "
            "holder VARCHAR(255) NOT NULL, expires_at DATETIME NOT NULL) ENGINE=InnoDB")
        conn.commit()
        deadline = time.monotonic() + timeout
        told = None
        while True:
            if self._try(conn, f"INSERT INTO {LOCK_TABLE} (name, holder, expires_at) "
                               "VALUES (%s, %s, UTC_TIMESTAMP() + INTERVAL %s SECOND)",
                         (MIGRATION_LOCK_NAME, self.holder, LEASE_SECONDS)):
                break
            if self._try(conn, f"UPDATE {LOCK_TABLE} SET holder = %s, "
                               "expires_at = UTC_TIMESTAMP() + INTERVAL %s SECOND "
                               "WHERE name = %s AND expires_at < UTC_TIMESTAMP()",
                         (self.holder, LEASE_SECONDS, MIGRATION_LOCK_NAME), rows=1):
                LOG.warning("took over the schema migration lock: its holder did not renew it")
                break
            held_by = conn.exec_driver_sql(f"SELECT holder FROM {LOCK_TABLE} WHERE name = %s",
                                           (MIGRATION_LOCK_NAME,)).scalar()
            conn.commit()
            if held_by and held_by != told:
                LOG.info("waiting for the schema migration of %s", held_by)
                told = held_by
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout}s waiting for another process's schema "
                                   f"migration ({held_by or 'holder unknown'})")
            time.sleep(random.uniform(0.1, 0.4))
        self._renewer = threading.Thread(target=self._renew, name="allotment-migration-lease", daemon=True)
        self._renewer.start()

    @staticmethod
    def _try(conn: Connection, statement: str, parameters: tuple, rows: int | None = None) -> bool:
        """Whether ``statement`` committed (and changed ``rows`` rows, when given)."""
        try:
            result = conn.exec_driver_sql(statement, parameters)
            conn.commit()
        except sa.exc.IntegrityError:  # the row is there: someone holds the lock
            conn.rollback()
            return False
        except sa.exc.DBAPIError as error:  # Galera: another node's write of the row won
            if not is_transient(error):
                raise
            conn.rollback()
            return False
        return rows is None or result.rowcount == rows

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                with self.engine.connect() as conn:
                    renewed = conn.exec_driver_sql(
                        f"UPDATE {LOCK_TABLE} SET expires_at = UTC_TIMESTAMP() + INTERVAL %s SECOND "
                        "WHERE name = %s AND holder = %s", (LEASE_SECONDS, MIGRATION_LOCK_NAME, self.holder))
                    conn.commit()
                if renewed.rowcount == 0:
                    LOG.error("the schema migration lock was taken over while this process migrated")
                    return
            except Exception as error:  # noqa: BLE001 - the next renewal tries again
                LOG.warning("could not renew the schema migration lock: %s", error)

    def release(self, conn: Connection) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        try:
            conn.exec_driver_sql(f"DELETE FROM {LOCK_TABLE} WHERE name = %s AND holder = %s",
                                 (MIGRATION_LOCK_NAME, self.holder))
            conn.commit()
        except sa.exc.DBAPIError as error:  # the lease then expires by itself
            LOG.warning("could not release the schema migration lock: %s", error)


@contextlib.contextmanager
def _migration_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that only one process at a time may run migrations in.

    SQLite: ``BEGIN IMMEDIATE`` (the engine's write option) waits for the
    write lock, so the version table is read after the other process
    committed.  PostgreSQL: a transaction-scoped advisory lock.  MySQL and
    MariaDB, whose DDL commits as it goes: a lease in a table of its own
    (:class:`_Lease`), which holds across the nodes of a Galera cluster,
    around the whole upgrade; there the session also waits, at each read,
    for its node to have applied what the cluster committed.
    """
    with engine.connect() as conn:
        conn = conn.execution_options(allotment_write=True)
        backend = conn.dialect.name
        lease = sync_wait = None
        try:
            if backend == "mysql":
                sync_wait = set_wsrep_sync_wait(conn, MIGRATION_SYNC_WAIT)
                lease = _Lease(engine)
                lease.acquire(conn)
            with conn.begin():
                if backend == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
                                 {"name": MIGRATION_LOCK_NAME})
                yield conn
        finally:
            if lease is not None:
                lease.release(conn)
            if sync_wait is not None:  # the pooled connection as it was
                try:
                    set_wsrep_sync_wait(conn, sync_wait)
                except sa.exc.DBAPIError:  # a lost connection is not returned to the pool
                    pass


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
    with engine.connect() as conn:
        refused = reference_layout.refusal(conn)
    if refused is not None:  # before the migration lock's table is made: nothing changed
        raise refused
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
