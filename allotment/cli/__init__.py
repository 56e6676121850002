"""``allotment``: serve the API, manage the schema, check the deployment.

One table, :data:`COMMANDS`, names every subcommand and the module that
does it; Placement's own commands, ``placement-manage`` and
``placement-status``, live beside them (:mod:`allotment.cli.manage`,
:mod:`allotment.cli.upgrade_check`) and do the same work under Placement's
names and output.  The modules import what is heavy inside the functions
that need it, so ``allotment --help`` stays quick.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NamedTuple

from oslo_config import cfg

from allotment import __version__
from allotment.cli import db, explain, openapi, reshape, serve, status


class Command(NamedTuple):
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: ``allotment NAME``, in the order ``--help`` lists them.
COMMANDS: dict[str, Command] = {
    "serve": Command("serve the Placement API", serve.configure, serve.run),
    "db": Command("manage the database schema", db.configure, db.run),
    "status": Command("check the database is reachable and up to date", status.configure, status.run),
    "explain": Command("explain what GET /allocation_candidates finds for a query string",
                       explain.configure, explain.run),
    "openapi": Command("write the OpenAPI 3.1 description of the API (one microversion)",
                       openapi.configure, openapi.run),
    "reshape": Command("apply one POST /reshaper payload in-process (no API server needed)",
                       reshape.configure, reshape.run),
}


def version_string() -> str:
    return __version__


def add_version(parser: argparse.ArgumentParser, prog: str) -> None:
    parser.add_argument("--version", action="version", version=f"{prog} {version_string()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="allotment", description=__doc__.splitlines()[0])
    add_version(parser, "allotment")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.configure(sub.add_parser(name, help=command.help))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except cfg.Error as error:
        # A bad placement.conf is the operator's to fix: say what is wrong, no traceback.
        print(f"allotment: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
