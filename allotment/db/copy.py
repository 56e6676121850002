"""Copy a whole Placement database into an empty one (``allotment db copy``).

For an operator moving from the embedded SQLite file to PostgreSQL or
MariaDB/MySQL (or between any two of them).  The source is Allotment's
own database or one the reference Placement created at its newest schema
(16.0.0, ``a082b8bb98d0``), adopted by Allotment or not; the target must
hold no rows.

* The source is read in one snapshot (a repeatable-read transaction; on
  SQLite a read transaction): what it held when the copy began is copied,
  whole and consistent, even while API processes keep writing to it.
  Writes made during the copy are not carried over.
* The target is checked before anything is created in it, then laid out
  as ``allotment db sync`` lays out a fresh database, and the rows are
  copied table by table, parents first, in batches, keeping every primary
  key.  Schema and rows go in one transaction, so an interrupted copy
  leaves the target as it found it.  (MySQL/MariaDB commit DDL as it runs:
  there an interrupted copy may leave the empty tables behind; a new run
  accepts them.)
* Before committing, every table of the target is read back and compared
  with the source: the row count, and a checksum over the rows in primary
  key order with each value written out the same way whatever the backend
  returned it as (:func:`canonical`).  A difference rolls the whole copy
  back.
* PostgreSQL's ``id`` sequences are moved past the copied ids; the version
  rows (``alembic_version``, ``allotment_version``) end as the source's.

Provider links that point forward (a provider whose parent or root has a
higher id, after re-parenting) are written once the whole table is in, so
foreign keys stay checked on every backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import io
import os
from typing import Iterator, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from allotment.db import engine as db_engine
from allotment.db import changes, migrate, reference_layout, tables

DEFAULT_BATCH_SIZE = 5000
#: Parents before children (foreign keys), from the table metadata.
COPIED = tuple(tables.metadata.sorted_tables)
PROVIDERS = tables.resource_providers
_ALLOTMENT_VERSION = sa.Table(migrate.VERSION_TABLE, sa.MetaData(),
                              sa.Column("version_num", sa.String(32), nullable=False))
_PLACEMENT_VERSION = sa.Table(reference_layout.VERSION_TABLE, sa.MetaData(),
                              sa.Column("version_num", sa.String(32), nullable=False))
BACKENDS = ("sqlite", "postgresql", "mysql")


class CopyError(Exception):
    """The copy was refused or failed; the message is one line for the operator."""


class Progress(Protocol):
    """Told how the copy advances (the command line draws a bar from it)."""

    def start(self, table: str, total: int, phase: str = "copy") -> None:
        """``phase``: "copy" (source to target) or "verify" (reading the target back)."""

    def advance(self, rows: int) -> None: ...

    def finish(self) -> None: ...


class _Silent:
    def start(self, table: str, total: int, phase: str = "copy") -> None:
        pass

    def advance(self, rows: int) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclasses.dataclass
class TableCheck:
    """One table's count and checksum on each side."""

    table: str
    source_rows: int
    source_sum: str
    target_rows: int
    target_sum: str

    @property
    def ok(self) -> bool:
        return (self.source_rows, self.source_sum) == (self.target_rows, self.target_sum)


@dataclasses.dataclass
class Outcome:
    """What a copy (or a verification) found."""

    checks: list[TableCheck]
    #: (Placement's revision, Allotment's revision or None) of each side.
    source_versions: tuple[str | None, str | None]
    target_versions: tuple[str | None, str | None]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks) and self.source_versions == self.target_versions

    @property
    def rows(self) -> int:
        return sum(check.source_rows for check in self.checks)


# -- checksums --------------------------------------------------------------

