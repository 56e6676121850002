"""placement.conf options a deployment tool writes, honoured as Placement honours them.

* logging through oslo.log: each request's line in ``log_file`` carries
  oslo's context, ``[<global request id> <request id> <user> <project> - -
  - -]``; an incoming ``X-OpenStack-Request-ID`` of the form ``req-<uuid>``
  becomes the global request id (any other is ignored, as oslo.middleware's
  RequestId ignores it); the file is reopened after logrotate moves it;
  ``use_json`` and ``logging_context_format_string`` work;
* ``[placement_database] max_retries`` / ``retry_interval``: the server
  waits for its database, a log line per try;
* ``sync_on_startup``: the WSGI application migrates only when it is set;
* ``[cors]``: Placement's default allowed headers.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from tests.conftest import BACKEND, SERVER_URLS, ApiClient, make_conf
from tests.functional.test_server import (fresh_db, get, gunicorn_wsgi, running, serve,  # noqa: F401
                                          write_config)

backend_independent = pytest.mark.skipif(BACKEND != "sqlite", reason="does not depend on the database backend")
needs_server = pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite is a file: there is no server to wait for")

GLOBAL_ID = "req-" + str(uuid.uuid4())
#: oslo.log's default context: [global local user project domain system_scope user_domain project_domain]
CONTEXT = re.compile(r"\[(\S+) (req-[0-9a-f-]{36}) (\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\] ")


def _lines_with(path: Path, needle: str, timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in path.read_text().splitlines() if needle in line] if path.exists() else []
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def _post_provider(live, headers: dict | None = None) -> requests.Response:
    resp = requests.post(live.url + "/resource_providers", json={"name": f"rp-{uuid.uuid4().hex[:8]}"},
                         headers={"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.20",
                                  **(headers or {})}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp


# -- logging --------------------------------------------------------------------

@backend_independent
def test_request_lines_in_log_file_carry_oslo_context_and_the_global_request_id(tmp_path):
    log_file = tmp_path / "placement-api.log"
    config = write_config(tmp_path / "etc", f"sqlite:///{tmp_path}/p.sqlite",
                          extra=f"[DEFAULT]\nlog_file = {log_file}\n")
    with running(config, "--workers", "1") as live:
        answered = _post_provider(live, {"X-OpenStack-Request-ID": GLOBAL_ID})
        local_id = answered.headers["x-openstack-request-id"]
        assert local_id != GLOBAL_ID
        ignored = {}
        for bogus in ("bogus", GLOBAL_ID.upper(), GLOBAL_ID + "0", "req-" + uuid.uuid4().hex):
            resp = get(live, "/resource_providers", headers={"X-OpenStack-Request-ID": bogus})
            ignored[bogus] = resp.headers["x-openstack-request-id"]
        anonymous = get(live, "/", token=None).headers["x-openstack-request-id"]

        line, = _lines_with(log_file, local_id)
        found = CONTEXT.search(line)
        assert found and found.groups() == (GLOBAL_ID, local_id, "admin", "admin", "-", "-", "-", "-"), line
        assert " INFO placement.requestlog [" in line
        assert line.endswith(found.group(0) + "127.0.0.1 " + line.split("127.0.0.1 ", 1)[1])
        assert '"POST /resource_providers" status: 200' in line and "microversion: 1.20" in line
        for bogus, request_id in ignored.items():
            line, = _lines_with(log_file, request_id)
            assert CONTEXT.search(line).group(1) == "None", (bogus, line)
            assert bogus not in line
        line, = _lines_with(log_file, anonymous)
        assert CONTEXT.search(line).groups()[2:] == ("-",) * 6


@backend_independent
def test_log_file_is_reopened_after_logrotate_moves_it(tmp_path):
    """oslo.log's default WatchedFileHandler: logrotate's rename-and-create, no copytruncate."""
    log_file = tmp_path / "placement-api.log"
    config = write_config(tmp_path / "etc", f"sqlite:///{tmp_path}/p.sqlite",
                          extra=f"[DEFAULT]\nlog_file = {log_file}\n")
    with running(config, "--workers", "1") as live:
        before = get(live, "/").headers["x-openstack-request-id"]
        assert _lines_with(log_file, before)
        os.rename(log_file, tmp_path / "placement-api.log.1")
        after = get(live, "/").headers["x-openstack-request-id"]
        assert _lines_with(log_file, after), "no new file after the old one was moved away"
        assert after not in (tmp_path / "placement-api.log.1").read_text()


@backend_independent
def test_use_json_and_format_strings_are_honoured(tmp_path):
    json_log = tmp_path / "json.log"
    config = write_config(tmp_path / "etc", f"sqlite:///{tmp_path}/p.sqlite",
                          extra=f"[DEFAULT]\nlog_file = {json_log}\nuse_json = true\n")
    with running(config, "--workers", "1") as live:
        request_id = _post_provider(live, {"X-OpenStack-Request-ID": GLOBAL_ID}).headers["x-openstack-request-id"]
        line, = _lines_with(json_log, request_id)
        record = json.loads(line)
        assert record["name"] == "placement.requestlog"
        assert record["context"]["global_request_id"] == GLOBAL_ID
        assert record["context"]["request_id"] == request_id

    plain = tmp_path / "plain.log"
    config = write_config(tmp_path / "etc2", f"sqlite:///{tmp_path}/p.sqlite", extra=f"""
        [DEFAULT]
        log_file = {plain}
        logging_context_format_string = CTX %(request_id)s %(global_request_id)s %(user_identity)s | %(message)s
        logging_user_identity_format = user=%(user)s
        default_log_levels = placement.requestlog=WARN
        """)
    with running(config, "--workers", "1") as live:
        request_id = get(live, "/").headers["x-openstack-request-id"]
        assert _lines_with(plain, request_id, timeout=1) == []  # default_log_levels silenced the line
    config.write_text(config.read_text().replace("placement.requestlog=WARN", "sqlalchemy=WARN"))
    with running(config, "--workers", "1") as live:
        request_id = _post_provider(live).headers["x-openstack-request-id"]
        line, = _lines_with(plain, request_id)
        assert line.startswith(f"CTX {request_id} None user=admin | 127.0.0.1 \"POST /resource_providers\"")


# -- waiting for the database ----------------------------------------------------

@backend_independent
def test_serve_gives_up_after_max_retries_with_a_line_per_try(tmp_path):
    config = write_config(tmp_path, "postgresql+psycopg2://nobody@127.0.0.1:1/placement",
                          extra="[placement_database]\nmax_retries = 3\nretry_interval = 1\n")
    live = serve(config, "--workers", "1")
    try:
        assert live.process.wait(timeout=60) == 1
    finally:
        live.stop()
    tries = [line for line in live.log().splitlines() if "database not reachable" in line]
    assert [re.search(r"try \d of 3", line).group(0) for line in tries] == ["try 1 of 3", "try 2 of 3",
                                                                             "try 3 of 3"], live.log()
    assert "next try in 1 s" in tries[0] and "giving up" in tries[-1]
    assert "Traceback" not in live.log()


@needs_server
def test_serve_started_before_its_database_waits_for_it_for_ever(tmp_path):
    """max_retries = -1 (Kolla's): the database is created while the server waits."""
    name = f"allotment_late_{uuid.uuid4().hex[:10]}"
    url = SERVER_URLS[BACKEND].format(name=name)
    admin_url = SERVER_URLS[BACKEND].format(name="postgres" if BACKEND == "postgresql" else "")
    config = write_config(tmp_path, url, extra="[placement_database]\nmax_retries = -1\nretry_interval = 1\n")
    live = serve(config, "--workers", "1")
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        deadline = time.monotonic() + 60
        while len([line for line in live.log().splitlines() if "of unlimited" in line]) < 2:
            assert live.process.poll() is None, live.log()
            assert time.monotonic() < deadline, live.log()
            time.sleep(0.2)
        with admin.connect() as conn:
            quoted = f'"{name}"' if BACKEND == "postgresql" else f"`{name}`"
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        live.wait_ready()
        assert get(live, "/resource_providers").status_code == 200
    finally:
        live.stop()
        with admin.connect() as conn:
            quoted = f'"{name}"' if BACKEND == "postgresql" else f"`{name}`"
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}"
                                 + (" WITH (FORCE)" if BACKEND == "postgresql" else ""))
        admin.dispose()


