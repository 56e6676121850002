"""The aggregates a resource provider belongs to.

Aggregates are bare UUIDs (Placement does not know what they mean); a row
in ``placement_aggregates`` is created the first time a provider joins one
and kept afterwards.  Setting a provider's aggregates replaces the whole
set.

The write starts by taking the provider's row lock with an UPDATE: from
1.19 that is the generation compare-and-swap (the client named the
generation it saw); before 1.19 Placement leaves the generation alone, so
the UPDATE changes nothing but still orders concurrent writers of the
provider.  Reads that follow are therefore current on every backend, and
two writers never race on the association's primary key.  Two providers
joining the same *new* aggregate can still race on its unique uuid: the
loser raises ``AggregateRace`` and the caller re-runs the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows, tables
from allotment.db.engine import utcnow
from allotment.db.generations import bump_provider
from allotment.domain import resource_providers as providers

RP = tables.resource_providers
AGG = tables.placement_aggregates
RP_AGG = tables.resource_provider_aggregates

#: Re-runs of a write that lost the race to create an aggregate row.
RACE_RETRIES = 10
#: The (uuid, id) of the aggregates of the list ``uuids`` that exist.
_AGGREGATE_IDS = sa.select(AGG.c.uuid, AGG.c.id).where(AGG.c.uuid.in_(sa.bindparam("uuids", expanding=True)))


class AggregateRace(Exception):
    """Another transaction created the same aggregate first: re-run."""


def provider_aggregates(conn: Connection, provider_id: int) -> list[str]:
    """The provider's aggregate uuids, in the order it joined them."""
    rows = conn.execute(
        sa.select(AGG.c.uuid).join(RP_AGG, RP_AGG.c.aggregate_id == AGG.c.id)
        .where(RP_AGG.c.resource_provider_id == provider_id)
        .order_by(RP_AGG.c.created_at, AGG.c.id)
    )
    return list(rows.scalars())


def _ensure_aggregates(conn: Connection, uuids: set[str]) -> dict[str, int]:
    """{uuid: id} for ``uuids``, creating the rows that do not exist yet."""
    if not uuids:
        return {}
    wanted = {"uuids": sorted(uuids)}
    found = dict(raw_rows.rows_in_parts(conn, _AGGREGATE_IDS, wanted))
    missing = sorted(uuids - found.keys())
    if missing:
        now = utcnow()
        try:
            conn.execute(sa.insert(AGG), [{"uuid": uuid, "created_at": now} for uuid in missing])
        except sa.exc.IntegrityError:
            raise AggregateRace() from None
        found = dict(raw_rows.rows_in_parts(conn, _AGGREGATE_IDS, wanted))
    return found


def set_provider_aggregates(conn: Connection, provider: providers.ProviderRecord, uuids: Sequence[str], *,
                            expected_generation: int | None) -> int:
    """Make ``uuids`` the provider's aggregates; returns its generation afterwards.

    With ``expected_generation`` (1.19+) the generation is swapped from it
    (``ConcurrentUpdate`` if it moved on); without, it is left unchanged.
    """
    if expected_generation is not None:
        generation = bump_provider(conn, provider.id, expected_generation, uuid=provider.uuid)
    else:
        locked = conn.execute(sa.update(RP).where(RP.c.id == provider.id).values(generation=RP.c.generation))
        if locked.rowcount != 1:
            raise providers.not_found(provider.uuid)
        generation = conn.execute(sa.select(RP.c.generation).where(RP.c.id == provider.id)).scalar_one()
    wanted = _ensure_aggregates(conn, set(uuids))
    current = set(conn.execute(
        sa.select(RP_AGG.c.aggregate_id).where(RP_AGG.c.resource_provider_id == provider.id)).scalars())
    removed = current - set(wanted.values())
    if removed:
        for part in raw_rows.parts(sorted(removed)):
            conn.execute(sa.delete(RP_AGG).where(RP_AGG.c.resource_provider_id == provider.id,
                                                 RP_AGG.c.aggregate_id.in_(part)))
    added = [wanted[uuid] for uuid in dict.fromkeys(uuids) if wanted[uuid] not in current]
    if added:
        now = utcnow()
        conn.execute(sa.insert(RP_AGG), [
            {"resource_provider_id": provider.id, "aggregate_id": aggregate_id, "created_at": now}
            for aggregate_id in added
        ])
    return generation