def _datetime(value: datetime.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return value.isoformat(" ", "seconds")


#: How each type the drivers return is written; looked up by exact type (the
#: copy writes millions of values).
_WRITTEN = {
    type(None): lambda value: "\x00",
    bool: lambda value: "1" if value else "0",
    int: str,
    str: str,
    float: lambda value: format(value, ".6g"),
    datetime.datetime: _datetime,
    bytes: lambda value: value.decode("utf-8", "backslashreplace"),
}


def canonical(value) -> str:
    """A value as text, the same whichever backend stored and returned it.

    Floats to 6 significant digits: MySQL/MariaDB keep ``allocation_ratio``
    in a 4-byte FLOAT and return it rounded so.  Datetimes to the second, as
    naive UTC: MySQL/MariaDB ``DATETIME`` holds no fraction (the copy drops
    it there), SQLite returns what it parsed from text.  NULL is a NUL
    character, which no name or uuid holds.
    """
    written = _WRITTEN.get(type(value))
    if written is not None:
        return written(value)
    for kind, written in _WRITTEN.items():  # subclasses (e.g. a driver's own int or str)
        if kind is not type(None) and isinstance(value, kind):
            return written(value)
    return str(value)


class Checksum:
    """Rows in primary key order, canonical text, SHA-256."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.rows = 0

    def add(self, rows) -> None:
        for row in rows:
            self._hash.update(("\x1f".join(map(canonical, row)) + "\x1e").encode())
        self.rows += len(rows)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _ordered(table: sa.Table) -> sa.Select:
    return sa.select(*table.c).order_by(*table.primary_key.columns)


def table_checksum(conn: Connection, table: sa.Table, batch_size: int = DEFAULT_BATCH_SIZE,
                   progress: Progress | None = None, total: int = 0) -> Checksum:
    progress = progress or _Silent()
    progress.start(table.name, total, "verify")
    checksum = Checksum()
    result = conn.execution_options(stream_results=True, yield_per=batch_size).execute(_ordered(table))
    for batch in result.partitions(batch_size):
        checksum.add(batch)
        progress.advance(len(batch))
    progress.finish()
    return checksum


# -- connections --------------------------------------------------------------

def open_engine(url: str, role: str, *, reading: bool) -> Engine:
    """An engine for ``url``, or :class:`CopyError` saying what is wrong with the URL.

    A source SQLite file must exist (connecting would create an empty one)
    and is opened without switching its journal mode.
    """
    try:
        parsed = db_engine.normalize_url(url)
    except (sa.exc.ArgumentError, ValueError) as error:
        raise CopyError(f"the {role} is not a database URL ({url!r}): {error}") from None
    backend = parsed.get_backend_name()
    if backend not in BACKENDS:
        raise CopyError(f"the {role} URL names an unsupported database {parsed.drivername!r}: "
                        "give a sqlite://, postgresql:// or mysql:// URL")
    if backend == "sqlite":
        path = parsed.database
        if not path or path == ":memory:":
            raise CopyError(f"the {role} must be a SQLite file, not an in-memory database")
        if reading and not os.path.isfile(path):
            raise CopyError(f"the {role} SQLite file {path} does not exist")
        directory = os.path.dirname(os.path.abspath(path))
        if not reading and not os.path.isdir(directory):
            raise CopyError(f"the {role} SQLite file's directory {directory} does not exist")
    try:
        return db_engine.create_engine(url, pool_size=1, max_overflow=1, sqlite_wal=not reading)
    except (sa.exc.NoSuchModuleError, ImportError) as error:
        raise CopyError(f"the {role} URL names a database driver that is not installed "
                        f"({parsed.drivername}): {error}") from None


@contextlib.contextmanager
def _connected(engine: Engine, role: str) -> Iterator[Connection]:
    try:
        conn = engine.connect()
    except sa.exc.DBAPIError as error:
        raise CopyError(f"cannot connect to the {role} database "
                        f"{engine.url.render_as_string(hide_password=True)}: {_first_line(error)}") from None
    with conn:
        yield conn


def _first_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None)
    lines = str(orig if orig is not None else error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


@contextlib.contextmanager
def snapshot(conn: Connection) -> Iterator[Connection]:
    """A read-only transaction that sees the database as it was when it began."""
    if conn.dialect.name in ("postgresql", "mysql"):
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    with conn.begin():
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
        yield conn


# -- what may be copied -----------------------------------------------------------

def versions(conn: Connection) -> tuple[str | None, str | None]:
    """(Placement's ``alembic_version``, Allotment's ``allotment_version``)."""
    return reference_layout.placement_revision(conn), migrate.allotment_revision(conn)


def check_source(conn: Connection) -> tuple[str | None, str | None]:
    """The source's versions, or :class:`CopyError` saying what to run on it first."""
    found = reference_layout.state(conn)
    if found in ("empty", "unknown"):
        revision = reference_layout.placement_revision(conn)
        what = "no Placement tables" if found == "empty" else (
            "tables but no Placement schema revision" if revision is None
            else f"schema revision {revision!r}, which is neither Placement's nor Allotment's")
        raise CopyError(f"the source is not a Placement database ({what})")
    if found == "legacy":
        raise CopyError("the source was laid out by an earlier Allotment (revision "
                        f"{reference_layout.LEGACY_ALLOTMENT_REVISION}): run 'allotment db sync' on it first")
    placement, allotment = versions(conn)
    incomplete = reference_layout.incomplete_data(conn)
    if incomplete:
        then = "" if placement == reference_layout.HEAD else ", then 'allotment db sync'"
        raise CopyError(f"the source's data must be completed first ({incomplete}): run "
                        f"'{reference_layout.ONLINE_MIGRATIONS}' on it{then}")
    if placement != reference_layout.HEAD:
        raise CopyError(f"the source is at Placement schema revision {placement}, older than 16.0.0's "
                        f"({reference_layout.HEAD}): run 'allotment db sync' on it first")
    head = migrate.head_revision()
    if allotment is not None and allotment != head:
        if migrate.is_known_revision(allotment):
            raise CopyError(f"the source is at Allotment revision {allotment}, older than {head}: "
                            "run 'allotment db sync' on it first")
        raise CopyError(f"the source is at Allotment revision {allotment}, which this Allotment "
                        f"(latest {head}) does not know: copy it with the newer Allotment")
    return placement, allotment


def check_target(conn: Connection) -> None:
    """:class:`CopyError` unless the target holds no rows and nothing but Placement's tables."""
    present = set(sa.inspect(conn).get_table_names())
    # Allotment's own bookkeeping (its revision, the change number that reused
    # candidate answers are checked against) is laid out afresh, never copied.
    ours = ({table.name for table in COPIED} | {reference_layout.VERSION_TABLE, migrate.VERSION_TABLE}
            | {changes.COUNTER, changes.LOG, changes.PROVIDER_CHANGES, changes.PROVIDER_LOG}
            | {migrate.LOCK_TABLE})
    foreign = sorted(present - ours)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise CopyError(f"refusing to copy: the target database holds tables that are not "
                        f"Placement's ({shown}); give an empty database")
    held = []
    for table in sorted(COPIED, key=lambda table: table is not PROVIDERS):
        if table.name in present:
            count = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            if count:
                held.append(f"{table.name}: {count} {'row' if count == 1 else 'rows'}")
    if held:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more tables" if len(held) > 4 else "")
        raise CopyError(f"refusing to copy: the target database is not empty ({shown}); "
                        "give an empty database")
    if present and reference_layout.state(conn) == "unknown":
        raise CopyError("refusing to copy: the target database holds a schema Allotment does not "
                        f"know (alembic_version {reference_layout.placement_revision(conn)!r}); "
                        "give an empty database")


# -- the copy -----------------------------------------------------------------------

def _to_mysql(row: dict) -> dict:
    """Datetimes without the fraction MySQL's DATETIME would round (MariaDB truncates)."""
    for key, value in row.items():
        if isinstance(value, datetime.datetime) and value.microsecond:
            row[key] = value.replace(microsecond=0)
    return row


def _hold_forward_links(rows: list[dict]) -> list[dict]:
    """Providers whose parent or root has a higher id (not copied yet): link them later.

    Their links are cleared in ``rows`` and returned, to be set once every
    provider is in.
    """
    later = []
    for row in rows:
        links = {column: row[column] for column in ("parent_provider_id", "root_provider_id")
                 if row[column] is not None and row[column] > row["id"]}
        if links:
            later.append({"provider": row["id"], **{f"new_{c}": row[c] for c in
                                                       ("parent_provider_id", "root_provider_id")}})
            for column in links:
                row[column] = None
    return later


def _link_providers(conn: Connection, held: list[dict]) -> None:
    conn.execute(
        sa.update(PROVIDERS).where(PROVIDERS.c.id == sa.bindparam("provider"))
        .values(parent_provider_id=sa.bindparam("new_parent_provider_id"),
                root_provider_id=sa.bindparam("new_root_provider_id")),
        held)


def insert_rows(conn: Connection, table: sa.Table, rows: list[dict]) -> None:
    """One batch into the target (a seam the tests use to simulate a lossy copy).

    PostgreSQL through psycopg2 takes it with ``COPY``, several times faster
    than ``INSERT``s there; the other backends with a multi-row ``INSERT``.
    """
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg2":
        _copy_into_postgresql(conn, table, rows)
    else:
        conn.execute(sa.insert(table), rows)


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value) -> str:
    """A value in ``COPY``'s text format."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return value.translate(_COPY_ESCAPES)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(" ")
    return str(value)


def _copy_into_postgresql(conn: Connection, table: sa.Table, rows: list[dict]) -> None:
    columns = list(table.c.keys())
    data = io.StringIO("".join("\t".join([_copy_text(row[column]) for column in columns]) + "\n"
                               for row in rows))
    cursor = conn.connection.cursor()
    try:
        cursor.copy_expert(f"COPY {table.name} ({', '.join(columns)}) FROM STDIN", data)
    finally:
        cursor.close()


def copy_table(source: Connection, target: Connection, table: sa.Table, total: int,
               batch_size: int, progress: Progress) -> Checksum:
    """Every row of ``table``, in primary key order; the source's checksum."""
    checksum = Checksum()
    mysql = target.dialect.name == "mysql"
    held: list[dict] = []
    progress.start(table.name, total)
    result = source.execution_options(stream_results=True, yield_per=batch_size).execute(_ordered(table))
    for batch in result.partitions(batch_size):
        checksum.add(batch)
        rows = [row._asdict() for row in batch]
        if mysql:
            rows = [_to_mysql(row) for row in rows]
        if table is PROVIDERS:
            held += _hold_forward_links(rows)
        insert_rows(target, table, rows)
        progress.advance(len(rows))
    if held:
        _link_providers(target, held)
    progress.finish()
    return checksum


