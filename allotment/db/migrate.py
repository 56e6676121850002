"""Schema migrations: ``allotment db sync`` / ``db version`` and start-up.

Several API processes may start at once against one empty database; each
runs the upgrade, and a loser of the race that finds the schema already at
head afterwards carries on instead of failing.
"""

from __future__ import annotations

import logging
import os

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

LOG = logging.getLogger(__name__)
_HERE = os.path.join(os.path.dirname(__file__), "migrations")


def _alembic_config(connection=None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", _HERE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> str:
    """Bring the schema to head; returns the revision now in place."""
    head = head_revision()
    if current_revision(engine) == head:
        return head
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "head")
    except Exception:
        # Another process may have migrated concurrently.
        if current_revision(engine) == head:
            LOG.info("schema was migrated concurrently by another process")
            return head
        raise
    return head
