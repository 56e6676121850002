"""How much of each resource class the cloud has, and how much is used.

For the capacity gauges of ``GET /metrics``: per resource class, the sum of
``total``, ``reserved``, ``capacity`` (``int((total - reserved) *
allocation_ratio)`` per inventory record, the figure the API shows) and
``used`` (allocations against that inventory, as the usages API counts
them), over the whole cloud and per aggregate.  A provider counts towards
an aggregate when it or its root is a member (an aggregate on a compute
node spans its tree, as ``member_of`` has it).

One statement, whatever the size of the cloud: rows grouped by aggregate,
class and the record's (total, reserved, ratio), so that the capacity is
truncated per record exactly as the API does it (in Python, the same
arithmetic) while the database returns one row per distinct kind of
record, not per provider.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import tables
from allotment.domain import inventory_fit as rules

INV = tables.inventories
RC = tables.resource_classes
RP = tables.resource_providers
ALLOC = tables.allocations
AGG = tables.placement_aggregates
RP_AGG = tables.resource_provider_aggregates


@dataclasses.dataclass
class Sums:
    total: int = 0
    reserved: int = 0
    capacity: int = 0
    used: int = 0


def usage_cte() -> sa.CTE:
    """Allocated amounts per (provider id, resource class id)."""
    return (sa.select(ALLOC.c.resource_provider_id.label("provider"), ALLOC.c.resource_class_id.label("rc"),
                      sa.func.sum(ALLOC.c.used).label("used"))
            .group_by(ALLOC.c.resource_provider_id, ALLOC.c.resource_class_id)
            .cte("usage"))


def inventories_with_usage(usage: sa.CTE):
    """Inventories joined with their class and their usage (``usage_cte``)."""
    return INV.join(RC, RC.c.id == INV.c.resource_class_id).outerjoin(
        usage, sa.and_(usage.c.provider == INV.c.resource_provider_id, usage.c.rc == INV.c.resource_class_id))


def _statement() -> sa.Select:
    usage = usage_cte()
    membership = sa.union(
        sa.select(RP_AGG.c.resource_provider_id.label("provider"), RP_AGG.c.aggregate_id.label("aggregate")),
        sa.select(RP.c.id, RP_AGG.c.aggregate_id).join(RP_AGG, RP_AGG.c.resource_provider_id == RP.c.root_provider_id),
    ).cte("membership")
    record = (INV.c.total, INV.c.reserved, INV.c.allocation_ratio)
    sums = (sa.func.count(), sa.func.sum(sa.func.coalesce(usage.c.used, 0)))
    with_usage = inventories_with_usage(usage)
    cloud = (sa.select(sa.cast(sa.null(), sa.String(36)).label("aggregate"), RC.c.name, *record, *sums)
             .select_from(with_usage)
             .group_by(RC.c.name, *record))
    per_aggregate = (sa.select(AGG.c.uuid, RC.c.name, *record, *sums)
                     .select_from(with_usage.join(membership, membership.c.provider == INV.c.resource_provider_id)
                                  .join(AGG, AGG.c.id == membership.c.aggregate))
                     .group_by(AGG.c.uuid, RC.c.name, *record))
    return sa.union_all(cloud, per_aggregate)


_SUMS = _statement()


def capacity_sums(conn: Connection) -> dict[str | None, dict[str, Sums]]:
    """aggregate uuid (None: the whole cloud) -> resource class -> sums."""
    found: dict[str | None, dict[str, Sums]] = {None: {}}
    for aggregate, rc, total, reserved, ratio, records, used in conn.execute(_SUMS).all():
        sums = found.setdefault(aggregate, {}).setdefault(rc, Sums())
        sums.total += total * records
        sums.reserved += reserved * records
        sums.capacity += rules.capacity(total, reserved, ratio) * records
        sums.used += int(used)
    return found


def filtered_sums(conn: Connection, providers: sa.Select | None = None) -> dict[str, Sums]:
    """resource class -> sums over the providers whose ids ``providers``
    selects (None: the whole cloud), with the same arithmetic as above.

    Two grouped statements rather than one join: the inventory records
    grouped by kind, and the allocations that an inventory record backs
    (the unique (provider, class) index) summed per class; on a large cloud
    this is several times faster than joining every record to its usage."""
    records = (sa.select(RC.c.name, INV.c.total, INV.c.reserved, INV.c.allocation_ratio, sa.func.count())
               .select_from(INV.join(RC, RC.c.id == INV.c.resource_class_id))
               .group_by(RC.c.name, INV.c.total, INV.c.reserved, INV.c.allocation_ratio))
    used = (sa.select(RC.c.name, sa.func.sum(ALLOC.c.used))
            .select_from(ALLOC.join(INV, sa.and_(INV.c.resource_provider_id == ALLOC.c.resource_provider_id,
                                                 INV.c.resource_class_id == ALLOC.c.resource_class_id))
                         .join(RC, RC.c.id == ALLOC.c.resource_class_id))
            .group_by(RC.c.name))
    if providers is not None:
        records = records.where(INV.c.resource_provider_id.in_(providers))
        used = used.where(INV.c.resource_provider_id.in_(providers))
    found: dict[str, Sums] = {}
    for rc, total, reserved, ratio, count in conn.execute(records).all():
        sums = found.setdefault(rc, Sums())
        sums.total += total * count
        sums.reserved += reserved * count
        sums.capacity += rules.capacity(total, reserved, ratio) * count
    for rc, amount in conn.execute(used).all():
        found.setdefault(rc, Sums()).used += int(amount or 0)
    return found
