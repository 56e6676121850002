"""Placement's own schema history, and how Allotment adopts a database at any point of it.

The reference Placement versions its schema in ``alembic_version`` with
these revisions (oldest first); 16.0.0's is ``a082b8bb98d0``:

``b4ed3a175331``  the first (Stein) layout
``611cd6dffd7b``  no schema change; refuses to go on while a provider has
                  no ``root_provider_id``
``b5c396305c25``  no schema change; refuses to go on while an allocation's
                  consumer has no record
``422ece571366``  ``consumer_types`` table, ``consumers.consumer_type_id``
``a082b8bb98d0``  drops five indexes that duplicated unique constraints

Allotment's tables are that 16.0.0 layout (``tables.py``).  Before its own
migrations run, :func:`adopt` brings whatever it finds to it: an empty
database gets the layout created; a reference database at an older
revision gets the same changes the reference would make (written here, on
our own), with the same refusals when data must first be completed by
``allotment db online-data-migrations``; ``alembic_version`` then says
``a082b8bb98d0``, so the reference itself still recognises the database
(the way back).  Allotment's own history lives in ``allotment_version``.

Databases created by Allotment before it adopted this layout carry
Allotment's revision ``0001`` in ``alembic_version``; the same tables with
other index and constraint names.  They are converted in place.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import tables

REVISIONS = ["b4ed3a175331", "611cd6dffd7b", "b5c396305c25", "422ece571366", "a082b8bb98d0"]
HEAD = REVISIONS[-1]
#: What Allotment wrote to ``alembic_version`` before it kept its own table.
LEGACY_ALLOTMENT_REVISION = "0001"
VERSION_TABLE = "alembic_version"
ONLINE_MIGRATIONS = "allotment db online-data-migrations"


class SchemaNotReady(Exception):
    """The database cannot be brought to the layout yet; the message says why (one line)."""

    def __init__(self, message: str, *, needs_online_migrations: bool = False):
        super().__init__(message)
        self.needs_online_migrations = needs_online_migrations


_version = sa.Table(
    VERSION_TABLE, sa.MetaData(),
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


def placement_revision(conn: Connection) -> str | None:
    """The revision in Placement's ``alembic_version`` (None: no table or no row)."""
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(sa.select(_version.c.version_num)).scalar()


def _set_revision(conn: Connection, revision: str) -> None:
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        _version.create(conn)
    conn.execute(sa.delete(_version))
    conn.execute(sa.insert(_version).values(version_num=revision))


def named_revision(name: str) -> str | None:
    """The Placement revision ``name`` stands for, as Placement's ``db
    stamp`` reads it: a revision id or a start of one of two characters or
    more that only one revision has, ``head`` or ``heads`` (16.0.0's), or
    ``base`` (None: no revision).  Raises ``KeyError`` for any other."""
    if name in ("head", "heads"):
        return HEAD
    if name == "base":
        return None
    found = [revision for revision in REVISIONS if revision.startswith(name)] if len(name) >= 2 else []
    if len(found) != 1:
        raise KeyError(name)
    return found[0]


def stamp(conn: Connection, revision: str | None) -> None:
    """Record ``revision`` as the schema's Placement revision, changing
    nothing else (None: record none).  For a schema whose revision is
    known to its operator but not written, as after copying the tables
    out of the nova_api database: ``db sync`` then takes it from there."""
    if revision is not None:
        _set_revision(conn, revision)
    elif sa.inspect(conn).has_table(VERSION_TABLE):
        conn.execute(sa.delete(_version))


def providers_without_root(conn: Connection) -> int:
    rp = tables.resource_providers
    return conn.execute(sa.select(sa.func.count()).select_from(rp)
                        .where(rp.c.root_provider_id.is_(None))).scalar_one()


def allocations_without_consumer(conn: Connection) -> int:
    alloc, consumers = tables.allocations, tables.consumers
    return conn.execute(
        sa.select(sa.func.count())
        .select_from(alloc.outerjoin(consumers, consumers.c.uuid == alloc.c.consumer_id))
        .where(consumers.c.id.is_(None))).scalar_one()


