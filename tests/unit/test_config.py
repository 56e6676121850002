"""Configuration: upstream's placement.conf names, where files are found, bad values.

An operator's existing ``placement.conf`` must work unchanged, so every test
here writes a file the way an operator would and reads it through
``allotment.config.load``.
"""

from __future__ import annotations

import textwrap

import pytest
from oslo_config import cfg

from allotment import config

SQLITE = "sqlite:////tmp/allotment-config-test.sqlite"


@pytest.fixture
def write_conf(tmp_path):
    def write(body: str, name: str = "placement.conf") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return str(path)
    return write


@pytest.fixture(autouse=True)
def no_config_dir(monkeypatch, tmp_path):
    """Keep the machine's own files out: no $OS_PLACEMENT_CONFIG_DIR, no /etc/placement."""
    monkeypatch.delenv("OS_PLACEMENT_CONFIG_DIR", raising=False)
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIR", str(tmp_path / "etc-placement"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def test_upstream_option_names_are_read(write_conf):
    path = write_conf(f"""
        [DEFAULT]
        debug = true

        [api]
        auth_strategy = noauth2

        [placement_database]
        connection = {SQLITE}
        max_pool_size = 7
        max_overflow = 3
        pool_timeout = 9
        connection_recycle_time = 600
        sqlite_synchronous = false

        [placement]
        randomize_allocation_candidates = true
        incomplete_consumer_project_id = 11111111-2222-3333-4444-555555555555
        incomplete_consumer_user_id = 66666666-7777-8888-9999-000000000000
        allocation_conflict_retry_count = 3
        max_allocation_candidates = 1000
        allocation_candidates_generation_strategy = breadth-first

        [oslo_policy]
        policy_file = /etc/placement/policy.yaml
        enforce_new_defaults = true

        [cors]
        allowed_origin = http://valid.example.com
        allow_headers = openstack-api-version
    """)
    conf = config.load(path)
    assert conf.debug is True
    assert conf.api.auth_strategy == "noauth2"
    db = conf.placement_database
    assert (db.connection, db.max_pool_size, db.max_overflow, db.pool_timeout) == (SQLITE, 7, 3, 9)
    assert db.connection_recycle_time == 600
    assert db.sqlite_synchronous is False
    p = conf.placement
    assert p.randomize_allocation_candidates is True
    assert p.incomplete_consumer_project_id == "11111111-2222-3333-4444-555555555555"
    assert p.incomplete_consumer_user_id == "66666666-7777-8888-9999-000000000000"
    assert p.allocation_conflict_retry_count == 3
    assert p.max_allocation_candidates == 1000
    assert p.allocation_candidates_generation_strategy == "breadth-first"
    assert conf.oslo_policy.policy_file == "/etc/placement/policy.yaml"
    assert conf.oslo_policy.enforce_new_defaults is True
    assert conf.cors.allowed_origin == ["http://valid.example.com"]
    assert conf.cors.allow_headers == ["openstack-api-version"]


def test_defaults_match_upstream(write_conf):
    conf = config.load(write_conf(f"[placement_database]\nconnection = {SQLITE}\n"))
    assert conf.api.auth_strategy == "keystone"
    assert conf.placement.randomize_allocation_candidates is False
    assert conf.placement.incomplete_consumer_project_id == "00000000-0000-0000-0000-000000000000"
    assert conf.placement.incomplete_consumer_user_id == "00000000-0000-0000-0000-000000000000"
    assert conf.placement.allocation_conflict_retry_count == 10
    assert conf.placement.max_allocation_candidates == -1
    assert conf.placement.allocation_candidates_generation_strategy == "depth-first"
    assert conf.cors.allowed_origin is None


def test_pool_options_accept_upstream_extras(write_conf):
    """Options upstream accepts but that mean little here must still parse."""
    conf = config.load(write_conf(f"""
        [placement_database]
        connection = {SQLITE}
        slave_connection = {SQLITE}
        mysql_sql_mode = TRADITIONAL
        mysql_wsrep_sync_wait = 1
        max_retries = -1
        retry_interval = 2
        connection_debug = 10
        connection_trace = true
        sync_on_startup = true
    """))
    assert conf.placement_database.mysql_wsrep_sync_wait == 1
    assert conf.placement_database.max_retries == -1


