"""Resource classes: the standard ones (synced at start) and custom ones.

Standard classes keep ids below ``CUSTOM_RESOURCE_CLASS_MIN_ID`` and can be
neither renamed nor deleted; custom classes get ids from that number up.
The id of a new custom class is chosen as ``max(id) + 1``: two processes
creating classes at the same moment may pick the same id, and the loser's
insert fails on the primary key.  ``IdTaken`` signals that case so the
caller re-runs the whole transaction (``Database.run_write(retry_on=...)``)
with a fresh maximum.

Inventories and allocations refer to classes by id without a foreign key
(as upstream), so "in use" is checked here, in the deleting statement.
"""

from __future__ import annotations

import datetime
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import tables
from allotment.db.engine import utcnow
from allotment.domain.errors import BadRequest, Conflict, NotFound

RC = tables.resource_classes
MIN_CUSTOM_ID = tables.CUSTOM_RESOURCE_CLASS_MIN_ID


class ResourceClass(NamedTuple):
    id: int
    name: str
    created_at: datetime.datetime | None
    updated_at: datetime.datetime | None

    @property
    def is_standard(self) -> bool:
        return self.id < MIN_CUSTOM_ID

    @property
    def last_modified(self) -> datetime.datetime | None:
        """When a custom class last changed; None for standard classes (library-defined)."""
        if self.is_standard:
            return None
        return self.updated_at or self.created_at


class IdTaken(Exception):
    """A concurrent creator took the id (or name) we chose: re-run the transaction."""


_COLUMNS = (RC.c.id, RC.c.name, RC.c.created_at, RC.c.updated_at)


def not_found(name: str) -> NotFound:
    return NotFound(f"No such resource class {name}.")


def list_all(conn: Connection) -> list[ResourceClass]:
    """Every class, standard first, in id order (one query)."""
    return [ResourceClass(*row) for row in conn.execute(sa.select(*_COLUMNS).order_by(RC.c.id))]


def find(conn: Connection, name: str) -> ResourceClass | None:
    row = conn.execute(sa.select(*_COLUMNS).where(RC.c.name == name)).first()
    return ResourceClass(*row) if row else None


def get(conn: Connection, name: str) -> ResourceClass:
    """The class called ``name``; 404 when there is none."""
    found = find(conn, name)
    if found is None:
        raise not_found(name)
    return found


def _next_custom_id(conn: Connection) -> int:
    highest = conn.execute(sa.select(sa.func.max(RC.c.id))).scalar()
    return max(MIN_CUSTOM_ID, (highest or 0) + 1)


def insert_custom(conn: Connection, name: str) -> ResourceClass:
    """Insert a custom class known not to exist yet; ``IdTaken`` on a lost race.

    After ``IdTaken`` the transaction must be abandoned (PostgreSQL refuses
    further statements in it), which ``run_write(retry_on=(IdTaken,))`` does.
    """
    now = utcnow()
    new_id = _next_custom_id(conn)
    try:
        conn.execute(sa.insert(RC).values(id=new_id, name=name, created_at=now))
    except sa.exc.IntegrityError:
        raise IdTaken(name) from None
    return ResourceClass(new_id, name, now, None)


def create(conn: Connection, name: str) -> ResourceClass:
    """Create custom class ``name``; 409 when it already exists."""
    if find(conn, name) is not None:
        raise Conflict(f"Conflicting resource class already exists: {name}")
    return insert_custom(conn, name)


def ensure(conn: Connection, name: str) -> bool:
    """Make sure custom class ``name`` exists; True when this call created it."""
    if find(conn, name) is not None:
        return False
    insert_custom(conn, name)
    return True


def rename(conn: Connection, name: str, new_name: str) -> ResourceClass:
    """Rename a custom class (microversions before 1.7).

    Inventories and allocations follow, as they refer to the class by id.
    """
    current = get(conn, name)
    if current.is_standard:
        raise BadRequest(f"Cannot update standard resource class {name}")
    if new_name == current.name:
        return current
    if find(conn, new_name) is not None:
        raise Conflict(f"Resource class already exists: {new_name}")
    now = utcnow()
    try:
        conn.execute(sa.update(RC).where(RC.c.id == current.id).values(name=new_name, updated_at=now))
    except sa.exc.IntegrityError:
        raise IdTaken(new_name) from None
    return current._replace(name=new_name, updated_at=now)


def _in_use(class_id: int) -> sa.ColumnElement[bool]:
    inventory = sa.select(tables.inventories.c.id).where(
        tables.inventories.c.resource_class_id == class_id)
    allocation = sa.select(tables.allocations.c.id).where(
        tables.allocations.c.resource_class_id == class_id)
    return sa.or_(sa.exists(inventory), sa.exists(allocation))


def delete(conn: Connection, name: str) -> None:
    """Delete custom class ``name`` unless inventories or allocations use it.

    The use check sits in the DELETE itself, so nothing slips in between a
    separate check and the delete.
    """
    current = get(conn, name)
    if current.is_standard:
        raise BadRequest(f"Error in delete resource class: Cannot delete standard resource class {name}.")
    deleted = conn.execute(
        sa.delete(RC).where(RC.c.id == current.id, sa.not_(_in_use(current.id)))
    ).rowcount
    if deleted != 1:
        raise Conflict(f"Error in delete resource class: Cannot delete resource class {name}. "
                       "Class is in use in inventory.")
