"""``allotment``: serve the API, manage the schema, check the deployment.

Subcommands register themselves in ``COMMANDS`` (name -> (configure, run))
so that later features (online data migrations, reshape) add a function
here without touching the others.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
from typing import Callable

LOG = logging.getLogger("allotment")


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-file", metavar="PATH",
                        help="placement.conf to read (default: $OS_PLACEMENT_CONFIG_DIR/placement.conf, "
                             "then /etc/placement/placement.conf, else the embedded SQLite default)")


def _load(args, *, dev_defaults: bool = True):
    from allotment import service

    return service.load_config(args.config_file, dev_defaults=dev_defaults)


# -- serve ----------------------------------------------------------------

def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except OSError:
            return False


def configure_serve(parser: argparse.ArgumentParser) -> None:
    _add_config(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8778, help="port to listen on (default 8778)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default: number of CPUs, at least 2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker (default 4)")
    parser.add_argument("--timeout", type=int, default=120,
                        help="seconds before a stuck worker is restarted (default 120)")
    parser.add_argument("--allow-insecure-noauth", action="store_true",
                        help="allow [api] auth_strategy = noauth2 on a non-loopback address")


def run_serve(args) -> int:
    from allotment import config, server, service

    conf = _load(args)
    if conf.api.auth_strategy == "noauth2" and not _is_loopback(args.host):
        if not args.allow_insecure_noauth:
            LOG.error("refusing to serve noauth2 on %s: anyone who can reach it is admin; "
                      "pass --allow-insecure-noauth to do it anyway", args.host)
            return 2
        LOG.warning("serving noauth2 on non-loopback address %s: every caller can claim any identity",
                    args.host)
        config.allow_any_host(conf)
    metrics_dir = server.prepare_metrics(conf)  # before the application is built
    try:
        app = service.build_application(conf)
    except _schema_errors() as error:
        LOG.error("not serving: %s", _one_line(error))
        return 1
    app.db.dispose()  # never share the migration's connections with forked workers
    workers = args.workers or max(2, os.cpu_count() or 1)
    server.run(app, host=args.host, port=args.port, workers=workers, threads=args.threads,
               timeout=args.timeout, metrics_dir=metrics_dir)
    return 0


# -- db -------------------------------------------------------------------

def configure_db(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", required=True)
    for name, help_text in DB_COMMANDS_HELP.items():
        command = sub.add_parser(name, help=help_text)
        _add_config(command)
        if name in DB_COMMANDS_ARGS:
            DB_COMMANDS_ARGS[name](command)


DB_COMMANDS_HELP = {
    "sync": "create or upgrade the schema to the latest revision (idempotent)",
    "version": "print the schema revision of the database",
}
DB_COMMANDS: dict[str, Callable] = {}
DB_COMMANDS_ARGS: dict[str, Callable[[argparse.ArgumentParser], None]] = {}


def db_command(name: str, help_text: str,
               arguments: Callable[[argparse.ArgumentParser], None] | None = None):
    """Register ``allotment db NAME``; ``arguments`` adds its own options."""
    def register(func):
        DB_COMMANDS_HELP[name] = help_text
        DB_COMMANDS[name] = func
        if arguments is not None:
            DB_COMMANDS_ARGS[name] = arguments
        return func
    return register


def _schema_errors() -> tuple[type[BaseException], ...]:
    import sqlalchemy as sa

    from allotment.db.migrate import SchemaNotReady

    return (SchemaNotReady, sa.exc.SQLAlchemyError)


def _one_line(error: BaseException) -> str:
    from allotment.db.migrate import SchemaNotReady

    if isinstance(error, SchemaNotReady):
        return str(error)
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip().splitlines()
    return f"database error: {text[0] if text else type(error).__name__}"


@db_command("sync", DB_COMMANDS_HELP["sync"])
def _db_sync(args) -> int:
    from allotment import service
    from allotment.db import migrate

    conf = _load(args)
    db = service.database_from_config(conf)
    try:
        service.prepare_database(db)
        print(f"database at Placement schema {migrate.placement_revision(db.engine)}, "
              f"Allotment revision {migrate.current_revision(db.engine)}")
    except _schema_errors() as error:
        print(f"allotment db sync: {_one_line(error)}")
        return 1
    return 0


@db_command("version", DB_COMMANDS_HELP["version"])
def _db_version(args) -> int:
    """Allotment's revision (``None`` before the first sync); Placement's on stderr."""
    from allotment import service
    from allotment.db import migrate

    conf = _load(args)
    db = service.database_from_config(conf)
    try:
        print(migrate.current_revision(db.engine) or "None")
        print(f"Placement schema revision: {migrate.placement_revision(db.engine) or 'None'}",
              file=sys.stderr)
    except _schema_errors() as error:
        print(f"allotment db version: {_one_line(error)}")
        return 1
    return 0


def _online_migration_arguments(parser: argparse.ArgumentParser) -> None:
    from allotment.db import online_migrations

    parser.add_argument("--max-count", type=int, default=None, metavar="N",
                        help="migrate at most N records in this run (default: all, in batches of "
                             f"{online_migrations.BATCH_SIZE})")


@db_command("online-data-migrations",
            "complete data older Placement left incomplete: provider roots, consumer records for "
            "old allocations (safe while serving; resumable)",
            _online_migration_arguments)
def _db_online_data_migrations(args) -> int:
    """Exit 1 while work remains, 0 when none does, as ``placement-manage`` reports it."""
    from allotment import service
    from allotment.db import online_migrations

    if args.max_count is not None and args.max_count < 1:
        print("--max-count must be a positive integer")
        return 2
    conf = _load(args)
    db = service.database_from_config(conf)
    owner = (conf.placement.incomplete_consumer_project_id, conf.placement.incomplete_consumer_user_id)
    try:
        report = online_migrations.run(db, owner, args.max_count)
    except _schema_errors() as error:
        print(f"allotment db online-data-migrations: {_one_line(error)}")
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


def run_db(args) -> int:
    return DB_COMMANDS[args.db_command](args)


# -- status ---------------------------------------------------------------

STATUS_CHECKS: list[Callable] = []


def status_check(func):
    """Register a check for ``allotment status``: returns (ok, message)."""
    STATUS_CHECKS.append(func)
    return func


@status_check
def _check_schema(db) -> tuple[bool, str]:
    from allotment.db import migrate

    return migrate.status(db.engine)


@status_check
def _check_incomplete_data(db) -> tuple[bool, str]:
    """Data that ``allotment db online-data-migrations`` completes (any Placement revision)."""
    import sqlalchemy as sa

    from allotment.db import reference_layout

    try:
        with db.read() as conn:
            if reference_layout.state(conn) in ("empty", "unknown"):
                return True, "no Placement data to check"
            roots = reference_layout.providers_without_root(conn)
            from allotment.db import online_migrations

            consumers = online_migrations.count_incomplete_consumers(conn)
    except sa.exc.DBAPIError as error:
        return False, f"cannot check for incomplete data: {_one_line(error)}"
    missing = []
    if roots:
        missing.append(f"{roots} resource providers have no root provider")
    if consumers:
        missing.append(f"{consumers} consumers have allocations but no consumer record")
    if missing:
        return False, "; ".join(missing) + ": run 'allotment db online-data-migrations'"
    return True, "every consumer with allocations has a consumer record and every provider its root"


def configure_status(parser: argparse.ArgumentParser) -> None:
    _add_config(parser)


def run_status(args) -> int:
    from allotment import service

    conf = _load(args)
    db = service.database_from_config(conf)
    try:
        with db.engine.connect():
            pass
    except Exception as error:  # noqa: BLE001 - reported, not raised
        print(f"FAILURE: cannot connect to the database: {error}")
        return 2
    worst = 0
    for check in STATUS_CHECKS:
        try:
            ok, message = check(db)
        except _schema_errors() as error:
            ok, message = False, _one_line(error)
        print(("OK: " if ok else "FAILURE: ") + message)
        worst = max(worst, 0 if ok else 1)
    print("verdict: " + ("ready" if worst == 0 else "action needed"))
    return worst


COMMANDS: dict[str, tuple[Callable, Callable, str]] = {
    "serve": (configure_serve, run_serve, "serve the Placement API"),
    "db": (configure_db, run_db, "manage the database schema"),
    "status": (configure_status, run_status, "check the database is reachable and up to date"),
}


def main(argv: list[str] | None = None) -> int:
    # Subcommands added by other modules register on import.
    for module in ("allotment.reshape_cli", "allotment.explain_cli", "allotment.openapi_cli",
                   "allotment.copy_cli"):
        try:
            __import__(module)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
    parser = argparse.ArgumentParser(prog="allotment", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (configure, _run, help_text) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    from oslo_config import cfg

    try:
        return COMMANDS[args.command][1](args)
    except cfg.Error as error:
        # A bad placement.conf is the operator's to fix: say what is wrong, no traceback.
        print(f"allotment: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
