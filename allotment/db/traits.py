"""Traits and the traits of resource providers.

Standard traits (from os-traits, synced at start) cannot be deleted; custom
ones carry the ``CUSTOM_`` prefix.  A trait in use by a provider cannot be
deleted: the association table's foreign key backs the check that sits in
the DELETE statement.

Changing a provider's traits bumps its generation with a compare-and-swap
in the same transaction (``generations.bump_provider``); the bump comes
first, so on PostgreSQL and MySQL it also orders concurrent writers of the
same provider before any association row is touched.  A write that changes
nothing (the same set again, clearing a provider without traits) leaves the
generation alone, as Placement does: clients holding it keep a valid one.
"""

from __future__ import annotations

import datetime
from typing import Iterable, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows, tables
from allotment.db.engine import utcnow
from allotment.db.generations import bump_provider
from allotment.domain.errors import BadRequest, ConcurrentUpdate, Conflict, NotFound

TRAITS = tables.traits
RP = tables.resource_providers
RP_TRAITS = tables.resource_provider_traits
CUSTOM_PREFIX = "CUSTOM_"


class Trait(NamedTuple):
    id: int
    name: str
    created_at: datetime.datetime | None
    updated_at: datetime.datetime | None

    @property
    def last_modified(self) -> datetime.datetime | None:
        return self.updated_at or self.created_at


class ProviderTraits(NamedTuple):
    generation: int
    traits: list[Trait]


class UnknownTraits(BadRequest):
    """Traits named in a query (a filter, a request group) do not exist (Placement's message)."""

    def __init__(self, names: Iterable[str]):
        super().__init__(f"No such trait(s): {', '.join(sorted(names))}.")


class NameTaken(Exception):
    """A concurrent writer inserted the same trait first: re-run the transaction."""


_COLUMNS = (TRAITS.c.id, TRAITS.c.name, TRAITS.c.created_at, TRAITS.c.updated_at)


def last_modified(traits: Iterable[Trait]) -> datetime.datetime | None:
    """The newest change among ``traits`` (None for none: the caller says "now")."""
    return max((t.last_modified for t in traits if t.last_modified), default=None)


# -- /traits -----------------------------------------------------------------

def list_traits(conn: Connection, *, names: list[str] | None = None, prefix: str | None = None,
                associated: bool | None = None) -> list[Trait]:
    """Traits matching every filter given, by name (one query)."""
    query = sa.select(*_COLUMNS).order_by(TRAITS.c.name)
    if names is not None:
        query = query.where(TRAITS.c.name.in_(names))
    if prefix is not None:
        # LIKE narrows (and may use the index); the substring comparison
        # makes it exact and case-sensitive on SQLite too.
        query = query.where(TRAITS.c.name.startswith(prefix, autoescape=True),
                            sa.func.substr(TRAITS.c.name, 1, len(prefix)) == prefix)
    if associated is not None:
        used = sa.exists(sa.select(RP_TRAITS.c.trait_id).where(RP_TRAITS.c.trait_id == TRAITS.c.id))
        query = query.where(used if associated else sa.not_(used))
    return [Trait(*row) for row in conn.execute(query)]


def find(conn: Connection, name: str) -> Trait | None:
    row = conn.execute(sa.select(*_COLUMNS).where(TRAITS.c.name == name)).first()
    return Trait(*row) if row else None


def get(conn: Connection, name: str) -> Trait:
    found = find(conn, name)
    if found is None:
        raise NotFound(f"No such trait(s): {name}.")
    return found


def ensure(conn: Connection, name: str) -> tuple[Trait, bool]:
    """The trait called ``name``, created if missing; True when this call created it."""
    existing = find(conn, name)
    if existing is not None:
        return existing, False
    now = utcnow()
    try:
        new_id = conn.execute(sa.insert(TRAITS).values(name=name, created_at=now)).inserted_primary_key[0]
    except sa.exc.IntegrityError:
        raise NameTaken(name) from None
    return Trait(new_id, name, now, None), True


def delete(conn: Connection, name: str) -> None:
    """Delete custom trait ``name`` unless a provider has it."""
    trait = get(conn, name)
    if not name.startswith(CUSTOM_PREFIX):
        raise BadRequest(f"Cannot delete standard trait {name}.")
    in_use = sa.exists(sa.select(RP_TRAITS.c.trait_id).where(RP_TRAITS.c.trait_id == trait.id))
    deleted = conn.execute(sa.delete(TRAITS).where(TRAITS.c.id == trait.id, sa.not_(in_use))).rowcount
    if deleted != 1:
        raise Conflict(f"The trait {name} is in use by a resource provider.")