def incomplete_data(conn: Connection) -> str | None:
    """What the online data migrations would complete (one phrase), or None."""
    found = []
    left = providers_without_root(conn)
    if left:
        found.append(f"{left} resource providers have no root provider")
    left = allocations_without_consumer(conn)
    if left:
        found.append(f"{left} allocations have no consumer record")
    return "; ".join(found) or None


def pending_online_migrations(conn: Connection) -> str | None:
    """Why the layout cannot be reached before online data migrations, or None."""
    found = incomplete_data(conn)
    if not found:
        return None
    return found + f": run '{ONLINE_MIGRATIONS}', then sync again"


def state(conn: Connection) -> str:
    """``empty``, ``reference`` (any Placement revision), ``legacy`` or ``unknown``."""
    revision = placement_revision(conn)
    if revision is None:
        present = set(sa.inspect(conn).get_table_names()) & set(tables.metadata.tables)
        return "unknown" if present else "empty"
    if revision in REVISIONS:
        return "reference"
    if revision == LEGACY_ALLOTMENT_REVISION:
        return "legacy"
    return "unknown"


def refusal(conn: Connection) -> SchemaNotReady | None:
    """Why a database that carries a revision cannot be taken over (None:
    it can, or it carries none yet).  Read only: asked before anything is
    changed, the migration lock's table included.  A database without a
    revision is judged under the lock, as another process may be laying
    it out at this very moment."""
    revision = placement_revision(conn)
    if revision is None or revision == LEGACY_ALLOTMENT_REVISION:
        return None
    if revision not in REVISIONS:
        return SchemaNotReady(f"the database's schema revision {revision!r} is neither Placement's "
                              "nor Allotment's: not a layout Allotment knows")
    # The reference's two blocking revisions.
    if REVISIONS.index(revision) < REVISIONS.index("b5c396305c25"):
        reason = pending_online_migrations(conn)
        if reason:
            return SchemaNotReady(f"schema at Placement revision {revision} cannot be upgraded yet: "
                                  + reason, needs_online_migrations=True)
    return None


def adopt(conn: Connection) -> str | None:
    """Bring the database to Placement 16.0.0's layout; returns the revision found.

    Raises :class:`SchemaNotReady` (nothing changed) when it cannot.
    """
    revision = placement_revision(conn)
    found = state(conn)
    if found == "empty":
        tables.metadata.create_all(conn)
        _set_revision(conn, HEAD)
        return None
    if found == "legacy":
        _convert_legacy(conn)
        _set_revision(conn, HEAD)
        return revision
    if found == "unknown" and revision is None:
        raise SchemaNotReady("the database holds Placement tables but no schema revision "
                             "(alembic_version): not a layout Allotment knows")
    refused = refusal(conn)  # checked before changing anything
    if refused is not None:
        raise refused
    position = REVISIONS.index(revision)
    if position == len(REVISIONS) - 1:
        _binary_collation(conn)
        return revision
    if position < REVISIONS.index("422ece571366"):
        _add_consumer_types(conn)
        _set_revision(conn, "422ece571366")
    _drop_redundant_indexes(conn)
    _set_revision(conn, HEAD)
    _binary_collation(conn)
    return revision


