"""Online data migrations: data fixes that run while the API serves.

``allotment db online-data-migrations`` (in ``allotment/cli.py``) runs them.

``set_root_provider_ids``
    Providers created before nested providers existed (Placement before
    Queens' schema) may have no ``root_provider_id``.  Each gets its tree's
    root: itself when it has no parent, else its parent's root.  The
    reference refuses to upgrade past revision 611cd6dffd7b until none is
    left, and so does Allotment's take-over.

``create_incomplete_consumers``
    Allocations written before consumer records existed (Placement before
    microversion 1.8) name a consumer uuid with no record.  The API copes
    (it shows such consumers with the configured incomplete project and
    user, and a write creates the record), but ``/usages`` cannot count them
    and their generation is undefined.  This migration gives each one a
    record owned by ``[placement] incomplete_consumer_project_id`` /
    ``incomplete_consumer_user_id``, at generation 0, as Placement's does.
    The reference refuses to upgrade past revision b5c396305c25 until none
    is left.

Both work on every schema revision of the reference (the oldest have no
``consumer_types`` table yet: nothing here touches it).  The work goes in
batches, each its own short transaction, so it can run beside live API
processes and be interrupted at any point: what committed stays done and
the next run starts from what is left.  A batch that races an API write
creating the same consumer is simply re-run.
"""

from __future__ import annotations

from typing import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import consumers, tables
from allotment.db.engine import Database, utcnow

ALLOC = tables.allocations
CONSUMERS = tables.consumers
PROVIDERS = tables.resource_providers
BATCH_SIZE = 50


def _orphans() -> sa.Select:
    """Consumer uuids of allocations without a consumer record."""
    return (
        sa.select(ALLOC.c.consumer_id)
        .select_from(ALLOC.outerjoin(CONSUMERS, CONSUMERS.c.uuid == ALLOC.c.consumer_id))
        .where(CONSUMERS.c.id.is_(None))
        .distinct()
    )


def count_incomplete_consumers(conn: Connection) -> int:
    """How many consumers have allocations but no record."""
    return conn.execute(sa.select(sa.func.count()).select_from(_orphans().subquery())).scalar_one()


def create_incomplete_consumers(conn: Connection, limit: int, owner: tuple[str, str]) -> int:
    """Create records for up to ``limit`` of those consumers; returns how many."""
    uuids = conn.execute(_orphans().order_by(ALLOC.c.consumer_id).limit(limit)).scalars().all()
    if not uuids:
        return 0
    project_id = _external_id(conn, tables.projects, owner[0])
    user_id = _external_id(conn, tables.users, owner[1])
    now = utcnow()
    try:
        conn.execute(sa.insert(CONSUMERS), [
            {"uuid": uuid, "project_id": project_id, "user_id": user_id, "generation": 0,
             "created_at": now, "updated_at": now}
            for uuid in uuids
        ])
    except sa.exc.IntegrityError:
        raise consumers.RecordRace("a consumer record") from None
    return len(uuids)


def _external_id(conn: Connection, table: sa.Table, external_id: str) -> int:
    """The id of a project or user, created when new (a concurrent creation is a race)."""
    found = conn.execute(sa.select(table.c.id).where(table.c.external_id == external_id)).scalar()
    if found is not None:
        return found
    now = utcnow()
    try:
        return conn.execute(sa.insert(table).values(external_id=external_id, created_at=now,
                                                    updated_at=now)).inserted_primary_key[0]
    except sa.exc.IntegrityError:
        raise consumers.RecordRace(f"{table.name} {external_id}") from None


def count_providers_without_root(conn: Connection) -> int:
    return conn.execute(sa.select(sa.func.count()).select_from(PROVIDERS)
                        .where(PROVIDERS.c.root_provider_id.is_(None))).scalar_one()


def set_root_provider_ids(conn: Connection, limit: int, _owner: tuple[str, str]) -> int:
    """Give up to ``limit`` providers whose root is known their root id; returns how many.

    A provider without a parent is its own root; one whose parent's root is
    known gets that.  Deeper providers are reached by later batches.
    """
    parent = PROVIDERS.alias("parent")
    rows = conn.execute(
        sa.select(PROVIDERS.c.id, PROVIDERS.c.parent_provider_id, parent.c.root_provider_id)
        .select_from(PROVIDERS.outerjoin(parent, parent.c.id == PROVIDERS.c.parent_provider_id))
        .where(PROVIDERS.c.root_provider_id.is_(None))
        .where(sa.or_(PROVIDERS.c.parent_provider_id.is_(None), parent.c.root_provider_id.is_not(None)))
        .order_by(PROVIDERS.c.id).limit(limit)).all()
    for provider_id, parent_id, parent_root in rows:
        root = provider_id if parent_id is None else parent_root
        conn.execute(sa.update(PROVIDERS).where(PROVIDERS.c.id == provider_id)
                     .where(PROVIDERS.c.root_provider_id.is_(None)).values(root_provider_id=root))
    return len(rows)


#: name -> (count what is left, migrate up to N): the migrations, in order.
MIGRATIONS: dict[str, tuple[Callable[[Connection], int], Callable[[Connection, int, tuple[str, str]], int]]] = {
    "set_root_provider_ids": (count_providers_without_root, set_root_provider_ids),
    "create_incomplete_consumers": (count_incomplete_consumers, create_incomplete_consumers),
}


def run(db: Database, owner: tuple[str, str], max_count: int | None = None,
        batch_size: int = BATCH_SIZE) -> dict[str, tuple[int, int]]:
    """Run every migration in batches: {name: (found, completed)}.

    ``max_count`` bounds the records migrated in this run (all migrations
    together); ``None`` means until nothing is left.
    """
    report: dict[str, tuple[int, int]] = {}
    budget = max_count
    for name, (count, migrate) in MIGRATIONS.items():
        with db.read() as conn:
            found = count(conn)
        done = 0
        while done < found and (budget is None or budget > 0):
            size = batch_size if budget is None else min(batch_size, budget)
            migrated = db.run_write(lambda conn: migrate(conn, size, owner),
                                    retry_on=(consumers.RecordRace,), retries=10)
            if migrated == 0:
                break
            done += migrated
            if budget is not None:
                budget -= migrated
        report[name] = (found, done)
    return report


def run_pass(db: Database, owner: tuple[str, str], limit: int) -> dict[str, tuple[int, int]]:
    """One pass as ``placement-manage db online_data_migrations`` makes it:
    each migration in turn, in one transaction, on at most what is left of
    ``limit`` records: {name: (matched, migrated)}, stopping once ``limit``
    records were migrated.  Run passes until one migrates nothing."""
    report: dict[str, tuple[int, int]] = {}
    migrated_so_far = 0
    for name, (count, migrate) in MIGRATIONS.items():
        budget = limit - migrated_so_far
        with db.read() as conn:
            matched = min(count(conn), budget)
        done = 0
        if matched:
            done = db.run_write(lambda conn: migrate(conn, budget, owner),
                                retry_on=(consumers.RecordRace,), retries=10)
        report[name] = (matched, done)
        migrated_so_far += done
        if migrated_so_far >= limit:
            break
    return report
