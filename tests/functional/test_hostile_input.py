"""Hostile input: never a 500, always a 4xx in Placement's error format.

Each case is one of a class a fuzzer finds (see tools/fuzz): numbers beyond
what a database column holds, text a database cannot store, paths and
query strings that are not UTF-8.  Where Placement answers sensibly the
answer is Placement's; where it answers 500 (or differently per backend)
the rule is ours and documented in the README ("Limits").  Every case runs
on the backend under test, so each backend gets the same answers.
"""

from __future__ import annotations

import pytest

from tests.conftest import new_uuid

MAX_INT = 2147483647
HUGE = 99999999999999999999  # beyond 64 bits
U64 = 18446744073709551615


def assert_error(response, status: int, *fragments: str) -> dict:
    """``status`` in Placement's error format, with a request id."""
    assert response.status == status, response
    error = response.error()
    assert error["status"] == status
    assert error["request_id"].startswith("req-")
    assert error["request_id"] == response.headers["x-openstack-request-id"]
    for fragment in fragments:
        assert fragment in error["detail"], error["detail"]
    return error


@pytest.fixture
def provider(api):
    uuid = new_uuid()
    assert api.post("/resource_providers", json={"name": "hostile", "uuid": uuid}).status == 200
    response = api.put(f"/resource_providers/{uuid}/inventories", json={
        "resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}}})
    assert response.status == 200, response
    return uuid


# -- paths that are not UTF-8, or hold a NUL ----------------------------------

def test_path_that_is_not_utf8_is_read_as_latin1_like_placement(api):
    # Placement: 404 "No resource provider with uuid \x00\xff found" on
    # SQLite and MariaDB.  The NUL makes it a plain 404 here, on every backend.
    assert_error(api.get("/resource_providers/%00%ff"), 404)
    assert_error(api.get("/resource_providers/%ff"), 404, "No resource provider with uuid \u00ff found")


def test_consumer_path_that_is_not_utf8_has_no_allocations(api):
    # Placement answers 200 {} for any consumer it does not know.
    response = api.get("/allocations/%ff%fe")
    assert response.status == 200, response
    assert response.json["allocations"] == {}


@pytest.mark.parametrize("path", [
    "/resource_providers/%00", "/resource_classes/CUSTOM_%00", "/traits/CUSTOM_%00",
    "/allocations/%00", "/resource_providers/%00/inventories/VCPU",
])
def test_path_with_nul_is_not_found(api, path):
    assert_error(api.get(path), 404)


# -- query strings ------------------------------------------------------------

@pytest.mark.parametrize("query", [
    "/resource_providers?name=%ff", "/usages?project_id=%ff",
    "/allocation_candidates?resources=VCPU:1&required=%ff",
    "/traits?name=in:%ff",
])
def test_query_that_is_not_utf8_is_a_400(api, query):
    assert_error(api.get(query), 400, "Invalid query string parameters: 'utf-8' codec can't decode")


@pytest.mark.parametrize("query", [
    "/resource_providers?name=a%00b", "/usages?project_id=a%00", "/usages?project_id=p&user_id=%00",
    "/allocation_candidates?resources=VCPU:1&required=CUSTOM_%00",
    "/resource_providers?resources=CUSTOM_%00:1", "/traits?name=startswith:%00",
])
def test_query_with_nul_is_a_400(api, query):
    assert_error(api.get(query), 400, "Invalid query string parameters", "U+0000")


def test_huge_limit_means_no_limit_like_placement(api, provider):
    for limit in (str(HUGE), "9" * 5000):
        response = api.get(f"/allocation_candidates?resources=VCPU:1&limit={limit}")
        assert response.status == 200, response
        assert len(response.json["allocation_requests"]) == 1


@pytest.mark.parametrize("path", ["/allocation_candidates", "/resource_providers"])
@pytest.mark.parametrize("amount", [MAX_INT + 1, HUGE, U64])
def test_resource_amount_beyond_the_column_is_a_400(api, provider, path, amount):
    assert_error(api.get(f"{path}?resources=VCPU:{amount}"), 400,
                 f"Requested resource VCPU requires amount <= {MAX_INT}. Got: {amount}.")


@pytest.mark.parametrize("path", ["/allocation_candidates", "/resource_providers"])
def test_largest_resource_amount_is_answered(api, provider, path):
    response = api.get(f"{path}?resources=VCPU:{MAX_INT}")
    assert response.status == 200, response


# -- text a database cannot store ---------------------------------------------

def test_provider_name_with_nul_is_refused_on_every_backend(api):
    error = assert_error(api.post("/resource_providers", json={"name": "a\u0000b"}), 400,
                         "JSON does not validate", "U+0000")
    assert error["detail"]
    assert api.get("/resource_providers").json["resource_providers"] == []


def test_other_control_characters_are_stored_as_given(api):
    name = "tab\tnewline\nbell\u0007del\u007f"
    response = api.post("/resource_providers", json={"name": name})
    assert response.status == 200, response
    uuid = response.json["uuid"]
    assert api.get(f"/resource_providers/{uuid}").json["name"] == name


@pytest.mark.parametrize("make", [
    lambda rp: ("PUT", f"/resource_providers/{rp}", {"name": "x\u0000"}),
    lambda rp: ("PUT", f"/resource_providers/{rp}/traits",
                {"resource_provider_generation": 1, "traits": ["CUSTOM_\u0000"]}),
    lambda rp: ("PUT", f"/allocations/{new_uuid()}", {
        "allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p\u0000", "user_id": "u",
        "consumer_generation": None, "consumer_type": "INSTANCE"}),
    lambda rp: ("POST", "/allocations", {new_uuid(): {
        "allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "\u0000",
        "consumer_generation": None, "consumer_type": "INSTANCE"}}),
    lambda rp: ("POST", "/resource_classes", {"name": "CUSTOM_\u0000"}),
])
def test_nul_anywhere_in_a_body_is_refused(api, provider, make):
    method, path, body = make(provider)
    assert_error(api.request(method, path, json=body), 400, "U+0000")


def test_lone_surrogate_in_a_body_is_malformed_json(api):
    response = api.post("/resource_providers", body=b'{"name": "\\ud800"}',
                        headers={"Content-Type": "application/json"})
    assert_error(response, 400, "Malformed JSON")


# -- numbers beyond 64 bits in bodies -----------------------------------------

def test_integer_beyond_64_bits_is_read_as_an_integer(api, provider):
    # orjson would read it as 1e+20 ("not of type 'integer'"); Placement
    # reads the integer and compares it: a generation conflict.
    body = (b'{"resource_provider_generation": 99999999999999999999, '
            b'"inventories": {"VCPU": {"total": 8}}}')
    response = api.put(f"/resource_providers/{provider}/inventories", body=body,
                       headers={"Content-Type": "application/json"})
    assert_error(response, 409, "resource provider generation conflict")
    body = b'{"resource_provider_generation": 1, "total": 99999999999999999999}'
    response = api.put(f"/resource_providers/{provider}/inventories/VCPU", body=body,
                       headers={"Content-Type": "application/json"})
    assert_error(response, 400, f"99999999999999999999 is greater than the maximum of {MAX_INT}")


@pytest.mark.parametrize("generation", [MAX_INT + 1, U64, HUGE, -HUGE])
def test_generations_beyond_the_column_are_conflicts(api, provider, generation):
    checks = [
        ("PUT", f"/resource_providers/{provider}/inventories",
         {"resource_provider_generation": generation, "inventories": {}}),
        ("PUT", f"/resource_providers/{provider}/inventories/VCPU",
         {"resource_provider_generation": generation, "total": 4}),
        ("PUT", f"/resource_providers/{provider}/traits",
         {"resource_provider_generation": generation, "traits": []}),
        ("PUT", f"/resource_providers/{provider}/aggregates",
         {"resource_provider_generation": generation, "aggregates": []}),
        ("PUT", f"/allocations/{new_uuid()}",
         {"allocations": {provider: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u",
          "consumer_generation": generation, "consumer_type": "INSTANCE"}),
        ("POST", "/reshaper", {
            "inventories": {provider: {"resource_provider_generation": generation,
                                       "inventories": {"VCPU": {"total": 8}}}},
            "allocations": {}}),
    ]
    for method, path, body in checks:
        response = api.request(method, path, body=_exact_json(body),
                               headers={"Content-Type": "application/json", "X-Roles": "admin,service"})
        assert response.status == 409, (method, path, response)
        assert response.error()["request_id"].startswith("req-")


@pytest.mark.parametrize("amount", [MAX_INT + 1, U64, HUGE])
def test_allocation_amounts_beyond_the_column_do_not_fit(api, provider, amount):
    # Placement answers 409: more than max_unit (at most 2147483647) never fits.
    body = {"allocations": {provider: {"resources": {"VCPU": amount}}}, "project_id": "p",
            "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}
    response = api.put(f"/allocations/{new_uuid()}", body=_exact_json(body),
                       headers={"Content-Type": "application/json"})
    assert_error(response, 409, "Unable to allocate inventory")
    response = api.post("/allocations", body=_exact_json({new_uuid(): body}),
                        headers={"Content-Type": "application/json"})
    assert_error(response, 409, "Unable to allocate inventory")


def _exact_json(data) -> bytes:
    import json

    return json.dumps(data).encode()


def test_inventory_records_under_unknown_class_names_must_be_records(api, provider):
    # Placement: 500 ('float' object is not iterable); found by the fuzzer.
    response = api.put(f"/resource_providers/{provider}/inventories", json={
        "resource_provider_generation": 1, "inventories": {"errors": 1.5}})
    assert_error(response, 400, "JSON does not validate: 1.5 is not of type 'object'")
    # A record under a name that is no class is still an unknown class, as in Placement.
    response = api.put(f"/resource_providers/{provider}/inventories", json={
        "resource_provider_generation": 1, "inventories": {"lower": {"total": 1}}})
    assert_error(response, 400, "Unknown resource class in inventory")


# -- allocation ratios no column or float holds -------------------------------


@pytest.mark.parametrize("ratio", [-3.5e38, -8.18854572436032e+307])
def test_allocation_ratio_below_what_mysql_stores_is_a_400(api, provider, ratio):
    # Placement: 500 on MySQL (single-precision column), or, where the
    # product with the total is beyond a float, 500 on every backend (found
    # by the fuzzer on MariaDB).  Bounded below as it is above, everywhere.
    response = api.post(f"/resource_providers/{provider}/inventories", json={
        "resource_class": "DISK_GB", "total": MAX_INT, "reserved": MAX_INT - 1, "allocation_ratio": ratio})
    assert_error(response, 400, f"{ratio!r} is less than the minimum of -3.40282e+38")
    for path, body in ((f"/resource_providers/{provider}/inventories/VCPU",
                        {"resource_provider_generation": 1, "total": 8, "allocation_ratio": ratio}),
                       (f"/resource_providers/{provider}/inventories",
                        {"resource_provider_generation": 1, "inventories": {"VCPU": {
                            "total": 8, "allocation_ratio": ratio}}})):
        assert_error(api.put(path, json=body), 400, "is less than the minimum of -3.40282e+38")


def test_allocation_ratio_at_the_lower_bound_is_stored_on_every_backend(api, provider):
    # A negative ratio leaves capacity only where reserved exceeds total
    # (Placement's rule, kept): the record is then stored, and read back.
    response = api.post(f"/resource_providers/{provider}/inventories", json={
        "resource_class": "DISK_GB", "total": 1, "reserved": 4, "allocation_ratio": -3.4e38})
    assert response.status == 201, response
    response = api.get(f"/resource_providers/{provider}/inventories/DISK_GB")
    assert response.json["allocation_ratio"] == pytest.approx(-3.4e38, rel=1e-6)


def test_an_unknown_class_record_whose_capacity_is_beyond_a_float_is_judged_not_crashed_on(api, provider):
    # Placement: 500 (OverflowError: its capacity, (total - reserved) * ratio,
    # is -inf as a float).  Its exact value is negative: no capacity.
    response = api.put(f"/resource_providers/{provider}/inventories", json={
        "resource_provider_generation": 1, "inventories": {"lower": {"total": 4, "allocation_ratio": -1e308}}})
    assert_error(response, 400, "Invalid inventory for 'lower'")


# -- documents nested deep, values quoted long --------------------------------

TOO_DEEP = "Malformed JSON: arrays and objects nested more than 32 levels deep"


@pytest.mark.parametrize("depth", [33, 200, 950, 1100, 100_000])
@pytest.mark.parametrize("opening, closing", [("[", "]"), ('{"a":', "}")])
def test_json_nested_at_any_depth_is_a_short_400(api, provider, depth, opening, closing):
    # Placement: 500 from about 900 levels (its reader recurses), and the
    # whole value quoted back below that.
    value = opening * depth + "1" + closing * depth
    for method, path in (("POST", "/resource_providers"), ("PUT", f"/allocations/{new_uuid()}"),
                         ("PUT", f"/resource_providers/{provider}/inventories")):
        response = api.request(method, path, body=f'{{"name": {value}}}'.encode(),
                               headers={"Content-Type": "application/json"})
        error = assert_error(response, 400, TOO_DEEP)
        assert len(response.text) < 1000, len(response.text)
        assert error["detail"].endswith(TOO_DEEP)


def test_json_nested_32_deep_is_judged_by_the_schema(api):
    value = "[" * 31 + "1" + "]" * 31  # 32 levels with the body's own object
    response = api.post("/resource_providers", body=f'{{"name": {value}}}'.encode(),
                        headers={"Content-Type": "application/json"})
    assert_error(response, 400, "JSON does not validate: ", "is not of type 'string'")


def test_a_normal_size_value_is_quoted_whole_as_placement_quotes_it(api):
    import jsonschema

    name = "n" * 300
    response = api.post("/resource_providers", json={"name": name})
    expected = next(jsonschema.Draft4Validator({"type": "string", "maxLength": 200}).iter_errors(name))
    # Placement's text: the message, the rule and the whole value.
    error = assert_error(response, 400, f"JSON does not validate: {expected.message}", f"On instance['name']:")
    assert error["detail"].count(name) == 2


@pytest.mark.parametrize("value", [
    '"' + "x" * 150_000 + '"',
    "[" + ",".join(['"' + "y" * 100 + '"'] * 20_000) + "]",
    "{" + ",".join(f'"k{i}": [1, 2, 3]' for i in range(20_000)) + "}",
])
def test_a_large_value_is_quoted_cut_to_a_bound(api, value):
    response = api.post("/resource_providers", body=f'{{"name": {value}}}'.encode(),
                        headers={"Content-Type": "application/json"})
    error = assert_error(response, 400, "JSON does not validate: ", "more characters)")
    assert len(response.text) < 12_000, len(response.text)
    assert error["detail"].startswith(
        "The server could not comply with the request since it is either malformed or otherwise incorrect.")


def test_a_long_text_with_a_nul_is_quoted_cut_to_a_bound(api):
    response = api.post("/resource_providers", json={"name": "z" * 100_000 + "\u0000"})
    assert_error(response, 400, "U+0000", "zzz...zzz")
    assert len(response.text) < 6_000


# -- what reaches the log -----------------------------------------------------

def request_lines(caplog, response) -> list[str]:
    """The request line of ``response`` (its request id is in the record's context)."""
    request_id = response.headers["x-openstack-request-id"]
    return [record.getMessage() for record in caplog.records
            if getattr(record, "context", {}).get("request_id") == request_id]


@pytest.mark.parametrize("path, shown", [
    ("/resource_providers/x%0a2026-01-01 INFO forged", "/resource_providers/x\\n2026-01-01 INFO forged"),
    ("/traits/%0d%1b[31mred%e2%80%a8", "/traits/\\r\\x1b[31mred\\xe2\\x80\\xa8"),
    ("/resource_providers/%c2%85next", "/resource_providers/\\xc2\\x85next"),
])
def test_control_characters_of_a_path_are_escaped_in_the_request_log_line(api, caplog, path, shown):
    import logging

    with caplog.at_level(logging.INFO, logger="placement.requestlog"):
        response = api.get(path)
    lines = request_lines(caplog, response)
    assert len(lines) == 1
    assert "\n" not in lines[0] and "\r" not in lines[0] and "\x1b" not in lines[0]
    assert f'"GET {shown}" status: {response.status}' in lines[0]


def test_a_printable_path_is_logged_as_it_is(api, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="placement.requestlog"):
        response = api.get("/resource_providers/caf%c3%a9?name=a%0ab")
    line, = request_lines(caplog, response)
    assert '"GET /resource_providers/caf\u00c3\u00a9?name=a%0ab"' in line  # PEP 3333's Latin-1 reading, unchanged


def test_a_cut_quote_keeps_what_the_message_says_of_the_value(api):
    response = api.post("/resource_providers", json={"name": "w" * 50_000})
    error = assert_error(response, 400, "more characters)", "is too long")
    assert len(error["detail"]) < 6_000


def test_control_characters_of_a_noauth2_user_are_escaped_in_the_request_log_line(api, caplog):
    """noauth2 takes the user and project from the client's token: escaped in the line's context."""
    import logging

    with caplog.at_level(logging.INFO, logger="placement.requestlog"):
        response = api.get("/", token="evil\nuser:proj\x1b[31m")
    record, = [r for r in caplog.records
               if getattr(r, "context", {}).get("request_id") == response.headers["x-openstack-request-id"]]
    assert (record.context["user"], record.context["project"]) == ("evil\\nuser", "proj\\x1b[31m")
