"""``placement.tests.fixtures.Database``: a Placement database for one test,
made and brought to head by Allotment.

The database stays known to :mod:`placement.tests.functional.fixtures.placement`
for as long as the fixture lives, so a ``PlacementFixture(db=False)`` on the
same configuration serves it (nova's regression tests build the database
first and start and stop the API around it).
"""

from __future__ import annotations

import os

import fixtures
from oslo_config import cfg

from allotment import service

#: id(ConfigOpts) -> the Database a fixture made for that configuration.
DATABASES: dict[int, object] = {}


class Database(fixtures.Fixture):
    def __init__(self, conf_fixture, set_config: bool = False):
        """``set_config``: register ``[placement_database] connection`` if
        needed and, when it is empty, point it at a fresh SQLite file."""
        super().__init__()
        self.conf_fixture = conf_fixture
        self.set_config = set_config

    def _setUp(self):
        conf = self.conf_fixture.conf
        if self.set_config:
            try:
                self.conf_fixture.register_opt(cfg.StrOpt("connection"), group="placement_database")
            except cfg.DuplicateOptError:
                pass
            if not conf.placement_database.connection:
                # A file, not ``sqlite://``: an in-memory database lives on one
                # connection, and nova's services run requests side by side.
                directory = self.useFixture(fixtures.TempDir()).path
                self.conf_fixture.config(connection="sqlite:///" + os.path.join(directory, "placement.sqlite"),
                                         group="placement_database")
        self.database = service.database_from_config(conf)
        self.addCleanup(self.database.dispose)
        service.prepare_database(self.database)
        DATABASES[id(conf)] = self.database
        self.addCleanup(DATABASES.pop, id(conf), None)


__all__ = ["Database", "DATABASES"]
