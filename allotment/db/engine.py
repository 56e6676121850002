"""Connections and transactions, the same way on every backend.

Correctness under concurrency rests on two rules (DESIGN.md):

* every write runs in one transaction that bumps the generation of each
  provider or consumer it changes with a compare-and-swap; losing the swap
  raises ``ConcurrentUpdate`` and the transaction rolls back;
* deadlocks, serialization failures and SQLite's ``database is locked`` are
  transient: the whole transaction is re-run a bounded number of times.

SQLite gets WAL (readers never wait for the writer), foreign keys, a busy
timeout, and ``BEGIN IMMEDIATE`` for write transactions: taking the write
lock up front means two processes never both read and then fail to upgrade,
which is what makes other servers answer ``500 database is locked``.

PostgreSQL connections stay in the driver's autocommit mode, and a
transaction's ``BEGIN`` / ``COMMIT`` / ``ROLLBACK`` are sent by us
(:func:`_setup_postgresql`): reads then need no transaction at all, and no
connection is switched between modes per request (each switch cost psycopg2
a ``SET default_transaction_isolation`` round trip).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import logging
import random
import re
import time
from typing import Callable, Iterator, TypeVar

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import Connection, Engine

LOG = logging.getLogger(__name__)
T = TypeVar("T")

# How often a transaction that hit a deadlock / lock timeout is re-run.
TRANSIENT_RETRIES = 20
#: How often a write transaction whose connection was lost before COMMIT is
#: run again on a new connection.
RECONNECTS = 1
SQLITE_BUSY_TIMEOUT_MS = 60_000
#: A pooled server connection idle longer than this is pinged before use.
IDLE_PING_SECONDS = 10.0
_LAST_USED = "allotment_last_used"


def utcnow() -> datetime.datetime:
    """Naive UTC timestamp, as stored in created_at / updated_at."""
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None, microsecond=0)


def normalize_url(url: str) -> sa.engine.URL:
    """Accept the URLs operators already have and pick a driver we ship.

    A bare ``postgresql://`` means psycopg 3 to SQLAlchemy 2.1 and a bare
    ``mysql://`` means mysqlclient; we ship psycopg2 and PyMySQL, so map to
    them unless the URL names a driver explicitly.
    """
    parsed = sa.engine.make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    elif parsed.drivername == "mysql":
        parsed = parsed.set(drivername="mysql+pymysql")
    if parsed.get_backend_name() == "mysql" and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed


def create_engine(url: str, *, pool_size: int = 5, max_overflow: int = 50,
                  pool_timeout: int | None = None, recycle: int = 3600,
                  sqlite_synchronous: bool = True, mysql_sql_mode: str | None = "TRADITIONAL",
                  mysql_wsrep_sync_wait: int | None = None, echo: bool = False, sqlite_wal: bool = True,
                  pg_autocommit: bool = False, pg_prepare: bool = True) -> Engine:
    """``sqlite_wal=False`` leaves a SQLite file's journal mode as it is (a copy's source).
    ``pg_autocommit``: PostgreSQL (psycopg2) transactions are sent by us on
    connections the driver keeps in autocommit (:func:`_setup_postgresql`;
    not for server-side cursors, which psycopg2 refuses there); with
    ``pg_prepare`` (the default) such an engine also keeps server-side
    prepared statements (:func:`_prepare_statements`)."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    kwargs: dict = {"future": True, "echo": echo}
    if backend == "sqlite":
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        if parsed.database in (None, "", ":memory:"):
            kwargs["poolclass"] = sa.pool.StaticPool
    else:
        # The connection returned last is handed out first: when fewer
        # requests run than the pool holds, they keep the same database
        # sessions busy, whose caches (the server's and the CPU's) are warm,
        # instead of each session in turn.  Measured on PostgreSQL, one
        # client claiming in a loop against a worker (tools/scalebench
        # --claim-clients 1, four runs, either first): database CPU per
        # claim 0.68-0.85x.  Sessions left idle are pinged before use
        # (_ping_idle_connections).
        kwargs.update(pool_size=pool_size, max_overflow=max_overflow, pool_recycle=recycle, pool_use_lifo=True)
        if pool_timeout is not None:
            kwargs["pool_timeout"] = pool_timeout
    if pg_autocommit and backend == "postgresql" and parsed.get_driver_name() == "psycopg2":
        kwargs["isolation_level"] = "AUTOCOMMIT"
    engine = sa.create_engine(parsed, **kwargs)
    if backend == "sqlite":
        _setup_sqlite(engine, sqlite_synchronous, sqlite_wal)
    else:
        _ping_idle_connections(engine)
        if kwargs.get("isolation_level") == "AUTOCOMMIT":
            _setup_postgresql(engine, pg_prepare)
        if backend == "mysql" and (mysql_sql_mode or mysql_wsrep_sync_wait is not None):
            _setup_mysql(engine, mysql_sql_mode, mysql_wsrep_sync_wait)
    return engine