# -- /resource_providers/{uuid}/traits ---------------------------------------------

def provider_not_found(uuid: str) -> NotFound:
    return NotFound(f"No resource provider with uuid {uuid} found")


def _provider(conn: Connection, uuid: str) -> tuple[int, int]:
    """(id, generation) of the provider; 404 when there is none."""
    row = conn.execute(sa.select(RP.c.id, RP.c.generation).where(RP.c.uuid == uuid)).first()
    if row is None:
        raise provider_not_found(uuid)
    return row.id, row.generation


def provider_traits(conn: Connection, uuid: str) -> ProviderTraits | None:
    """A provider's generation and traits in one query; None when it does not exist."""
    joined = RP.outerjoin(RP_TRAITS, RP_TRAITS.c.resource_provider_id == RP.c.id) \
               .outerjoin(TRAITS, TRAITS.c.id == RP_TRAITS.c.trait_id)
    rows = conn.execute(
        sa.select(RP.c.generation, *_COLUMNS).select_from(joined)
        .where(RP.c.uuid == uuid).order_by(TRAITS.c.name)
    ).all()
    if not rows:
        return None
    traits = [Trait(*row[1:]) for row in rows if row.id is not None]
    return ProviderTraits(rows[0].generation, traits)


def _resolve(conn: Connection, names: list[str]) -> list[Trait]:
    """The traits called ``names``; 400 naming every one that does not exist."""
    wanted = list(dict.fromkeys(names))
    found = [trait for part in raw_rows.parts(wanted) for trait in list_traits(conn, names=part)]
    if len(wanted) > raw_rows.IDS_PER_STATEMENT:
        found.sort(key=lambda trait: trait.name)  # one statement's order, by name
    known = {trait.name for trait in found}
    missing = [name for name in wanted if name not in known]
    if missing:
        raise BadRequest(f"No such trait {', '.join(missing)}")
    return found


def _current_ids(conn: Connection, provider_id: int) -> set[int]:
    return set(conn.execute(
        sa.select(RP_TRAITS.c.trait_id).where(RP_TRAITS.c.resource_provider_id == provider_id)
    ).scalars())


def _replace_associations(conn: Connection, provider_id: int, trait_ids: set[int]) -> None:
    current = _current_ids(conn, provider_id)
    removed = current - trait_ids
    added = trait_ids - current
    if removed:
        for part in raw_rows.parts(sorted(removed)):
            conn.execute(sa.delete(RP_TRAITS).where(RP_TRAITS.c.resource_provider_id == provider_id,
                                                    RP_TRAITS.c.trait_id.in_(part)))
    if added:
        now = utcnow()
        conn.execute(sa.insert(RP_TRAITS), [
            {"resource_provider_id": provider_id, "trait_id": trait_id, "created_at": now}
            for trait_id in sorted(added)
        ])


def set_provider_traits(conn: Connection, uuid: str, names: list[str], generation: int) -> ProviderTraits:
    """Give the provider exactly the traits ``names``, if it is still at ``generation``."""
    provider_id, current = _provider(conn, uuid)
    if current != generation:
        raise ConcurrentUpdate("Resource provider's generation already changed. "
                               "Please update the generation and try again.")
    traits = _resolve(conn, names)
    wanted = {trait.id for trait in traits}
    if wanted == _current_ids(conn, provider_id):
        # Nothing to change; answer it only if the provider is still at the
        # generation the client named.  The first read may predate a writer
        # that has since committed these very traits (PostgreSQL reads each
        # statement afresh): read the generation again under a row lock,
        # which sees the latest commit, so that writer wins and this is 409.
        locked = conn.execute(
            sa.select(RP.c.generation).where(RP.c.id == provider_id).with_for_update()
        ).scalar_one()
        if locked != generation:
            raise ConcurrentUpdate("Resource provider's generation already changed. "
                                   "Please update the generation and try again.")
        return ProviderTraits(generation, traits)
    new_generation = bump_provider(conn, provider_id, generation, uuid=uuid)
    _replace_associations(conn, provider_id, wanted)
    return ProviderTraits(new_generation, traits)


def clear_provider_traits(conn: Connection, uuid: str) -> int:
    """Remove every trait from the provider; returns its new generation
    (unchanged when it had none)."""
    provider_id, generation = _provider(conn, uuid)
    if not _current_ids(conn, provider_id):
        return generation
    new_generation = bump_provider(conn, provider_id, generation, uuid=uuid)
    conn.execute(sa.delete(RP_TRAITS).where(RP_TRAITS.c.resource_provider_id == provider_id))
    return new_generation
