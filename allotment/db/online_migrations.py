"""``allotment db online-data-migrations``: data fixes that run while the API serves.

``create_incomplete_consumers``
    Allocations written before consumer records existed (Placement before
    microversion 1.8) name a consumer uuid with no record.  The API copes
    (it shows such consumers with the configured incomplete project and
    user, and a write creates the record), but ``/usages`` cannot count them
    and their generation is undefined.  This migration gives each one a
    record owned by ``[placement] incomplete_consumer_project_id`` /
    ``incomplete_consumer_user_id``, at generation 0, as Placement's does.

The work goes in batches, each its own short transaction, so it can run
beside live API processes and be interrupted at any point: what committed
stays done and the next run starts from what is left.  A batch that races
an API write creating the same consumer is simply re-run.  ``--max-count N``
stops after N records; the exit code is 1 while work remains, 0 when none
does, as ``placement-manage db online_data_migrations`` reports it.

``allotment status`` includes a check that says whether this still needs
to run.
"""

from __future__ import annotations

import argparse
from typing import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment import cli
from allotment.db import consumers, tables
from allotment.db.engine import Database, utcnow

ALLOC = tables.allocations
CONSUMERS = tables.consumers
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
    ids = consumers.ensure_owner(conn, *owner)
    now = utcnow()
    try:
        conn.execute(sa.insert(CONSUMERS), [
            {"uuid": uuid, "project_id": ids.project_id, "user_id": ids.user_id, "generation": 0,
             "created_at": now, "updated_at": now}
            for uuid in uuids
        ])
    except sa.exc.IntegrityError:
        raise consumers.RecordRace("a consumer record") from None
    return len(uuids)


#: name -> (count what is left, migrate up to N): the migrations, in order.
MIGRATIONS: dict[str, tuple[Callable[[Connection], int], Callable[[Connection, int, tuple[str, str]], int]]] = {
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


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-count", type=int, default=None, metavar="N",
                        help="migrate at most N records in this run (default: all, in batches of "
                             f"{BATCH_SIZE})")


@cli.db_command("online-data-migrations",
                "create consumer records missing for old allocations (safe while serving; resumable)",
                _arguments)
def _db_online_data_migrations(args) -> int:
    from allotment import service

    if args.max_count is not None and args.max_count < 1:
        print("--max-count must be a positive integer")
        return 2
    conf = cli._load(args)
    db = service.database_from_config(conf)
    owner = (conf.placement.incomplete_consumer_project_id, conf.placement.incomplete_consumer_user_id)
    report = run(db, owner, args.max_count)
    remaining = 0
    for name, (found, done) in report.items():
        print(f"{name}: {found} found, {done} migrated")
        remaining += found - done
    if remaining:
        print(f"{remaining} records still need migrating: run the command again")
        return 1
    print("online data migrations complete")
    return 0


@cli.status_check
def _check_incomplete_consumers(db: Database) -> tuple[bool, str]:
    try:
        with db.read() as conn:
            left = count_incomplete_consumers(conn)
    except sa.exc.DBAPIError as error:
        return False, f"cannot count consumers without records: {error.orig}"
    if left:
        return False, (f"{left} consumers have allocations but no consumer record: run "
                       "'allotment db online-data-migrations'")
    return True, "every consumer with allocations has a consumer record"
