"""The HTTP layer answers as Placement does where its own suite does not look.

Each expectation here was read off the reference server (issue 9, found by
tools/difftest): statuses, headers and error texts of the microversion,
authentication, routing and body-decoding layers.
"""

from __future__ import annotations

import pytest

from tests.conftest import new_uuid

VARY = "openstack-api-version"


# -- microversions ------------------------------------------------------------
@pytest.mark.parametrize("value", ["-1.2", "1.99", "0.9", "2.0"])
def test_unacceptable_version_is_406_with_the_versions_served(api, value):
    resp = api.get("/resource_providers", version=value)
    assert resp.status == 406
    error = resp.error()
    assert error["max_version"] == "1.39"
    assert error["min_version"] == "1.0"
    assert error["detail"].endswith(f"Invalid microversion: Unacceptable version header: {value}")
    # Negotiation failed: there is no version to report.
    assert "OpenStack-API-Version" not in resp.headers


@pytest.mark.parametrize("value, reason", [
    ("1.x", "invalid literal for int() with base 10: 'x'"),
    ("1.2.3", "invalid literal for int() with base 10: '2.3'"),
    ("1", "Version.__new__() missing 1 required positional argument: 'minor'"),
])
def test_malformed_version_is_400_with_the_reason(api, value, reason):
    resp = api.get("/resource_providers", version=value)
    assert resp.status == 400
    assert resp.error()["detail"].endswith(f"Invalid microversion: invalid version string: {value}; {reason}")
    assert "max_version" not in resp.error()


@pytest.mark.parametrize("value, served", [("1.05", "1.5"), (" 1.30 ", "1.30"), ("1.+7", "1.7")])
def test_versions_are_read_as_numbers(api, value, served):
    resp = api.get("/resource_providers", version=value)
    assert resp.status == 200
    assert resp.headers["OpenStack-API-Version"] == f"placement {served}"


def test_the_last_placement_entry_of_the_header_wins(api):
    resp = api.get("/resource_providers", version="",
                   headers={"OpenStack-API-Version": "placement 1.2, compute 2.1, placement 1.14"})
    assert resp.headers["OpenStack-API-Version"] == "placement 1.14"


# -- authentication -------------------------------------------------------------
def test_401_from_noauth2_is_the_plain_wsgi_answer(api):
    resp = api.get("/resource_providers", token="", version="1.99")  # auth comes before negotiation
    assert resp.status == 401
    body = resp.json
    assert body["code"] == "401 Unauthorized" and body["title"] == "Unauthorized"
    assert body["message"].startswith("This server could not verify that you are authorized")
    for header in ("OpenStack-API-Version", "Vary", "WWW-Authenticate"):
        assert header not in resp.headers


def test_401_in_plain_text_for_a_client_that_takes_neither_html_nor_json(api):
    resp = api.get("/resource_providers", token="", headers={"Accept": "text/plain"})
    assert resp.status == 401
    assert resp.headers["Content-Type"] == "text/plain; charset=UTF-8"
    assert resp.text.startswith("401 Unauthorized\n\nThis server could not verify")


# -- Vary on errors ---------------------------------------------------------------
def test_no_vary_on_errors_raised_around_the_handlers(api):
    no_route = api.get("/nowhere", version="1.32")
    missing_provider = api.put(f"/resource_providers/{new_uuid()}/traits", version="1.33",
                               json={"traits": [], "resource_provider_generation": 0})
    forbidden = api.get("/resource_providers", token="someone")
    # Before 1.7 a rename looks the class up outside its handler's answers.
    missing_class = api.put("/resource_classes/CUSTOM_", json={"name": "CUSTOM_NEW"}, version="1.2")
    for resp, status in ((no_route, 404), (missing_provider, 404), (forbidden, 403), (missing_class, 404)):
        assert resp.status == status
        assert "Vary" not in resp.headers, resp
        assert resp.headers["OpenStack-API-Version"].startswith("placement ")


def test_vary_on_errors_the_handlers_answer(api):
    missing_usages = api.get(f"/resource_providers/{new_uuid()}/usages")
    no_allocations = api.delete(f"/allocations/{new_uuid()}")
    conflict = api.post("/resource_classes", json={"name": "CUSTOM_TWICE"})
    conflict = api.post("/resource_classes", json={"name": "CUSTOM_TWICE"})
    for resp, status in ((missing_usages, 404), (no_allocations, 404), (conflict, 409)):
        assert resp.status == status
        assert resp.headers["Vary"] == VARY, resp


