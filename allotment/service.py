"""Start-up shared by every entry point: config, logging, database, schema, app."""

from __future__ import annotations

import gc
import itertools
import logging
import time

import sqlalchemy as sa
from oslo_config import cfg

from allotment import config, logs
from allotment.api.collector import gc_paused
from allotment.db import changes, migrate, standard_names
from allotment.db.engine import Database, database_from_config, one_line

__all__ = ["build_application", "database_from_config", "fill_provider_mirror", "load_config",
           "prepare_database", "setup_logging", "wait_for_database"]

LOG = logging.getLogger(__name__)


def load_config(config_files: str | list[str] | None, *, config_dirs: list[str] | None = None,
                dev_defaults: bool = False, command: bool = False) -> cfg.ConfigOpts:
    """The configuration, logging set up from it (``command``: logs to stderr by default)."""
    conf = config.load(config_files, config_dirs=config_dirs, dev_defaults=dev_defaults)
    setup_logging(conf, command=command)
    return conf


def setup_logging(conf: cfg.ConfigOpts, *, command: bool = False) -> None:
    logs.setup(conf, command=command)


def wait_for_database(db: Database, conf: cfg.ConfigOpts, *, sleep=time.sleep) -> None:
    """Connect once, trying again as ``[placement_database] max_retries`` and
    ``retry_interval`` say while the server cannot be reached (``-1``: for
    ever); a line is logged for each failed try.  SQLite is a file: no wait.
    """
    if db.backend == "sqlite":
        return
    tries = conf.placement_database.max_retries
    interval = conf.placement_database.retry_interval
    attempts = itertools.count(1) if tries == -1 else range(1, max(tries, 1) + 1)
    of = "unlimited" if tries == -1 else str(max(tries, 1))
    for attempt in attempts:
        try:
            with db.engine.connect():
                return
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as error:
            last = tries != -1 and attempt >= max(tries, 1)
            reason = one_line(error)
            if last:
                LOG.error("database not reachable (try %d of %s): %s; giving up", attempt, of, reason)
                raise
            LOG.warning("database not reachable (try %d of %s): %s; next try in %d s",
                        attempt, of, reason, interval)
            db.dispose()
            sleep(interval)


def prepare_database(db: Database) -> None:
    """Migrate to head and sync standard names; safe to run concurrently."""
    migrate.upgrade(db.engine)
    standard_names.sync(db)


def check_database(db: Database) -> None:
    """Without migrating: refuse a schema that is not at head, then sync standard names."""
    if not migrate.is_current(db.engine):
        ready, reason = migrate.status(db.engine)
        raise migrate.SchemaNotReady(
            f"{reason.replace('allotment db sync', 'placement-manage db sync')} "
            "(or set [placement_database] sync_on_startup = true)")
    standard_names.sync(db)


def build_application(conf: cfg.ConfigOpts, *, prepare: bool | None = True,
                      auth_strategy: str | None = None, wait: bool = False):
    """The WSGI application for ``conf``; ``auth_strategy`` overrides ``[api]``'s.

    ``prepare``: True brings the schema to head first; None does so only
    when ``[placement_database] sync_on_startup`` is set, and otherwise
    refuses a schema that is not at head (Placement's WSGI application);
    False touches nothing.  ``wait``: wait for the database first
    (:func:`wait_for_database`).
    """
    from allotment.api.app import Application  # every handler: only the commands that serve load it

    db = database_from_config(conf)
    if wait:
        wait_for_database(db, conf)
    if prepare is None:
        if conf.placement_database.sync_on_startup:
            prepare_database(db)
        else:
            check_database(db)
    elif prepare:
        prepare_database(db)
    return Application(conf, db, auth_strategy=auth_strategy)


def fill_provider_mirror(app) -> float | None:
    """Read every provider into ``app``'s mirror now (the seconds it took;
    None when the application keeps no mirror or could not read one).

    ``allotment serve`` calls this in the master process before it forks
    the workers: each worker then starts with the mirror, current at the
    change number read here, and its first answer reads only what changed
    since, instead of every provider (about 5 s of CPU for 430,000
    providers).  The server listens only once it is done, so the cost
    moves from the first requests to start-up, once instead of once a
    worker.  What each run of trees can hold is worked out then too
    (:meth:`~allotment.domain.provider_tree.TreeMemo.work_out_every_run`),
    about 0.15 s at 430,000 providers.  A failure is logged and left to
    the workers' first reads.

    The collector is held off during the read (it builds millions of
    objects, none in a cycle: at 430,000 providers the collections it set
    off took a quarter of the read), and what the master holds then is
    frozen (:func:`gc.freeze`): the workers' collections never walk the
    mirror they inherit, nor write to its pages, which the workers then
    keep sharing with the master."""
    mirror = app.state.mirror
    if mirror is None:
        return None
    started = time.perf_counter()
    try:
        with gc_paused():
            with app.db.read() as conn:
                number = changes.read_number(conn)[0]
                mirrored = mirror.snapshot(conn, number)
            if mirrored is None:
                return None
            mirrored.kept.trees.work_out_every_run(mirrored.snapshot)
    except sa.exc.SQLAlchemyError as error:
        LOG.warning("provider mirror not read before the workers start: %s", one_line(error))
        return None
    gc.freeze()
    return time.perf_counter() - started
