"""/resource_providers and /resource_providers/{uuid}, as the API reference describes them."""

from __future__ import annotations

import datetime
import re
import threading

import pytest
import sqlalchemy as sa

from allotment.db import tables
from tests.conftest import BACKEND, new_uuid

HTTP_DATE = r"^\w+, \d+ \w+ \d{4} [\d:]+ GMT$"
AGG_A = "f918801a-5e54-4bee-9095-09a9d0c786b8"
AGG_B = "a893eb5c-e2a0-4251-ab26-f71d3b0cfc0b"


def create(api, name=None, uuid=None, parent=None, version="1.39"):
    body = {"name": name or f"rp-{new_uuid()}"}
    if uuid:
        body["uuid"] = uuid
    if parent:
        body["parent_provider_uuid"] = parent
    resp = api.post("/resource_providers", json=body, version=version)
    assert resp.status == 200, resp
    return resp.json


def assert_error(resp, status, *fragments, code=None):
    assert resp.status == status, resp
    error = resp.error()
    for fragment in fragments:
        assert fragment in error["detail"], (fragment, error["detail"])
    if code is not None:
        assert error["code"] == code, error


def listed(api, query="", version="1.39"):
    resp = api.get(f"/resource_providers{query}", version=version)
    assert resp.status == 200, resp
    return {rp["name"] for rp in resp.json["resource_providers"]}


def count(app) -> int:
    with app.db.read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(tables.resource_providers)).scalar()


# -- POST /resource_providers -----------------------------------------------------------

def test_create_before_1_20_is_201_with_location_and_no_body(api):
    uuid = new_uuid()
    resp = api.post("/resource_providers", json={"name": "n1", "uuid": uuid}, version="1.19")
    assert resp.status == 201
    assert resp.headers["Location"].endswith(f"/resource_providers/{uuid}")
    assert resp.text == ""
    assert "Content-Type" not in resp.headers


def test_create_from_1_20_returns_the_provider(api):
    uuid = new_uuid()
    resp = api.post("/resource_providers", json={"name": "n1", "uuid": uuid}, version="1.20")
    assert resp.status == 200
    assert resp.headers["Location"].endswith(f"/resource_providers/{uuid}")
    body = resp.json
    assert body["uuid"] == uuid and body["name"] == "n1" and body["generation"] == 0
    assert body["parent_provider_uuid"] is None and body["root_provider_uuid"] == uuid
    assert re.match(HTTP_DATE, resp.headers["Last-Modified"])
    assert resp.headers["Cache-Control"] == "no-cache"


def test_create_without_uuid_generates_one(api):
    body = create(api, "anonymous")
    assert re.match(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", body["uuid"])
    assert api.get(f"/resource_providers/{body['uuid']}").json["name"] == "anonymous"


def test_hyphenless_uuid_is_stored_canonically_and_conflicts_with_the_hyphenated(api):
    body = create(api, "dashless", uuid="2290D4AF9E6E400B9D651EE01376F71A")
    assert body["uuid"] == "2290d4af-9e6e-400b-9d65-1ee01376f71a"
    resp = api.post("/resource_providers", json={"name": "other", "uuid": "2290d4af-9e6e-400b-9d65-1ee01376f71a"})
    assert_error(resp, 409, "Conflicting resource provider uuid: 2290d4af-9e6e-400b-9d65-1ee01376f71a "
                            "already exists.", code="placement.duplicate_name")


def test_duplicate_name_is_409(api):
    create(api, "taken")
    resp = api.post("/resource_providers", json={"name": "taken", "uuid": new_uuid()})
    assert_error(resp, 409, "Conflicting resource provider name: taken already exists.",
                 code="placement.duplicate_name")
    assert resp.error()["title"] == "Conflict"
    assert count(api.application) == 1


def test_duplicate_name_and_uuid_names_both(api):
    uuid = create(api, "both")["uuid"]
    resp = api.post("/resource_providers", json={"name": "both", "uuid": uuid})
    assert_error(resp, 409, f"Conflicting resource provider uuid: {uuid}, name: both already exists.")


def test_names_are_case_sensitive_and_unicode(api):
    create(api, "Case")
    create(api, "case")
    snowman = create(api, "☃")
    assert api.get(f"/resource_providers/{snowman['uuid']}").json["name"] == "☃"
    assert listed(api, "?name=%E2%98%83") == {"☃"}


@pytest.mark.parametrize("body, fragment", [
    ({"name": "x" * 201}, "Failed validating 'maxLength'"),
    ({"name": 5}, "5 is not of type 'string'"),
    ({}, "'name' is a required property"),
    ({"name": "n", "uuid": "not a uuid"}, "'not a uuid' is not a 'uuid'"),
    ({"name": "n", "uuid": "2290d4af-9e6e-400b-9d65-1ee01376f71"}, "is not a 'uuid'"),
    ({"name": "n", "color": "blue"}, "Additional properties are not allowed ('color' was unexpected)"),
    ({"name": "n", "parent_provider_uuid": "nope"}, "JSON does not validate"),
    ({"name": "n", "root_provider_uuid": new_uuid()}, "Additional properties are not allowed"),
])
def test_create_rejects_bad_bodies(api, body, fragment):
    resp = api.post("/resource_providers", json=body)
    assert_error(resp, 400, "JSON does not validate", fragment)
    assert count(api.application) == 0


@pytest.mark.parametrize("version", ["1.0", "1.14", "1.20", "1.39"])
def test_create_with_an_empty_name_is_400_before_any_other_check(api, version):
    # Placement's schema lets "" through and its create refuses it, before
    # it looks at the uuid or the parent.
    taken = create(api, "taken")["uuid"]
    for body in ({"name": ""}, {"name": "", "uuid": taken},
                 {"name": "", "uuid": new_uuid(), **({"parent_provider_uuid": new_uuid()}
                                                    if version >= "1.14" else {})}):
        resp = api.post("/resource_providers", json=body, version=version)
        shown = body.get("uuid", "")
        assert_error(resp, 400, f'Unable to create resource provider "", {shown}',
                     "Object action create failed because: name is required")
    assert count(api.application) == 1


def test_rename_to_an_empty_name_is_accepted(api):
    # As in Placement: only create refuses "".
    uuid = create(api, "named")["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": ""})
    assert resp.status == 200 and resp.json["name"] == ""