def _ping_idle_connections(engine: Engine) -> None:
    """Check a pooled connection before use when it has been idle a while.

    A server restart, a failover or a firewall dropping idle sessions
    leaves dead connections in the pool; a ping on checkout finds them and
    the pool replaces them.  SQLAlchemy's ``pool_pre_ping`` pings on every
    checkout, a round trip per request that costs a busy server a good
    share of its time; a connection that was in use less than
    :data:`IDLE_PING_SECONDS` ago is trusted instead.  (If the database
    dies in between, the request fails, the pool drops every connection
    made before that, and the next request gets a fresh one.)
    """
    dialect = engine.dialect

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, record, _proxy):
        last_used = record.info.get(_LAST_USED)
        if last_used is None or time.monotonic() - last_used < IDLE_PING_SECONDS:
            return
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as error:
            if dialect.is_disconnect(error, dbapi_conn, None):
                raise exc.DisconnectionError(f"idle connection was closed: {error}") from error
            raise

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn, record):
        record.info[_LAST_USED] = time.monotonic()


def _setup_sqlite(engine: Engine, synchronous: bool, wal: bool = True) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised by every test
        # Let SQLAlchemy, not pysqlite, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if wal:
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
            except Exception:  # read-only media or :memory: keep their mode
                pass
        cursor.execute(f"PRAGMA synchronous = {'NORMAL' if synchronous else 'OFF'}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # On the DBAPI cursor: through ``exec_driver_sql`` SQLAlchemy sets a
        # whole execution up for it (measured: a tenth of a claim's
        # in-process CPU went to its two BEGINs).  A failure (the database
        # still locked after the busy timeout) is raised as SQLAlchemy
        # would raise it, so the write's retries see it.
        statement = "BEGIN IMMEDIATE" if conn.get_execution_options().get("allotment_write") else "BEGIN"
        cursor = conn.connection.cursor()
        try:
            cursor.execute(statement)
        except engine.dialect.loaded_dbapi.Error as error:
            raise_as_sqlalchemy(conn, error, statement, (), cursor)
        finally:
            cursor.close()


def raise_as_sqlalchemy(conn: Connection, error: Exception, statement: str, values, cursor) -> None:
    """Raise ``error``, which a statement run on ``conn``'s DBAPI cursor
    raised, as ``conn.execute`` would have (SQLAlchemy's class for it; the
    connection invalidated if the error says it was lost)."""
    conn._handle_dbapi_exception(error, statement, values, cursor, None)
    raise error  # not reached: the call above raises


#: Key of a pooled connection's ``info``: its next begin sends no ``BEGIN``
#: (set by :meth:`Database.read` on PostgreSQL, where each statement of a
#: READ COMMITTED transaction has a snapshot of its own anyway).
NO_TRANSACTION = "allotment_no_transaction"
_PG_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"


#: PostgreSQL: DBAPI connections whose transaction has begun for
#: SQLAlchemy but whose ``BEGIN`` is not sent yet (:func:`_beginning_cursor`).
_BEGIN_DUE: set = set()


@functools.cache
def _beginning_cursor() -> type:
    """The psycopg2 cursor class of :func:`_setup_postgresql`'s connections:
    a transaction's ``BEGIN`` goes in the same message as its first
    statement (``BEGIN ...; <statement>``: the statement's result is the
    cursor's), one round trip fewer per write transaction, and none at all
    for a transaction that sends nothing.  Whatever runs a statement on the
    connection does so through a cursor, and every cursor the connection
    makes is of this class; a server-side (named) cursor, and the methods
    whose text cannot be prefixed, send the ``BEGIN`` alone first."""
    import psycopg2.extensions as ext

    class BeginningCursor(ext.cursor):
        def _begun(self) -> bool:
            """Send a due ``BEGIN`` alone; whether one was due."""
            connection = self.connection
            if connection not in _BEGIN_DUE:
                return False
            _BEGIN_DUE.discard(connection)
            self.execute(_PG_BEGIN)
            return True

        def execute(self, query, vars=None):
            connection = self.connection
            if connection in _BEGIN_DUE:
                if self.name is None and isinstance(query, (str, bytes)):
                    _BEGIN_DUE.discard(connection)
                    query = (_PG_BEGIN_THEN if isinstance(query, str) else _PG_BEGIN_THEN_BYTES) + query
                else:
                    self._begun()
            return super().execute(query, vars)

        def executemany(self, query, vars_list):
            self._begun()
            return super().executemany(query, vars_list)

        def callproc(self, *args, **kwargs):
            self._begun()
            return super().callproc(*args, **kwargs)

        def copy_expert(self, *args, **kwargs):
            self._begun()
            return super().copy_expert(*args, **kwargs)

        def copy_from(self, *args, **kwargs):
            self._begun()
            return super().copy_from(*args, **kwargs)

        def copy_to(self, *args, **kwargs):
            self._begun()
            return super().copy_to(*args, **kwargs)

    return BeginningCursor


_PG_BEGIN_THEN = _PG_BEGIN + "; "
_PG_BEGIN_THEN_BYTES = _PG_BEGIN_THEN.encode()


def _setup_postgresql(engine: Engine, prepare: bool = True) -> None:
    """Transactions sent by hand on connections the driver keeps in autocommit.

    SQLAlchemy still opens and closes its transactions as usual; at each
    begin it asks the dialect to ``do_begin``, which has ``BEGIN`` sent with
    the transaction's first statement (:func:`_beginning_cursor`) unless
    the pooled connection's info holds :data:`NO_TRANSACTION` (taken
    there, and dropped at check-in if a begin never came).  Commit
    and rollback look at libpq's transaction status (known without a round
    trip) and send ``COMMIT`` / ``ROLLBACK`` only when a transaction is open
    (one that sent nothing was never opened);
    the pool's rollback of a returned connection is then free.  A
    connection given another isolation level for a while (``copy`` asks for
    REPEATABLE READ) leaves autocommit until it is reset, and the driver's
    own transaction handling applies meanwhile.  (No connection event is
    listened to: one listener makes SQLAlchemy dispatch every statement's
    events, some 15 calls per write request.)
    """
    import psycopg2.extensions as ext

    dialect = engine.dialect
    idle = ext.TRANSACTION_STATUS_IDLE
    beginning = _beginning_cursor()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.cursor_factory = beginning

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_conn, record):
        record.info.pop(NO_TRANSACTION, None)
        _BEGIN_DUE.discard(dbapi_conn)

    def _send(proxied, statement: str) -> None:
        cursor = proxied.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()

    def do_begin(proxied):
        raw = proxied.dbapi_connection
        if not proxied.info.pop(NO_TRANSACTION, False) and raw.autocommit:
            if isinstance(raw.cursor_factory, type) and issubclass(raw.cursor_factory, beginning):
                _BEGIN_DUE.add(raw)  # sent with the transaction's first statement
            else:
                _send(proxied, _PG_BEGIN)

    def ender(driver_method: str, statement: str):
        def end(proxied):
            raw = proxied.dbapi_connection
            if raw in _BEGIN_DUE:  # no statement since the begin: nothing was sent, nothing to end
                _BEGIN_DUE.discard(raw)
            elif not raw.autocommit:
                getattr(raw, driver_method)()
            elif raw.info.transaction_status != idle:
                _send(proxied, statement)
        return end

    dialect.do_begin = do_begin
    dialect.do_commit = ender("commit", "COMMIT")
    dialect.do_rollback = ender("rollback", "ROLLBACK")
    if prepare:
        _prepare_statements(engine)


