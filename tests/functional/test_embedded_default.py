"""The embedded default (no configuration file: SQLite, noauth2 on
127.0.0.1) is for one operator on one machine: it answers only requests
addressed to a loopback name, and keeps its database private."""

from __future__ import annotations

import os
import stat

import pytest
import webob

from allotment import config


@pytest.fixture
def no_config(monkeypatch, tmp_path):
    monkeypatch.delenv("OS_PLACEMENT_CONFIG_DIR", raising=False)
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIR", str(tmp_path / "etc-placement"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    old = os.umask(0o022)
    yield tmp_path
    os.umask(old)


@pytest.fixture
def embedded(no_config):
    from allotment import service

    app = service.build_application(config.load(None, dev_defaults=True, args=[]))
    yield app
    app.db.dispose()


def _get(app, host: str | None, path: str = "/resource_providers") -> webob.Response:
    req = webob.Request.blank(path)
    req.headers["X-Auth-Token"] = "admin"
    if host is None:
        del req.headers["Host"]
    else:
        req.headers["Host"] = host
    return req.get_response(app)


@pytest.mark.parametrize("host", ["localhost", "localhost:8778", "LOCALHOST.", "api.localhost:1",
                                  "127.0.0.1", "127.0.0.1:8778", "127.1.2.3:80", "[::1]", "[::1]:8778", None])
def test_loopback_names_are_answered(embedded, host):
    assert _get(embedded, host).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8778", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "10.0.0.1:8778", "[::2]:8778", "[::1]x",
                                  "localhost:80:80", "0.0.0.0:8778", ""])
def test_other_host_names_are_refused(embedded, host):
    # A page in the operator's browser that made its own name resolve to
    # 127.0.0.1 (DNS rebinding) sends that name: it must not reach the API
    # of a server where every caller is admin.
    for path in ("/resource_providers", "/"):
        response = _get(embedded, host, path)
        assert response.status_code == 400, (host, path)
        error = response.json["errors"][0]
        assert "answers only requests addressed to localhost" in error["detail"]
        assert error["request_id"] == response.headers["x-openstack-request-id"]


def test_a_configuration_file_with_noauth2_answers_any_host(no_config, tmp_path):
    from allotment import service

    path = tmp_path / "placement.conf"
    path.write_text(f"[placement_database]\nconnection = sqlite:///{tmp_path}/p.sqlite\n"
                    "[api]\nauth_strategy = noauth2\n")
    app = service.build_application(config.load(str(path), dev_defaults=True, args=[]))
    try:
        assert _get(app, "placement.example:8778").status_code == 200
    finally:
        app.db.dispose()


def test_the_database_file_and_its_directory_are_private(embedded, no_config):
    directory = no_config / "data" / "allotment"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in os.listdir(directory):  # the database, and SQLite's journal files if any
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name


def test_a_database_left_readable_by_an_older_version_is_made_private(no_config):
    directory = no_config / "data" / "allotment"
    directory.mkdir(parents=True, mode=0o755)
    (directory / "placement.sqlite").touch(mode=0o644)
    os.chmod(directory, 0o755)
    config.default_sqlite_url()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "placement.sqlite").stat().st_mode) == 0o600
