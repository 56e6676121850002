"""Connections and transactions (allotment.db.engine) on the selected backend."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from allotment.db import engine as engine_module
from allotment.db.engine import Database
from tests.conftest import BACKEND, pg_statements_sent

server_only = pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite has no server connection to lose")


@pytest.fixture
def database(db_url):
    db = Database(db_url, pool_size=1, max_overflow=0)
    yield db
    db.engine.dispose()


def _session_id(conn) -> int:
    query = "SELECT pg_backend_pid()" if BACKEND == "postgresql" else "SELECT CONNECTION_ID()"
    return conn.exec_driver_sql(query).scalar()


def _kill(db_url: str, session_id: int) -> None:
    """End a session from another connection, as a server restart would."""
    killer = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with killer.connect() as conn:
            if BACKEND == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_terminate_backend({session_id})")
            else:
                conn.exec_driver_sql(f"KILL {session_id}")
    finally:
        killer.dispose()


@server_only
def test_an_idle_dead_connection_is_replaced_before_use(database, db_url, monkeypatch):
    with database.read() as conn:
        first = _session_id(conn)
    _kill(db_url, first)
    monkeypatch.setattr(engine_module, "IDLE_PING_SECONDS", 0.0)
    with database.read() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert _session_id(conn) != first


@server_only
def test_a_recently_used_connection_is_not_pinged(database, monkeypatch):
    pings = []
    real_ping = database.engine.dialect.do_ping
    monkeypatch.setattr(database.engine.dialect, "do_ping",
                        lambda dbapi_conn: pings.append(1) or real_ping(dbapi_conn))
    for _ in range(3):
        with database.read() as conn:
            conn.exec_driver_sql("SELECT 1")
    assert pings == []
    monkeypatch.setattr(engine_module, "IDLE_PING_SECONDS", 0.0)
    with database.read() as conn:
        conn.exec_driver_sql("SELECT 1")
    assert pings == [1]


@server_only
def test_one_request_after_another_runs_on_the_session_used_last(db_url):
    """A pool that holds more connections than are in use hands out the one
    returned last: a client's requests one after another keep one database
    session busy (its caches warm) rather than each session in turn."""
    database = Database(db_url, pool_size=4, max_overflow=0)
    try:
        with database.read() as first, database.read() as second, database.read() as third:
            sessions = [_session_id(conn) for conn in (first, second, third)]
        assert len(set(sessions)) == 3
        seen = []
        for _ in range(4):
            with database.read() as conn:
                seen.append(_session_id(conn))
            with database.write() as conn:
                seen.append(_session_id(conn))
        assert seen == [sessions[0]] * 8  # the three went back in order; the first came back last
    finally:
        database.engine.dispose()


@pytest.mark.skipif(BACKEND != "postgresql", reason="only PostgreSQL reads outside a transaction")
def test_postgresql_reads_run_without_a_transaction_and_writes_within_one(database):
    # now() is when the transaction began: in one, later statements see it lag.
    with database.read() as conn:
        conn.exec_driver_sql("SELECT pg_sleep(0.01)")
        assert conn.exec_driver_sql("SELECT now() = statement_timestamp()").scalar()
    with database.write() as conn:
        conn.exec_driver_sql("SELECT pg_sleep(0.01)")
        assert conn.exec_driver_sql("SELECT now() < statement_timestamp()").scalar()
    # The pooled connection went back as it came: the next read is outside
    # a transaction and the next write is one transaction again.
    with database.read() as conn:
        conn.exec_driver_sql("SELECT pg_sleep(0.01)")
        assert conn.exec_driver_sql("SELECT now() = statement_timestamp()").scalar()
    with database.write() as conn:
        conn.exec_driver_sql("SELECT pg_sleep(0.01)")
        assert conn.exec_driver_sql("SELECT now() < statement_timestamp()").scalar()
    # Nothing is left open on the pooled connection once a write is over.
    with database.engine.connect() as conn:
        assert conn.connection.dbapi_connection.info.transaction_status == 0  # idle


@pytest.mark.skipif(BACKEND != "postgresql", reason="PostgreSQL transactions are sent by Allotment")
def test_postgresql_write_rolls_back_on_error_and_commits_otherwise(database):
    with database.write() as conn:
        conn.exec_driver_sql("CREATE TABLE rollback_probe (n INTEGER)")
    try:
        with pytest.raises(RuntimeError):
            with database.write() as conn:
                conn.exec_driver_sql("INSERT INTO rollback_probe VALUES (1)")
                raise RuntimeError("boom")
        with database.write() as conn:
            conn.exec_driver_sql("INSERT INTO rollback_probe VALUES (2)")
        with database.read() as conn:
            assert [r[0] for r in conn.exec_driver_sql("SELECT n FROM rollback_probe")] == [2]
    finally:
        with database.write() as conn:
            conn.exec_driver_sql("DROP TABLE rollback_probe")


def test_reads_see_one_snapshot_where_the_backend_gives_one(database, db_url):
    """SQLite and MySQL/MariaDB reads keep their first snapshot (PostgreSQL's
    READ COMMITTED gives each statement its own, transaction or not)."""
    with database.write() as conn:
        conn.exec_driver_sql("CREATE TABLE snapshot_probe (n INTEGER)")
    try:
        with database.read() as conn:
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM snapshot_probe").scalar() == 0
            other = Database(db_url)
            try:
                with other.write() as writer:
                    writer.exec_driver_sql("INSERT INTO snapshot_probe VALUES (1)")
            finally:
                other.engine.dispose()
            seen = conn.exec_driver_sql("SELECT COUNT(*) FROM snapshot_probe").scalar()
        assert seen == (1 if BACKEND == "postgresql" else 0)
    finally:
        with database.write() as conn:
            conn.exec_driver_sql("DROP TABLE snapshot_probe")


@pytest.mark.skipif(BACKEND != "mysql", reason="wsrep_sync_wait is a MariaDB/Galera session variable")
def test_mysql_wsrep_sync_wait_is_set_on_every_session(db_url):
    from tests.conftest import make_conf

    conf = make_conf(db_url, placement_database__mysql_wsrep_sync_wait=1)
    db = engine_module.database_from_config(conf)
    try:
        sessions = set()
        with db.read() as first, db.write() as second:  # two pooled sessions at once
            for conn in (first, second):
                assert conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar() == 1
                sessions.add(_session_id(conn))
        assert len(sessions) == 2
    finally:
        db.dispose()
    # Unset, the server's own value is left alone.
    plain = engine_module.database_from_config(make_conf(db_url))
    try:
        with plain.read() as conn:
            assert (conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar()
                    == conn.exec_driver_sql("SELECT @@GLOBAL.wsrep_sync_wait").scalar())
    finally:
        plain.dispose()


@pytest.mark.skipif(BACKEND != "sqlite", reason="BEGIN IMMEDIATE waits for SQLite's one writer")
def test_sqlite_begin_that_finds_the_database_locked_is_retried(db_url, monkeypatch):
    """The BEGIN sent on the DBAPI cursor: a BEGIN IMMEDIATE that finds
    another writer still holding the database after the busy timeout is
    raised as SQLAlchemy's error, which a write counts as transient and
    runs again (here once the other writer is done)."""
    import sqlite3
    import threading

    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 50)
    monkeypatch.setattr(engine_module, "TRANSIENT_RETRIES", 200)
    database = Database(db_url, pool_size=1, max_overflow=0)
    holder = sqlite3.connect(sa.engine.make_url(db_url).database, isolation_level=None,
                             check_same_thread=False)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sa.exc.OperationalError, match="database is locked") as raised:
            with database.write():
                pass
        assert engine_module.is_transient(raised.value)
        threading.Timer(0.3, holder.rollback).start()
        assert database.run_write(lambda conn: conn.exec_driver_sql("SELECT 1").scalar()) == 1
    finally:
        holder.rollback()
        holder.close()
        database.engine.dispose()


@pytest.mark.skipif(BACKEND != "postgresql", reason="the BEGIN sent with the first statement is PostgreSQL's")
def test_postgresql_begin_goes_with_the_first_statement(database):
    """A write transaction's BEGIN is sent in the same message as its first
    statement, whatever sends it (SQLAlchemy, the DBAPI cursor, several
    rows at once); one that sends nothing sends nothing, not even COMMIT;
    a failed statement still rolls everything back."""
    sent = pg_statements_sent(database.engine)
    with database.write() as conn:
        txid = conn.exec_driver_sql("SELECT txid_current()").scalar()
        assert conn.exec_driver_sql("SELECT txid_current()").scalar() == txid  # one transaction
    assert sent == ["BEGIN ISOLATION LEVEL READ COMMITTED; SELECT txid_current()", "SELECT txid_current()",
                    "COMMIT"]
    sent.clear()
    with database.write():
        pass
    assert sent == []
    with database.write() as conn:
        cursor = conn.connection.cursor()
        cursor.executemany("SELECT %s", [(1,), (2,)])
        cursor.close()
    assert sent[0] == "BEGIN ISOLATION LEVEL READ COMMITTED" and sent[-1] == "COMMIT", sent
    with database.write() as conn:
        conn.exec_driver_sql("CREATE TEMPORARY TABLE begun (n int)")
    with pytest.raises(sa.exc.DBAPIError):
        with database.write() as conn:
            conn.exec_driver_sql("INSERT INTO begun VALUES (1)")
            conn.exec_driver_sql("SELECT 1 / 0")
    with database.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM begun").scalar() == 0
        # Reads send no BEGIN at all.
        assert conn.exec_driver_sql("SELECT now() = statement_timestamp()").scalar()