#: Execution option of a statement that PostgreSQL should plan once per
#: connection (see :func:`_prepare_statements`); :func:`prepared` sets it.
PREPARE = "allotment_prepare"
#: Prepared statements kept per connection (least recently used first out).
PREPARED_PER_CONNECTION = 256
_PREPARED = "allotment_prepared"
#: A pyformat placeholder (``%(name)s``) or an escaped ``%%``.
PLACEHOLDER = re.compile(r"%%|%\(([^)]+)\)s")


def prepared(statement: T) -> T:
    """``statement``, marked to be a server-side prepared statement on
    PostgreSQL.  Only for statements whose every parameter's type
    PostgreSQL can infer from where it stands (``PREPARE`` must not fail
    inside a transaction) and that run many times with one shape."""
    return statement.execution_options(**{PREPARE: True})


class _Prepared:
    """The statements prepared on one DBAPI connection."""

    __slots__ = ("names", "counter")

    def __init__(self) -> None:
        self.names: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.counter = 0


@functools.lru_cache(maxsize=4096)
def prepared_form(statement: str) -> tuple[str, str]:
    """(``statement`` with $n placeholders and no ``%%`` escapes, to
    PREPARE; the "(%(a)s, %(b)s)" arguments of its EXECUTE), kept per
    statement text: a pure function of the text."""
    numbers: dict[str, int] = {}

    def number(match: re.Match) -> str:
        if match.group(1) is None:
            return "%"
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    text = PLACEHOLDER.sub(number, statement)
    return text, "(" + ", ".join(f"%({name})s" for name in numbers) + ")"


