"""``GET /healthcheck``: oslo.middleware's healthcheck form, for load balancers.

The unhealthy side (database unreachable: 503) is in test_faults.py; here
the form itself, on every backend.
"""

from __future__ import annotations

import json

from tests.conftest import ApiClient, make_conf


def _check(api: ApiClient, method: str = "GET", accept: str | None = "text/plain"):
    return api.request(method, "/healthcheck", version=None, token="", headers={"Accept": accept})


def test_healthy_is_200_ok_in_plain_text_without_a_token(api):
    resp = _check(api)
    assert (resp.status, resp.text) == (200, "OK")
    assert resp.headers["Content-Type"] == "text/plain; charset=UTF-8"
    assert "OpenStack-API-Version" not in resp.headers  # not a Placement resource: no microversion


def test_head_is_204_without_a_body(api):
    resp = _check(api, "HEAD")
    assert (resp.status, resp.text) == (204, "")


def test_json_and_html_for_clients_that_ask(api):
    resp = _check(api, accept="application/json")
    assert resp.status == 200
    assert json.loads(resp.text) == {"detailed": False, "reasons": ["OK"]}
    resp = _check(api, accept="text/html")
    assert resp.status == 200 and "<TD>OK</TD>" in resp.text
    # No Accept at all: plain text.
    assert _check(api, accept=None).text == "OK"


def test_other_methods_are_refused(api):
    resp = _check(api, "POST")
    assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"


def test_disable_by_file_turns_the_server_away(db_url, tmp_path):
    from allotment.api.app import Application
    from allotment.service import database_from_config

    flag = tmp_path / "healthcheck_disable"
    conf = make_conf(db_url, healthcheck__backends=["disable_by_file"],
                     healthcheck__disable_by_file_path=str(flag))
    application = Application(conf, database_from_config(conf))
    try:
        api = ApiClient(application)
        assert _check(api).status == 200
        flag.write_text("")
        resp = _check(api)
        assert (resp.status, resp.text) == (503, "DISABLED BY FILE")
        assert _check(api, "HEAD").status == 503
        # Only the check: the API itself goes on answering.
        assert api.get("/resource_providers").status == 200
        flag.unlink()
        assert _check(api).status == 200
    finally:
        application.db.dispose()


def test_root_stays_placements_version_document(api):
    resp = api.get("/", token="")
    assert resp.status == 200
    assert [version["id"] for version in resp.json["versions"]] == ["v1.0"]