# -- 405, 406, 415 -------------------------------------------------------------------
def test_405_names_the_method_and_lists_allowed_ones_in_placement_order(api):
    resp = api.delete("/resource_providers")
    assert resp.status == 405
    assert resp.headers["Allow"] == "GET, POST"
    assert resp.error()["detail"] == ("The method DELETE is not allowed for this resource. \n\n "
                                      "The method specified is not allowed for this resource.")
    assert api.post(f"/resource_providers/{new_uuid()}").headers["Allow"] == "GET, DELETE, PUT"
    assert api.post(f"/allocations/{new_uuid()}").headers["Allow"] == "GET, PUT, DELETE"


def test_405_below_a_methods_version_names_the_method(api):
    resp = api.delete(f"/resource_providers/{new_uuid()}/inventories", version="1.3")
    assert resp.status == 405
    assert resp.error()["detail"].startswith("The method DELETE is not allowed for this resource.")


@pytest.mark.parametrize("accept, content_type", [
    ("text/plain", "text/plain; charset=UTF-8"),
    ("application/xml", "text/plain; charset=UTF-8"),
    ("text/html", "text/html; charset=UTF-8"),
])
def test_406_for_an_accept_without_json_in_the_form_the_client_takes(api, accept, content_type):
    resp = api.get("/resource_providers", headers={"Accept": accept})
    assert resp.status == 406
    assert resp.headers["Content-Type"] == content_type
    assert f"(content of type {accept}. " in resp.text
    assert "Only application/json is provided" in resp.text
    assert resp.headers["Vary"] == VARY


def test_406_json_detail_names_the_accept_header(api):
    resp = api.get("/resource_providers", version="1.99", headers={"Accept": "application/*"})
    assert resp.status == 406
    assert "(content of type application/*. \n\n Invalid microversion" in resp.error()["detail"]


