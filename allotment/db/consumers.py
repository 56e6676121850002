"""Consumer records and the projects, users and consumer types they name.

A consumer record says who owns a set of allocations (project and user,
microversion 1.8), how far its allocations have been rewritten (its
generation, 1.28) and what kind of thing it is (its type, 1.38).  The
allocations table refers to consumers by uuid without a foreign key, so
allocations written before consumer records existed stay readable until
``allotment db online-data-migrations`` gives them one.

Projects, users and consumer types are created the first time a write names
them.  That is race-safe without locks: look the name up, insert it when
absent, and let the unique constraint decide between two processes inserting
the same name.  The loser's ``IntegrityError`` becomes ``RecordRace`` and the
caller re-runs its whole transaction: a fresh transaction sees the winner's
row, which a re-read inside the same REPEATABLE READ transaction (MySQL's
default) would not.  These rows are never deleted, so what a transaction has
read stays valid until it commits.

Every change to a consumer goes through a generation compare-and-swap
(``generations.bump_consumer``, or a delete that names the generation it
read), so two writers of one consumer can never both win.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import MutableMapping

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from allotment.db import generations, raw_rows, tables
from allotment.db.engine import prepared, utcnow
from allotment.domain.errors import ConcurrentUpdate

CONSUMERS = tables.consumers
PROJECTS = tables.projects
USERS = tables.users
TYPES = tables.consumer_types

#: What Placement shows as the type of a consumer that was never given one.
UNKNOWN_TYPE = "unknown"


class RecordRace(ConcurrentUpdate):
    """Another transaction inserted the same project, user, type or consumer
    first; re-running the whole transaction resolves it."""

    def __init__(self, what: str):
        super().__init__(f"Another thread concurrently created {what}. Please retry your update")


@dataclass(frozen=True)
class Consumer:
    """A consumer record with its owner's external ids resolved."""

    id: int
    uuid: str
    generation: int
    project_id: int
    user_id: int
    project: str
    user: str
    consumer_type_id: int | None


@dataclass(frozen=True)
class Owner:
    """Internal ids of a consumer's project and user (and type)."""

    project_id: int
    user_id: int
    consumer_type_id: int | None = None


# Statements built once: each is compiled once per process, not per request.
_INSERTS = {table.name: prepared(sa.insert(table)) for table in (PROJECTS, USERS, TYPES)}
#: A consumer's row, run on the DBAPI cursor (:func:`raw_rows.insert`): one
#: on every claim for a new consumer.
_INSERT_CONSUMER = sa.insert(CONSUMERS).values({name: sa.bindparam(name) for name in (
    "uuid", "project_id", "user_id", "consumer_type_id", "generation", "created_at", "updated_at")})
_DELETE_AT_GENERATION = prepared(sa.delete(CONSUMERS).where(CONSUMERS.c.id == sa.bindparam("consumer_id"),
                                                            CONSUMERS.c.generation == sa.bindparam("seen")))
_OWNER_LOOKUP = prepared(sa.union_all(
    sa.select(sa.literal_column("'p'").label("kind"), PROJECTS.c.id)
    .where(PROJECTS.c.external_id == sa.bindparam("project")),
    sa.select(sa.literal_column("'u'"), USERS.c.id).where(USERS.c.external_id == sa.bindparam("user")),
    sa.select(sa.literal_column("'t'"), TYPES.c.id).where(TYPES.c.name == sa.bindparam("type")),
))


def _insert_name(conn: Connection, table: sa.Table, column: str, value: str, what: str) -> int:
    """Insert one named row; a concurrent insert of the same name is a RecordRace."""
    now = utcnow()
    try:
        result = conn.execute(_INSERTS[table.name], {column: value, "created_at": now, "updated_at": now})
    except exc.IntegrityError:
        raise RecordRace(what) from None
    return result.inserted_primary_key[0]


def ensure_owner(conn: Connection, project: str, user: str, consumer_type: str | None = None, *,
                 known: MutableMapping[tuple[str, str], int] | None = None) -> Owner:
    """Internal ids of a project, a user and (optionally) a consumer type,
    creating whichever is new.  One query when they all exist; none when
    ``known`` (``("P" | "U" | "T", name) -> id`` of those found existing,
    read in this transaction) was read for these names: a name absent from
    it did not exist then, and what this call inserts is added to it.
    (These rows are never deleted, so what was read stays true; one
    inserted since by another transaction makes our insert a ``RecordRace``.)"""
    if known is not None:
        ids = {"p": known.get(("P", project)), "u": known.get(("U", user)),
               "t": known.get(("T", consumer_type)) if consumer_type is not None else None}
    else:
        ids = dict(conn.execute(_OWNER_LOOKUP, {"project": project, "user": user,
                                                "type": consumer_type}).all())
    project_id = ids.get("p")
    if project_id is None:
        project_id = _insert_name(conn, PROJECTS, "external_id", project, f"project {project}")
        if known is not None:
            known[("P", project)] = project_id
    user_id = ids.get("u")
    if user_id is None:
        user_id = _insert_name(conn, USERS, "external_id", user, f"user {user}")
        if known is not None:
            known[("U", user)] = user_id
    type_id = ids.get("t")
    if type_id is None and consumer_type is not None:
        type_id = _insert_name(conn, TYPES, "name", consumer_type, f"consumer type {consumer_type}")
        if known is not None:
            known[("T", consumer_type)] = type_id
    return Owner(project_id, user_id, type_id)


def insert(conn: Connection, uuid: str, owner: Owner, *, generation: int) -> int:
    """Create a consumer record; a concurrent creation of the same uuid is a RecordRace."""
    now = utcnow()
    try:
        return raw_rows.insert(conn, _INSERT_CONSUMER, {
            "uuid": uuid, "project_id": owner.project_id, "user_id": owner.user_id,
            "consumer_type_id": owner.consumer_type_id, "generation": generation,
            "created_at": now, "updated_at": now})
    except exc.IntegrityError:
        raise RecordRace(f"consumer {uuid}") from None


def bump(conn: Connection, consumer: Consumer, owner: Owner | None = None) -> int:
    """Advance the consumer's generation from the one read (compare-and-swap),
    then record a new owner or type if ``owner`` differs; returns the new generation.

    The owner update runs after the swap, so it only ever happens in the
    transaction that won the consumer.
    """
    new_generation = generations.bump_consumer(conn, consumer.id, consumer.generation,
                                               uuid=consumer.uuid)
    if owner is not None and (owner.project_id, owner.user_id, owner.consumer_type_id) != (
            consumer.project_id, consumer.user_id, consumer.consumer_type_id):
        conn.execute(sa.update(CONSUMERS).where(CONSUMERS.c.id == consumer.id).values(
            project_id=owner.project_id, user_id=owner.user_id,
            consumer_type_id=owner.consumer_type_id))
    return new_generation


def delete(conn: Connection, consumer: Consumer) -> None:
    """Remove a consumer record if it is still at the generation read.

    Deleting is a change like any other: naming the generation makes it a
    compare-and-swap, so a concurrent writer of the consumer is detected.
    """
    result = conn.execute(_DELETE_AT_GENERATION, {"consumer_id": consumer.id, "seen": consumer.generation})
    if result.rowcount != 1:
        raise ConcurrentUpdate(f"consumer {consumer.uuid} generation conflict: another process "
                               "updated it. Please retry your update")


