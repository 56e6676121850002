"""The HTTP core as clients see it: root document, microversions, errors."""

from __future__ import annotations

import re


def test_root_needs_no_token_and_reports_versions(api):
    resp = api.get("/", token="", version="")
    assert resp.status == 200
    version = resp.json["versions"][0]
    assert version["min_version"] == "1.0"
    assert version["max_version"] == "1.39"
    assert resp.headers["OpenStack-API-Version"] == "placement 1.0"
    assert "openstack-api-version" in resp.headers["Vary"]


def test_latest_is_the_maximum(api):
    resp = api.get("/", version="latest")
    assert resp.headers["OpenStack-API-Version"] == "placement 1.39"


def test_malformed_version_is_400(api):
    resp = api.get("/", version="pony.horse")
    assert resp.status == 400
    assert "invalid version string: pony.horse" in resp.error()["detail"]


def test_unsupported_version_is_406(api):
    for value in ("0.5", "1.40", "2.0"):
        resp = api.get("/", version=value)
        assert resp.status == 406, value
        assert f"Unacceptable version header: {value}" in resp.error()["detail"]


def test_unknown_path_is_404_with_request_id_and_code(api):
    resp = api.get("/barnabas", version="1.23")
    assert resp.status == 404
    error = resp.error()
    assert error["title"] == "Not Found"
    assert re.match(r"req-[0-9a-f-]+$", error["request_id"])
    assert error["code"] == "placement.undefined_code"
    assert resp.headers["x-openstack-request-id"] == error["request_id"]


def test_no_error_code_before_1_23(api):
    assert "code" not in api.get("/barnabas", version="1.22").error()


def test_wrong_method_is_405_with_allow(api):
    resp = api.delete("/")
    assert resp.status == 405
    assert resp.headers["Allow"] == "GET"
    assert "The method DELETE is not allowed for this resource." in resp.error()["detail"]


def test_token_required_except_root(api):
    assert api.get("/resource_providers", token="").status == 401


def test_cache_headers_from_1_15(api):
    assert "Last-Modified" not in api.get("/", version="1.14").headers
    resp = api.get("/", version="1.15")
    assert resp.headers["Cache-Control"] == "no-cache"
    assert re.match(r"^\w+, \d+ \w+ \d{4} [\d:]+ GMT$", resp.headers["Last-Modified"])


def test_content_length_without_type_is_400(api):
    resp = api.request("POST", "/resource_providers", body=b"hello", headers={"Content-Type": None})
    assert resp.status == 400
    assert "content-type header required" in resp.text