def execute_prepared(proxied, cursor, sql: str) -> None:
    """Execute ``sql`` (no parameters) with ``cursor`` of the pooled
    connection ``proxied``, as a prepared statement where the engine keeps
    them (:func:`_prepare_statements`), plainly elsewhere."""
    execute = prepared_execute(proxied, cursor, sql, sql, "EXECUTE {name}")
    cursor.execute(sql if execute is None else execute)


def prepared_execute(proxied, cursor, key: str, prepare: str, execute: str) -> str | None:
    """``execute`` (an ``EXECUTE {name} (...)`` text) for the statement
    ``prepare`` (``$n`` placeholders, sent without parameters) prepared on
    the pooled connection ``proxied`` under ``key``, preparing it first if
    the connection has not; None where the engine prepares nothing.  The
    name is recorded once ``PREPARE`` succeeded; a caller whose ``EXECUTE``
    then fails calls :func:`forget_prepared`."""
    known: _Prepared | None = proxied.info.get(_PREPARED)
    if known is None:
        return None
    name = known.names.get(key)
    if name is None:
        name, prefix = _new_name(known)
        cursor.execute(f"{prefix}PREPARE {name} AS {prepare}")
        known.names[key] = name
    else:
        known.names.move_to_end(key)
    return execute.format(name=name)


def forget_prepared(proxied, key: str) -> None:
    """Prepare the statement kept under ``key`` afresh (a new name) next time."""
    known: _Prepared | None = proxied.info.get(_PREPARED)
    if known is not None:
        known.names.pop(key, None)


def _new_name(known: _Prepared) -> tuple[str, str]:
    """A name never used on the connection, and the ``DEALLOCATE`` to send
    first when the connection keeps as many statements as it may."""
    known.counter += 1
    prefix = ""
    if len(known.names) >= PREPARED_PER_CONNECTION:
        _, dropped = known.names.popitem(last=False)
        prefix = f"DEALLOCATE {dropped}; "
    return f"allotment_{known.counter}", prefix


