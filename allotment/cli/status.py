"""``allotment status``: is the database reachable, at head, its data complete?

``placement-status upgrade check`` (:mod:`allotment.cli.upgrade_check`)
runs Placement's checks and these under oslo.upgradecheck's table.
"""

from __future__ import annotations

import argparse
from typing import Callable

from allotment.cli import common


def check_schema(db) -> tuple[bool, str]:
    from allotment.db import migrate

    return migrate.status(db.engine)


def check_incomplete_data(db) -> tuple[bool, str]:
    """Data that ``allotment db online-data-migrations`` completes (any Placement revision)."""
    import sqlalchemy as sa

    from allotment.db import online_migrations, reference_layout

    try:
        with db.read() as conn:
            if reference_layout.state(conn) in ("empty", "unknown"):
                return True, "no Placement data to check"
            roots = reference_layout.providers_without_root(conn)
            consumers = online_migrations.count_incomplete_consumers(conn)
    except sa.exc.DBAPIError as error:
        return False, f"cannot check for incomplete data: {common.one_line(error)}"
    missing = []
    if roots:
        missing.append(f"{roots} resource providers have no root provider")
    if consumers:
        missing.append(f"{consumers} consumers have allocations but no consumer record")
    if missing:
        return False, "; ".join(missing) + ": run 'allotment db online-data-migrations'"
    return True, "every consumer with allocations has a consumer record and every provider its root"


#: Every check, in the order it is reported: (ok, one line).
CHECKS: list[Callable] = [check_schema, check_incomplete_data]


def configure(parser: argparse.ArgumentParser) -> None:
    common.add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from allotment import service

    conf = common.load(args)
    db = service.database_from_config(conf)
    try:
        with db.engine.connect():
            pass
    except Exception as error:  # noqa: BLE001 - reported, not raised
        print(f"FAILURE: cannot connect to the database: {error}")
        return 2
    worst = 0
    for check in CHECKS:
        try:
            ok, message = check(db)
        except common.schema_errors() as error:
            ok, message = False, common.one_line(error)
        print(("OK: " if ok else "FAILURE: ") + message)
        worst = max(worst, 0 if ok else 1)
    print("verdict: " + ("ready" if worst == 0 else "action needed"))
    return worst
