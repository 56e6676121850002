"""Start-up shared by every entry point: config, logging, schema, app."""

from __future__ import annotations

import logging
import sys
import time

from oslo_config import cfg

from allotment import config
from allotment.db import migrate, standard_names
from allotment.db.engine import Database, database_from_config

__all__ = ["build_application", "database_from_config", "load_config", "prepare_database",
           "setup_logging"]

LOG = logging.getLogger(__name__)


def load_config(config_file: str | None, *, dev_defaults: bool = False) -> cfg.ConfigOpts:
    conf = config.load(config_file, dev_defaults=dev_defaults)
    setup_logging(conf)
    return conf


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not to
    the stream it was when logging was set up (which a test harness, or a
    caller redirecting stderr, may have closed since)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _Formatter(logging.Formatter):
    """logging's Formatter, the text of the time made once a second rather
    than for every record (every request logs a line)."""

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        known = self._second
        if known[0] != second:
            known = self._second = (second, time.strftime(self.default_time_format, self.converter(second)))
        return self.default_msec_format % (known[1], record.msecs)


def setup_logging(conf: cfg.ConfigOpts) -> None:
    root = logging.getLogger()
    if getattr(root, "_allotment_configured", False):
        return
    level = logging.DEBUG if conf.debug else logging.INFO
    handlers: list[logging.Handler] = [_StderrHandler()]
    if conf.log_file:
        handlers.append(logging.FileHandler(conf.log_file))
    fmt = _Formatter("%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    for handler in handlers:
        handler.setFormatter(fmt)
        root.addHandler(handler)
    root.setLevel(level)
    root._allotment_configured = True  # type: ignore[attr-defined]


def prepare_database(db: Database) -> None:
    """Migrate to head and sync standard names; safe to run concurrently."""
    migrate.upgrade(db.engine)
    standard_names.sync(db)


def build_application(conf: cfg.ConfigOpts, *, prepare: bool = True,
                      auth_strategy: str | None = None):
    """The WSGI application for ``conf``; ``auth_strategy`` overrides ``[api]``'s."""
    from allotment.api.app import Application

    db = database_from_config(conf)
    if prepare:
        prepare_database(db)
    return Application(conf, db, auth_strategy=auth_strategy)