def test_create_accepts_a_200_character_name(api):
    assert create(api, "y" * 200)["name"] == "y" * 200


def test_create_rejects_malformed_json(api):
    resp = api.post("/resource_providers", body=b'{"foo": }', headers={"Content-Type": "application/json"})
    assert_error(resp, 400, "Malformed JSON:")


def test_parent_is_not_accepted_before_1_14(api):
    parent = create(api)["uuid"]
    resp = api.post("/resource_providers", json={"name": "c", "parent_provider_uuid": parent}, version="1.13")
    assert_error(resp, 400, "JSON does not validate", "'parent_provider_uuid' was unexpected")


def test_create_child_and_grandchild(api):
    root = create(api, "root")["uuid"]
    child = create(api, "child", parent=root)
    grandchild = create(api, "grandchild", parent=child["uuid"])
    assert child["parent_provider_uuid"] == root and child["root_provider_uuid"] == root
    assert grandchild["parent_provider_uuid"] == child["uuid"]
    assert grandchild["root_provider_uuid"] == root


def test_create_with_null_parent_is_a_root(api):
    body = create(api, "r", parent=None)
    resp = api.post("/resource_providers", json={"name": "r2", "parent_provider_uuid": None})
    assert resp.status == 200 and resp.json["root_provider_uuid"] == resp.json["uuid"]
    assert body["parent_provider_uuid"] is None


def test_create_with_missing_parent_is_400(api):
    uuid, parent = new_uuid(), new_uuid()
    resp = api.post("/resource_providers", json={"name": "orphan", "uuid": uuid, "parent_provider_uuid": parent})
    assert_error(resp, 400, f'Unable to create resource provider "orphan", {uuid}: Object action create failed '
                            "because: parent provider UUID does not exist.")
    assert count(api.application) == 0


def test_create_as_own_parent_is_400(api):
    uuid = new_uuid()
    resp = api.post("/resource_providers", json={"name": "self", "uuid": uuid, "parent_provider_uuid": uuid})
    assert_error(resp, 400, f'Unable to create resource provider "self", {uuid}:',
                 "parent provider UUID cannot be same as UUID. Please set parent provider UUID to None if "
                 "there is no parent.")


# -- GET /resource_providers/{uuid} ---------------------------------------------------------

def test_get_shape_by_version(api):
    uuid = create(api, "shape")["uuid"]
    old = api.get(f"/resource_providers/{uuid}", version="1.13").json
    assert set(old) == {"uuid", "name", "generation", "links"}
    new = api.get(f"/resource_providers/{uuid}", version="1.14").json
    assert set(new) == {"uuid", "name", "generation", "links", "parent_provider_uuid", "root_provider_uuid"}


@pytest.mark.parametrize("version, rels", [
    ("1.0", ["self", "inventories", "usages"]),
    ("1.1", ["self", "inventories", "usages", "aggregates"]),
    ("1.5", ["self", "inventories", "usages", "aggregates"]),
    ("1.6", ["self", "inventories", "usages", "aggregates", "traits"]),
    ("1.10", ["self", "inventories", "usages", "aggregates", "traits"]),
    ("1.11", ["self", "inventories", "usages", "aggregates", "traits", "allocations"]),
    ("1.39", ["self", "inventories", "usages", "aggregates", "traits", "allocations"]),
])
def test_links_by_version(api, version, rels):
    uuid = create(api)["uuid"]
    links = api.get(f"/resource_providers/{uuid}", version=version).json["links"]
    assert [link["rel"] for link in links] == rels
    base = f"/resource_providers/{uuid}"
    assert [link["href"] for link in links] == [base] + [f"{base}/{rel}" for rel in rels[1:]]


