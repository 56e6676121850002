"""A change number for what allocation candidates read, kept by the database.

Answers of ``GET /allocation_candidates`` may be reused by a process only
while nothing they were computed from has changed, whoever changed it: this
process, another Allotment process or host, a reference Placement process
during a switch, or hand-written SQL.  So the number is not kept by
Allotment's code but by triggers on every table a candidate depends on
(:data:`TRACKED`), created by Allotment's migration 0003; every committed
transaction that writes one of them makes the number grow, in that same
transaction, whoever wrote.

:func:`read_number` reads it.  Read first in a request's read transaction
(or, on PostgreSQL, in a statement before any data is read), equal numbers
at two reads mean that no write to those tables committed between them:
an answer computed after the first read is then what a fresh read at the
second would give.

* **SQLite**: one row, ``allotment_changes.n``, is increased by row
  triggers.  SQLite runs one write transaction at a time anyway, so this
  row serialises nothing that was not serial already.  A reader's
  transaction sees the row as of its snapshot, like the data.  The same
  triggers (migration 0004) also note, in ``allotment_provider_changes``,
  which provider each written row belongs to, with the counter's value
  after the write: the providers changed since number *m* are those noted
  above *m* (:func:`changed_providers`), which is how a process keeps its
  mirror of every provider current (:mod:`allotment.db.provider_mirror`).
  A write to a table of names that is not an insert (a class renamed, a
  trait or aggregate deleted) is noted as provider 0: everything.  A
  second row of the counter table holds a random token chosen when the
  table is made, folded into the number, so that numbers from before the
  table was made again (by a migration) never equal later ones.
* **PostgreSQL**: a single counter row would make every writer wait for
  the previous one to commit (and could deadlock writers that lock
  providers in different orders), so writers never update a shared row:
  a statement trigger inserts the writing transaction's id into
  ``allotment_change_log`` (one row per transaction, ``ON CONFLICT DO
  NOTHING``; different transactions never touch the same row).  The
  number is ``allotment_changes.n + count(allotment_change_log)``, read in
  one statement (one snapshot): a transaction's row becomes visible exactly
  when its data does, whatever order ids were handed out in, so the number
  grows by one at each such commit.  :func:`compact` moves the log's rows
  into ``n`` in one transaction (the number stays the same at its commit)
  so that counting stays cheap.  The triggers are ``ENABLE ALWAYS``: they
  fire under ``session_replication_role = replica`` too.
* **MySQL / MariaDB**: no triggers; :func:`read_number` gives None and
  nothing is reused.

Whether the triggers are all there is checked in the same statement (a
dropped or disabled trigger, e.g. after a table was rebuilt, turns reuse
off rather than leaving a write unseen).

**Which database**: a number means something only for the database it
was read from.  Each number carries, above its count (``identity <<
TOKEN_SHIFT``), the identity of the history it belongs to: a random token
kept in the counter table (made with it, renewed by migration 0005), and
on PostgreSQL also the counter table's own oid (a restored dump makes the
table anew) and the server's start time (a point-in-time recovery or a
promoted replica is a server started since).  Numbers of two histories are
never equal (:func:`same_history`), and within one history a number read
later that is smaller than one read earlier means the database went back
in time (a restored backup): :func:`went_back` tells both, and the mirror
of every provider (:mod:`allotment.db.provider_mirror`) reads everything
again when it sees either.  (A restored SQLite file keeps its token: it is
seen going back when a read sees its smaller number, that is unless as
many writes as were lost have been made before any read.)
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows
from allotment.db.engine import execute_prepared

#: Tables whose rows decide a candidate answer: providers (trees,
#: generations), inventories, usage, trait and aggregate memberships and
#: the names they refer to.
TRACKED = ("resource_providers", "inventories", "allocations", "resource_provider_traits",
           "resource_provider_aggregates", "placement_aggregates", "traits", "resource_classes")

COUNTER = "allotment_changes"
LOG = "allotment_change_log"
#: Provider id -> the counter's value after its last write (SQLite), or
#: after the compaction that folded its last noted write (PostgreSQL).
PROVIDER_CHANGES = "allotment_provider_changes"
#: PostgreSQL: (writing transaction, provider) of the writes not yet folded.
PROVIDER_LOG = "allotment_provider_log"
#: PostgreSQL: the functions of the triggers that note providers.
PG_NOTE_PREFIX = "allotment_note_"
#: The column naming the provider in each tracked table of provider rows;
#: the others are tables of names.
PROVIDER_COLUMN = {"resource_providers": "id", "inventories": "resource_provider_id",
                   "allocations": "resource_provider_id", "resource_provider_traits": "resource_provider_id",
                   "resource_provider_aggregates": "resource_provider_id"}
#: A noted "provider" 0: something every provider may depend on changed.
EVERYTHING = 0
#: The token is kept in the counter table's row of this id.
_TOKEN_ROW = 2
#: Numbers are identity * 2**TOKEN_SHIFT + the count.
TOKEN_SHIFT = 64
_COUNT_MASK = (1 << TOKEN_SHIFT) - 1
TRIGGER_PREFIX = "allotment_chg_"
PG_FUNCTION = "allotment_note_change"
#: Backends on which the triggers are made.
BACKENDS = ("sqlite", "postgresql")
#: Backends whose triggers note the providers each write changed.
NOTING_BACKENDS = ("sqlite", "postgresql")
#: Compact the PostgreSQL log once it holds this many rows.
COMPACT_AT = 256


def _sqlite_triggers() -> list[tuple[str, str, str]]:
    """(trigger name, table, event) of every SQLite trigger."""
    return [(f"{TRIGGER_PREFIX}{table}_{event.lower()}", table, event)
            for table in TRACKED for event in ("INSERT", "UPDATE", "DELETE")]


#: Notes a provider with the counter's new value (the counter row is
#: updated first in the same trigger).
_SQLITE_NOTE = (f"INSERT INTO {PROVIDER_CHANGES} (provider_id, n) SELECT {{provider}}, n FROM {COUNTER} "
                f"WHERE id = 1 ON CONFLICT (provider_id) DO UPDATE SET n = excluded.n")


def _noted_providers(table: str, event: str) -> list[str]:
    """What a SQLite trigger notes: the provider of the old and new row, or
    everything for a change to a table of names (a new name changes no
    provider: only rows that use it do)."""
    column = PROVIDER_COLUMN.get(table)
    if column is None:
        return [] if event == "INSERT" else [str(EVERYTHING)]
    return {"INSERT": [f"NEW.{column}"], "DELETE": [f"OLD.{column}"],
            "UPDATE": [f"OLD.{column}", f"NEW.{column}"]}[event]


def create(conn: Connection, *, note_providers: bool = True) -> None:
    """Make the counter and the triggers (migrations 0003 and 0004),
    replacing any left from an earlier take-over (a database handed back
    to the reference keeps them; its allotment_version may not say so).
    ``note_providers=False``: on SQLite, without the provider notes of
    0004 (its downgrade)."""
    backend = conn.dialect.name
    if backend not in BACKENDS:
        return
    drop(conn)
    conn.exec_driver_sql(f"CREATE TABLE {COUNTER} (id INTEGER NOT NULL PRIMARY KEY, n BIGINT NOT NULL)")
    conn.exec_driver_sql(f"INSERT INTO {COUNTER} (id, n) VALUES (1, 0)")
    new_identity(conn)
    if backend == "sqlite":
        if note_providers:
            conn.exec_driver_sql(f"CREATE TABLE {PROVIDER_CHANGES} "
                                 f"(provider_id INTEGER NOT NULL PRIMARY KEY, n BIGINT NOT NULL)")
            conn.exec_driver_sql(f"CREATE INDEX {PROVIDER_CHANGES}_n ON {PROVIDER_CHANGES} (n)")
        for name, table, event in _sqlite_triggers():
            noted = "".join(f"{_SQLITE_NOTE.format(provider=provider)}; "
                            for provider in (_noted_providers(table, event) if note_providers else ()))
            conn.exec_driver_sql(f"CREATE TRIGGER {name} AFTER {event} ON {table} "
                                 f"BEGIN UPDATE {COUNTER} SET n = n + 1 WHERE id = 1; {noted}END")
        return
    conn.exec_driver_sql(f"CREATE TABLE {LOG} (txid BIGINT NOT NULL PRIMARY KEY)")
    conn.exec_driver_sql(
        f"CREATE FUNCTION {PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"INSERT INTO {LOG} (txid) VALUES (txid_current()) ON CONFLICT DO NOTHING; "
        f"RETURN NULL; END $$")
    for table in TRACKED:
        name = TRIGGER_PREFIX + table
        conn.exec_driver_sql(f"CREATE TRIGGER {name} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
                             f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {PG_FUNCTION}()")
        conn.exec_driver_sql(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}")
    if not note_providers:
        return
    conn.exec_driver_sql(f"CREATE TABLE {PROVIDER_LOG} (txid BIGINT NOT NULL, provider_id BIGINT NOT NULL, "
                         f"PRIMARY KEY (txid, provider_id))")
    conn.exec_driver_sql(f"CREATE TABLE {PROVIDER_CHANGES} "
                         f"(provider_id BIGINT NOT NULL PRIMARY KEY, n BIGINT NOT NULL)")
    conn.exec_driver_sql(f"CREATE INDEX {PROVIDER_CHANGES}_n ON {PROVIDER_CHANGES} (n)")
    for table in TRACKED:
        function = PG_NOTE_PREFIX + table
        column = PROVIDER_COLUMN.get(table)
        if column is None:  # a table of names: everything, unless a name was added
            conn.exec_driver_sql(
                f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"{_PG_NOTE.format(rows=f'(SELECT {EVERYTHING}) AS everything (p)', column='p')} "
                f"RETURN NULL; END $$")
            _pg_note_trigger(conn, table, "UPDATE OR DELETE OR TRUNCATE", "", function)
            continue
        # Statement triggers with transition tables: one statement per write
        # statement, however many rows it wrote.
        conn.exec_driver_sql(
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF TG_OP IN ('INSERT', 'UPDATE') THEN {_PG_NOTE.format(rows='new_rows', column=column)} END IF; "
            f"IF TG_OP IN ('DELETE', 'UPDATE') THEN {_PG_NOTE.format(rows='old_rows', column=column)} END IF; "
            f"IF TG_OP = 'TRUNCATE' THEN "
            f"{_PG_NOTE.format(rows=f'(SELECT {EVERYTHING}) AS everything (p)', column='p')} END IF; "
            f"RETURN NULL; END $$")
        for event, transition in _PG_TRANSITIONS:
            _pg_note_trigger(conn, table, event, transition, function)


def new_identity(conn: Connection) -> None:
    """Give the counter table a new random token: numbers read from now on
    belong to a new history (see the module doc)."""
    if conn.dialect.name not in BACKENDS:
        return
    token = secrets.randbits(62) + 1
    if not conn.exec_driver_sql(f"UPDATE {COUNTER} SET n = {token} WHERE id = {_TOKEN_ROW}").rowcount:
        conn.exec_driver_sql(f"INSERT INTO {COUNTER} (id, n) VALUES ({_TOKEN_ROW}, {token})")


def same_history(first: int, second: int) -> bool:
    """Whether two numbers were read from the same database (history)."""
    return first >> TOKEN_SHIFT == second >> TOKEN_SHIFT


def went_back(kept: int, now: int) -> str | None:
    """Why ``now``, read after ``kept`` was, cannot follow it (None: it can):
    the database is not the one ``kept`` was read from, or it went back."""
    if not same_history(kept, now):
        return "the database is not the one read before (its identity changed)"
    if now < kept:
        return (f"the database went back in time (change number {now & _COUNT_MASK}, "
                f"after {kept & _COUNT_MASK})")
    return None


#: (event, transition tables) of the PostgreSQL triggers that note providers.
_PG_TRANSITIONS = (("INSERT", "REFERENCING NEW TABLE AS new_rows"),
                   ("UPDATE", "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                   ("DELETE", "REFERENCING OLD TABLE AS old_rows"),
                   ("TRUNCATE", ""))
_PG_NOTE = (f"INSERT INTO {PROVIDER_LOG} (txid, provider_id) SELECT DISTINCT txid_current(), {{column}} "
            f"FROM {{rows}} ON CONFLICT DO NOTHING;")


def _pg_note_triggers() -> list[tuple[str, str]]:
    """(trigger name, table) of every PostgreSQL trigger that notes providers."""
    found = []
    for table in TRACKED:
        events = [event for event, _ in _PG_TRANSITIONS] if table in PROVIDER_COLUMN else ["NAMES"]
        found += [(f"{TRIGGER_PREFIX}note_{table}_{event.lower()}", table) for event in events]
    return found


def _pg_note_trigger(conn: Connection, table: str, event: str, transition: str, function: str) -> None:
    suffix = "names" if " OR " in event else event.lower()
    name = f"{TRIGGER_PREFIX}note_{table}_{suffix}"
    conn.exec_driver_sql(f"CREATE TRIGGER {name} AFTER {event} ON {table} {transition} "
                         f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()")
    conn.exec_driver_sql(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}")


def drop(conn: Connection) -> None:
    """Undo :func:`create`."""
    backend = conn.dialect.name
    if backend == "sqlite":
        for name, _, _ in _sqlite_triggers():
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PROVIDER_CHANGES}")
    elif backend == "postgresql":
        for table in TRACKED:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {TRIGGER_PREFIX}{table} ON {table}")
        for name, table in _pg_note_triggers():
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        for table in TRACKED:
            conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {PG_NOTE_PREFIX}{table}()")
        conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {PG_FUNCTION}()")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {LOG}")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PROVIDER_LOG}")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PROVIDER_CHANGES}")
    else:
        return
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {COUNTER}")


_SQLITE_NUMBER = sa.text(
    f"SELECT (SELECT n FROM {COUNTER} WHERE id = 1), "
    f"(SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE '{TRIGGER_PREFIX}%'), "
    f"(SELECT n FROM {COUNTER} WHERE id = {_TOKEN_ROW})")
#: PostgreSQL: how many of our triggers are there and enabled.
_PG_TRIGGERS = (f"(SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgname LIKE '{TRIGGER_PREFIX}%' "
                f"AND tgenabled = 'A')")
#: PostgreSQL: what the identity is made of (the token, the counter table's
#: oid, the server's start time in microseconds).
_PG_IDENTITY = (f"(SELECT n FROM {COUNTER} WHERE id = {_TOKEN_ROW}), "
                f"(SELECT tableoid::bigint FROM {COUNTER} WHERE id = 1), "
                f"(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint")
#: PostgreSQL: the number, the triggers, the log's length and the identity.
#: The log is counted once: a count reads every row the log's churn left
#: behind since the table was last vacuumed (a race of 6,400 claims left
#: 5,700), and its second count cost a GET 0.04-0.07 ms of the server's
#: time with 3,200 of them (pgbench, prepared, one client).
_PG_NUMBER = sa.text(
    f"SELECT (SELECT n FROM {COUNTER} WHERE id = 1) + counted.logged, "
    f"{_PG_TRIGGERS}, counted.logged, {_PG_IDENTITY} FROM (SELECT count(*) AS logged FROM {LOG}) AS counted")
_PG_NUMBER_SQL = _PG_NUMBER.text
_SQLITE_NUMBER_SQL = _SQLITE_NUMBER.text
_EXPECTED = {"sqlite": len(TRACKED) * 3, "postgresql": len(TRACKED) + len(_pg_note_triggers())}


def read_number(conn: Connection) -> tuple[int | None, bool]:
    """(the change number, or None when it cannot be trusted here; whether
    :func:`compact` is due).  Call it before reading any data with ``conn``."""
    backend = conn.dialect.name
    if backend not in BACKENDS:
        return None, False
    try:
        if backend == "sqlite":
            # On the DBAPI cursor: SQLAlchemy's per-statement work cost more
            # than SQLite's own (same connection, same transaction).
            cursor = conn.connection.cursor()
            try:
                cursor.execute(_SQLITE_NUMBER_SQL)
                number, triggers, token = cursor.fetchone()
            finally:
                cursor.close()
            number, logged = _with_token(number, token), 0
        else:
            number, triggers, logged, *identity = _pg_number(conn.connection)
            number = _with_token(number, _pg_identity(*identity))
    except (sa.exc.DBAPIError, conn.dialect.loaded_dbapi.Error):  # not migrated yet: a read
        return None, False                                          # without a transaction to spoil
    return _number(backend, number, triggers, logged)


def _pg_number(proxied) -> tuple:
    """The number's statement on PostgreSQL, prepared where the engine keeps
    prepared statements (planned once per connection: about 20 us of the
    server's time, where planning it each time took 100)."""
    cursor = proxied.cursor()
    try:
        execute_prepared(proxied, cursor, _PG_NUMBER_SQL)
        return cursor.fetchone()
    finally:
        cursor.close()


def current_number(engine: sa.Engine) -> tuple[int | None, bool]:
    """:func:`read_number` in a statement of its own, on a pooled DBAPI
    connection (none of SQLAlchemy's per-statement work): what a request
    that may not need to read anything else asks first."""
    backend = engine.dialect.name
    if backend not in BACKENDS:
        return None, False
    try:
        raw = engine.raw_connection()
    except engine.dialect.dbapi.Error:  # unreachable: the request's own read says so
        return None, False
    try:
        if backend == "postgresql":
            row = _pg_number(raw)
            raw.rollback()  # end the transaction the driver opened, if it opened one
        else:
            cursor = raw.cursor()
            try:
                cursor.execute(_SQLITE_NUMBER_SQL)
                row = cursor.fetchone()
            finally:
                cursor.close()
    except engine.dialect.dbapi.Error as error:  # not migrated yet, or the database went away
        if engine.dialect.is_disconnect(error, raw.dbapi_connection, None):
            raw.invalidate()  # the pool replaces it, as it would after SQLAlchemy's own statement
        return None, False
    finally:
        raw.close()
    if backend == "postgresql":
        number, triggers, logged, *identity = row
        return _number(backend, _with_token(number, _pg_identity(*identity)), triggers, logged)
    return _number(backend, _with_token(row[0], row[2]), row[1], 0)


def _with_token(n, token):
    """The number: the count with the identity above it (None without a
    token: on SQLite a table made before migration 0004, on PostgreSQL
    before 0005)."""
    if n is None or token is None:
        return None
    return (int(token) << TOKEN_SHIFT) + int(n)


def _pg_identity(token, oid, started) -> int | None:
    """PostgreSQL's identity from its parts (62 bits)."""
    if token is None or oid is None:
        return None
    return hash((int(token), int(oid), int(started or 0))) & ((1 << 62) - 1)


@dataclasses.dataclass(frozen=True)
class PgNotes:
    """PostgreSQL: what one snapshot showed of the change number and notes."""

    #: The change number (as :func:`read_number` gives it).
    number: int
    #: The counter's value (what compactions folded in).
    folded: int
    #: The snapshot the notes were read in (``pg_current_snapshot()`` as
    #: text: which transactions it saw committed, in a few bytes however
    #: long the log is).
    snapshot: str


#: A snapshot in which no transaction is seen committed.
_NO_SNAPSHOT = "1:1:"


def _pg_notes_of(folded, triggers, logged, snapshot, identity) -> PgNotes | None:
    number, _ = _number("postgresql", None if folded is None else _with_token(
        int(folded) + int(logged), _pg_identity(*identity)), triggers, 0)
    return None if number is None else PgNotes(number, int(folded), snapshot)


#: PostgreSQL: the notes and the providers changed since earlier ones, as
#: parts of a single statement that may read other rows too, in the same
#: snapshot (a statement sees one snapshot, transaction or not): common
#: table expressions ``counted`` (the counter and the log's length) and
#: ``changed`` (the ids of the providers written by the transactions that
#: committed after the notes whose folded count is the parameter
#: ``{folded}`` and whose snapshot was ``{snapshot}``; :data:`EVERYTHING`
#: among them when a table of names was; an id once for each note of it,
#: so possibly more than once).  Such a transaction is either still in the
#: provider log and was not seen committed by the earlier snapshot, or a
#: compaction that committed since folded it, and then noted its providers
#: above the earlier folded count.  (The earlier snapshot stands for the
#: transactions of the log it saw: passing their ids instead cost 0.35 ms
#: of the client's CPU to write out 360 of them, and the server as much to
#: read and compare them.)  Neither log is read when the count has not
#: moved from the earlier number's (``{count}``): nothing committed since
#: (a compaction keeps the count).  A transaction older than the earlier
#: snapshot's oldest running one was seen ended there, so the provider log
#: is read from that one on (its key's range): with 318 rows in the log,
#: the notes alone took 0.24-0.30 ms a statement instead of 0.38-0.39
#: (pgbench, prepared, one client) ...
PG_CHANGED_SINCE = (f"counted AS MATERIALIZED (SELECT (SELECT n FROM {COUNTER} WHERE id = 1) AS folded, "
                    f"(SELECT count(*) FROM {LOG}) AS logged), "
                    f"changed AS MATERIALIZED (SELECT provider_id FROM {PROVIDER_LOG} "
                    f"WHERE (SELECT folded + logged <> {{count}} FROM counted) "
                    f"AND txid >= pg_snapshot_xmin({{snapshot}}::pg_snapshot)::text::bigint "
                    f"AND NOT pg_visible_in_snapshot(txid::text::xid8, {{snapshot}}::pg_snapshot) "
                    f"UNION ALL SELECT provider_id FROM {PROVIDER_CHANGES} "
                    f"WHERE (SELECT folded + logged <> {{count}} FROM counted) AND n > {{folded}})")
#: ... and the notes' columns (:data:`PG_NOTES_WIDTH` of them, first in the
#: statement's row), which :func:`pg_notes_in` reads.
PG_NOTES_COLUMNS = (f"(SELECT folded FROM counted), {_PG_TRIGGERS}, (SELECT logged FROM counted), "
                    f"pg_current_snapshot()::text, ARRAY(SELECT provider_id FROM changed), {_PG_IDENTITY}")
PG_NOTES_WIDTH = 8


def pg_since(since: PgNotes | None) -> dict:
    """The parameters of :data:`PG_CHANGED_SINCE` for notes read before
    (None: none were)."""
    if since is None:
        return {"folded": -1, "snapshot": _NO_SNAPSHOT, "count": -1}
    return {"folded": since.folded, "snapshot": since.snapshot, "count": since.number & _COUNT_MASK}


def pg_notes_in(row, since: PgNotes | None) -> tuple[PgNotes | None, set[int] | None]:
    """:func:`pg_notes`' answer from the first :data:`PG_NOTES_WIDTH`
    columns of a statement made with :data:`PG_CHANGED_SINCE` and
    :data:`PG_NOTES_COLUMNS` for ``since``."""
    folded, triggers, logged, snapshot, changed, *identity = row[:PG_NOTES_WIDTH]
    notes = _pg_notes_of(folded, triggers, logged, snapshot, identity)
    if notes is None:
        return None, None
    if since is None or went_back(since.number, notes.number):
        return notes, None
    return notes, {int(pid) for pid in changed}


#: The notes alone (with pyformat parameters: the columns' % escaped).
_PG_NOTES = ("WITH " + PG_CHANGED_SINCE.format(folded="%(folded)s", snapshot="%(snapshot)s", count="%(count)s")
             + " SELECT " + PG_NOTES_COLUMNS.replace("%", "%%"))


def pg_notes(conn: Connection, since: PgNotes | None) -> tuple[PgNotes | None, set[int] | None]:
    """PostgreSQL, in one snapshot (``conn``'s REPEATABLE READ transaction):
    (the notes now, or None when they cannot be trusted; the providers
    written by the transactions that committed after ``since`` was read,
    :data:`EVERYTHING` among them when a table of names was; None without
    ``since``): :data:`PG_CHANGED_SINCE`'s rule."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(_PG_NOTES, pg_since(since))
        row = cursor.fetchone()
    finally:
        cursor.close()
    return pg_notes_in(row, since)


#: PostgreSQL: columns a write statement adds to tell the change number it
#: began from, its own transaction not counted (the log holds the writing
#: transaction's id from its first tracked statement on, and the later
#: statements see it): the count, then the identity's parts.
PG_BEGAN_FROM_COLUMNS = (
    f"(SELECT n FROM {COUNTER} WHERE id = 1) + (SELECT count(*) FROM {LOG}) "
    f"- (SELECT count(*) FROM {LOG} WHERE txid = txid_current())",  # its own: by the key, not row by row
    f"(SELECT n FROM {COUNTER} WHERE id = {_TOKEN_ROW})",
    f"(SELECT tableoid::bigint FROM {COUNTER} WHERE id = 1)",
    "(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint")


def pg_began_from(count, token, oid, started) -> int | None:
    """The change number of :data:`PG_BEGAN_FROM_COLUMNS`' values (None
    where the counter table lacks its token)."""
    return _with_token(count, _pg_identity(token, oid, started))


@dataclasses.dataclass(frozen=True)
class OwnWrite:
    """A write this process committed, whose whole effect on the providers
    it knows: what a mirror needs to follow it without reading them again.

    ``number``: the change number the write began from.  On PostgreSQL,
    what the write's last statement saw, without the write
    (:func:`pg_began_from`): the write commits after that statement began,
    so it is at least the ``number + 1``-th commit, and a read that knew of
    it before it found the number at ``number + 1`` knows it to be exactly
    that (see :meth:`allotment.db.provider_mirror.ProviderMirror.wrote`).  On
    SQLite, which runs one write transaction at a time, the number read in
    the write's transaction before it wrote.  ``after``: the number the
    write left (PostgreSQL: ``number + 1``; SQLite: read after its writes,
    since each row written counts).
    ``generations``: provider id -> the generation the write gave it.
    ``records``: (provider id, class id) -> the inventory record as that
    statement read it with the write's own usage added (provider id, class
    id, total, reserved, min_unit, max_unit, step_size, allocation_ratio,
    used), for every (provider, class) whose usage it changed.  Nothing
    else of a provider changed, and the write swapped the generation of
    every provider in ``records`` (a mirror follows no write that did not:
    a later write's swap is what orders two writes to one provider)."""

    number: int
    generations: Mapping[int, int]
    records: Mapping[tuple[int, int], tuple]
    after: int


_CHANGED = (sa.select(sa.column("provider_id")).select_from(sa.table(PROVIDER_CHANGES))
            .where(sa.column("n") > sa.bindparam("n")))


def changed_providers(conn: Connection, since: int, now: int) -> set[int] | None:
    """SQLite: ids of the providers written between the numbers ``since``
    and ``now`` (both read by :func:`read_number`, ``now`` in ``conn``'s
    transaction), :data:`EVERYTHING` among them when a table of names was;
    None when the two numbers are not of the same table (it was made
    again: everything may have changed)."""
    if not same_history(since, now):
        return None
    return {row[0] for row in raw_rows.rows(conn, _CHANGED, {"n": since & _COUNT_MASK})}


def _number(backend: str, number, triggers, logged) -> tuple[int | None, bool]:
    if number is None or triggers != _EXPECTED[backend]:
        return None, False
    return int(number), logged >= COMPACT_AT


#: The log folded into the counter and the noted providers into
#: PROVIDER_CHANGES with the counter's new value, in one statement (one
#: snapshot: a transaction's rows in both logs are moved together).
_PG_COMPACT = sa.text(
    f"WITH gone AS (DELETE FROM {LOG} RETURNING 1), "
    f"moved AS (DELETE FROM {PROVIDER_LOG} RETURNING provider_id), "
    f"counted AS (UPDATE {COUNTER} SET n = n + (SELECT count(*) FROM gone) WHERE id = 1 RETURNING n) "
    f"INSERT INTO {PROVIDER_CHANGES} (provider_id, n) "
    f"SELECT DISTINCT provider_id, (SELECT n FROM counted) FROM moved "
    f"ON CONFLICT (provider_id) DO UPDATE SET n = excluded.n")


def compact(conn: Connection) -> None:
    """Fold the PostgreSQL log into the counter, in one write transaction
    (``conn`` is in one): the number is the same before and after its
    commit.  Only one process at a time does it; others skip."""
    if conn.dialect.name != "postgresql":
        return
    if conn.execute(sa.text("SELECT pg_try_advisory_xact_lock(hashtext(:name))"),
                    {"name": LOG}).scalar():
        conn.execute(_PG_COMPACT)
