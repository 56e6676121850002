"""Usages: how much of each resource class is allocated, in one query each.

* ``provider_usages``: per class of a provider's inventory (classes with an
  inventory but no allocations count 0; allocations of a class the provider
  no longer has inventory of are not shown), with the provider's generation.
* ``total_usages``: a project's (optionally one user's) allocations summed
  per class, over every provider; the quota question nova asks, answered
  from placement alone (microversion 1.9).  Allocations whose consumer has
  no record yet (written before 1.8 and not migrated) belong to no project.
* ``usages_by_consumer_type``: the same sums grouped by consumer type, with
  the number of distinct consumers in each group (1.38).

Each statement is built once per variant and compiled once per process.
The lookups follow indexes: project by external id, its consumers by
``(project_id, user_id)``, their allocations by ``consumer_id``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import tables

ALLOC = tables.allocations
INV = tables.inventories
RP = tables.resource_providers
RC = tables.resource_classes
CONSUMERS = tables.consumers
PROJECTS = tables.projects
USERS = tables.users
TYPES = tables.consumer_types

#: ``consumer_type`` filter values with a special meaning (1.38).
ALL_TYPES = "all"
UNKNOWN_TYPE = "unknown"


@dataclass(frozen=True)
class ProviderUsages:
    generation: int
    usages: dict[str, int]


_PROVIDER_USAGES = (
    sa.select(RP.c.generation, RC.c.name, sa.func.coalesce(sa.func.sum(ALLOC.c.used), 0))
    .select_from(RP)
    .outerjoin(INV, INV.c.resource_provider_id == RP.c.id)
    .outerjoin(RC, RC.c.id == INV.c.resource_class_id)
    .outerjoin(ALLOC, sa.and_(ALLOC.c.resource_provider_id == INV.c.resource_provider_id,
                              ALLOC.c.resource_class_id == INV.c.resource_class_id))
    .where(RP.c.uuid == sa.bindparam("provider"))
    .group_by(RP.c.generation, RC.c.name)
)


def provider_usages(conn: Connection, provider_uuid: str) -> ProviderUsages | None:
    """Usage per inventory class of a provider; None if there is no such provider."""
    rows = conn.execute(_PROVIDER_USAGES, {"provider": provider_uuid}).all()
    if not rows:
        return None
    return ProviderUsages(rows[0][0], {name: int(amount) for _gen, name, amount in rows if name is not None})


def _owned_allocations(by_user: bool) -> sa.Select:
    """FROM/WHERE of the allocations of a project's (and user's) consumers."""
    query = (
        sa.select()
        .select_from(ALLOC)
        .join(CONSUMERS, CONSUMERS.c.uuid == ALLOC.c.consumer_id)
        .join(PROJECTS, PROJECTS.c.id == CONSUMERS.c.project_id)
        .join(RC, RC.c.id == ALLOC.c.resource_class_id)
        .where(PROJECTS.c.external_id == sa.bindparam("project"))
    )
    if by_user:
        query = query.join(USERS, USERS.c.id == CONSUMERS.c.user_id).where(
            USERS.c.external_id == sa.bindparam("user"))
    return query


@functools.cache
def _total_usages_query(by_user: bool) -> sa.Select:
    return (_owned_allocations(by_user)
            .add_columns(RC.c.name, sa.func.sum(ALLOC.c.used))
            .group_by(RC.c.name))


def total_usages(conn: Connection, project: str, user: str | None = None) -> dict[str, int]:
    """{resource class: units allocated} for the project's (and user's) consumers."""
    query = _total_usages_query(user is not None)
    return {name: int(amount) for name, amount in conn.execute(query, {"project": project, "user": user})}


@functools.cache
def _by_type_query(by_user: bool, mode: str) -> sa.CompoundSelect:
    """The UNION ALL of per-class sums and distinct-consumer counts.

    ``mode``: "all" (one group), "unknown" (untyped consumers), "one" (the
    type named by the ``type`` parameter) or "every" (a group per type).
    """
    base = _owned_allocations(by_user).outerjoin(TYPES, TYPES.c.id == CONSUMERS.c.consumer_type_id)
    if mode == ALL_TYPES:
        group_key = sa.literal_column("'all'")
        grouping: list = []
    else:
        group_key = TYPES.c.name
        grouping = [TYPES.c.name]
        if mode == UNKNOWN_TYPE:
            base = base.where(CONSUMERS.c.consumer_type_id.is_(None))
        elif mode == "one":
            base = base.where(TYPES.c.name == sa.bindparam("type"))
    sums = (base.add_columns(group_key.label("type"), RC.c.name.label("class"),
                             sa.func.sum(ALLOC.c.used).label("amount"))
            .group_by(*grouping, RC.c.name))
    counts = (base.add_columns(group_key.label("type"), sa.null().label("class"),
                               sa.func.count(sa.distinct(ALLOC.c.consumer_id)).label("amount"))
              .group_by(*grouping))
    if not grouping:
        # An aggregate without GROUP BY yields a row even when nothing matches.
        counts = counts.having(sa.func.count(ALLOC.c.id) > 0)
    return sa.union_all(sums, counts)


def usages_by_consumer_type(conn: Connection, project: str, user: str | None = None,
                            consumer_type: str | None = None) -> dict[str, dict[str, int]]:
    """{type: {class: units, ..., "consumer_count": n}} for the project's consumers.

    ``consumer_type`` narrows the answer: ``"all"`` gives a single group
    named "all" over every consumer, ``"unknown"`` the consumers without a
    type, any other name that type only.  Without it every type is a group,
    consumers without a type under "unknown".  Sums per class and distinct
    consumer counts come from one statement (``UNION ALL`` of both
    aggregates), so the two always describe the same moment.
    """
    if consumer_type in (ALL_TYPES, UNKNOWN_TYPE):
        mode = consumer_type
    else:
        mode = "every" if consumer_type is None else "one"
    query = _by_type_query(user is not None, mode)
    result: dict[str, dict[str, int]] = {}
    for type_name, class_name, amount in conn.execute(query, {"project": project, "user": user,
                                                              "type": consumer_type}):
        group = result.setdefault(type_name if type_name is not None else UNKNOWN_TYPE, {})
        group["consumer_count" if class_name is None else class_name] = int(amount)
    return result
