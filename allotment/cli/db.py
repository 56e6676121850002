"""``allotment db``: the schema (sync, version), the online data migrations,
and a whole database's copy.

``placement-manage db ...`` (:mod:`allotment.cli.manage`) runs the same
work under Placement's names and output.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NamedTuple

from allotment.cli import common, db_copy


class Subcommand(NamedTuple):
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] | None = None


def sync(args: argparse.Namespace) -> int:
    from allotment import service
    from allotment.db import migrate

    conf = common.load(args)
    db = service.database_from_config(conf)
    try:
        service.wait_for_database(db, conf)
        service.prepare_database(db)
        print(f"database at Placement schema {migrate.placement_revision(db.engine)}, "
              f"Allotment revision {migrate.current_revision(db.engine)}")
    except common.schema_errors() as error:
        print(f"allotment db sync: {common.one_line(error)}")
        return 1
    return 0


def version(args: argparse.Namespace) -> int:
    """Allotment's revision (``None`` before the first sync); Placement's on stderr."""
    from allotment import service
    from allotment.db import migrate

    conf = common.load(args)
    db = service.database_from_config(conf)
    try:
        print(migrate.current_revision(db.engine) or "None")
        print(f"Placement schema revision: {migrate.placement_revision(db.engine) or 'None'}",
              file=sys.stderr)
    except common.schema_errors() as error:
        print(f"allotment db version: {common.one_line(error)}")
        return 1
    return 0


def _online_migration_arguments(parser: argparse.ArgumentParser) -> None:
    from allotment.db import online_migrations

    parser.add_argument("--max-count", type=int, default=None, metavar="N",
                        help="migrate at most N records in this run (default: all, in batches of "
                             f"{online_migrations.BATCH_SIZE})")


def online_data_migrations(args: argparse.Namespace) -> int:
    """Exit 1 while work remains, 0 when none does."""
    from allotment import service
    from allotment.db import online_migrations

    if args.max_count is not None and args.max_count < 1:
        print("--max-count must be a positive integer")
        return 2
    conf = common.load(args)
    db = service.database_from_config(conf)
    try:
        report = online_migrations.run(db, incomplete_owner(conf), args.max_count)
    except common.schema_errors() as error:
        print(f"allotment db online-data-migrations: {common.one_line(error)}")
        return 1
    remaining = 0
    for name, (found, done) in report.items():
        print(f"{name}: {found} found, {done} migrated")
        remaining += found - done
    if remaining:
        print(f"{remaining} records still need migrating: run the command again")
        return 1
    print("online data migrations complete")
    return 0


def incomplete_owner(conf) -> tuple[str, str]:
    """The project and user recorded for consumers older Placement left without a record."""
    return conf.placement.incomplete_consumer_project_id, conf.placement.incomplete_consumer_user_id


#: ``allotment db NAME``, in the order ``--help`` lists them.
SUBCOMMANDS: dict[str, Subcommand] = {
    "sync": Subcommand("create or upgrade the schema to the latest revision (idempotent)", sync),
    "version": Subcommand("print the schema revision of the database", version),
    "online-data-migrations": Subcommand(
        "complete data older Placement left incomplete: provider roots, consumer records for "
        "old allocations (safe while serving; resumable)",
        online_data_migrations, _online_migration_arguments),
    "copy": Subcommand(db_copy.HELP, db_copy.run, db_copy.configure),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", required=True)
    for name, subcommand in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=subcommand.help)
        common.add_config_arguments(command)
        if subcommand.arguments is not None:
            subcommand.arguments(command)


def run(args: argparse.Namespace) -> int:
    return SUBCOMMANDS[args.db_command].run(args)
