"""The ``allotment`` command line, run as an operator runs it: a separate process.

``db sync`` / ``db version`` / ``status`` run against a fresh database on
the selected backend; the checks of configuration and of ``serve``'s
refusal to expose noauth2 do not depend on the backend and run once, on
SQLite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from allotment.db import migrate
from tests.conftest import BACKEND
from tests.functional.test_server import (clean_env, free_port, fresh_db, get,  # noqa: F401 (fixture)
                                          run_allotment, serve, wait_for_log, write_config,
                                          LiveServer, allotment_command)

backend_independent = pytest.mark.skipif(BACKEND != "sqlite",
                                         reason="does not depend on the database backend")
HEAD = migrate.head_revision()


@pytest.fixture
def config(fresh_db, tmp_path) -> Path:  # noqa: F811 (fixture)
    return write_config(tmp_path / "etc", fresh_db)


def _standard_rows(config_path: Path) -> tuple[int, int]:
    url = config_path.read_text().split("connection = ", 1)[1].split("\n", 1)[0]
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return (conn.execute(sa.text("SELECT COUNT(*) FROM resource_classes")).scalar_one(),
                    conn.execute(sa.text("SELECT COUNT(*) FROM traits")).scalar_one())
    finally:
        engine.dispose()


# -- db sync / db version --------------------------------------------------

def test_db_version_of_an_empty_database_is_none(config):
    result = run_allotment("db", "version", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


def test_db_sync_migrates_to_head_and_is_idempotent(config):
    first = run_allotment("db", "sync", "--config-file", str(config))
    assert first.returncode == 0, first.stderr
    assert HEAD in first.stdout
    rows = _standard_rows(config)
    assert rows[0] > 0 and rows[1] > 0

    second = run_allotment("db", "sync", "--config-file", str(config))
    assert second.returncode == 0, second.stderr
    assert HEAD in second.stdout
    assert _standard_rows(config) == rows

    version = run_allotment("db", "version", "--config-file", str(config))
    assert (version.returncode, version.stdout.strip()) == (0, HEAD)


# -- status ----------------------------------------------------------------

def test_status_before_sync_says_what_to_do(config):
    result = run_allotment("status", "--config-file", str(config))
    assert result.returncode == 1
    assert "FAILURE:" in result.stdout
    assert "allotment db sync" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "verdict: action needed"


def test_status_after_sync_is_ready(config):
    assert run_allotment("db", "sync", "--config-file", str(config)).returncode == 0
    result = run_allotment("status", "--config-file", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILURE" not in result.stdout
    assert f"OK: Placement schema a082b8bb98d0 (16.0.0), Allotment revision {HEAD} (latest)" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "verdict: ready"


@backend_independent
def test_status_with_an_unreachable_database_exits_2(tmp_path):
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    config = write_config(tmp_path, "postgresql+psycopg2://nobody@127.0.0.1:1/placement")
    result = run_allotment("status", "--config-file", str(config))
    assert result.returncode == 2
    assert "FAILURE: cannot connect to the database" in result.stdout


# -- configuration errors ----------------------------------------------------

@backend_independent
@pytest.mark.parametrize("command, section, line, named", [
    (("db", "sync"), "placement", "allocation_conflict_retry_count = lots",
     "[placement] allocation_conflict_retry_count"),
    (("db", "sync"), "placement", "max_allocation_candidates = -7", "[placement] max_allocation_candidates"),
    (("db", "sync"), "api", "auth_strategy = trust-me", "[api] auth_strategy"),
    (("status",), "placement_database", "max_pool_size = many", "[placement_database] max_pool_size"),
    (("serve", "--port", "1"), "placement", "allocation_candidates_generation_strategy = sideways",
     "[placement] allocation_candidates_generation_strategy"),
])
def test_bad_config_value_fails_at_start_naming_the_option(tmp_path, command, section, line, named):
    db_url = f"sqlite:///{tmp_path}/placement.sqlite"
    config = tmp_path / "placement.conf"
    config.write_text(f"[placement_database]\nconnection = {db_url}\n[{section}]\n{line}\n")
    result = run_allotment(*command, "--config-file", str(config))
    assert result.returncode == 2
    assert named in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "placement.sqlite").exists(), "nothing may happen before the config is valid"


@backend_independent
def test_config_file_without_a_database_is_refused(tmp_path):
    config = tmp_path / "placement.conf"
    config.write_text("[api]\nauth_strategy = noauth2\n")
    result = run_allotment("db", "sync", "--config-file", str(config))
    assert result.returncode == 2
    assert "connection" in result.stderr and "placement_database" in result.stderr


@backend_independent
def test_missing_config_file_is_refused(tmp_path):
    result = run_allotment("status", "--config-file", str(tmp_path / "absent.conf"))
    assert result.returncode != 0
    assert "absent.conf" in result.stderr


# -- serve: noauth2 stays on loopback unless told otherwise -------------------

@backend_independent
@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_noauth2_on_a_public_address_is_refused(tmp_path, host):
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/placement.sqlite")
    result = run_allotment("serve", "--config-file", str(config), "--host", host,
                           "--port", str(free_port()), timeout=60)
    assert result.returncode == 2
    assert "--allow-insecure-noauth" in result.stderr


@backend_independent
def test_noauth2_on_a_public_address_with_the_flag_serves_and_warns(tmp_path):
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/placement.sqlite")
    live = serve(config, "--host", "0.0.0.0", "--allow-insecure-noauth", "--workers", "1")
    try:
        live.wait_ready()
        assert get(live, "/").status_code == 200
        assert wait_for_log(live, "WARNING"), live.log()
        assert "noauth2" in "".join(wait_for_log(live, "WARNING"))
    finally:
        live.stop()


# -- the embedded default ------------------------------------------------------

@backend_independent
def test_serve_without_any_config_uses_the_embedded_default(tmp_path):
    """SQLite under XDG_DATA_HOME, noauth2: the README's first command and curl."""
    if Path("/etc/placement/placement.conf").exists():
        pytest.skip("this machine has /etc/placement/placement.conf, which would be used")
    port = free_port()
    env = clean_env(XDG_DATA_HOME=str(tmp_path / "data"), HOME=str(tmp_path))
    live = LiveServer(allotment_command() + ["serve", "--port", str(port), "--workers", "1"],
                      port, tmp_path / "server.log", env=env)
    try:
        live.wait_ready()
        resp = requests.get(live.url + "/no/such/thing",
                            headers={"x-auth-token": "admin",
                                     "openstack-api-version": "placement latest"}, timeout=30)
        assert resp.status_code == 404  # past noauth2 with the admin token
        assert resp.headers["openstack-api-version"] == "placement 1.39"
        assert get(live, "/resource_providers", token=None).status_code == 401
    finally:
        live.stop()
    assert (tmp_path / "data" / "allotment" / "placement.sqlite").exists()