def test_get_cache_headers_only_from_1_15(api):
    uuid = create(api)["uuid"]
    assert re.match(HTTP_DATE, api.get(f"/resource_providers/{uuid}", version="1.15").headers["Last-Modified"])
    old = api.get(f"/resource_providers/{uuid}", version="1.14").headers
    assert "Last-Modified" not in old and "Cache-Control" not in old


def test_get_missing_is_404(api):
    uuid = new_uuid()
    assert_error(api.get(f"/resource_providers/{uuid}"), 404, f"No resource provider with uuid {uuid} found")
    assert api.get("/resource_providers/random_sauce").status == 404


# -- GET /resource_providers -------------------------------------------------------------

def test_empty_list_has_cache_headers_from_1_15(api):
    resp = api.get("/resource_providers", version="1.15")
    assert resp.json == {"resource_providers": []}
    assert re.match(HTTP_DATE, resp.headers["Last-Modified"])
    assert "Last-Modified" not in api.get("/resource_providers", version="1.14").headers


def test_list_by_name_and_uuid(api):
    first = create(api, "first")
    create(api, "second")
    assert listed(api) == {"first", "second"}
    assert listed(api, "?name=first") == {"first"}
    assert listed(api, f"?uuid={first['uuid']}") == {"first"}
    assert listed(api, f"?uuid={new_uuid()}") == set()
    assert listed(api, "?name=flubblebubble") == set()
    # An empty name filters nothing (Placement's), even with a provider named "".
    api.put(f"/resource_providers/{first['uuid']}", json={"name": ""})
    assert listed(api, "?name=") == {"", "second"}


@pytest.mark.parametrize("query, version", [
    ("?uuid=spameggs", "1.39"),
    ("?spam=eggs", "1.39"),
    (f"?member_of={AGG_A}", "1.2"),
    ("?resources=VCPU:1", "1.3"),
    (f"?in_tree={AGG_A}", "1.13"),
    ("?in_tree=not-a-uuid", "1.14"),
    ("?required=HW_CPU_X86_SGX", "1.17"),
])
def test_list_rejects_unknown_or_too_new_parameters(api, query, version):
    assert_error(api.get(f"/resource_providers{query}", version=version), 400,
                 "Invalid query string parameters")


def test_list_before_1_14_has_no_tree_fields(api):
    create(api)
    provider = api.get("/resource_providers", version="1.13").json["resource_providers"][0]
    assert "parent_provider_uuid" not in provider and "root_provider_uuid" not in provider


def test_in_tree_lists_the_whole_tree(api):
    root = create(api, "root")["uuid"]
    child = create(api, "child", parent=root)["uuid"]
    create(api, "grandchild", parent=child)
    create(api, "other")
    assert listed(api, f"?in_tree={child}") == {"root", "child", "grandchild"}
    assert listed(api, f"?in_tree={root}") == {"root", "child", "grandchild"}
    assert listed(api, f"?in_tree={new_uuid()}") == set()


def _with_aggregates(api, uuid, *aggregates):
    generation = api.get(f"/resource_providers/{uuid}").json["generation"]
    resp = api.put(f"/resource_providers/{uuid}/aggregates",
                   json={"aggregates": list(aggregates), "resource_provider_generation": generation})
    assert resp.status == 200, resp


def test_member_of(api):
    one, two, three = (create(api, name)["uuid"] for name in ("one", "two", "three"))
    _with_aggregates(api, one, AGG_A)
    _with_aggregates(api, two, AGG_A, AGG_B)
    assert listed(api, f"?member_of={AGG_A}", "1.3") == {"one", "two"}
    assert listed(api, f"?member_of=in:{AGG_B},{new_uuid()}", "1.3") == {"two"}
    assert listed(api, f"?member_of={AGG_A}&member_of={AGG_B}", "1.24") == {"two"}
    assert listed(api, f"?member_of=!{AGG_B}", "1.32") == {"one", "three"}
    assert listed(api, f"?member_of=!in:{AGG_A},{AGG_B}", "1.32") == {"three"}
    assert listed(api, f"?member_of={AGG_A}&member_of=!{AGG_B}", "1.32") == {"one"}


@pytest.mark.parametrize("query, version, fragment", [
    ("?member_of=not+a+uuid", "1.3", "Expected 'member_of' parameter to contain valid UUID(s)."),
    (f"?member_of={AGG_A},{AGG_B}", "1.3", "Multiple values for 'member_of' must be prefixed with the 'in:'"),
    (f"?member_of={AGG_A}&member_of={AGG_B}", "1.23", "Multiple member_of parameters are not supported"),
    (f"?member_of=!{AGG_A}", "1.31", "Forbidden member_of parameters are not supported in the specified "
                                    "microversion"),
    (f"?member_of=in:{AGG_A},!{AGG_B}", "1.32", "Expected 'member_of' parameter to contain valid UUID(s)."),
])
def test_member_of_errors(api, query, version, fragment):
    assert_error(api.get(f"/resource_providers{query}", version=version), 400, fragment)


