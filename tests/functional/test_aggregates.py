"""/resource_providers/{uuid}/aggregates, as the API reference describes it."""

from __future__ import annotations

import re

import pytest

from tests.conftest import BACKEND, new_uuid
from tests.functional.test_resource_providers import HTTP_DATE, assert_error, create, race

AGG_1 = "f918801a-5e54-4bee-9095-09a9d0c786b8"
AGG_2 = "a893eb5c-e2a0-4251-ab26-f71d3b0cfc0b"
AGG_3 = "83a3d69d-8920-48e2-8914-cadfd8fa2f91"


@pytest.fixture
def provider(api):
    return create(api, "with-aggregates")["uuid"]


def url(uuid):
    return f"/resource_providers/{uuid}/aggregates"


def put(api, uuid, aggregates, generation=None, version="1.39"):
    body = aggregates if generation is None else {"aggregates": aggregates,
                                                  "resource_provider_generation": generation}
    return api.put(url(uuid), json=body, version=version)


def generation(api, uuid):
    return api.get(f"/resource_providers/{uuid}").json["generation"]


def test_not_found_below_1_1(api, provider):
    assert api.get(url(provider), version="1.0").status == 404
    assert api.put(url(provider), json=[], version="1.0").status == 404


def test_missing_provider_is_404_before_the_body_is_judged(api):
    uuid = new_uuid()
    assert_error(api.get(url(uuid)), 404, f"No resource provider with uuid {uuid} found")
    assert_error(api.put(url(uuid), json=[]), 404, f"No resource provider with uuid {uuid} found")
    assert api.put(url(uuid), json=[AGG_1], version="1.1").status == 404


def test_empty_at_first(api, provider):
    assert api.get(url(provider), version="1.1").json == {"aggregates": []}
    assert api.get(url(provider), version="1.19").json == {"aggregates": [],
                                                            "resource_provider_generation": 0}


def test_before_1_19_a_bare_list_and_no_generation_change(api, provider):
    resp = put(api, provider, [AGG_1, AGG_2], version="1.1")
    assert resp.status == 200
    assert resp.json == {"aggregates": [AGG_1, AGG_2]}
    assert sorted(api.get(url(provider), version="1.18").json["aggregates"]) == sorted([AGG_1, AGG_2])
    assert generation(api, provider) == 0


def test_from_1_19_generation_is_checked_and_bumped(api, provider):
    resp = put(api, provider, [AGG_1, AGG_2], generation=0)
    assert resp.status == 200
    assert resp.json == {"aggregates": [AGG_1, AGG_2], "resource_provider_generation": 1}
    assert generation(api, provider) == 1

    stale = put(api, provider, [], generation=0)
    assert_error(stale, 409, "Resource provider's generation already changed. Please update the generation "
                             "and try again.", code="placement.concurrent_update")
    assert len(api.get(url(provider)).json["aggregates"]) == 2

    cleared = put(api, provider, [], generation=1)
    assert cleared.json == {"aggregates": [], "resource_provider_generation": 2}
    assert api.get(url(provider)).json == {"aggregates": [], "resource_provider_generation": 2}


def test_replacing_keeps_common_members_and_other_providers(api, provider):
    other = create(api, "other")["uuid"]
    put(api, other, [AGG_1], generation=0)
    put(api, provider, [AGG_1, AGG_2], generation=0)
    put(api, provider, [AGG_2, AGG_3], generation=1)
    assert sorted(api.get(url(provider)).json["aggregates"]) == sorted([AGG_2, AGG_3])
    assert api.get(url(other)).json["aggregates"] == [AGG_1]


def test_hyphenless_uuids_are_accepted(api, provider):
    resp = put(api, provider, ["2290d4af9e6e400b9d651ee01376f71a"], generation=0)
    assert resp.status == 200
    assert resp.json["aggregates"] == ["2290d4af9e6e400b9d651ee01376f71a"]


@pytest.mark.parametrize("version, body, fragment", [
    ("1.39", [AGG_1, AGG_2], "is not of type 'object'"),
    ("1.18", {"aggregates": [AGG_1], "resource_provider_generation": 0}, "is not of type 'array'"),
    ("1.39", {"aggregates": [AGG_1]}, "'resource_provider_generation' is a required property"),
    # Of the two faults, the one Placement reports (jsonschema's best match).
    ("1.39", {"aggregates": ["harry", "sally"], "resource_provider_generation": 0}, "'sally' is not a 'uuid'"),
    ("1.39", {"aggregates": [AGG_1, AGG_1], "resource_provider_generation": 0}, "has non-unique elements"),
    ("1.39", {"aggregates": [AGG_1], "resource_provider_generation": "0"}, "'0' is not of type 'integer'"),
    ("1.39", {"aggregates": [AGG_1], "resource_provider_generation": 0, "x": 1},
     "Additional properties are not allowed"),
    ("1.1", [AGG_1, AGG_1], "has non-unique elements"),
    ("1.1", ["harry"], "'harry' is not a 'uuid'"),
])
def test_bad_bodies_are_400_and_change_nothing(api, provider, version, body, fragment):
    put(api, provider, [AGG_3], generation=0)
    resp = api.put(url(provider), json=body, version=version)
    assert_error(resp, 400, "JSON does not validate", fragment)
    assert api.get(url(provider)).json == {"aggregates": [AGG_3], "resource_provider_generation": 1}


def test_malformed_json(api, provider):
    resp = api.put(url(provider), body=b'{"bad", "not json"}', headers={"Content-Type": "application/json"})
    assert_error(resp, 400, "Malformed JSON")


def test_cache_headers_only_from_1_15(api, provider):
    for method in ("get", "put"):
        kwargs = {} if method == "get" else {"json": [AGG_1]}
        new = getattr(api, method)(url(provider), version="1.15", **kwargs).headers
        assert re.match(HTTP_DATE, new["Last-Modified"]) and new["Cache-Control"] == "no-cache"
        old = getattr(api, method)(url(provider), version="1.14", **kwargs).headers
        assert "Last-Modified" not in old and "Cache-Control" not in old


def test_non_admin_is_forbidden(api, provider):
    assert api.get(url(provider), token="user").status == 403
    assert api.put(url(provider), json=[AGG_1], version="1.1", token="user").status == 403


@pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite lets only one writer in at a time")
def test_providers_joining_the_same_new_aggregate_at_once_all_succeed(api):
    providers = [create(api)["uuid"] for _ in range(6)]
    for _ in range(5):
        aggregate = new_uuid()
        statuses = race(*(lambda uuid=uuid: put(api, uuid, [aggregate], version="1.1").status
                          for uuid in providers))
        assert statuses == [200] * len(providers)
        members = api.get(f"/resource_providers?member_of={aggregate}").json["resource_providers"]
        assert len(members) == len(providers)


@pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite lets only one writer in at a time")
def test_concurrent_writers_of_one_generation_one_wins(api, provider):
    statuses = race(*(lambda aggregate=new_uuid(): put(api, provider, [aggregate], generation=0).status
                      for _ in range(4)))
    assert sorted(statuses) == [200, 409, 409, 409]
    assert generation(api, provider) == 1
    assert len(api.get(url(provider)).json["aggregates"]) == 1