def _set_versions(conn: Connection, placement: str | None, allotment: str | None) -> None:
    """The target's version rows as the source's (``allotment_version`` empty when the
    source was never served by Allotment, as ``allotment db sync`` then finds it)."""
    conn.execute(sa.delete(_PLACEMENT_VERSION))
    conn.execute(sa.insert(_PLACEMENT_VERSION).values(version_num=placement))
    conn.execute(sa.delete(_ALLOTMENT_VERSION))
    if allotment is not None:
        conn.execute(sa.insert(_ALLOTMENT_VERSION).values(version_num=allotment))


@contextlib.contextmanager
def _explicit_ids(conn: Connection) -> Iterator[None]:
    """MySQL/MariaDB: store id 0 (VCPU's) as given instead of taking the next one."""
    if conn.dialect.name == "mysql":
        conn.exec_driver_sql("SET SESSION sql_mode = "
                             "CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'NO_AUTO_VALUE_ON_ZERO')")
    yield


def copy(source_url: str, target_url: str, *, batch_size: int = DEFAULT_BATCH_SIZE,
         progress: Progress | None = None) -> Outcome:
    """Copy the source into the empty target and verify it; :class:`CopyError` when refused.

    A verification that fails rolls the copy back and returns the outcome
    (``ok`` False) with the target left as it was.
    """
    if batch_size < 1:
        raise CopyError("the batch size must be a positive number of rows")
    progress = progress or _Silent()
    source_engine = open_engine(source_url, "source", reading=True)
    target_engine = open_engine(target_url, "target", reading=False)
    try:
        if _same_database(source_engine.url, target_engine.url):
            raise CopyError("the source and the target are the same database")
        with _connected(source_engine, "source") as src, snapshot(src) as src:
            source_versions = check_source(src)
            totals = {table.name: src.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
                      for table in COPIED}
            with _connected(target_engine, "target") as tgt:
                tgt = tgt.execution_options(allotment_write=True)
                transaction = tgt.begin()
                try:
                    check_target(tgt)
                    with _explicit_ids(tgt):
                        migrate.create_in(tgt)
                        sums = {table.name: copy_table(src, tgt, table, totals[table.name], batch_size,
                                                       progress)
                                for table in COPIED}
                    _set_versions(tgt, *source_versions)
                    reference_layout.restart_id_sequences(tgt)
                    outcome = Outcome(
                        [_check(table.name, sums[table.name],
                                table_checksum(tgt, table, batch_size, progress, totals[table.name]))
                         for table in COPIED], source_versions, versions(tgt))
                    if outcome.ok:
                        transaction.commit()
                    else:
                        transaction.rollback()
                    return outcome
                finally:
                    if transaction.is_active:
                        transaction.rollback()
    except reference_layout.SchemaNotReady as error:
        raise CopyError(f"the target cannot be laid out: {error}") from None
    finally:
        source_engine.dispose()
        target_engine.dispose()