def _inventory(api, uuid, **inventories):
    generation = api.get(f"/resource_providers/{uuid}").json["generation"]
    resp = api.put(f"/resource_providers/{uuid}/inventories",
                   json={"resource_provider_generation": generation, "inventories": inventories})
    assert resp.status == 200, resp


def _allocate(api, uuid, **resources):
    resp = api.put(f"/allocations/{new_uuid()}", version="1.28", json={
        "allocations": {uuid: {"resources": resources}},
        "project_id": "p", "user_id": "u", "consumer_generation": None})
    assert resp.status == 204, resp


def test_resources_filter_applies_capacity_and_unit_rules(api):
    disk = create(api, "disk")["uuid"]
    create(api, "empty")
    _inventory(api, disk, DISK_GB={"total": 2048, "reserved": 48, "min_unit": 10, "max_unit": 1000,
                                   "step_size": 10, "allocation_ratio": 1.0},
               VCPU={"total": 4, "allocation_ratio": 2.0})
    assert listed(api, "?resources=DISK_GB:500", "1.4") == {"disk"}
    assert listed(api, "?resources=DISK_GB:500,VCPU:8") == {"disk"}
    for query in ("DISK_GB:1", "DISK_GB:1010", "DISK_GB:11", "VCPU:9", "MEMORY_MB:1"):
        assert listed(api, f"?resources={query}") == set(), query
    # Usage counts: 2000 usable, 1200 used, so 800 fits but not 810.
    _allocate(api, disk, DISK_GB=600)
    _allocate(api, disk, DISK_GB=600)
    assert listed(api, "?resources=DISK_GB:800") == {"disk"}
    assert listed(api, "?resources=DISK_GB:810") == set()


@pytest.mark.parametrize("value, fragments", [
    ("VCPU", ["Badly formed resources parameter. Expected resources query string parameter in form:",
              "Got: VCPU."]),
    ("VCPU:fred", ["Requested resource VCPU expected positive integer amount.", "Got: fred."]),
    ("VCPU:-2", ["Requested resource VCPU requires amount >= 1.", "Got: -2."]),
    ("DISK_GB:500,", ["Badly formed resources parameter.", "Got: ."]),
    ("", ["Badly formed resources parameter.", "Got: empty string."]),
    ("MYMISSINGCLASS:1", ["Invalid resource class in resources parameter: No such resource class "
                          "MYMISSINGCLASS."]),
])
def test_resources_filter_errors(api, value, fragments):
    assert_error(api.get(f"/resource_providers?resources={value}"), 400, *fragments)


def _traits(api, uuid, *traits):
    generation = api.get(f"/resource_providers/{uuid}").json["generation"]
    resp = api.put(f"/resource_providers/{uuid}/traits",
                   json={"resource_provider_generation": generation, "traits": list(traits)})
    assert resp.status == 200, resp


def test_required_traits(api):
    left, middle, right = (create(api, name)["uuid"] for name in ("left", "middle", "right"))
    _traits(api, left, "HW_CPU_X86_SGX", "STORAGE_DISK_SSD")
    _traits(api, middle, "STORAGE_DISK_SSD", "HW_CPU_X86_AVX")
    assert listed(api, "?required=STORAGE_DISK_SSD", "1.18") == {"left", "middle"}
    assert listed(api, "?required=STORAGE_DISK_SSD,HW_CPU_X86_SGX") == {"left"}
    assert listed(api, "?required=!STORAGE_DISK_SSD", "1.22") == {"right"}
    assert listed(api, "?required=STORAGE_DISK_SSD,!HW_CPU_X86_SGX") == {"middle"}
    assert listed(api, "?required=!HW_CPU_X86_VMX") == {"left", "middle", "right"}
    # 1.39: any-of, and repeated parameters are ANDed; before, the last one wins.
    assert listed(api, "?required=in:HW_CPU_X86_SGX,HW_CPU_X86_AVX") == {"left", "middle"}
    assert listed(api, "?required=in:HW_CPU_X86_SGX,HW_CPU_X86_AVX&required=!HW_CPU_X86_SGX") == {"middle"}
    assert listed(api, "?required=HW_CPU_X86_SGX&required=HW_CPU_X86_AVX", "1.38") == {"middle"}


