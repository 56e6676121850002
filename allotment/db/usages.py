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

The lookups follow indexes: project by external id, its consumers by
``(project_id, user_id)``, their allocations by ``consumer_id``.
"""

from __future__ import annotations

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


def provider_usages(conn: Connection, provider_uuid: str) -> ProviderUsages | None:
    """Usage per inventory class of a provider; None if there is no such provider."""
    used = sa.func.coalesce(sa.func.sum(ALLOC.c.used), 0)
    query = (
        sa.select(RP.c.generation, RC.c.name, used)
        .select_from(RP)
        .outerjoin(INV, INV.c.resource_provider_id == RP.c.id)
        .outerjoin(RC, RC.c.id == INV.c.resource_class_id)
        .outerjoin(ALLOC, sa.and_(ALLOC.c.resource_provider_id == INV.c.resource_provider_id,
                                  ALLOC.c.resource_class_id == INV.c.resource_class_id))
        .where(RP.c.uuid == provider_uuid)
        .group_by(RP.c.generation, RC.c.name)
    )
    rows = conn.execute(query).all()
    if not rows:
        return None
    return ProviderUsages(rows[0][0], {name: int(amount) for _gen, name, amount in rows if name is not None})


def _owned_allocations(project: str, user: str | None) -> sa.Select:
    """FROM/WHERE of the allocations of a project's (and user's) consumers."""
    query = (
        sa.select()
        .select_from(ALLOC)
        .join(CONSUMERS, CONSUMERS.c.uuid == ALLOC.c.consumer_id)
        .join(PROJECTS, PROJECTS.c.id == CONSUMERS.c.project_id)
        .join(RC, RC.c.id == ALLOC.c.resource_class_id)
        .where(PROJECTS.c.external_id == project)
    )
    if user is not None:
        query = query.join(USERS, USERS.c.id == CONSUMERS.c.user_id).where(USERS.c.external_id == user)
    return query


def total_usages(conn: Connection, project: str, user: str | None = None) -> dict[str, int]:
    """{resource class: units allocated} for the project's (and user's) consumers."""
    query = (_owned_allocations(project, user)
             .add_columns(RC.c.name, sa.func.sum(ALLOC.c.used))
             .group_by(RC.c.name))
    return {name: int(amount) for name, amount in conn.execute(query)}


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
    base = _owned_allocations(project, user).outerjoin(TYPES, TYPES.c.id == CONSUMERS.c.consumer_type_id)
    if consumer_type == ALL_TYPES:
        group_key = sa.literal_column("'all'")
        grouping: list = []
    else:
        group_key = TYPES.c.name
        grouping = [TYPES.c.name]
        if consumer_type == UNKNOWN_TYPE:
            base = base.where(CONSUMERS.c.consumer_type_id.is_(None))
        elif consumer_type is not None:
            base = base.where(TYPES.c.name == consumer_type)
    sums = (base.add_columns(group_key.label("type"), RC.c.name.label("class"),
                             sa.func.sum(ALLOC.c.used).label("amount"))
            .group_by(*grouping, RC.c.name))
    counts = (base.add_columns(group_key.label("type"), sa.null().label("class"),
                               sa.func.count(sa.distinct(ALLOC.c.consumer_id)).label("amount"))
              .group_by(*grouping))
    if not grouping:
        # An aggregate without GROUP BY yields a row even when nothing matches.
        counts = counts.having(sa.func.count(ALLOC.c.id) > 0)
    result: dict[str, dict[str, int]] = {}
    for type_name, class_name, amount in conn.execute(sa.union_all(sums, counts)):
        group = result.setdefault(type_name if type_name is not None else UNKNOWN_TYPE, {})
        group["consumer_count" if class_name is None else class_name] = int(amount)
    return result
