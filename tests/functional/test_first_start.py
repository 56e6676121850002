"""Several hosts starting at once on one empty database: every one succeeds.

Three ``allotment db sync`` (and, separately, three ``allotment serve``) are
started together against a new, empty database; on the Galera pass each goes
through a different node of the cluster (``tests.ha.galera.spread``), which
is what used to fail: ``GET_LOCK`` holds on one node only, and two of three
migrators failed on tables the first had just made.  Every one must exit 0
(or serve), and the schema must be whole and at head once, with the standard
names in it once.
"""

from __future__ import annotations

import subprocess
import threading
import time

import os_resource_classes
import os_traits
import pytest
import sqlalchemy as sa

from allotment.db import migrate, reference_layout
from tests.conftest import BACKEND
from tests.functional.test_server import allotment_command, clean_env, fresh_db, get, serve, write_config  # noqa: F401
from tests.ha.galera import spread

HOSTS = 3


def _check_schema(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert migrate.allotment_revision(conn) == migrate.head_revision()
            assert reference_layout.placement_revision(conn) == reference_layout.HEAD
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM alembic_version").scalar() == 1
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM allotment_version").scalar() == 1
            assert (conn.exec_driver_sql("SELECT COUNT(*) FROM resource_classes").scalar()
                    == len(os_resource_classes.STANDARDS))
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM traits").scalar() == len(os_traits.get_traits())
    finally:
        engine.dispose()


def test_db_syncs_started_together_on_an_empty_database_all_succeed(fresh_db, tmp_path):
    configs = [write_config(tmp_path / f"host{i}", url) for i, url in enumerate(spread(fresh_db, HOSTS))]
    commands = [allotment_command() + ["db", "sync", "--config-file", str(config)] for config in configs]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=clean_env(), stdin=subprocess.DEVNULL) for command in commands]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    codes = [process.returncode for process in processes]
    assert codes == [0] * HOSTS, "\n---\n".join(outputs)
    for url in spread(fresh_db, HOSTS):
        _check_schema(url)


def test_servers_started_together_on_an_empty_database_all_serve(fresh_db, tmp_path):
    configs = [write_config(tmp_path / f"host{i}", url) for i, url in enumerate(spread(fresh_db, HOSTS))]
    servers = [serve(config, "--workers", "1", "--threads", "2") for config in configs]
    try:
        for live in servers:
            live.wait_ready()
        for live in servers:
            assert get(live, "/resource_classes/VCPU", version="1.2").status_code == 200
            assert "Traceback" not in live.log(), live.log()
    finally:
        for live in servers:
            live.stop()
    _check_schema(fresh_db)


# -- the lease (MySQL/MariaDB) ------------------------------------------------

def _leased(url: str, holder: str, seconds: int) -> sa.Engine:
    """An engine on ``url`` whose database holds a lease of ``holder`` ending in ``seconds``."""
    from allotment.db.engine import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {migrate.LOCK_TABLE} (name VARCHAR(64) NOT NULL PRIMARY KEY, "
                             "holder VARCHAR(255) NOT NULL, expires_at DATETIME NOT NULL)")
        conn.exec_driver_sql(f"INSERT INTO {migrate.LOCK_TABLE} VALUES (%s, %s, "
                             "UTC_TIMESTAMP() + INTERVAL %s SECOND)", (migrate.MIGRATION_LOCK_NAME, holder, seconds))
    return engine


@pytest.mark.skipif(BACKEND != "mysql", reason="the lease is MySQL/MariaDB's (elsewhere: the database's own locks)")
def test_a_lease_left_by_a_migrator_that_died_is_taken_over(fresh_db):
    engine = _leased(fresh_db, "gone-host:1:dead", -1)
    try:
        assert migrate.upgrade(engine) == migrate.head_revision()
        with engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {migrate.LOCK_TABLE}").scalar() == 0
    finally:
        engine.dispose()


@pytest.mark.skipif(BACKEND != "mysql", reason="the lease is MySQL/MariaDB's (elsewhere: the database's own locks)")
def test_a_migrator_waits_while_another_holds_the_lease(fresh_db):
    engine = _leased(fresh_db, "other-host:1:alive", 60)
    done = []
    migrator = threading.Thread(target=lambda: done.append(migrate.upgrade(engine)))
    try:
        migrator.start()
        time.sleep(1.5)
        assert migrator.is_alive() and migrate.current_revision(engine) is None
        with engine.begin() as conn:  # the other migrator is done
            conn.exec_driver_sql(f"DELETE FROM {migrate.LOCK_TABLE}")
        migrator.join(timeout=60)
        assert done == [migrate.head_revision()]
    finally:
        migrator.join(timeout=60)
        engine.dispose()