def _binary_collation(conn: Connection) -> None:
    """MySQL/MariaDB: compare names byte for byte, as Placement does.

    A database created for Placement takes the server's default collation,
    often case-insensitive (``utf8mb4_general_ci``), while Placement matches
    trait and resource class names exactly (in its own caches): with the
    default collation ``GET /traits/custom_gold`` would find ``CUSTOM_GOLD``.
    The tables are converted to ``utf8mb4_bin``, as Allotment creates its
    own; Placement is indifferent to the collation.  Converting rebuilds a
    table, so this runs once, on the tables not converted yet.
    """
    if conn.dialect.name != "mysql":
        return
    pending = conn.execute(sa.text(
        "SELECT DISTINCT table_name FROM information_schema.columns "
        "WHERE table_schema = DATABASE() AND collation_name IS NOT NULL "
        "AND collation_name <> 'utf8mb4_bin'")).scalars().all()
    for table in sorted(set(pending) & set(tables.metadata.tables)):
        conn.exec_driver_sql(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")


def _add_consumer_types(conn: Connection) -> None:
    tables.consumer_types.create(conn)
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("ALTER TABLE consumers ADD COLUMN consumer_type_id INTEGER "
                             "CONSTRAINT consumers_consumer_type_id_fkey REFERENCES consumer_types (id)")
        conn.exec_driver_sql("CREATE INDEX consumers_consumer_type_id_idx ON consumers (consumer_type_id)")
        return
    conn.exec_driver_sql("ALTER TABLE consumers ADD COLUMN consumer_type_id INTEGER NULL")
    # The index first: MySQL would otherwise make one of its own for the key.
    conn.exec_driver_sql("CREATE INDEX consumers_consumer_type_id_idx ON consumers (consumer_type_id)")
    conn.exec_driver_sql("ALTER TABLE consumers ADD CONSTRAINT consumers_consumer_type_id_fkey "
                         "FOREIGN KEY (consumer_type_id) REFERENCES consumer_types (id)")


# Indexes of the older layout that 16.0.0 no longer has (each duplicated a
# unique constraint).
_REDUNDANT_INDEXES = [
    ("inventories", "inventories_resource_provider_id_idx"),
    ("inventories", "inventories_resource_provider_resource_class_idx"),
    ("placement_aggregates", "ix_placement_aggregates_uuid"),
    ("resource_providers", "resource_providers_name_idx"),
    ("resource_providers", "resource_providers_uuid_idx"),
]


def _drop_index(conn: Connection, table: str, name: str) -> None:
    if conn.dialect.name == "mysql":
        conn.exec_driver_sql(f"DROP INDEX {name} ON {table}")
    else:
        conn.exec_driver_sql(f"DROP INDEX {name}")


def _drop_redundant_indexes(conn: Connection) -> None:
    inspector = sa.inspect(conn)
    for table, name in _REDUNDANT_INDEXES:
        if any(index["name"] == name for index in inspector.get_indexes(table)):
            _drop_index(conn, table, name)


def _convert_legacy(conn: Connection) -> None:
    """Allotment's own first layout (revision 0001) to 16.0.0's: same tables and rows.

    Every table is rebuilt from ``tables.py`` under a temporary name, its
    rows copied, the old one dropped and the new one renamed, children
    after parents so that foreign keys stay satisfied.
    """
    backend = conn.dialect.name
    order = tables.metadata.sorted_tables
    if backend == "sqlite":
        conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
    elif backend == "mysql":
        conn.exec_driver_sql("SET SESSION foreign_key_checks = 0")
    old = sa.MetaData()
    old.reflect(conn, only=[table.name for table in order])
    # Drop the old ones, children first, after copying their rows aside.
    rows = {}
    for table in order:
        source = old.tables[table.name]
        rows[table.name] = [dict(row._mapping) for row in conn.execute(
            sa.select(source).order_by(*source.primary_key.columns))]
    for table in reversed(order):
        old.tables[table.name].drop(conn)
    for table in order:
        table.create(conn)
        if rows[table.name]:
            conn.execute(sa.insert(table), rows[table.name])
    restart_id_sequences(conn)
    if backend == "mysql":
        conn.exec_driver_sql("SET SESSION foreign_key_checks = 1")


def restart_id_sequences(conn: Connection) -> None:
    """PostgreSQL: each ``id`` sequence to follow the highest id in its table.

    Rows inserted with their ids given (a rebuilt table, a copied database)
    leave a sequence where it was, and the next row the API creates would
    collide with a copied one.  (MySQL/MariaDB and SQLite move their counters
    past explicitly inserted ids themselves.)
    """
    if conn.dialect.name != "postgresql":
        return
    for table in tables.metadata.sorted_tables:
        if "id" in table.c and table.c.id.autoincrement is True:
            conn.exec_driver_sql(
                f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                f"COALESCE((SELECT MAX(id) FROM {table.name}), 0) + 1, false)")