def _prepare_statements(engine: Engine) -> None:
    """Statements marked :func:`prepared` are parsed and planned once per
    connection: ``PREPARE`` the first time, ``EXECUTE`` after
    (:func:`prepared_execute`, which the candidate reads and the change
    number use too: one set of names and one bound per connection).
    Planning is most of what the server spends on the short statements of
    a write (a union of a few indexed lookups: 160 us as a plain statement,
    17 us executed).

    A prepared statement outlives the transaction that made it, even one
    that fails; the name is recorded only once ``PREPARE`` succeeded, and a
    statement prepared again gets a new name, so none is ever made twice.
    psycopg2 still puts the values into the ``EXECUTE`` text, as it does
    into plain statements.  (The dialect's ``do_execute`` does it, not a
    statement event: every other statement then pays one check.)
    """

    @event.listens_for(engine, "connect")
    def _on_connect(_dbapi_conn, record):
        record.info[_PREPARED] = _Prepared()

    def do_execute(cursor, statement, parameters, context=None):
        if (context is not None and parameters and context.execution_options.get(PREPARE)
                and type(parameters) is dict):
            text, arguments = prepared_form(statement)
            execute = prepared_execute(context.root_connection.connection, cursor, statement, text,
                                       "EXECUTE {name}" + arguments)
            if execute is not None:
                statement = execute
        cursor.execute(statement, parameters)

    engine.dialect.do_execute = do_execute


def _setup_mysql(engine: Engine, sql_mode: str | None, wsrep_sync_wait: int | None = None) -> None:
    """Each new session: the SQL mode, and Galera's ``wsrep_sync_wait`` when
    ``[placement_database] mysql_wsrep_sync_wait`` sets it.

    A Galera node answers reads from what it has applied, which may be a
    moment behind what another node has already committed: a provider
    created through node 1 can be 404 right after through node 2.  With
    ``wsrep_sync_wait = 1`` each read first waits until the node has
    applied everything committed in the cluster before it (a round of
    group communication: a fraction of a millisecond on a LAN).  A server
    without the variable (MySQL, or MariaDB built without Galera) is told
    once in the log and the sessions go on without it."""
    warned = []

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        cursor = dbapi_conn.cursor()
        try:
            if sql_mode:
                cursor.execute("SET SESSION sql_mode = %s", (sql_mode,))
            if wsrep_sync_wait is not None:
                try:
                    cursor.execute("SET SESSION wsrep_sync_wait = %s", (wsrep_sync_wait,))
                except engine.dialect.loaded_dbapi.Error as error:
                    if _mysql_code(error) != _UNKNOWN_VARIABLE:
                        raise
                    if not warned:
                        warned.append(True)
                        LOG.warning("[placement_database] mysql_wsrep_sync_wait is set but the database "
                                    "server has no wsrep_sync_wait (not a Galera node): ignored")
        finally:
            cursor.close()


#: MySQL's "Unknown system variable".
_UNKNOWN_VARIABLE = 1193


def _mysql_code(error: BaseException) -> int | None:
    args = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def set_wsrep_sync_wait(conn: Connection, value: int) -> int | None:
    """Set the session's ``wsrep_sync_wait`` on a MySQL/MariaDB connection;
    returns the value it had, or None where the server has no such
    variable (then nothing is set)."""
    try:
        previous = conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar()
        conn.exec_driver_sql("SET SESSION wsrep_sync_wait = %s", (value,))
    except exc.DBAPIError as error:
        if _mysql_code(error.orig) != _UNKNOWN_VARIABLE:
            raise
        conn.rollback()
        return None
    conn.commit()
    return int(previous)