@pytest.mark.parametrize("value, version, fragment", [
    ("!STORAGE_DISK_SSD", "1.21", "Invalid query string parameters: Expected 'required' parameter value of "
                                  "the form: HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: !STORAGE_DISK_SSD"),
    ("", "1.39", "Expected 'required' parameter value of the form: HW_CPU_X86_VMX,!CUSTOM_MAGIC."),
    ("", "1.21", "Expected 'required' parameter value of the form: HW_CPU_X86_VMX,CUSTOM_MAGIC."),
    ("STORAGE_DISK_SSD,,HW_CPU_X86_SGX", "1.39", "Got an empty trait in"),
    ("in:CUSTOM_FOO,HW_CPU_X86_MMX", "1.38", "The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only supported "
                                             "since microversion 1.39."),
    ("STORAGE_DISK_SSD,BOGUS_TRAIT,CUSTOM_NOPE", "1.39",
     'Invalid trait(s) in "required" parameter: No such trait(s): BOGUS_TRAIT, CUSTOM_NOPE.'),
    # Required names are looked up before forbidden ones.
    ("!CUSTOM_GONE,CUSTOM_NOPE", "1.39", 'Invalid trait(s) in "required" parameter: No such trait(s): CUSTOM_NOPE.'),
])
def test_required_errors(api, value, version, fragment):
    assert_error(api.get(f"/resource_providers?required={value}", version=version), 400, fragment)


def test_filters_combine(api):
    root = create(api, "root")["uuid"]
    child = create(api, "child", parent=root)["uuid"]
    other = create(api, "other")["uuid"]
    for uuid in (root, child, other):
        _traits(api, uuid, "STORAGE_DISK_SSD")
        _inventory(api, uuid, IPV4_ADDRESS={"total": 10})
    _with_aggregates(api, child, AGG_A)
    _with_aggregates(api, other, AGG_A)
    query = f"?required=STORAGE_DISK_SSD&resources=IPV4_ADDRESS:5&member_of={AGG_A}&in_tree={root}"
    assert listed(api, query) == {"child"}
    assert listed(api, query + "&name=root") == set()


# Placement ends its search with nothing as soon as one filter matches no
# provider at all, before it looks up the names of the later ones; in its
# order: in_tree, the required traits, the forbidden traits' names,
# member_of, the resource classes (checked against the reference).
NO_PROVIDER = "in_tree=00000000-0000-4000-8000-000000000000"
AGG_C = "5c5b1c4e-56a2-4b4e-9c5e-3a4bb1a2d0c7"


@pytest.mark.parametrize("ending, unknown_after", [
    # An unknown class is never reached once a filter has emptied the search.
    ("required=CUSTOM_NO_ONE_HAS_IT", "resources=CUSTOM_GOLD:2"),
    (f"member_of=in:{AGG_B},{AGG_C}", "resources=CUSTOM_GOLD:2"),
    (f"required=CUSTOM_NO_ONE_HAS_IT&member_of=in:{AGG_B}", "resources=CUSTOM_GOLD:2"),
    (NO_PROVIDER, "resources=CUSTOM_GOLD:2"),
    # Nor an unknown trait after an earlier filter emptied it.
    (NO_PROVIDER, "required=CUSTOM_NOPE"),
    ("required=CUSTOM_NO_ONE_HAS_IT", "required=!CUSTOM_NOPE"),
    (NO_PROVIDER, "required=!CUSTOM_NOPE"),
])
def test_a_filter_matching_no_provider_ends_the_search_before_later_names(api, ending, unknown_after):
    _filtered_scene(api)
    r = api.get(f"/resource_providers?{ending}&{unknown_after}", version="1.39")
    assert r.status == 200, r
    assert r.json == {"resource_providers": []}


@pytest.mark.parametrize("query, fragment", [
    # Filters that end nothing: the unknown name is reported.
    ("required=STORAGE_DISK_SSD&resources=CUSTOM_GOLD:2", "Invalid resource class in resources parameter"),
    (f"member_of={AGG_A}&resources=CUSTOM_GOLD:2", "Invalid resource class in resources parameter"),
    ("uuid=00000000-0000-4000-8000-000000000000&resources=CUSTOM_GOLD:2",
     "Invalid resource class in resources parameter"),
    ("name=nobody&required=CUSTOM_NOPE", 'Invalid trait(s) in "required" parameter'),
    ("required=!STORAGE_DISK_SSD&resources=CUSTOM_GOLD:2", "Invalid resource class in resources parameter"),
    (f"member_of=!{AGG_A}&resources=CUSTOM_GOLD:2", "Invalid resource class in resources parameter"),
    # Names are looked up before the search of their own filter, and forbidden
    # trait names before member_of is searched.
    ("required=CUSTOM_NOPE&required=CUSTOM_NO_ONE_HAS_IT", 'Invalid trait(s) in "required" parameter'),
    (f"required=!CUSTOM_NOPE&member_of={AGG_B}", 'Invalid trait(s) in "required" parameter'),
])
def test_filters_that_match_a_provider_leave_unknown_names_reported(api, query, fragment):
    _filtered_scene(api)
    assert_error(api.get(f"/resource_providers?{query}", version="1.39"), 400, fragment)


def _filtered_scene(api):
    """One provider with a trait, an aggregate and VCPU; CUSTOM_NO_ONE_HAS_IT exists."""
    assert api.put("/traits/CUSTOM_NO_ONE_HAS_IT").status in (201, 204)
    uuid = create(api, "filtered")["uuid"]
    _traits(api, uuid, "STORAGE_DISK_SSD")
    _with_aggregates(api, uuid, AGG_A)
    _inventory(api, uuid, VCPU={"total": 4})