# -- sync_on_startup ------------------------------------------------------------

def test_wsgi_application_migrates_only_with_sync_on_startup(fresh_db, tmp_path):  # noqa: F811 (fixture)
    """Without it a new database gets 503s naming placement-manage db sync; after that, answers."""
    config = write_config(tmp_path / "etc", fresh_db)
    live = gunicorn_wsgi(config)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                resp = get(live, "/resource_providers")
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and live.process.poll() is None, live.log()
                time.sleep(0.2)
        assert resp.status_code == 503
        assert "placement-manage db sync" in resp.json()["errors"][0]["detail"]
        from tests.functional.test_placement_commands import run

        assert run("placement-manage", config, "db", "sync").returncode == 0
        assert get(live, "/resource_providers").status_code == 200
    finally:
        live.stop()


# -- CORS -------------------------------------------------------------------------

@backend_independent
def test_cors_preflight_allows_placements_headers_by_default(db_url):
    from allotment.api.app import Application
    from allotment.service import database_from_config

    conf = make_conf(db_url, cors__allowed_origin=["https://dashboard.example.com"])
    app = Application(conf, database_from_config(conf))
    client = ApiClient(app, token="")
    resp = client.request("OPTIONS", "/resource_providers", version="", headers={
        "Origin": "https://dashboard.example.com",
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "X-Auth-Token,OpenStack-API-Version,X-OpenStack-Request-Id"})
    assert resp.status == 200
    assert resp.headers["Access-Control-Allow-Origin"] == "https://dashboard.example.com"
    allowed = {name.strip().lower() for name in resp.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"x-auth-token", "openstack-api-version", "x-openstack-request-id"} <= allowed
    answered = client.request("GET", "/", version="", headers={"Origin": "https://dashboard.example.com"})
    exposed = answered.headers["Access-Control-Expose-Headers"].lower()
    assert "openstack-api-version" in exposed and "x-openstack-request-id" in exposed
    app.db.dispose()