@pytest.mark.parametrize("group, option, value", [
    ("placement", "allocation_conflict_retry_count", "lots"),
    ("placement", "allocation_conflict_retry_count", "-1"),
    ("placement", "max_allocation_candidates", "-2"),
    ("placement", "allocation_candidates_generation_strategy", "sideways"),
    ("placement", "randomize_allocation_candidates", "perhaps"),
    ("api", "auth_strategy", "trust-me"),
    ("placement_database", "max_pool_size", "five"),
    ("placement_database", "connection_debug", "101"),
    ("placement_database", "sqlite_synchronous", "sometimes"),
    ("oslo_policy", "enforce_new_defaults", "maybe"),
    ("DEFAULT", "debug", "loud"),
])
def test_invalid_value_fails_at_load_naming_the_option(write_conf, group, option, value):
    connection = "" if group == "placement_database" else f"[placement_database]\nconnection = {SQLITE}\n"
    body = connection + f"[{group}]\n{option} = {value}\n"
    if group == "placement_database":
        body += f"connection = {SQLITE}\n"
    with pytest.raises(cfg.Error) as raised:
        config.load(write_conf(body))
    message = str(raised.value)
    assert option in message
    assert f"[{group}]" in message


def test_file_without_a_database_is_refused(write_conf):
    """With a file, the embedded SQLite default must not be used silently."""
    path = write_conf("[api]\nauth_strategy = noauth2\n")
    for dev_defaults in (False, True):
        with pytest.raises(cfg.RequiredOptError) as raised:
            config.load(path, dev_defaults=dev_defaults)
        assert "connection" in str(raised.value)
        assert "placement_database" in str(raised.value)


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as raised:
        config.load(str(tmp_path / "nope.conf"))
    assert "nope.conf" in str(raised.value)


def test_embedded_default_without_any_file(tmp_path):
    conf = config.load(None, dev_defaults=True)
    assert conf.api.auth_strategy == "noauth2"
    expected = tmp_path / "data" / "allotment" / "placement.sqlite"
    assert conf.placement_database.connection == f"sqlite:///{expected}"


def test_no_file_and_no_embedded_default_needs_a_connection():
    """The WSGI entry point has no embedded default: it needs a real file."""
    with pytest.raises(cfg.RequiredOptError):
        config.load(None, dev_defaults=False)


def test_file_found_through_os_placement_config_dir(write_conf, tmp_path, monkeypatch):
    directory = tmp_path / "confdir"
    directory.mkdir()
    (directory / "placement.conf").write_text(
        f"[placement_database]\nconnection = {SQLITE}\n[api]\nauth_strategy = noauth2\n")
    monkeypatch.setenv("OS_PLACEMENT_CONFIG_DIR", str(directory))
    assert config.find_config_file() == str(directory / "placement.conf")
    conf = config.load(None, dev_defaults=True)
    assert conf.placement_database.connection == SQLITE
    assert conf.api.auth_strategy == "noauth2"


def test_os_placement_config_dir_wins_over_etc(tmp_path, monkeypatch):
    etc = tmp_path / "etc-placement"
    etc.mkdir()
    (etc / "placement.conf").write_text("[placement_database]\nconnection = sqlite:////etc-one\n")
    assert config.find_config_file() == str(etc / "placement.conf")
    override = tmp_path / "override"
    override.mkdir()
    (override / "placement.conf").write_text("[placement_database]\nconnection = sqlite:////other\n")
    monkeypatch.setenv("OS_PLACEMENT_CONFIG_DIR", str(override))
    assert config.find_config_file() == str(override / "placement.conf")
    # A directory without the file falls through to /etc/placement.
    monkeypatch.setenv("OS_PLACEMENT_CONFIG_DIR", str(tmp_path / "empty"))
    assert config.find_config_file() == str(etc / "placement.conf")


def test_explicit_file_wins_over_the_search(write_conf, tmp_path, monkeypatch):
    directory = tmp_path / "confdir"
    directory.mkdir()
    (directory / "placement.conf").write_text("[placement_database]\nconnection = sqlite:////wrong\n")
    monkeypatch.setenv("OS_PLACEMENT_CONFIG_DIR", str(directory))
    conf = config.load(write_conf(f"[placement_database]\nconnection = {SQLITE}\n", "mine.conf"))
    assert conf.placement_database.connection == SQLITE