def _statements(app, work) -> int:
    counter = {"n": 0}

    def count_it(*_args):
        counter["n"] += 1

    sa.event.listen(app.db.engine, "before_cursor_execute", count_it)
    try:
        work()
    finally:
        sa.event.remove(app.db.engine, "before_cursor_execute", count_it)
    return counter["n"]


def test_filtered_list_issues_the_same_few_queries_for_many_providers(api):
    query = f"/resource_providers?required=STORAGE_DISK_SSD&resources=VCPU:1&member_of={AGG_A}"

    def add(n):
        for _ in range(n):
            uuid = create(api)["uuid"]
            _traits(api, uuid, "STORAGE_DISK_SSD")
            _inventory(api, uuid, VCPU={"total": 2})
            _with_aggregates(api, uuid, AGG_A)

    add(2)
    few = _statements(api.application, lambda: api.get(query))
    add(20)
    many = _statements(api.application, lambda: api.get(query))
    assert len(api.get(query).json["resource_providers"]) == 22
    assert few == many <= 4


# -- PUT /resource_providers/{uuid} ------------------------------------------------------

def test_rename_keeps_generation_and_updates_last_modified(api):
    uuid = create(api, "old")["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "new"}, version="1.15")
    assert resp.status == 200
    assert resp.json["name"] == "new" and resp.json["generation"] == 0
    assert re.match(HTTP_DATE, resp.headers["Last-Modified"])
    assert "Location" not in resp.headers
    assert api.get(f"/resource_providers/{uuid}").json["name"] == "new"


def test_update_is_last_modified_at_the_update_before(api, app):
    # Placement answers an update with the provider's update time as it was
    # before this update: a child never written has none, so no header; a
    # root has one from birth; a generation bump counts as an update.
    root = create(api, "root")["uuid"]
    child = create(api, "child", parent=root)["uuid"]
    written = create(api, "written", parent=root)["uuid"]
    assert api.put(f"/resource_providers/{written}/traits", version="1.29",
                   json={"traits": ["HW_CPU_X86_AVX"], "resource_provider_generation": 0}).status == 200
    first = api.put(f"/resource_providers/{child}", json={"name": "x"}, version="1.29")
    assert first.status == 200 and first.json["name"] == "x"
    assert "Last-Modified" not in first.headers and first.headers["Cache-Control"] == "no-cache"
    assert re.match(HTTP_DATE, api.get(f"/resource_providers/{child}", version="1.29").headers["Last-Modified"])
    assert re.match(HTTP_DATE, api.put(f"/resource_providers/{child}", json={"name": "y"},
                                       version="1.29").headers["Last-Modified"])
    assert re.match(HTTP_DATE, api.put(f"/resource_providers/{written}", json={"name": "w"},
                                       version="1.29").headers["Last-Modified"])
    assert re.match(HTTP_DATE, api.put(f"/resource_providers/{root}", json={"name": "r"},
                                       version="1.29").headers["Last-Modified"])
    # The value is the earlier update's time, not now.
    with app.db.write() as conn:
        conn.execute(tables.resource_providers.update().where(tables.resource_providers.c.uuid == child)
                     .values(updated_at=datetime.datetime(2001, 2, 3, 4, 5, 6)))
    resp = api.put(f"/resource_providers/{child}", json={"name": "z"}, version="1.29")
    assert resp.headers["Last-Modified"] == "Sat, 03 Feb 2001 04:05:06 GMT"


def test_an_update_that_changes_nothing_is_no_write(api, app):
    """Placement writes nothing when the name and place stay (its ORM sees no
    change), so a child never changed still has no update time for the next
    answer: no Last-Modified, however often it is sent (also after setting
    the parent it already has)."""
    root = create(api, "root")["uuid"]
    child = create(api, "child", parent=root)["uuid"]
    same_parent = api.put(f"/resource_providers/{child}", json={"name": "child", "parent_provider_uuid": root},
                          version="1.24")
    assert same_parent.status == 200 and "Last-Modified" not in same_parent.headers
    for _ in range(2):
        resp = api.put(f"/resource_providers/{child}", json={"name": "child"}, version="1.21")
        assert resp.status == 200 and "Last-Modified" not in resp.headers, resp
    with app.db.read() as conn:
        assert conn.execute(sa.select(tables.resource_providers.c.updated_at)
                            .where(tables.resource_providers.c.uuid == child)).scalar() is None
    # A real change is written, and the next answer carries its time.
    assert "Last-Modified" not in api.put(f"/resource_providers/{child}", json={"name": "renamed"},
                                          version="1.21").headers
    assert re.match(HTTP_DATE, api.put(f"/resource_providers/{child}", json={"name": "renamed"},
                                       version="1.21").headers["Last-Modified"])


def test_rename_to_a_taken_name_is_409(api):
    create(api, "taken")
    uuid = create(api, "mine")["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "taken"})
    assert_error(resp, 409, "Conflicting resource provider taken already exists.", code="placement.duplicate_name")
    assert api.get(f"/resource_providers/{uuid}").json["name"] == "mine"


def test_rename_to_own_name_is_fine(api):
    uuid = create(api, "same")["uuid"]
    assert api.put(f"/resource_providers/{uuid}", json={"name": "same"}).status == 200


@pytest.mark.parametrize("body, fragment", [
    ({"name": "z" * 201}, "Failed validating 'maxLength'"),
    ({"badfield": "x"}, "JSON does not validate"),
    ({"name": "n", "uuid": new_uuid()}, "Additional properties are not allowed"),
    ({"name": "n", "root_provider_uuid": new_uuid()}, "Additional properties are not allowed"),
])
def test_update_rejects_bad_bodies(api, body, fragment):
    uuid = create(api, "keep")["uuid"]
    assert_error(api.put(f"/resource_providers/{uuid}", json=body), 400, fragment)
    assert api.get(f"/resource_providers/{uuid}").json["name"] == "keep"


def test_update_missing_provider_is_404_even_with_a_bad_body(api):
    uuid = new_uuid()
    assert_error(api.put(f"/resource_providers/{uuid}", json={"bad": 1}), 404,
                 f"No resource provider with uuid {uuid} found")
    assert api.put(f"/resource_providers/{uuid}", json={"name": "x"}).status == 404


def test_parent_not_settable_before_1_14(api):
    parent = create(api)["uuid"]
    uuid = create(api)["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "c", "parent_provider_uuid": parent},
                   version="1.13")
    assert_error(resp, 400, "JSON does not validate")


def test_a_root_may_be_given_a_parent_from_1_14_and_its_subtree_follows(api):
    top = create(api, "top")["uuid"]
    mid = create(api, "mid")["uuid"]
    low = create(api, "low", parent=mid)["uuid"]
    resp = api.put(f"/resource_providers/{mid}", json={"name": "mid", "parent_provider_uuid": top},
                   version="1.14")
    assert resp.status == 200, resp
    assert resp.json["parent_provider_uuid"] == top and resp.json["root_provider_uuid"] == top
    assert resp.json["generation"] == 0
    assert api.get(f"/resource_providers/{low}").json["root_provider_uuid"] == top
    assert listed(api, f"?in_tree={low}") == {"top", "mid", "low"}


def test_setting_the_same_parent_before_1_37_is_allowed(api):
    parent = create(api)["uuid"]
    uuid = create(api, "kid", parent=parent)["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "kid", "parent_provider_uuid": parent},
                   version="1.36")
    assert resp.status == 200 and resp.json["parent_provider_uuid"] == parent


def test_reparenting_and_unparenting_need_1_37(api):
    first = create(api, "first")["uuid"]
    second = create(api, "second")["uuid"]
    uuid = create(api, "kid", parent=first)["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "kid", "parent_provider_uuid": second},
                   version="1.36")
    assert_error(resp, 400, f"Unable to save resource provider {uuid}: Object action update failed because: "
                            "re-parenting a provider is not currently allowed.")
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "kid", "parent_provider_uuid": None},
                   version="1.36")
    assert_error(resp, 400, "un-parenting a provider is not currently allowed.")
    assert api.get(f"/resource_providers/{uuid}").json["parent_provider_uuid"] == first


