"""Read-only statements run on the DBAPI cursor, compiled once.

``conn.execute(statement, params)`` does a lot of per-statement work in
SQLAlchemy that a read issued on every request does not need: it looks
the compiled form up, rebuilds the parameters, expands every ``IN`` list
(``expanding`` parameters) into a new statement text and sets a result
object up.  On a small request that is as much CPU as the database's own
work (measured: 0.06 ms a statement, a third of a cold
``GET /allocation_candidates?...&limit=10`` on SQLite).

:func:`rows` keeps, per statement, dialect and length of each list
parameter, the expanded text and where each of its placeholders takes its
value from (SQLAlchemy's own :meth:`~sqlalchemy.engine.Compiled.
construct_expanded_state` computes both, once), and then runs the text
directly on the connection's DBAPI cursor: the same text and values
SQLAlchemy would send, on the same connection and in the same transaction.
Lists are padded to a power of two with their last element (``IN (a, b,
c, c)`` means ``IN (a, b, c)``) so that few distinct texts exist: fewer
compilations here, and the driver's or server's cached plans are reused.

Where SQLAlchemy would convert values -- a bind processor, or a result
processor for a column's type as the cursor describes it -- the statement
goes through ``conn.execute`` instead (none of the candidate statements
needs one on SQLite, PostgreSQL or MySQL/MariaDB).

A database error is raised as SQLAlchemy raises it from ``conn.execute``
(its exception class, a dropped connection invalidated), so the callers'
retries and their 503s see what they would have seen.  The statement is run
again only where nothing can have been lost since the transaction began:
on PostgreSQL outside a transaction (a prepared statement the server no
longer has is prepared afresh).  Inside a transaction it never is: MySQL
and MariaDB roll the whole transaction back on a deadlock (and Galera on
a conflicting write from another node), and the statement run again would
start a new transaction on the same connection, silently, so that a write
committed only what followed the error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db.engine import (PLACEHOLDER, forget_prepared, prepared_execute, prepared_form,
                                 raise_as_sqlalchemy)

#: libpq's transaction status outside a transaction (psycopg2's
#: TRANSACTION_STATUS_IDLE), the only state in which a failed read on
#: PostgreSQL may be run again.
_PG_IDLE = 0

#: Compiled forms kept at most, and expanded ones (statement x dialect x
#: list lengths); meant for statements built once per process (or per
#: query shape), not per call.
MAX_ENTRIES = 4096
#: List values :func:`rows_in_parts` puts in one statement at most (after
#: padding): SQLite takes 32,766 parameters a statement as it is built by
#: default (Debian's takes 250,000).
IDS_PER_STATEMENT = 8192


class _Value:
    """Stands for one parameter value while the recipe is worked out."""

    __slots__ = ("name", "index")

    def __init__(self, name: str, index: int | None):
        self.name = name
        self.index = index


class _Plan:
    """How to run one statement with lists of given lengths."""

    __slots__ = ("text", "recipe", "raw", "prepare", "execute", "binds")

    def __init__(self, text: str, recipe: tuple, placeholders: int, raw: bool | None, postgresql: bool):
        self.text = text
        #: writes: the bind processor of each placeholder (None: the value
        #: as it is), or None when no placeholder has one
        self.binds: tuple | None = None
        #: where the placeholders' values come from, in order: (name, None,
        #: None) a value, (name, start, stop) that slice of a list (one run
        #: of placeholders, not one entry each: a list of 16,384 ids would
        #: cost 1.5 MB kept), (None, constant, None) a constant
        self.recipe = recipe
        #: None: not known until the first cursor description is seen
        self.raw = raw
        #: PostgreSQL: the text as a prepared statement's (``$1``...), and
        #: the EXECUTE of it (``{name}`` to fill in) with the values
        self.prepare = self.execute = None
        if postgresql:
            numbers = iter(range(1, placeholders + 1))
            self.prepare = re.sub(r"%%|%s", lambda m: "%" if m.group() == "%%" else f"${next(numbers)}", text)
            self.execute = "EXECUTE {name}" + (f" ({', '.join(['%s'] * placeholders)})" if placeholders else "")


_PLANS: dict[tuple, _Plan] = {}
_COMPILED: dict[tuple, Any] = {}


def _padded_length(n: int) -> int:
    return n if n <= 1 or not n & (n - 1) else 1 << n.bit_length()


def _padded(values: list) -> list:
    n = len(values)
    padded = _padded_length(n)
    return values if padded == n else values + [values[-1]] * (padded - n)


def _dialect_key(dialect) -> tuple:
    return (type(dialect), dialect.paramstyle, getattr(dialect, "server_version_info", None))


def _plan(dialect, statement: sa.Executable, params: dict, key: tuple) -> _Plan:
    compiled_key = (statement, key[1])
    compiled = _COMPILED.get(compiled_key)
    if compiled is None:
        if len(_COMPILED) >= MAX_ENTRIES:
            _COMPILED.clear()
        compiled = _COMPILED[compiled_key] = statement.compile(dialect=dialect)
    sample = {name: ([_Value(name, i) for i in range(len(value))] if isinstance(value, list)
                     else _Value(name, None))
              for name, value in params.items()}
    expanded = compiled.construct_expanded_state(sample)
    if dialect.positional:
        text = expanded.statement
        order = expanded.positiontup
    else:  # pyformat (psycopg2): made positional, %(name)s -> %s in order
        order = []

        def placeholder(match: re.Match) -> str:
            if match.group(1) is None:
                return "%%"
            order.append(match.group(1))
            return "%s"

        text = PLACEHOLDER.sub(placeholder, expanded.statement)
    recipe: list[tuple] = []
    for name in order:
        value = expanded.parameters[name]
        if not isinstance(value, _Value):
            recipe.append((None, value, None))
        elif value.index is None:
            recipe.append((value.name, None, None))
        elif recipe and recipe[-1][0] == value.name and recipe[-1][2] == value.index:
            recipe[-1] = (value.name, recipe[-1][1], value.index + 1)
        else:
            recipe.append((value.name, value.index, value.index + 1))
    plan = _Plan(text, tuple(recipe), len(order), False if expanded.processors else None,
                 dialect.name == "postgresql")
    # For writes: every placeholder's converter, the expanded ones' and
    # the others' (SQLAlchemy keeps the latter on the compiled form only).
    converters = {**compiled._bind_processors, **expanded.processors}
    if any(name in converters for name in order):
        plan.binds = tuple(converters.get(name) for name in order)
    return plan


def _plan_of(dialect, statement: sa.Executable, params: dict, lists: tuple) -> _Plan:
    """The kept plan of ``statement`` on ``dialect`` with lists of the
    lengths ``lists`` gives ((name, length) pairs), made on first use."""
    key = (statement, _dialect_key(dialect), lists)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= MAX_ENTRIES:
            _PLANS.clear()
        plan = _PLANS[key] = _plan(dialect, statement, params, key)
    return plan


def parts(values: list) -> Iterator[list]:
    """``values`` in slices of :data:`IDS_PER_STATEMENT`, for statements
    (writes among them) that take one list."""
    for start in range(0, len(values), IDS_PER_STATEMENT):
        yield values[start:start + IDS_PER_STATEMENT]


def rows_in_parts(conn: Connection, statement: sa.Executable, params: dict,
                  split: tuple[str, ...] | None = None) -> list:
    """The rows of ``statement`` with ``params``, the lists named in
    ``split`` (every list when None) split over as many statements as it
    takes for none to hold more than :data:`IDS_PER_STATEMENT` list values
    (each part a power of two, so its padding adds none; the lists not
    split go whole with each): for statements whose every row comes from
    one value of one split list (no order, total or join across them)."""
    lists = {name: value for name, value in params.items() if isinstance(value, list)}
    if sum([_padded_length(len(value)) for value in lists.values()]) <= IDS_PER_STATEMENT:
        return rows(conn, statement, params)
    parted = {name: lists[name] for name in (lists if split is None else split)}
    whole = sum([_padded_length(len(value)) for name, value in lists.items() if name not in parted])
    part = 1 << max(0, (max(IDS_PER_STATEMENT - whole, 1) // len(parted)).bit_length() - 1)
    return [row for start in range(0, max(len(value) for value in parted.values()), part)
            for row in rows(conn, statement, {**params, **{name: value[start:start + part]
                                                           for name, value in parted.items()}})]


def rows(conn: Connection, statement: sa.Executable, params: dict) -> list:
    """All rows of a read-only ``statement``, a list of tuples (or of
    SQLAlchemy rows; see the module doc)."""
    dialect = conn.dialect
    params = {name: _padded(value) if isinstance(value, list) else value for name, value in params.items()}
    plan = _plan_of(dialect, statement, params,
                    tuple([(name, len(value)) for name, value in params.items() if isinstance(value, list)]))
    if plan.raw is False:
        return conn.execute(statement, params).all()
    values: list = []
    for name, start, stop in plan.recipe:
        if name is None:
            values.append(start)
        elif start is None:
            values.append(params[name])
        else:
            values += params[name][start:stop]
    dbapi_conn = conn.connection
    cursor = dbapi_conn.cursor()
    try:
        try:
            execute = None
            if plan.prepare is not None:
                execute = prepared_execute(dbapi_conn, cursor, plan.text, plan.prepare, plan.execute)
            cursor.execute(plan.text if execute is None else execute, values)
            found = cursor.fetchall()
        except dialect.dbapi.Error as error:
            if plan.prepare is None:
                raise_as_sqlalchemy(conn, error, plan.text, values, cursor)
            forget_prepared(dbapi_conn, plan.text)  # prepared afresh next time
            if dbapi_conn.dbapi_connection.info.transaction_status != _PG_IDLE:
                raise_as_sqlalchemy(conn, error, plan.text, values, cursor)
            found = None
        if found is not None and plan.raw is None:
            plan.raw = _no_result_processing(dialect, statement, cursor.description)
    finally:
        cursor.close()
    if found is None or not plan.raw:
        return conn.execute(statement, params).all()
    return found if type(found) is list else list(found)  # PyMySQL gives a tuple


def _no_result_processing(dialect, statement: sa.Executable, description) -> bool:
    """Whether SQLAlchemy would hand the rows over as the driver gives them."""
    columns = list(statement.selected_columns)
    if len(columns) != len(description):
        return False
    return all(column.type.dialect_impl(dialect).result_processor(dialect, info[1]) is None
               for column, info in zip(columns, description))


def write(conn: Connection, statement: sa.Executable, params: dict | list[dict]) -> int:
    """Run an ``INSERT``, ``UPDATE`` or ``DELETE`` with scalar parameters
    (a list of them: once for each, on the cursor's ``executemany``) on
    the DBAPI cursor, in ``conn``'s transaction; the rows it touched.

    What :func:`rows` does for reads, for the writes of a claim: the
    generation swaps and the rows inserted.  Values are converted as
    SQLAlchemy's bind processors would (SQLite keeps timestamps as text).
    An error is raised as ``conn.execute`` raises it and the statement is
    never run again (a write runs inside a transaction)."""
    return _write(conn, statement, params, _COUNT)


#: PostgreSQL: each ``INSERT`` given to :func:`insert`, with ``RETURNING``
#: its primary key.
_RETURNING: dict[sa.Executable, sa.Executable] = {}


def insert(conn: Connection, statement: sa.Insert, params: dict) -> int:
    """Run an ``INSERT`` of one row as :func:`write` does; the new row's
    primary key (what ``conn.execute(...).inserted_primary_key[0]`` gives):
    ``RETURNING`` it on PostgreSQL, the cursor's ``lastrowid`` elsewhere."""
    if conn.dialect.name == "postgresql":
        returning = _RETURNING.get(statement)
        if returning is None:
            if len(_RETURNING) >= MAX_ENTRIES:
                _RETURNING.clear()
            returning = _RETURNING[statement] = statement.returning(*statement.table.primary_key.columns)
        statement = returning
    return _write(conn, statement, params, _KEY)


def _bound_values(plan: _Plan, one: dict) -> list:
    """The values of a statement without lists, as its bind processors make them."""
    values = [start if name is None else one[name] for name, start, _ in plan.recipe]
    if plan.binds is not None:
        values = [value if bind is None or value is None else bind(value)
                  for bind, value in zip(plan.binds, values)]
    return values


#: What :func:`_write` gives: the rows touched, the new row's key, the rows returned.
_COUNT, _KEY, _ROWS = "count", "key", "rows"


def _write(conn: Connection, statement: sa.Executable, params: dict | list[dict], result: str):
    dialect = conn.dialect
    many = isinstance(params, list)
    sample = params[0] if many else params
    plan = _plan_of(dialect, statement, sample, ())
    dbapi_conn = conn.connection
    cursor = dbapi_conn.cursor()
    try:
        text = plan.text
        try:
            if many:
                values = [_bound_values(plan, one) for one in params]
                cursor.executemany(text, values)
            else:
                values = _bound_values(plan, params)
                if plan.prepare is not None:
                    text = prepared_execute(dbapi_conn, cursor, plan.text, plan.prepare, plan.execute) or text
                cursor.execute(text, values)
                if result == _KEY:
                    return cursor.fetchone()[0] if cursor.description else cursor.lastrowid
                if result == _ROWS:
                    found = cursor.fetchall()
        except dialect.dbapi.Error as error:
            if plan.prepare is not None:
                forget_prepared(dbapi_conn, plan.text)
            raise_as_sqlalchemy(conn, error, plan.text, values, cursor)
        if result != _ROWS:
            return cursor.rowcount
        if plan.raw is None:
            plan.raw = _no_result_processing(dialect, statement, cursor.description)
        if not plan.raw:
            raise TypeError("written_rows: the statement's columns need converting by SQLAlchemy")
        return found if type(found) is list else list(found)
    finally:
        cursor.close()


def written_rows(conn: Connection, statement: sa.Executable, params: dict) -> list:
    """The rows of a statement that writes (``RETURNING``, or a select over
    a data-modifying ``WITH``), with scalar parameters, run once on the
    DBAPI cursor in ``conn``'s transaction as :func:`write` runs writes
    (PostgreSQL: prepared).  Its columns must need no conversion: checked
    at its first run, since a statement that writes is never run a second
    time through SQLAlchemy to convert them (:func:`rows` may run a read
    again)."""
    return _write(conn, statement, params, _ROWS)


class HandWritten:
    """A read written for one backend by hand (PostgreSQL: a statement the
    SQL expression language would make no clearer), with ``%(name)s``
    placeholders; made once, at import.  ``prepare`` and ``execute``: its
    prepared form and the ``EXECUTE`` that runs it
    (:func:`allotment.db.engine.prepared_form`, as for the engine's own
    prepared statements)."""

    __slots__ = ("text", "prepare", "execute")

    def __init__(self, text: str):
        self.text = text
        self.prepare, arguments = prepared_form(text)
        self.execute = "EXECUTE {name}" + (f" {arguments}" if arguments != "()" else "")


def one_row(conn: Connection, statement: HandWritten, params: dict) -> tuple:
    """The one row of ``statement`` with ``params``, on ``conn``'s DBAPI
    cursor (PostgreSQL: prepared once per connection where the engine keeps
    prepared statements).  An error is raised as ``conn.execute`` raises
    it; a prepared statement that failed is prepared afresh next time."""
    dbapi_conn = conn.connection
    cursor = dbapi_conn.cursor()
    try:
        execute = None
        try:
            execute = prepared_execute(dbapi_conn, cursor, statement.text, statement.prepare, statement.execute)
            cursor.execute(statement.text if execute is None else execute, params)
            return cursor.fetchone()
        except conn.dialect.dbapi.Error as error:
            if execute is not None:
                forget_prepared(dbapi_conn, statement.text)
            raise_as_sqlalchemy(conn, error, statement.text, params, cursor)
    finally:
        cursor.close()
