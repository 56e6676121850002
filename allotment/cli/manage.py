"""``placement-manage``: Placement's database command, for the tools that run it.

    placement-manage [--config-file F ...] [--config-dir D ...] db sync
    placement-manage ... db version
    placement-manage ... db stamp VERSION
    placement-manage ... db online_data_migrations [--max-count N]

Deployment tools (Kolla-Ansible's bootstrap and upgrade, OpenStack-Ansible,
devstack) run these by name; they take the same options (oslo.config's
command line, oslo.log's logging options, ``--version``), print the same
things and end with the same exit status as Placement's:

``db sync``
    brings the schema to head (taking over a database Placement made, at
    any of its revisions); prints nothing; exit 0, or 1 with the reason on
    standard error.
``db version``
    prints the Placement schema revision (``a082b8bb98d0`` once in sync,
    ``None`` before); Allotment's own revision goes to standard error.
``db stamp VERSION``
    records VERSION as the schema's Placement revision and changes nothing
    else (a revision id or a unique start of one, ``head``, or ``base`` for
    none), as after copying Placement's tables out of nova_api; exit 0, or
    1 naming a revision it does not know.
``db online_data_migrations``
    runs the migrations in passes of 50 (or one pass of ``--max-count``),
    printing a line per pass that found work and then the table
    ``Migration | Total Found | Completed``; exit 0 when nothing more could
    be done, 1 when ``--max-count`` was given and records were migrated,
    2 when a migration failed, 127 for a bad ``--max-count``.

Messages name Placement's commands: ``allotment db ...`` works the same.
"""

from __future__ import annotations

import logging
import sys

from oslo_config import cfg

from allotment.cli import common, version_string
from allotment.cli.db import incomplete_owner

LOG = logging.getLogger("placement.cmd.manage")
#: Records per pass when --max-count is not given (Placement's batch).
BATCH = 50


def as_placement(text: str) -> str:
    """A message as Placement's operators read it: the command names they use."""
    return (text.replace("allotment db online-data-migrations", "placement-manage db online_data_migrations")
                .replace("allotment db sync", "placement-manage db sync"))


def _database(conf):
    from allotment import service

    return service.database_from_config(conf)


def db_sync(conf) -> int:
    from allotment import service

    db = _database(conf)
    try:
        service.wait_for_database(db, conf)
        service.prepare_database(db)
    except common.schema_errors() as error:
        print(as_placement(common.one_line(error)), file=sys.stderr)
        return 1
    return 0


def db_version(conf) -> int:
    from allotment.db import migrate

    db = _database(conf)
    try:
        print(migrate.placement_revision(db.engine))
        print(f"Allotment revision: {migrate.current_revision(db.engine)}", file=sys.stderr)
    except common.schema_errors() as error:
        print(common.one_line(error), file=sys.stderr)
        return 1
    return 0


def db_stamp(conf) -> int:
    from allotment.db import reference_layout

    name = conf.command.version
    try:
        revision = reference_layout.named_revision(name)
    except KeyError:
        print(f"Can't locate revision identified by {name!r}", file=sys.stderr)
        return 1
    db = _database(conf)
    try:
        with db.engine.begin() as conn:
            reference_layout.stamp(conn, revision)
    except common.schema_errors() as error:
        print(common.one_line(error), file=sys.stderr)
        return 1
    return 0


def db_online_data_migrations(conf) -> int:
    import prettytable

    from allotment.db import online_migrations

    max_count = conf.command.max_count
    limited = max_count is not None
    if limited:
        try:
            max_count = int(max_count)
        except ValueError:
            max_count = 0
        if max_count < 1:
            print("Must supply a positive value for max_count")
            return 127
    else:
        max_count = BATCH
        print(f"Running batches of {max_count} until complete")
    db = _database(conf)
    owner = incomplete_owner(conf)
    totals: dict[str, list[int]] = {}
    failed = False
    while True:
        try:
            report = online_migrations.run_pass(db, owner, max_count)
        except common.schema_errors() as error:
            print(f"Error attempting to run the online data migrations: {as_placement(common.one_line(error))}")
            LOG.exception("online data migrations failed")
            failed, report = True, {}
        ran = 0
        for name, (matched, done) in report.items():
            if matched:
                print(f"{matched} rows matched query {name}, {done} migrated")
            total = totals.setdefault(name, [0, 0])
            total[0] += matched
            total[1] += done
            ran += done
        if limited or failed or ran == 0:
            break
    table = prettytable.PrettyTable(["Migration", "Total Found", "Completed"])
    for name in online_migrations.MIGRATIONS:
        if name in totals:
            table.add_row([name, *totals[name]])
    print(table)
    if failed and not (limited and ran):
        print("Some migrations failed unexpectedly. Check log for details.")
        return 2
    return 1 if limited and ran else 0


def _add_db_commands(subparsers) -> None:
    db = subparsers.add_parser("db")
    commands = db.add_subparsers(title="database commands", dest="db_command")
    commands.required = True
    help_text = "Sync the database to the current version."
    commands.add_parser("sync", help=help_text, description=help_text).set_defaults(func=db_sync)
    help_text = "Report the current database version."
    commands.add_parser("version", help=help_text, description=help_text).set_defaults(func=db_version)
    help_text = "Stamp the version table with the given version."
    stamp = commands.add_parser("stamp", help=help_text, description=help_text)
    stamp.add_argument("version", help="the version to stamp")
    stamp.set_defaults(func=db_stamp)
    help_text = "Run the online data migrations."
    online = commands.add_parser("online_data_migrations", help=help_text, description=help_text)
    online.add_argument("--max-count", metavar="<number>", help="Maximum number of objects to consider")
    online.set_defaults(func=db_online_data_migrations)


def main(argv: list[str] | None = None) -> int:
    from allotment import config, service

    conf = config.new(cli_logging=True)
    conf.register_cli_opt(cfg.SubCommandOpt("db", dest="command", title="Command",
                                            help="Available DB commands", handler=_add_db_commands))
    try:
        config.parse(conf, sys.argv[1:] if argv is None else argv, prog="placement-manage",
                     version=version_string())
        service.setup_logging(conf, command=True)
        return conf.command.func(conf)
    except cfg.Error as error:
        print(f"placement-manage: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