def test_reparent_and_unparent_move_the_subtree(api):
    first = create(api, "first")["uuid"]
    second = create(api, "second")["uuid"]
    kid = create(api, "kid", parent=first)["uuid"]
    grandkid = create(api, "grandkid", parent=kid)["uuid"]
    _traits(api, kid, "STORAGE_DISK_SSD")  # generation 1
    resp = api.put(f"/resource_providers/{kid}", json={"name": "kid", "parent_provider_uuid": second})
    assert resp.status == 200, resp
    assert resp.json["root_provider_uuid"] == second and resp.json["generation"] == 1
    assert api.get(f"/resource_providers/{grandkid}").json["root_provider_uuid"] == second
    assert listed(api, f"?in_tree={first}") == {"first"}

    resp = api.put(f"/resource_providers/{kid}", json={"name": "kid", "parent_provider_uuid": None})
    assert resp.json["parent_provider_uuid"] is None and resp.json["root_provider_uuid"] == kid
    assert api.get(f"/resource_providers/{grandkid}").json["root_provider_uuid"] == kid
    assert listed(api, f"?in_tree={second}") == {"second"}


def test_moving_within_a_tree(api):
    root = create(api, "root")["uuid"]
    left = create(api, "left", parent=root)["uuid"]
    right = create(api, "right", parent=root)["uuid"]
    resp = api.put(f"/resource_providers/{right}", json={"name": "right", "parent_provider_uuid": left})
    assert resp.status == 200 and resp.json["root_provider_uuid"] == root