def _same_database(one: sa.engine.URL, other: sa.engine.URL) -> bool:
    if one.get_backend_name() == other.get_backend_name() == "sqlite":
        return os.path.realpath(one.database) == os.path.realpath(other.database)
    return one.set(drivername=one.get_backend_name()) == other.set(drivername=other.get_backend_name())


def _check(table: str, source: Checksum, target: Checksum) -> TableCheck:
    return TableCheck(table, source.rows, source.hexdigest(), target.rows, target.hexdigest())


def verify(source_url: str, target_url: str, *, batch_size: int = DEFAULT_BATCH_SIZE) -> Outcome:
    """Compare a finished copy with its source (each read in one snapshot); changes nothing."""
    source_engine = open_engine(source_url, "source", reading=True)
    target_engine = open_engine(target_url, "target", reading=True)
    try:
        with _connected(source_engine, "source") as src, snapshot(src) as src, \
                _connected(target_engine, "target") as tgt, snapshot(tgt) as tgt:
            source_versions = check_source(src)
            present = set(sa.inspect(tgt).get_table_names())
            missing = [table.name for table in COPIED if table.name not in present]
            if missing:
                raise CopyError(f"the target has no {', '.join(missing)} table: not a copy of a "
                                "Placement database")
            return Outcome([_check(table.name, table_checksum(src, table, batch_size),
                                   table_checksum(tgt, table, batch_size)) for table in COPIED],
                           source_versions, versions(tgt))
    finally:
        source_engine.dispose()
        target_engine.dispose()
