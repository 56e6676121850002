"""Generation compare-and-swap: how every writer proves it saw the latest state.

A write that changes a provider (inventory, traits, aggregates, allocations
against it, its parent) or a consumer bumps its generation in the same
transaction::

    UPDATE resource_providers SET generation = g + 1
     WHERE id = :id AND generation = :g

Zero rows means another transaction changed it after we read it: raise
``ConcurrentUpdate`` (409 ``placement.concurrent_update``) and let the
transaction roll back.  On PostgreSQL (READ COMMITTED) the UPDATE waits for a
concurrent writer of the same row and then re-checks the WHERE clause
against its committed result; on MySQL/MariaDB the UPDATE reads the latest
committed row; on SQLite writers are serialised by BEGIN IMMEDIATE.  So the
same code is correct on every backend without SELECT ... FOR UPDATE.

Callers touching several providers bump them in id order, so two
transactions never wait on each other in opposite orders.

Under contention that optimism costs: when many writers claim against one
provider at once, each swap waits for the writer before it and then finds
the generation moved, and every loser re-runs.  A re-run may therefore
``lock_providers`` first (``SELECT ... FOR UPDATE``, id order): it queues
behind the current writer instead of racing the next round.  The swap stays
the guard; the lock only makes it likely to succeed.
"""

from __future__ import annotations

from typing import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows, tables
from allotment.db.engine import prepared, utcnow
from allotment.domain.errors import ConcurrentUpdate

RP = tables.resource_providers
CONSUMERS = tables.consumers


def _swap(table: sa.Table) -> sa.Update:
    """The compare-and-swap statement, built once (parameters: id, expected, new, now)."""
    return prepared(sa.update(table)
                    .where(table.c.id == sa.bindparam("swap_id"), table.c.generation == sa.bindparam("expected"))
                    .values(generation=sa.bindparam("new"), updated_at=sa.bindparam("now")))


_SWAP_PROVIDER = _swap(RP)
_SWAP_CONSUMER = _swap(CONSUMERS)


def _advance(conn: Connection, swap: sa.Update, row_id: int, expected: int, what: str) -> int:
    """The compare-and-swap ``swap`` of one row from ``expected``; the new
    generation, or ConcurrentUpdate naming ``what`` when the row moved."""
    swapped = raw_rows.write(conn, swap, {"swap_id": row_id, "expected": expected,
                                          "new": expected + 1, "now": utcnow()})
    if swapped != 1:
        raise ConcurrentUpdate(
            f"{what} generation conflict: another process updated it. Please retry your update")
    return expected + 1


def bump_provider(conn: Connection, provider_id: int, expected: int, *, uuid: str | None = None) -> int:
    """Advance one provider's generation from ``expected``; returns the new one."""
    return _advance(conn, _SWAP_PROVIDER, provider_id, expected, f"resource provider {uuid or provider_id}")


def bump_providers(conn: Connection, expected: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Bump several providers ({id: generation read}); in id order to avoid deadlocks."""
    return {pid: bump_provider(conn, pid, gen) for pid, gen in sorted(set(expected))}


_LOCK_PROVIDERS = (sa.select(RP.c.id).where(RP.c.id.in_(sa.bindparam("ids", expanding=True)))
                   .order_by(RP.c.id).with_for_update())


def lock_providers(conn: Connection, provider_ids: Iterable[int]) -> None:
    """Wait for and hold the row locks of these providers until the transaction ends.

    Meant as the first statement of a transaction: on MySQL/MariaDB the
    snapshot of later reads is then taken after the wait, so they see what
    the writers before us committed (on PostgreSQL every statement does).
    Nothing to do on SQLite, where writers are serialised already.
    """
    ids = sorted(set(provider_ids))
    if ids and conn.dialect.name != "sqlite":
        conn.execute(_LOCK_PROVIDERS, {"ids": ids}).all()


def bump_consumer(conn: Connection, consumer_id: int, expected: int, *, uuid: str | None = None) -> int:
    """Advance one consumer's generation from ``expected``; returns the new one."""
    return _advance(conn, _SWAP_CONSUMER, consumer_id, expected, f"consumer {uuid or consumer_id}")