@backend_independent
def test_serve_defaults_to_loopback_port_8778():
    import argparse

    from allotment.cli import serve as serve_command

    parser = argparse.ArgumentParser()
    serve_command.configure(parser)
    args = parser.parse_args([])
    assert (args.host, args.port, args.allow_insecure_noauth) == ("127.0.0.1", 8778, False)


# -- version, several files ------------------------------------------------------

@backend_independent
def test_version():
    from allotment import __version__

    result = run_allotment("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"allotment {__version__}")
    assert __version__ != "0+unknown"


def test_several_config_files_and_a_config_dir(fresh_db, tmp_path):  # noqa: F811 (fixture)
    """The later file wins; a --config-dir file is read after both."""
    first = write_config(tmp_path / "a", "sqlite:////nonexistent/never-used.sqlite")
    second = tmp_path / "b.conf"
    second.write_text(f"[placement_database]\nconnection = {fresh_db}\n")
    extra = tmp_path / "conf.d"
    extra.mkdir()
    (extra / "50-placement.conf").write_text("[placement]\nallocation_conflict_retry_count = lots\n")
    synced = run_allotment("db", "sync", "--config-file", str(first), "--config-file", str(second))
    assert synced.returncode == 0, synced.stdout + synced.stderr
    refused = run_allotment("status", "--config-file", str(first), "--config-file", str(second),
                            "--config-dir", str(extra))
    assert refused.returncode == 2 and "[placement] allocation_conflict_retry_count" in refused.stderr