def one_line(error: BaseException) -> str:
    """The driver's message of a database error, on one line (for logs)."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip().splitlines()
    return text[0] if text else type(error).__name__


def is_transient(error: BaseException) -> bool:
    """True for errors that a re-run of the whole transaction can cure."""
    if not isinstance(error, exc.DBAPIError):
        return False
    orig = error.orig
    code = getattr(orig, "pgcode", None)
    if code in ("40001", "40P01", "55P03"):  # serialization failure, deadlock, lock not available
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in (1213, 1205, 1020):  # MySQL deadlock, lock wait
        return True
    text = str(orig).lower()
    return "database is locked" in text or "deadlock" in text or "database table is locked" in text


#: MySQL/MariaDB errors that say the server cannot be used now: cannot
#: connect (2002, 2003, 2005), connection lost or killed (2006, 2013, 2055,
#: 1927, 4031), too many connections (1040), shutting down (1053), and a
#: Galera node outside the primary component ("WSREP has not yet prepared
#: node for application use", 1047).
_MYSQL_UNREACHABLE = frozenset({1040, 1047, 1053, 1927, 2002, 2003, 2005, 2006, 2013, 2055, 4031})
#: PostgreSQL: admin or crash shutdown, starting up or in recovery, too many
#: connections (and every SQLSTATE of class 08, connection exception).
_PG_UNREACHABLE = frozenset({"57P01", "57P02", "57P03", "53300"})


def is_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot be reached (or used) at all
    now, rather than that one statement failed: the request can be answered
    503, to be tried again, instead of 500."""
    if isinstance(error, exc.DBAPIError):
        if error.connection_invalidated:
            return True
        orig = error.orig
    elif type(error).__module__.split(".")[0] in _DRIVERS:  # raised by the pool, unwrapped
        orig = error
    else:
        return False
    # PEP 249's names: the server or the link failed, not the statement.
    failed = type(orig).__name__ in ("OperationalError", "InterfaceError")
    if hasattr(orig, "pgcode"):  # psycopg2: connection failures carry no SQLSTATE
        code = orig.pgcode
        return failed and (code is None or code.startswith("08") or code in _PG_UNREACHABLE)
    code = _mysql_code(orig)
    if code is not None:
        return code in _MYSQL_UNREACHABLE
    return failed and "unable to open database file" in str(orig)


#: The drivers' modules (their errors may reach callers unwrapped from a
#: pool's connect).
_DRIVERS = frozenset({"psycopg2", "pymysql", "sqlite3"})


class CommitOutcomeUnknown(Exception):
    """The connection was lost while a transaction was being committed: the
    database may have committed it or not, and this process cannot tell."""


