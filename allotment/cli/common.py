"""What every command shares: where its configuration comes from, and how a
database error is said in one line.

Each ``allotment`` subcommand that reads ``placement.conf`` takes the same
options as Placement's own commands: ``--config-file`` (repeatable, later
files win) and ``--config-dir`` (every ``*.conf`` in it, sorted, read after
the files).  Without them the files are searched where Placement searches
(``allotment.config``).
"""

from __future__ import annotations

import argparse

from oslo_config import cfg


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-file", metavar="PATH", action="append", dest="config_files",
                        help="placement.conf to read; repeat it to read several, later ones winning "
                             "(default: $OS_PLACEMENT_CONFIG_DIR/placement.conf, then the places "
                             "Placement looks, /etc/placement/placement.conf among them; else the "
                             "embedded SQLite default)")
    parser.add_argument("--config-dir", metavar="DIR", action="append", dest="config_dirs",
                        help="also read every *.conf in DIR, in name order, after the files "
                             "(default: a placement.conf.d found where Placement looks)")


def load(args: argparse.Namespace, *, dev_defaults: bool = True) -> cfg.ConfigOpts:
    """The configuration the command line names, logging set up from it
    (to standard error unless the file says otherwise)."""
    from allotment import service

    return service.load_config(getattr(args, "config_files", None), config_dirs=getattr(args, "config_dirs", None),
                               dev_defaults=dev_defaults, command=True)


def load_quietly(args: argparse.Namespace) -> cfg.ConfigOpts:
    """The configuration, without the embedded default and without setting up
    logging unless the file asks for it (the command's output is its result)."""
    from allotment import config, service

    conf = config.load(getattr(args, "config_files", None), config_dirs=getattr(args, "config_dirs", None),
                       dev_defaults=False)
    if conf.debug or conf.log_file or conf.log_config_append:
        service.setup_logging(conf, command=True)
    return conf


def schema_errors() -> tuple[type[BaseException], ...]:
    """What a command reports in one line rather than as a traceback."""
    import sqlalchemy as sa

    from allotment.db.migrate import SchemaNotReady

    return (SchemaNotReady, sa.exc.SQLAlchemyError)


def one_line(error: BaseException) -> str:
    """A schema refusal as it is; a database error as its first line
    (:func:`allotment.db.migrate.why_unavailable`, imported when needed)."""
    from allotment.db.migrate import why_unavailable

    return why_unavailable(error)
