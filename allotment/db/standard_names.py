"""Keep the standard resource classes and traits in the database.

The lists come from the ``os-resource-classes`` and ``os-traits`` libraries
installed with Allotment; they are synced at start-up so that queries can
join on names and every process sees the same ids.  Standard resource
classes keep ids equal to their position in the library's list (as
upstream), custom ones start at ``CUSTOM_RESOURCE_CLASS_MIN_ID``.

Several processes may sync at once: inserts that lose a race are ignored.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Iterator

import os_resource_classes
import os_traits
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import tables
from allotment.db.engine import Database, is_transient, utcnow


def standard_resource_classes() -> list[str]:
    return list(os_resource_classes.STANDARDS)


def standard_traits() -> list[str]:
    return sorted(os_traits.get_traits())


def _missing(conn: Connection, table: sa.Table, names: list[str]) -> list[str]:
    existing = set(conn.execute(sa.select(table.c.name)).scalars())
    return [name for name in names if name not in existing]


@contextlib.contextmanager
def _explicit_zero_ids(conn: Connection) -> Iterator[None]:
    """Let VCPU keep id 0 on MySQL/MariaDB.

    There, inserting 0 into an auto-increment column normally means "next
    id" (VCPU would get some id after the last class); NO_AUTO_VALUE_ON_ZERO
    stores the 0 as given.  The session's mode is restored afterwards.
    """
    if conn.dialect.name != "mysql":
        yield
        return
    previous = conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar()
    conn.exec_driver_sql("SET SESSION sql_mode = "
                         "CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'NO_AUTO_VALUE_ON_ZERO')")
    try:
        yield
    finally:
        conn.exec_driver_sql("SET SESSION sql_mode = %s", (previous,))


#: Attempts of a sync that lost a race (an insert someone else made first,
#: or on Galera another node's insert certified first).
SYNC_ATTEMPTS = 10


def sync(db: Database) -> None:
    """Insert any standard class or trait the database lacks (idempotent)."""
    for attempt in range(SYNC_ATTEMPTS):
        try:
            with db.write() as conn:
                now = utcnow()
                rc_names = standard_resource_classes()
                missing_rcs = set(_missing(conn, tables.resource_classes, rc_names))
                if missing_rcs:
                    with _explicit_zero_ids(conn):
                        conn.execute(tables.resource_classes.insert(), [
                            {"id": index, "name": name, "created_at": now}
                            for index, name in enumerate(rc_names) if name in missing_rcs
                        ])
                missing_traits = _missing(conn, tables.traits, standard_traits())
                if missing_traits:
                    conn.execute(tables.traits.insert(), [
                        {"name": name, "created_at": now} for name in missing_traits
                    ])
            return
        except sa.exc.DBAPIError as error:
            # Another process inserted some of them first; look again.
            if not (isinstance(error, sa.exc.IntegrityError) or is_transient(error)) \
                    or attempt == SYNC_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.01, 0.1))