class Database:
    """One engine per process, created lazily so it survives a fork."""

    def __init__(self, url: str, **engine_kwargs):
        self.url = url
        self._engine_kwargs = engine_kwargs
        self._engine: Engine | None = None
        #: Told each time run_write re-runs a transaction: "transient" (a
        #: deadlock, serialization failure or lock) or "race" (an error
        #: listed in retry_on, such as a lost generation swap).  Metrics.
        self.on_retry: Callable[[str], None] | None = None
        #: Called whenever a pooled connection is found lost (the database
        #: restarted, failed over, or cannot be reached): what was read
        #: before may belong to a database that has since gone back in time.
        self.on_connection_lost: list[Callable[[], None]] = []

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            engine = create_engine(self.url, pg_autocommit=True, **self._engine_kwargs)

            @event.listens_for(engine, "invalidate")
            def _lost(_dbapi_conn, _record, _error):
                for callback in self.on_connection_lost:
                    callback()

            self._engine = engine
        return self._engine

    @property
    def backend(self) -> str:
        return normalize_url(self.url).get_backend_name()

    def dispose(self) -> None:
        """Drop pooled connections (after fork: never share sockets)."""
        if self._engine is not None:
            self._engine.dispose(close=False)
            self._engine = None

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """Reading only: one consistent snapshot where a transaction gives one.

        SQLite (WAL) and MySQL/MariaDB (REPEATABLE READ) take a snapshot at
        the first read of a transaction.  PostgreSQL at its default READ
        COMMITTED gives each statement a snapshot of its own, transaction
        or not, so reads there run without one: the same answers, two
        round trips (BEGIN, COMMIT) fewer.
        """
        with self.engine.connect() as conn:
            if self.engine.dialect.name == "postgresql":
                conn.connection.info[NO_TRANSACTION] = True
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A single write transaction (``BEGIN IMMEDIATE`` on SQLite).

        Losing the connection while the ``COMMIT`` is on its way raises
        :class:`CommitOutcomeUnknown`: the server may have committed (a
        Galera node killed after replicating the write, a network cut
        after the server received the ``COMMIT``) or not, and a caller
        must not report either.  Lost before the ``COMMIT``, nothing was
        committed and the error is raised as it is.
        """
        committing = False
        try:
            with self.engine.connect() as conn:
                conn = conn.execution_options(allotment_write=True)
                with conn.begin():
                    yield conn
                    committing = True
        except exc.DBAPIError as error:
            if committing and is_unreachable(error):
                LOG.warning("the database connection was lost during COMMIT: outcome unknown (%s)",
                            one_line(error))
                raise CommitOutcomeUnknown(str(error.orig)) from error
            raise

    def run_write(self, work: Callable[[Connection], T], *,
                  retry_on: tuple[type[BaseException], ...] = (),
                  retries: int = 0) -> T:
        """Run ``work`` in a write transaction, re-running it when that helps.

        Transient database errors are always retried (bounded); exceptions
        listed in ``retry_on`` (e.g. ``ConcurrentUpdate`` where Placement
        retries server-side) are retried ``retries`` times, then re-raised.
        """
        transient_left = TRANSIENT_RETRIES
        chosen_left = retries
        reconnect_left = RECONNECTS
        while True:
            try:
                with self.write() as conn:
                    return work(conn)
            except exc.DBAPIError as error:
                if error.connection_invalidated and reconnect_left > 0:
                    # Lost before COMMIT (write() tells the other case):
                    # nothing was committed, and a new connection may reach
                    # the database (a pooled one left by a restarted server,
                    # another node behind a load balancer).
                    reconnect_left -= 1
                    LOG.info("database connection lost, trying once more: %s", one_line(error))
                    continue
                if not is_transient(error) or transient_left <= 0:
                    raise
                transient_left -= 1
                LOG.debug("transient database error, retrying: %s", error.orig)
                reason = "transient"
            except retry_on:
                if chosen_left <= 0:
                    raise
                chosen_left -= 1
                reason = "race"
            if self.on_retry is not None:
                self.on_retry(reason)
            time.sleep(random.uniform(0.001, 0.02))


def database_from_config(conf) -> Database:
    """The database of ``[placement_database]`` in a loaded ``placement.conf``."""
    from allotment import config

    db_conf = conf.placement_database
    url = db_conf.connection
    if db_conf.connection_parameters:
        url += ("&" if "?" in url else "?") + db_conf.connection_parameters
    return Database(
        url,
        pool_size=_or(db_conf.max_pool_size, config.POOL_SIZE),
        max_overflow=_or(db_conf.max_overflow, config.MAX_OVERFLOW),
        pool_timeout=db_conf.pool_timeout, recycle=db_conf.connection_recycle_time,
        sqlite_synchronous=db_conf.sqlite_synchronous, mysql_sql_mode=db_conf.mysql_sql_mode,
        mysql_wsrep_sync_wait=db_conf.mysql_wsrep_sync_wait,
        echo=db_conf.connection_debug >= 50,
        pg_prepare=_allotment_option(conf, "pg_prepared_statements", True),
    )


def _or(value, default):
    """``value``, or ``default`` where ``placement.conf`` leaves it unset."""
    return default if value is None else value


def _allotment_option(conf, name: str, default):
    """``[allotment] name``, or ``default`` where the group is not registered."""
    try:
        return getattr(conf.allotment, name)
    except (AttributeError, KeyError):  # oslo.config: NoSuchOptError is an AttributeError
        return default
