"""``/resource_providers/{uuid}/traits``: read, replace and clear a provider's traits."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from allotment.db import tables
from tests.conftest import new_uuid

HTTP_DATE = r"^\w+, \d+ \w+ \d{4} [\d:]+ GMT$"


def make_provider(app, generation: int = 0) -> str:
    """A provider written straight to the table (this suite tests traits, not providers)."""
    uuid = new_uuid()
    with app.db.write() as conn:
        conn.execute(tables.resource_providers.insert().values(
            uuid=uuid, name="rp-" + uuid, generation=generation))
    return uuid


def generation_of(app, uuid: str) -> int:
    with app.db.read() as conn:
        return conn.execute(sa.select(tables.resource_providers.c.generation)
                            .where(tables.resource_providers.c.uuid == uuid)).scalar_one()


@pytest.fixture
def rp(app, api) -> str:
    api.put("/traits/CUSTOM_TRAIT_1")
    api.put("/traits/CUSTOM_TRAIT_2")
    return make_provider(app)


def put_traits(api, uuid, traits, generation, **kw):
    return api.put(f"/resource_providers/{uuid}/traits",
                   json={"traits": traits, "resource_provider_generation": generation}, **kw)


def test_new_provider_has_no_traits(api, rp):
    resp = api.get(f"/resource_providers/{rp}/traits", version="1.6")
    assert resp.status == 200
    assert resp.json == {"traits": [], "resource_provider_generation": 0}
    assert "Last-Modified" not in resp.headers


def test_set_traits_bumps_generation(api, app, rp):
    resp = put_traits(api, rp, ["CUSTOM_TRAIT_2", "CUSTOM_TRAIT_1"], 0, version="1.6")
    assert resp.status == 200
    assert resp.json["resource_provider_generation"] == 1
    assert sorted(resp.json["traits"]) == ["CUSTOM_TRAIT_1", "CUSTOM_TRAIT_2"]
    assert "Last-Modified" not in resp.headers
    assert generation_of(app, rp) == 1
    got = api.get(f"/resource_providers/{rp}/traits").json
    assert got == {"traits": ["CUSTOM_TRAIT_1", "CUSTOM_TRAIT_2"], "resource_provider_generation": 1}


def test_set_replaces_the_whole_set(api, rp):
    put_traits(api, rp, ["CUSTOM_TRAIT_1", "HW_CPU_X86_SSE"], 0)
    resp = put_traits(api, rp, ["CUSTOM_TRAIT_2", "HW_CPU_X86_SSE"], 1)
    assert resp.status == 200
    assert api.get(f"/resource_providers/{rp}/traits").json["traits"] == ["CUSTOM_TRAIT_2", "HW_CPU_X86_SSE"]
    emptied = put_traits(api, rp, [], 2)
    assert emptied.json == {"traits": [], "resource_provider_generation": 3}


def test_duplicate_names_count_once(api, rp):
    resp = put_traits(api, rp, ["CUSTOM_TRAIT_1", "CUSTOM_TRAIT_1"], 0)
    assert resp.status == 200
    assert resp.json["traits"] == ["CUSTOM_TRAIT_1"]


def test_stale_generation_is_409_and_changes_nothing(api, app, rp):
    resp = put_traits(api, rp, ["CUSTOM_TRAIT_1"], 5, version="1.23")
    assert resp.status == 409
    error = resp.error()
    assert error["code"] == "placement.concurrent_update"
    assert ("Resource provider's generation already changed. Please update the generation and try again."
            in error["detail"])
    assert generation_of(app, rp) == 0
    assert api.get(f"/resource_providers/{rp}/traits").json["traits"] == []


def test_unknown_traits_are_400_and_change_nothing(api, app, rp):
    resp = put_traits(api, rp, ["NON_EXISTED_TRAIT1", "NON_EXISTED_TRAIT2", "CUSTOM_TRAIT_1"], 0)
    assert resp.status == 400
    assert "No such trait NON_EXISTED_TRAIT1, NON_EXISTED_TRAIT2" in resp.error()["detail"]
    assert generation_of(app, rp) == 0
    assert api.get(f"/resource_providers/{rp}/traits").json["traits"] == []


@pytest.mark.parametrize("body, message", [
    ({"traits": ["CUSTOM_TRAIT_1"]}, "'resource_provider_generation' is a required property"),
    ({"resource_provider_generation": 0}, "'traits' is a required property"),
    ({"traits": ["CUSTOM_TRAIT_1"], "resource_provider_generation": "invalid_generation"},
     "'invalid_generation' is not of type 'integer'"),
    ({"traits": "invalid_type", "resource_provider_generation": 0}, "'invalid_type' is not of type 'array'"),
    ({"traits": [""], "resource_provider_generation": 0}, "Failed validating 'minLength'"),
    ({"traits": ["A" * 256], "resource_provider_generation": 0}, "Failed validating 'maxLength'"),
    ({"traits": [], "resource_provider_generation": 0, "additional": 1}, "Additional properties are not allowed"),
])
def test_bad_bodies_are_400(api, app, rp, body, message):
    resp = api.put(f"/resource_providers/{rp}/traits", json=body)
    assert resp.status == 400
    assert message in resp.error()["detail"]
    assert generation_of(app, rp) == 0


def test_malformed_json_and_wrong_content_type(api, rp):
    resp = api.put(f"/resource_providers/{rp}/traits", body=b"{", headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert "Malformed JSON:" in resp.error()["detail"]
    resp = api.put(f"/resource_providers/{rp}/traits", body=b"x", headers={"Content-Type": "text/plain"})
    assert resp.status == 415


def test_unknown_provider_is_404(api):
    resp = api.get("/resource_providers/non_existed/traits")
    assert resp.status == 404
    assert "No resource provider with uuid non_existed found" in resp.error()["detail"]
    resp = put_traits(api, "non_existed", ["CUSTOM_TRAIT_1"], 1)
    assert resp.status == 404
    assert "No resource provider with uuid non_existed found" in resp.error()["detail"]
    resp = api.delete("/resource_providers/non_existed/traits")
    assert resp.status == 404
    assert "No resource provider with uuid non_existed found" in resp.error()["detail"]


def test_delete_all_traits_bumps_generation(api, app, rp):
    put_traits(api, rp, ["CUSTOM_TRAIT_1", "CUSTOM_TRAIT_2"], 0)
    resp = api.delete(f"/resource_providers/{rp}/traits")
    assert resp.status == 204
    assert "Content-Type" not in resp.headers
    assert api.get(f"/resource_providers/{rp}/traits").json == {"traits": [], "resource_provider_generation": 2}
    # The traits themselves stay, and are now free to delete.
    assert api.delete("/traits/CUSTOM_TRAIT_1").status == 204


def test_routes_need_1_6(api, rp):
    assert api.get(f"/resource_providers/{rp}/traits", version="1.5").status == 404
    assert put_traits(api, rp, [], 0, version="1.5").status == 404
    assert api.delete(f"/resource_providers/{rp}/traits", version="1.5").status == 404


def test_cache_headers_from_1_15(api, rp):
    put_traits(api, rp, ["CUSTOM_TRAIT_1"], 0)
    for resp in (api.get(f"/resource_providers/{rp}/traits", version="1.15"),
                 put_traits(api, rp, ["CUSTOM_TRAIT_2"], 1, version="1.15")):
        assert resp.headers["Cache-Control"] == "no-cache"
        assert re.match(HTTP_DATE, resp.headers["Last-Modified"])
    assert "Last-Modified" not in api.get(f"/resource_providers/{rp}/traits", version="1.14").headers
    assert "Last-Modified" not in put_traits(api, rp, [], 2, version="1.14").headers


def test_other_providers_keep_their_traits(api, app, rp):
    other = make_provider(app)
    put_traits(api, other, ["CUSTOM_TRAIT_1"], 0)
    put_traits(api, rp, ["CUSTOM_TRAIT_1"], 0)
    api.delete(f"/resource_providers/{rp}/traits")
    assert api.get(f"/resource_providers/{other}/traits").json["traits"] == ["CUSTOM_TRAIT_1"]


def test_concurrent_writers_with_one_generation_one_wins(api, app, rp):
    """Only one of several PUTs naming the same generation may succeed."""
    def attempt(n):
        return put_traits(api, rp, ["CUSTOM_TRAIT_1" if n % 2 else "CUSTOM_TRAIT_2"], 0).status

    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = sorted(pool.map(attempt, range(12)))
    assert statuses == [200] + [409] * 11
    assert generation_of(app, rp) == 1
    assert len(api.get(f"/resource_providers/{rp}/traits").json["traits"]) == 1


def test_concurrent_deletes_all_succeed(api, app, rp):
    """DELETE names no generation: losing the swap re-runs it rather than failing
    (and the re-run finds nothing left to clear, so the generation moves once)."""
    put_traits(api, rp, ["CUSTOM_TRAIT_1"], 0)
    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses = list(pool.map(lambda _: api.delete(f"/resource_providers/{rp}/traits").status, range(8)))
    assert statuses == [204] * 8
    assert generation_of(app, rp) == 2
    assert api.get(f"/resource_providers/{rp}/traits").json["traits"] == []


def test_writes_that_change_nothing_keep_the_generation(api, app, rp):
    # Placement: clearing a provider without traits, or setting the set it
    # already has (in any order), leaves the generation alone.
    assert api.delete(f"/resource_providers/{rp}/traits").status == 204
    assert put_traits(api, rp, [], 0).json == {"traits": [], "resource_provider_generation": 0}
    assert generation_of(app, rp) == 0
    put_traits(api, rp, ["CUSTOM_TRAIT_1", "HW_CPU_X86_SSE"], 0)
    again = put_traits(api, rp, ["HW_CPU_X86_SSE", "CUSTOM_TRAIT_1", "CUSTOM_TRAIT_1"], 1)
    assert again.status == 200
    assert again.json == {"traits": ["CUSTOM_TRAIT_1", "HW_CPU_X86_SSE"], "resource_provider_generation": 1}
    assert generation_of(app, rp) == 1
    # The generation is still checked first.
    assert put_traits(api, rp, ["CUSTOM_TRAIT_1", "HW_CPU_X86_SSE"], 0).status == 409
    # A real change moves it.
    assert put_traits(api, rp, ["CUSTOM_TRAIT_1"], 1).json["resource_provider_generation"] == 2
    assert api.delete(f"/resource_providers/{rp}/traits").status == 204
    assert generation_of(app, rp) == 3
