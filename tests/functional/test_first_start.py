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

import os_resource_classes
import os_traits
import sqlalchemy as sa

from allotment.db import migrate, reference_layout
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