def test_loops_are_refused(api):
    root = create(api, "root")["uuid"]
    child = create(api, "child", parent=root)["uuid"]
    grandchild = create(api, "grandchild", parent=child)["uuid"]
    for target in (root, child, grandchild):
        resp = api.put(f"/resource_providers/{root}", json={"name": "root", "parent_provider_uuid": target})
        assert_error(resp, 400, f"Unable to save resource provider {root}: Object action update failed "
                                "because: creating loop in the provider tree is not allowed.")
    resp = api.put(f"/resource_providers/{child}", json={"name": "child", "parent_provider_uuid": grandchild})
    assert_error(resp, 400, "creating loop in the provider tree is not allowed.")
    assert api.get(f"/resource_providers/{root}").json["parent_provider_uuid"] is None


def test_parent_must_exist(api):
    uuid = create(api, "kid")["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "kid", "parent_provider_uuid": new_uuid()})
    assert_error(resp, 400, f"Unable to save resource provider {uuid}: Object action create failed because: "
                            "parent provider UUID does not exist.")


def test_parent_errors_come_before_name_conflicts(api):
    create(api, "taken")
    uuid = create(api, "kid")["uuid"]
    resp = api.put(f"/resource_providers/{uuid}", json={"name": "taken", "parent_provider_uuid": uuid})
    assert_error(resp, 400, "creating loop")


def race(*calls):
    """Run the calls in threads released at the same moment; their results in order."""
    barrier = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def run(index, call):
        barrier.wait()
        results[index] = call()

    threads = [threading.Thread(target=run, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite lets only one writer in at a time")
def test_concurrent_opposite_moves_never_build_a_loop(api):
    """Two clients hang A under B and B under A at once: at most one may win."""
    for _ in range(10):
        a, b = create(api, "a")["uuid"], create(api, "b")["uuid"]

        def move(child, name, parent):
            return lambda: api.put(f"/resource_providers/{child}",
                                   json={"name": name, "parent_provider_uuid": parent}).status

        assert sorted(race(move(a, "a", b), move(b, "b", a))) == [200, 400]
        roots = {api.get(f"/resource_providers/{uuid}").json["root_provider_uuid"] for uuid in (a, b)}
        assert len(roots) == 1 and roots <= {a, b}
        for uuid in (a, b):  # the child first
            if api.get(f"/resource_providers/{uuid}").json["parent_provider_uuid"]:
                assert api.delete(f"/resource_providers/{uuid}").status == 204
        for uuid in (a, b):
            api.delete(f"/resource_providers/{uuid}")


# -- DELETE /resource_providers/{uuid} -----------------------------------------------------

def test_delete(api):
    uuid = create(api)["uuid"]
    resp = api.delete(f"/resource_providers/{uuid}")
    assert resp.status == 204 and resp.text == ""
    assert_error(api.delete(f"/resource_providers/{uuid}"), 404,
                 f"No resource provider with uuid {uuid} found for delete")
    assert api.get(f"/resource_providers/{uuid}").status == 404


def test_delete_removes_inventory_traits_and_aggregate_links(api):
    uuid = create(api)["uuid"]
    other = create(api, "other")["uuid"]
    _inventory(api, uuid, VCPU={"total": 2})
    _traits(api, uuid, "STORAGE_DISK_SSD")
    _with_aggregates(api, uuid, AGG_A)
    _with_aggregates(api, other, AGG_A)
    assert api.delete(f"/resource_providers/{uuid}").status == 204
    assert listed(api, f"?member_of={AGG_A}") == {"other"}
    with api.application.db.read() as conn:
        for table in (tables.inventories, tables.resource_provider_traits):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0


def test_delete_parent_is_409(api):
    parent = create(api)["uuid"]
    create(api, parent=parent)
    resp = api.delete(f"/resource_providers/{parent}")
    assert_error(resp, 409, f"Unable to delete parent resource provider {parent}: It has child resource "
                            "providers.", code="placement.resource_provider.cannot_delete_parent")
    assert api.get(f"/resource_providers/{parent}").json["generation"] == 0


def test_delete_with_allocations_is_409(api):
    uuid = create(api)["uuid"]
    _inventory(api, uuid, VCPU={"total": 2})
    _allocate(api, uuid, VCPU=1)
    resp = api.delete(f"/resource_providers/{uuid}")
    assert_error(resp, 409, f"Unable to delete resource provider {uuid}: Resource provider has allocations.",
                 code="placement.resource_provider.inuse")
    assert api.get(f"/resource_providers/{uuid}/inventories").json["inventories"]["VCPU"]["total"] == 2


def test_delete_a_child_then_its_parent(api):
    parent = create(api)["uuid"]
    child = create(api, parent=parent)["uuid"]
    assert api.delete(f"/resource_providers/{child}").status == 204
    assert api.delete(f"/resource_providers/{parent}").status == 204
    assert count(api.application) == 0


# -- policy -----------------------------------------------------------------------------

def test_non_admin_is_forbidden(api):
    assert api.get("/resource_providers", token="user").status == 403
    assert api.post("/resource_providers", json={"name": "x"}, token="user").status == 403