def test_415_names_the_media_type(api):
    resp = api.request("POST", "/resource_providers", body=b'{"name": "x"}', headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    assert resp.error()["detail"].startswith("The request media type text/plain is not supported by this server.")


# -- HEAD -------------------------------------------------------------------------------
@pytest.mark.parametrize("path, status", [("/nowhere", 404), ("/resource_providers", 405)])
def test_head_errors_have_no_body(api, path, status):
    resp = api.request("HEAD", path)
    assert resp.status == status
    assert resp.raw.body == b""
    assert resp.headers["Content-Length"] == "0"
    assert resp.headers["Content-Type"] == "text/html; charset=UTF-8"


# -- bodies -------------------------------------------------------------------------------
def _post_raw(api, body: bytes, path="/resource_providers", version="1.30"):
    return api.request("POST", path, body=body, version=version, headers={"Content-Type": "application/json"})


def test_malformed_json_messages_are_pythons(api):
    resp = _post_raw(api, b'{"name": "x",}')
    assert resp.status == 400
    assert resp.error()["detail"].endswith(
        "Malformed JSON: Expecting property name enclosed in double quotes: line 1 column 14 (char 13)")
    resp = _post_raw(api, b"\xff\xfe")
    assert "Malformed JSON: 'utf-8' codec can't decode byte 0xff in position 0" in resp.error()["detail"]


@pytest.mark.parametrize("constant, shown", [(b"NaN", "nan"), (b"Infinity", "inf"), (b"-Infinity", "-inf")])
def test_nan_and_infinity_are_read_then_refused_by_the_schema(api, constant, shown):
    resp = _post_raw(api, b'{"name": ' + constant + b"}")
    assert resp.status == 400
    assert f"JSON does not validate: {shown} is not of type 'string'" in resp.error()["detail"]


def test_nan_where_a_number_is_due_is_refused_not_stored(api):
    rp = new_uuid()
    assert api.post("/resource_providers", json={"name": "nan", "uuid": rp}).status in (200, 201)
    body = b'{"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8, "allocation_ratio": NaN}}}'
    resp = api.request("PUT", f"/resource_providers/{rp}/inventories", body=body,
                       headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert "nan is not a finite number" in resp.error()["detail"]
    assert api.get(f"/resource_providers/{rp}/inventories").json["inventories"] == {}


def test_lone_surrogates_stay_refused(api):
    resp = _post_raw(api, b'{"name": "\\ud800"}')
    assert resp.status == 400
    assert "Malformed JSON" in resp.error()["detail"]


def test_the_most_relevant_schema_error_is_reported(api):
    rp = new_uuid()
    api.post("/resource_providers", json={"name": "relevant", "uuid": rp})
    body = {"resource_provider_generation": 0,
            "inventories": {"MEMORY_MB": {"total": 16, "min_unit": 0},
                            "DISK_GB": {"total": 4, "bogus": 1}}}
    resp = api.put(f"/resource_providers/{rp}/inventories", json=body)
    assert resp.status == 400
    assert "Additional properties are not allowed ('bogus' was unexpected)" in resp.error()["detail"]


def test_vary_on_a_missing_inventory_but_not_on_a_missing_provider(api):
    rp = new_uuid()
    api.post("/resource_providers", json={"name": "inventory-vary", "uuid": rp})
    missing_inventory = api.delete(f"/resource_providers/{rp}/inventories/VCPU")
    missing_provider = api.delete(f"/resource_providers/{new_uuid()}/inventories/VCPU")
    assert missing_inventory.status == missing_provider.status == 404
    assert missing_inventory.headers["Vary"] == VARY
    assert "Vary" not in missing_provider.headers


def test_usages_of_a_missing_provider_repeat_the_message_as_placement_does(api):
    rp = new_uuid()
    resp = api.get(f"/resource_providers/{rp}/usages")
    assert resp.status == 404
    message = f"No resource provider with uuid {rp} found"
    assert resp.error()["detail"].endswith(f"{message}: {message}")


def test_the_root_document_ignores_accept(api):
    resp = api.get("/", headers={"Accept": "text/plain"})
    assert resp.status == 200
    assert resp.json["versions"][0]["max_version"] == "1.39"



def test_an_unknown_parameter_is_reported_before_a_nul_in_it(api):
    resp = api.get("/resource_providers?a=%00", version="1.23")
    assert resp.status == 400
    assert "Additional properties are not allowed ('a' was unexpected)" in resp.error()["detail"]
    assert "U+0000" in api.get("/resource_providers?name=%00", version="1.23").error()["detail"]


@pytest.mark.parametrize("path, version, verdict", [
    ("/usages?a=%00", "1.30", "'project_id' is a required property"),
    ("/allocation_candidates?a=%00", "1.18", "'resources' is a required property"),
    ("/allocation_candidates?resources=VCPU:1&a=%00", "1.18", "('a' was unexpected)"),
])
def test_the_schema_speaks_before_a_nul_on_usages_and_candidates(api, path, version, verdict):
    resp = api.get(path, version=version)
    assert resp.status == 400
    assert verdict in resp.error()["detail"] and "U+0000" not in resp.error()["detail"]


@pytest.mark.parametrize("path", ["/usages?project_id=%00", "/allocation_candidates?resources=VCPU:%00"])
def test_a_nul_in_a_known_parameter_is_still_refused(api, path):
    resp = api.get(path, version="1.30")
    assert resp.status == 400 and "U+0000" in resp.error()["detail"]


# -- inventories under a key that is not a class name ----------------------------
def _provider_with_generation(api, name):
    rp = new_uuid()
    api.post("/resource_providers", json={"name": name, "uuid": rp})
    return rp


def test_a_stale_generation_is_reported_before_the_record_of_an_unknown_class(api):
    rp = _provider_with_generation(api, "stale-unknown")
    body = {"resource_provider_generation": 5,
            "inventories": {"DISK_GB": {"total": 4}, "bad-class": {"total": 4, "bogus": 1}}}
    resp = api.put(f"/resource_providers/{rp}/inventories", json=body, version="1.4")
    assert resp.status == 409
    assert resp.error()["detail"].endswith("resource provider generation conflict")


@pytest.mark.parametrize("record, verdict", [
    ({"total": 4, "bogus": 1, "min_unit": 0, "max_unit": 2 ** 40}, "No such resource class bad-class."),
    ({"total": -1}, "The reserved value is greater than or equal to total."),
    ({"total": 4, "reserved": 8, "bogus": 1}, "The reserved value is greater than or equal to total."),
])
def test_the_record_of_an_unknown_class_is_not_held_to_the_record_schema(api, record, verdict):
    rp = _provider_with_generation(api, "lenient-unknown")
    body = {"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": 4}, "bad-class": record}}
    resp = api.put(f"/resource_providers/{rp}/inventories", json=body, version="1.4")
    assert resp.status == 400
    assert resp.error()["detail"].endswith(verdict)


@pytest.mark.parametrize("record", ["x", {}, {"total": "8"}])
def test_a_record_placement_would_fail_on_stays_a_schema_error(api, record):
    rp = _provider_with_generation(api, "broken-unknown")
    body = {"resource_provider_generation": 0, "inventories": {"bad-class": record}}
    resp = api.put(f"/resource_providers/{rp}/inventories", json=body)
    assert resp.status == 400
    assert "JSON does not validate" in resp.error()["detail"]
