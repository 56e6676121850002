"""No header the client sends changes where the request says it arrived:
Forwarded / X-Forwarded-* (scheme, host, mount point) count only with
``[oslo_middleware] enable_proxy_headers_parsing``, as in Placement; the
HTTP server trusts none (nor a ``SCRIPT_NAME`` header); what is kept per
mount point is bounded; and no redirect leads to another host."""

from __future__ import annotations

import pytest
import requests
import webob

from tests.conftest import ApiClient, make_conf, new_uuid
from tests.functional.test_server import running_on_new_database

PROXY_HEADERS = {"X-Forwarded-Prefix": "/placement", "X-Forwarded-Proto": "https",
                 "X-Forwarded-Host": "proxy.example"}


def _app(db_url, **overrides):
    from allotment.api.app import Application
    from allotment.service import database_from_config

    conf = make_conf(db_url, **overrides)
    return Application(conf, database_from_config(conf))


@pytest.fixture
def behind_proxy(db_url):
    app = _app(db_url, oslo_middleware__enable_proxy_headers_parsing=True, allotment__ui=True)
    yield ApiClient(app)
    app.db.dispose()


def _created_location(api: ApiClient, headers: dict) -> str:
    uuid = new_uuid()
    response = api.post("/resource_providers", json={"name": uuid, "uuid": uuid}, version="1.19",
                        headers=headers)
    assert response.status == 201, response.text
    return response.headers["Location"].replace(uuid, "UUID")


def _servers(api: ApiClient, headers: dict) -> list:
    return api.get("/allotment/openapi.json", headers=headers).json["servers"]


@pytest.mark.parametrize("headers", [PROXY_HEADERS, {"Forwarded": "proto=https;host=proxy.example"}])
def test_forwarded_headers_are_ignored_by_default(api, headers):
    # WebOb makes it absolute from Host, as Placement's.
    assert _created_location(api, headers) == "http://localhost/resource_providers/UUID"
    assert _servers(api, headers) == [{"url": "/"}]


def test_forwarded_headers_count_when_the_operator_says_a_proxy_sets_them(behind_proxy):
    assert _created_location(behind_proxy, PROXY_HEADERS) == "https://proxy.example/placement/resource_providers/UUID"
    assert _servers(behind_proxy, PROXY_HEADERS) == [{"url": "/placement"}]


def _redirect(api: ApiClient, prefix: str) -> tuple[str, dict]:
    """The redirect's status and headers as the application sends them (WebOb's
    test client would make Location absolute from SCRIPT_NAME itself)."""
    environ = webob.Request.blank("/allotment/ui/", headers={"X-Forwarded-Prefix": prefix}).environ
    answer = {}
    api.application(environ, lambda status, headers, exc_info=None: answer.update(status=status,
                                                                                   headers=dict(headers)))
    return answer["status"], answer["headers"]


EVIL_PREFIXES = ["//evil.example", "evil.example", "/\\evil.example", "/a//evil", "https://evil.example",
                 "/p\r\nSet-Cookie: x=1"]


@pytest.mark.parametrize("prefix", EVIL_PREFIXES)
def test_no_redirect_or_location_leads_to_another_host(behind_proxy, prefix):
    # (oslo.middleware's proxy middleware makes Location absolute, from Host.)
    status, headers = _redirect(behind_proxy, prefix)
    assert status.startswith("301")
    assert headers["Location"] == "http://localhost/allotment/ui"
    assert _created_location(behind_proxy, {"X-Forwarded-Prefix": prefix}) == "http://localhost/resource_providers/UUID"
    assert _redirect(behind_proxy, "/placement")[1]["Location"] == "http://localhost/placement/allotment/ui"


def test_the_capacity_view_redirect_keeps_a_plain_mount_point_only():
    from allotment.api import ui

    seen = {}
    redirect = ui.slash_redirect(None)
    for prefix, expected in (("//evil.example", "/allotment/ui"), ("/placement", "/placement/allotment/ui")):
        environ = {"PATH_INFO": "/allotment/ui/", "REQUEST_METHOD": "GET", "SCRIPT_NAME": prefix}
        redirect(environ, lambda status, headers: seen.update(headers))
        assert seen["Location"] == expected


def test_documents_kept_per_mount_point_are_bounded(behind_proxy):
    from allotment.api import openapi

    for n in range(3 * openapi.RENDERED_KEPT):
        assert _servers(behind_proxy, {"X-Forwarded-Prefix": f"/p{n}"}) == [{"url": f"/p{n}"}]
    assert openapi._rendered.cache_info().currsize <= openapi.RENDERED_KEPT
    assert openapi._document.cache_info().currsize <= len(list(openapi.versions()))


def test_the_http_server_trusts_no_forwarded_or_script_name_header(tmp_path_factory):
    with running_on_new_database(tmp_path_factory, "proxy") as server:
        uuid = new_uuid()
        response = requests.post(server.url + "/resource_providers", json={"name": uuid, "uuid": uuid},
                                 headers={"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.19",
                                          "SCRIPT_NAME": "//evil.example", "Script-Name": "/x",
                                          **PROXY_HEADERS}, timeout=30)
        assert response.status_code == 201, response.text
        assert response.headers["Location"] == f"{server.url}/resource_providers/{uuid}"
        document = requests.get(server.url + "/allotment/openapi.json",
                                headers={"X-Forwarded-Prefix": "/placement", "SCRIPT_NAME": "/p"}, timeout=30)
        assert document.json()["servers"] == [{"url": "/"}]
