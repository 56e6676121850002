"""PUT/GET/DELETE /allocations/{consumer_uuid}, POST /allocations and
GET /resource_providers/{uuid}/allocations, as the API reference tells them.

Providers and inventories are seeded with SQL (``seed_provider``) so these
tests depend on nothing but the allocation code; the helpers are shared by
the usages and consumer tests.
"""

from __future__ import annotations

import os
import threading
import time
import uuid as uuidlib

import pytest
import sqlalchemy as sa

from allotment.db import allocations as alloc_db
from allotment.db import generations, tables
from allotment.db import inventories as inventory_db
from allotment.db.engine import utcnow
from tests.conftest import new_uuid

INCOMPLETE = "00000000-0000-0000-0000-000000000000"


# -- seeding helpers ----------------------------------------------------------


def seed_provider(app, inventories: dict | None = None, *, name: str | None = None) -> str:
    """Create a provider with inventories ({class: total or {field: value}}); its uuid."""
    uuid = new_uuid()
    with app.db.write() as conn:
        rp = tables.resource_providers
        now = utcnow()
        pid = conn.execute(sa.insert(rp).values(uuid=uuid, name=name or f"rp-{uuid}", generation=0,
                                                created_at=now, updated_at=now)).inserted_primary_key[0]
        conn.execute(sa.update(rp).where(rp.c.id == pid).values(root_provider_id=pid))
        for class_name, spec in (inventories or {}).items():
            fields = {"total": spec} if isinstance(spec, int) else dict(spec)
            record = {"reserved": 0, "min_unit": 1, "max_unit": fields["total"], "step_size": 1,
                      "allocation_ratio": 1.0, **fields}
            class_id = conn.execute(sa.select(tables.resource_classes.c.id).where(
                tables.resource_classes.c.name == class_name)).scalar_one()
            conn.execute(sa.insert(tables.inventories).values(resource_provider_id=pid, resource_class_id=class_id,
                                                              created_at=now, **record))
    return uuid


def seed_custom_class(app, name: str) -> None:
    with app.db.write() as conn:
        rc = tables.resource_classes
        next_id = max(tables.CUSTOM_RESOURCE_CLASS_MIN_ID,
                      (conn.execute(sa.select(sa.func.max(rc.c.id))).scalar() or 0) + 1)
        conn.execute(sa.insert(rc).values(id=next_id, name=name))


def seed_legacy_allocation(app, provider: str, consumer: str, resources: dict[str, int]) -> None:
    """Allocations as Placement wrote them before consumer records existed."""
    with app.db.write() as conn:
        pid = conn.execute(sa.select(tables.resource_providers.c.id).where(
            tables.resource_providers.c.uuid == provider)).scalar_one()
        ids = inventory_db.resource_class_ids(conn, resources)
        conn.execute(sa.insert(tables.allocations), [
            {"resource_provider_id": pid, "consumer_id": consumer, "resource_class_id": ids[name], "used": used}
            for name, used in resources.items()])


def provider_generation(api, provider: str) -> int:
    return api.get(f"/resource_providers/{provider}/allocations").json["resource_provider_generation"]


def usages(api, provider: str) -> dict:
    return api.get(f"/resource_providers/{provider}/usages").json["usages"]


def body(allocations: dict, generation=None, *, project="proj", user="user", **extra) -> dict:
    """A 1.28+ PUT body."""
    return {"allocations": allocations, "project_id": project, "user_id": user,
            "consumer_generation": generation, **extra}


def claim(provider: str, **resources) -> dict:
    return {provider: {"resources": resources}}


@pytest.fixture
def rp(app):
    return seed_provider(app, {"VCPU": 8, "MEMORY_MB": 2048, "DISK_GB": {"total": 100, "step_size": 10,
                                                                        "min_unit": 10, "max_unit": 50}})


@pytest.fixture
def api128(api):
    api.version = "1.28"
    return api


# -- GET /allocations/{consumer_uuid} -----------------------------------------


@pytest.mark.parametrize("version", ["1.0", "1.12", "1.28", "1.38"])
def test_get_unknown_consumer_is_an_empty_dict(api, version):
    r = api.get(f"/allocations/{new_uuid()}", version=version)
    assert r.status == 200
    assert r.json == {"allocations": {}}


def test_get_shows_owner_from_1_12_generation_from_1_28_type_from_1_38(api, rp):
    consumer = new_uuid()
    assert api.put(f"/allocations/{consumer}", version="1.38",
                   json=body(claim(rp, VCPU=2), consumer_type="INSTANCE")).status == 204
    old = api.get(f"/allocations/{consumer}", version="1.11").json
    assert old == {"allocations": {rp: {"generation": 1, "resources": {"VCPU": 2}}}}
    assert set(api.get(f"/allocations/{consumer}", version="1.12").json) == {"allocations", "project_id", "user_id"}
    assert api.get(f"/allocations/{consumer}", version="1.28").json["consumer_generation"] == 1
    latest = api.get(f"/allocations/{consumer}", version="1.38").json
    assert latest == {"allocations": {rp: {"generation": 1, "resources": {"VCPU": 2}}},
                      "project_id": "proj", "user_id": "user", "consumer_generation": 1,
                      "consumer_type": "INSTANCE"}


def test_get_has_cache_headers_from_1_15(api, rp):
    consumer = new_uuid()
    api.put(f"/allocations/{consumer}", version="1.28", json=body(claim(rp, VCPU=1)))
    assert "last-modified" not in api.get(f"/allocations/{consumer}", version="1.14").headers
    r = api.get(f"/allocations/{consumer}", version="1.15")
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["last-modified"].endswith(" GMT")


# -- PUT /allocations/{consumer_uuid}: formats by microversion -----------------


def test_put_list_format_before_1_8_gives_the_incomplete_owner(api, rp):
    consumer = new_uuid()
    r = api.put(f"/allocations/{consumer}", version="1.7",
                json={"allocations": [{"resource_provider": {"uuid": rp}, "resources": {"VCPU": 1}}]})
    assert r.status == 204
    assert "cache-control" not in r.headers and "last-modified" not in r.headers
    shown = api.get(f"/allocations/{consumer}", version="1.12").json
    assert (shown["project_id"], shown["user_id"]) == (INCOMPLETE, INCOMPLETE)


@pytest.mark.parametrize("missing", ["project_id", "user_id"])
def test_put_1_8_requires_project_and_user(api, rp, missing):
    data = {"allocations": [{"resource_provider": {"uuid": rp}, "resources": {"VCPU": 1}}],
            "project_id": "p", "user_id": "u"}
    del data[missing]
    r = api.put(f"/allocations/{new_uuid()}", version="1.8", json=data)
    assert r.status == 400
    assert "Failed validating 'required'" in r.error()["detail"]


@pytest.mark.parametrize("field,value,rule", [("project_id", "", "minLength"), ("user_id", "", "minLength"),
                                              ("project_id", "x" * 256, "maxLength"),
                                              ("user_id", "x" * 256, "maxLength")])
def test_put_owner_ids_are_1_to_255_characters(api, rp, field, value, rule):
    data = body(claim(rp, VCPU=1))
    data[field] = value
    r = api.put(f"/allocations/{new_uuid()}", version="1.28", json=data)
    assert r.status == 400
    assert f"Failed validating '{rule}'" in r.error()["detail"]


def test_put_1_12_takes_a_dict_and_refuses_the_list(api, rp):
    consumer = new_uuid()
    listish = {"allocations": [{"resource_provider": {"uuid": rp}, "resources": {"VCPU": 1}}],
               "project_id": "p", "user_id": "u"}
    assert api.put(f"/allocations/{consumer}", version="1.12", json=listish).status == 400
    dictish = {"allocations": claim(rp, VCPU=1), "project_id": "p", "user_id": "u"}
    assert api.put(f"/allocations/{consumer}", version="1.12", json=dictish).status == 204
    # What GET returns can be sent back (generation inside is ignored).
    shown = api.get(f"/allocations/{consumer}", version="1.12").json
    again = {"allocations": shown["allocations"], "project_id": "p", "user_id": "u"}
    assert api.put(f"/allocations/{consumer}", version="1.12", json=again).status == 204


@pytest.mark.parametrize("version,data,expected", [
    ("1.0", {"allocations": []}, "Failed validating 'minItems'"),
    ("1.0", {"allocations": [{"resources": {"DISK_GB": 10}}]}, "'resource_provider' is a required property"),
    ("1.12", {"allocations": {}, "project_id": "p", "user_id": "u"}, "should be non-empty"),
    ("1.12", {"allocations": {"nice_house_friend": {"resources": {"VCPU": 1}}}, "project_id": "p",
              "user_id": "u"}, "does not match any of the regexes"),
    ("1.28", {"allocations": {}, "project_id": "p", "user_id": "u"}, "'consumer_generation' is a required"),
    ("1.12", {"allocations": {}, "project_id": "p", "user_id": "u", "bad_field": 1}, "JSON does not validate"),
])
def test_put_refuses_malformed_bodies(api, rp, version, data, expected):
    r = api.put(f"/allocations/{new_uuid()}", version=version, json=data)
    assert r.status == 400
    assert expected in r.error()["detail"]


@pytest.mark.parametrize("amount,expected", [(0, "0 is less than the minimum of 1"),
                                             (-1, "-1 is less than the minimum of 1"),
                                             (1.5, "1.5 is not of type 'integer'"),
                                             ("2", "'2' is not of type 'integer'")])
def test_put_amounts_are_positive_integers(api128, rp, amount, expected):
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(rp, VCPU=amount)))
    assert r.status == 400
    assert expected in r.error()["detail"]


def test_put_lowercase_class_and_empty_resources_are_refused(api128, rp):
    assert "does not match any of the regexes" in api128.put(
        f"/allocations/{new_uuid()}", json=body(claim(rp, vcpu=1))).error()["detail"]
    r = api128.put(f"/allocations/{new_uuid()}", json=body({rp: {"resources": {}}}))
    assert r.status == 400 and "should be non-empty" in r.error()["detail"]


def test_put_malformed_json_and_wrong_media_type(api, rp):
    consumer = new_uuid()
    r = api.put(f"/allocations/{consumer}", body=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status == 400 and "Malformed JSON" in r.error()["detail"]
    r = api.put(f"/allocations/{consumer}", body=b"x", headers={"Content-Type": "text/plain"})
    assert r.status == 415


@pytest.mark.parametrize("version, owner", [("1.3", {}), ("1.11", {"project_id": "p", "user_id": "u"})])
def test_put_duplicate_provider_in_list_format_keeps_the_last_entry(api, rp, version, owner):
    # Placement turns the list into a dict keyed by provider: the last entry wins.
    consumer = new_uuid()
    first = {"resource_provider": {"uuid": rp}, "resources": {"VCPU": 2}}
    last = {"resource_provider": {"uuid": rp}, "resources": {"DISK_GB": 20}}
    r = api.put(f"/allocations/{consumer}", version=version, json={"allocations": [first, last], **owner})
    assert r.status == 204
    assert api.get(f"/allocations/{consumer}").json["allocations"] == {rp: {"generation": 1,
                                                                          "resources": {"DISK_GB": 20}}}
    assert usages(api, rp) == {"VCPU": 0, "MEMORY_MB": 0, "DISK_GB": 20}


def test_put_consumer_uuid_must_be_a_uuid_and_dashless_is_the_same_consumer(api128, rp):
    r = api128.put("/allocations/not-a-uuid", json=body(claim(rp, VCPU=1)))
    assert r.status == 400 and "Malformed consumer_uuid: not-a-uuid" in r.error()["detail"]
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1))).status == 204
    dashless = consumer.replace("-", "")
    assert api128.put(f"/allocations/{dashless}", json=body(claim(rp, VCPU=2), 1)).status == 204
    assert api128.get(f"/allocations/{consumer}").json["allocations"][rp]["resources"] == {"VCPU": 2}


def test_put_mappings_are_accepted_from_1_34(api, rp):
    data = body(claim(rp, VCPU=1), mappings={"": [rp]})
    r = api.put(f"/allocations/{new_uuid()}", version="1.33", json=data)
    assert r.status == 400 and "Additional properties are not allowed" in r.error()["detail"]
    assert api.put(f"/allocations/{new_uuid()}", version="1.34", json=data).status == 204
    r = api.put(f"/allocations/{new_uuid()}", version="1.34", json=body(claim(rp, VCPU=1), mappings={"a": "b"}))
    assert "'b' is not of type 'array'" in r.error()["detail"]
    r = api.put(f"/allocations/{new_uuid()}", version="1.34", json=body(claim(rp, VCPU=1), mappings={}))
    assert "{} should be non-empty" in r.error()["detail"]


# -- consumer generations (1.28) -----------------------------------------------


def test_new_consumer_needs_null_generation(api128, rp):
    consumer = new_uuid()
    r = api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1), 5))
    assert r.status == 409
    assert r.error()["code"] == "placement.concurrent_update"
    assert "consumer generation conflict - expected null but got 5" in r.error()["detail"]
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1))).status == 204
    assert api128.get(f"/allocations/{consumer}").json["consumer_generation"] == 1


def test_existing_consumer_needs_its_current_generation(api128, rp):
    consumer = new_uuid()
    api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1)))
    for stale in (None, 0, 2, -1):
        r = api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=5), stale))
        assert r.status == 409, stale
        assert r.error()["code"] == "placement.concurrent_update"
        assert f"consumer generation conflict - expected 1 but got {stale}" in r.error()["detail"]
    assert usages(api128, rp)["VCPU"] == 1
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=5), 1)).status == 204
    assert api128.get(f"/allocations/{consumer}").json["consumer_generation"] == 2


@pytest.mark.parametrize("generation", ["1", 1.0, True, {}])
def test_generation_must_be_an_integer_or_null(api128, rp, generation):
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(rp, VCPU=1), generation))
    assert r.status == 400
    assert "is not of type 'integer', 'null'" in r.error()["detail"]


def test_writes_before_1_28_bump_the_generation_silently(api, rp):
    consumer = new_uuid()
    api.put(f"/allocations/{consumer}", version="1.28", json=body(claim(rp, VCPU=1)))
    old = {"allocations": claim(rp, VCPU=2), "project_id": "proj", "user_id": "user"}
    assert api.put(f"/allocations/{consumer}", version="1.27", json=old).status == 204
    assert api.put(f"/allocations/{consumer}", version="1.27", json=old).status == 204
    assert api.get(f"/allocations/{consumer}", version="1.28").json["consumer_generation"] == 3


def test_empty_allocations_at_1_28_delete_the_consumer_safely(api128, rp):
    consumer = new_uuid()
    api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=3)))
    assert api128.put(f"/allocations/{consumer}", json=body({}, 0)).status == 409
    assert usages(api128, rp)["VCPU"] == 3
    assert api128.put(f"/allocations/{consumer}", json=body({}, 1)).status == 204
    assert api128.get(f"/allocations/{consumer}").json == {"allocations": {}}
    assert usages(api128, rp)["VCPU"] == 0
    # The record went with the allocations: the consumer is new again.
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1))).status == 204


def test_failed_claim_leaves_no_consumer_behind(api128, rp):
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=9999))).status == 409
    assert api128.get(f"/allocations/{consumer}").json == {"allocations": {}}
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1))).status == 204


def test_owner_can_change_with_a_write(api128, rp):
    consumer = new_uuid()
    api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1)))
    api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1), 1, project="other", user="someone"))
    shown = api128.get(f"/allocations/{consumer}").json
    assert (shown["project_id"], shown["user_id"]) == ("other", "someone")


# -- consumer types (1.38) -----------------------------------------------------


def test_consumer_type_is_required_from_1_38_and_unknown_before(api, rp):
    consumer = new_uuid()
    r = api.put(f"/allocations/{consumer}", version="1.38", json=body(claim(rp, VCPU=1)))
    assert r.status == 400 and "'consumer_type' is a required property" in r.error()["detail"]
    r = api.put(f"/allocations/{consumer}", version="1.38", json=body(claim(rp, VCPU=1), consumer_type="instance"))
    assert "'instance' does not match '^[A-Z0-9_]+$'" in r.error()["detail"]
    assert api.put(f"/allocations/{consumer}", version="1.37", json=body(claim(rp, VCPU=1))).status == 204
    assert api.get(f"/allocations/{consumer}", version="1.38").json["consumer_type"] == "unknown"
    r = api.put(f"/allocations/{consumer}", version="1.38", json=body(claim(rp, VCPU=1), 1, consumer_type="PONY"))
    assert r.status == 204
    assert api.get(f"/allocations/{consumer}", version="1.38").json["consumer_type"] == "PONY"
    # A write before 1.38 keeps the type.
    assert api.put(f"/allocations/{consumer}", version="1.37", json=body(claim(rp, VCPU=2), 2)).status == 204
    assert api.get(f"/allocations/{consumer}", version="1.38").json["consumer_type"] == "PONY"


# -- capacity ------------------------------------------------------------------


def test_capacity_counts_reserved_and_allocation_ratio(app, api128):
    provider = seed_provider(app, {"VCPU": {"total": 4, "reserved": 1, "max_unit": 8, "allocation_ratio": 2.5}})
    # (4 - 1) * 2.5 = 7.5 -> 7 units fit, 8 do not.
    assert api128.put(f"/allocations/{new_uuid()}", json=body(claim(provider, VCPU=7))).status == 204
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(provider, VCPU=1)))
    assert r.status == 409
    assert (f"Unable to allocate inventory: Unable to create allocation for 'VCPU' on resource provider "
            f"'{provider}'. The requested amount would exceed the capacity.") in r.error()["detail"]


@pytest.mark.parametrize("amount", [5, 60, 15])  # below min_unit, above max_unit, off step_size
def test_unit_constraints(api128, rp, amount):
    consumer = new_uuid()
    r = api128.put(f"/allocations/{consumer}", json=body(claim(rp, DISK_GB=amount)))
    assert r.status == 409
    assert "The requested amount would violate inventory constraints." in r.error()["detail"]
    assert api128.get(f"/allocations/{consumer}").json == {"allocations": {}}


def test_amount_beyond_any_integer_column_is_a_constraint_error(api128, rp):
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(rp, VCPU=2 ** 40)))
    assert r.status == 409
    assert "violate inventory constraints" in r.error()["detail"]


def test_replacing_a_consumers_allocations_does_not_count_them_twice(api128, rp):
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=6))).status == 204
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=8), 1)).status == 204
    assert usages(api128, rp)["VCPU"] == 8


def _shrink(app, provider: str, class_name: str, **fields) -> None:
    """Lower an inventory under what is allocated, as an operator may."""
    with app.db.write() as conn:
        inv, rp_t, rc = tables.inventories, tables.resource_providers, tables.resource_classes
        pid = conn.execute(sa.select(rp_t.c.id).where(rp_t.c.uuid == provider)).scalar_one()
        cid = conn.execute(sa.select(rc.c.id).where(rc.c.name == class_name)).scalar_one()
        conn.execute(sa.update(inv).where(inv.c.resource_provider_id == pid, inv.c.resource_class_id == cid)
                     .values(**fields))


def test_over_capacity_provider_takes_writes_that_do_not_make_it_worse(app, api128):
    # Placement refuses for capacity only when the usage after the write is
    # over capacity AND larger than before it (per provider and class).
    a = seed_provider(app, {"VCPU": {"total": 8, "max_unit": 8}, "MEMORY_MB": 1024})
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(a, VCPU=6, MEMORY_MB=512))).status == 204
    _shrink(app, a, "VCPU", total=4)
    # The same amounts again (a migration rewriting its consumer), then fewer.
    assert api128.put(f"/allocations/{consumer}", json=body(claim(a, VCPU=6, MEMORY_MB=512), 1)).status == 204
    assert api128.put(f"/allocations/{consumer}", json=body(claim(a, VCPU=5, MEMORY_MB=600), 2)).status == 204
    # More than before is refused, by this consumer or another.
    r = api128.put(f"/allocations/{consumer}", json=body(claim(a, VCPU=6, MEMORY_MB=600), 3))
    assert r.status == 409 and "would exceed the capacity" in r.error()["detail"]
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(a, VCPU=1)))
    assert r.status == 409 and "would exceed the capacity" in r.error()["detail"]
    # A class within capacity is unaffected by the other one being over.
    other = new_uuid()
    assert api128.put(f"/allocations/{other}", json=body(claim(a, MEMORY_MB=10))).status == 204
    assert usages(api128, a) == {"VCPU": 5, "MEMORY_MB": 610}


def test_over_capacity_counts_the_whole_write_not_each_consumer(app, api128):
    a = seed_provider(app, {"VCPU": {"total": 8, "max_unit": 8}})
    first, second = new_uuid(), new_uuid()
    assert api128.put(f"/allocations/{first}", json=body(claim(a, VCPU=6))).status == 204
    _shrink(app, a, "VCPU", total=4)
    # 6 -> 3 + 4 = 7: more than before, refused.
    moves = {first: body(claim(a, VCPU=3), 1), second: body(claim(a, VCPU=4))}
    assert api128.post("/allocations", json=moves).status == 409
    # 6 -> 3 + 3: not worse, although a new consumer takes some.
    moves[second] = body(claim(a, VCPU=3))
    assert api128.post("/allocations", json=moves).status == 204
    assert usages(api128, a) == {"VCPU": 6}


def test_over_capacity_still_checks_units_and_moves_are_judged_per_provider(app, api128):
    a = seed_provider(app, {"VCPU": {"total": 8, "max_unit": 8}})
    b = seed_provider(app, {"VCPU": {"total": 8, "max_unit": 8}})
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(a, VCPU=6))).status == 204
    _shrink(app, a, "VCPU", total=4, reserved=0, max_unit=4)
    r = api128.put(f"/allocations/{consumer}", json=body(claim(a, VCPU=6), 1))
    assert r.status == 409 and "would violate inventory constraints" in r.error()["detail"]
    _shrink(app, a, "VCPU", max_unit=8)
    # Part moved to b, the rest stays on a (still over, but less).
    assert api128.put(f"/allocations/{consumer}", json=body({**claim(a, VCPU=5), **claim(b, VCPU=1)}, 1)).status == 204
    assert (usages(api128, a), usages(api128, b)) == ({"VCPU": 5}, {"VCPU": 1})
    # Before 1.28 and in the list format too.
    assert api128.put(f"/allocations/{consumer}", version="1.0", json={
        "allocations": [{"resource_provider": {"uuid": a}, "resources": {"VCPU": 5}}]}).status == 204


def test_a_provider_without_inventory_is_named_with_every_class_placement_checks(app, api128, rp):
    """Asked of the reference Placement: when a provider of the request has
    no inventory at all, the 409 names every class the request allocates
    and every class its emptied consumers give up, in class id order."""
    bare, other = seed_provider(app), seed_provider(app, {"IPV4_ADDRESS": 8})
    emptied, kept, held_elsewhere = new_uuid(), new_uuid(), new_uuid()
    assert api128.put(f"/allocations/{emptied}", json=body(claim(rp, VCPU=1, DISK_GB=10))).status == 204
    assert api128.put(f"/allocations/{held_elsewhere}", json=body(claim(other, IPV4_ADDRESS=1))).status == 204

    def refused(batch: dict) -> str:
        r = api128.post("/allocations", json={consumer: {"allocations": allocations, "project_id": "p",
                                                          "user_id": "u", "consumer_generation": generation}
                                              for consumer, (allocations, generation) in batch.items()})
        assert r.status == 409, r
        return r.error()["detail"].split("\n\n")[-1].strip()

    new = {**claim(bare, MEMORY_MB=100)}
    assert refused({kept: (new, None), emptied: ({}, 1)}) == (
        f"Unable to allocate inventory: Inventory for 'VCPU, MEMORY_MB, DISK_GB' on resource provider '{bare}' "
        "invalid.")
    assert refused({kept: (new, None), held_elsewhere: ({}, 1)}) == (
        f"Unable to allocate inventory: Inventory for 'MEMORY_MB, IPV4_ADDRESS' on resource provider '{bare}' "
        "invalid.")
    # A consumer that moves (not emptied) names only what it asks for; the
    # classes asked for are in id order, not the request's.
    assert "Inventory for 'MEMORY_MB' on" in refused({emptied: (new, 1)})
    assert "Inventory for 'VCPU, MEMORY_MB' on" in refused({kept: ({**new, **claim(rp, VCPU=1)}, None)})


def test_unknown_provider_class_and_missing_inventory(app, api128, rp):
    missing = new_uuid()
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(missing, VCPU=1)))
    assert r.status == 400
    assert f"Allocation for resource provider '{missing}' that does not exist." in r.error()["detail"]
    consumer = new_uuid()
    r = api128.put(f"/allocations/{consumer}", json=body(claim(rp, COWS=1)))
    assert r.status == 400
    assert f"Unable to allocate inventory for consumer {consumer}: No such resource class COWS" in r.error()["detail"]
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(rp, VCPU=1, PCI_DEVICE=1)))
    assert r.status == 409
    assert f"Inventory for 'PCI_DEVICE' on resource provider '{rp}' invalid." in r.error()["detail"]
    bare = seed_provider(app)
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(bare, DISK_GB=10)))
    assert r.status == 409 and r.error()["title"] == "Conflict"
    assert usages(api128, rp) == {"VCPU": 0, "MEMORY_MB": 0, "DISK_GB": 0}


def test_a_write_refused_for_an_unknown_provider_keeps_new_consumers(api128, rp):
    # Placement records new consumers before it looks the providers up, and
    # keeps them when a provider is unknown: their next write names 0.
    missing = new_uuid()
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(missing, VCPU=1))).status == 400
    r = api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1)))
    assert r.status == 409 and r.error()["code"] == "placement.concurrent_update"
    assert "consumer generation conflict - expected 0 but got None" in r.error()["detail"]
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1), 0)).status == 204
    # POST: every new consumer of the request stays, before 1.28 too.
    first, second = new_uuid(), new_uuid()
    r = api128.post("/allocations", version="1.13", json={
        first: {"allocations": claim(rp, VCPU=1), "project_id": "p", "user_id": "u"},
        second: {"allocations": claim(missing, VCPU=1), "project_id": "p", "user_id": "u"}})
    assert r.status == 400 and f"'{missing}' that does not exist" in r.error()["detail"]
    for kept in (first, second):
        assert api128.put(f"/allocations/{kept}", json=body(claim(rp, VCPU=1))).status == 409
        assert api128.put(f"/allocations/{kept}", json=body(claim(rp, VCPU=1), 0)).status == 204
    # Writes refused later (an unknown class, capacity) leave nothing behind.
    for refused in (claim(rp, COWS=1), claim(rp, VCPU=100)):
        consumer = new_uuid()
        assert api128.put(f"/allocations/{consumer}", json=body(refused)).status in (400, 409)
        assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1))).status == 204


def test_consumer_generation_is_checked_before_the_providers(api128, rp):
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1))).status == 204
    r = api128.put(f"/allocations/{consumer}", json=body(claim(new_uuid(), VCPU=1), 5))
    assert r.status == 409
    assert "consumer generation conflict - expected 1 but got 5" in r.error()["detail"]
    r = api128.post("/allocations", json={new_uuid(): body(claim(new_uuid(), VCPU=1), 3)})
    assert r.status == 409
    assert "consumer generation conflict - expected null but got 3" in r.error()["detail"]


def test_custom_classes_allocate_like_standard_ones(app, api):
    seed_custom_class(app, "CUSTOM_GOLD")
    provider = seed_provider(app, {"VCPU": 24, "CUSTOM_GOLD": 5})
    consumer = new_uuid()
    old = {"allocations": [{"resource_provider": {"uuid": provider}, "resources": {"DISK_GB": 5, "CUSTOM_GOLD": 1}}],
           "project_id": "p", "user_id": "u"}
    assert api.put(f"/allocations/{consumer}", version="1.11", json=old).status == 409
    old["allocations"][0]["resources"] = {"CUSTOM_GOLD": 1}
    assert api.put(f"/allocations/{consumer}", version="1.11", json=old).status == 204


# -- generations of providers ---------------------------------------------------


def test_every_write_bumps_the_providers_it_claims_from_and_delete_bumps_none(app, api128):
    a = seed_provider(app, {"VCPU": 8})
    b = seed_provider(app, {"VCPU": 8})
    consumer = new_uuid()
    api128.put(f"/allocations/{consumer}", json=body({**claim(a, VCPU=1), **claim(b, VCPU=1)}))
    assert (provider_generation(api128, a), provider_generation(api128, b)) == (1, 1)
    shown = api128.get(f"/allocations/{consumer}").json["allocations"]
    assert shown[a]["generation"] == 1 and shown[b]["generation"] == 1
    # Moving away from b does not bump b (Placement doesn't either).
    api128.put(f"/allocations/{consumer}", json=body(claim(a, VCPU=2), 1))
    assert (provider_generation(api128, a), provider_generation(api128, b)) == (2, 1)
    # Emptying bumps the providers it releases.
    api128.put(f"/allocations/{consumer}", json=body({}, 2))
    assert provider_generation(api128, a) == 3
    api128.put(f"/allocations/{consumer}", json=body(claim(b, VCPU=2)))
    assert api128.delete(f"/allocations/{consumer}").status == 204
    assert provider_generation(api128, b) == 2


def _stale_reads(monkeypatch, losses: dict, which=None) -> None:
    """The write's first read sees a generation the provider does not have
    (of the provider of lowest id, or of highest with ``which="last"``), while
    ``losses["left"]`` lasts: its swap is lost, as when another writer
    committed since the read."""
    real = alloc_db._read_for_write

    def stale(*args, **kwargs):
        found = real(*args, **kwargs)
        if losses["left"] > 0 and found.generations:
            losses["left"] -= 1
            ids = sorted(found.generations)
            found.generations[ids[-1] if which == "last" else ids[0]] += 7
        return found

    monkeypatch.setattr(alloc_db, "_read_for_write", stale)


def test_lost_provider_swaps_are_retried_then_reported(app, api128, rp, monkeypatch):
    losses = {"left": 3}
    _stale_reads(monkeypatch, losses)
    consumer = new_uuid()
    assert api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1))).status == 204
    assert losses["left"] == 0
    assert api128.get(f"/allocations/{consumer}").json["consumer_generation"] == 1

    app.conf.set_override("allocation_conflict_retry_count", 2, group="placement")
    losses["left"] = 3
    r = api128.put(f"/allocations/{new_uuid()}", json=body(claim(rp, VCPU=1)))
    assert r.status == 409
    assert r.error()["code"] == "placement.concurrent_update"
    assert "Inventory and/or allocations changed while attempting to allocate" in r.error()["detail"]
    assert usages(api128, rp)["VCPU"] == 1


@pytest.mark.parametrize("which", ["first", "last"])
def test_a_lost_swap_of_any_provider_of_a_claim_leaves_nothing(app, api128, monkeypatch, which):
    """A claim for a new consumer from two providers whose swap of one is
    lost every time: nothing is written, neither the allocations nor the
    consumer, nor either provider's generation (on PostgreSQL the last
    swap goes in one statement with the consumer's and allocations' rows)."""
    a = seed_provider(app, {"VCPU": 8})
    b = seed_provider(app, {"VCPU": 8})
    # The project and user exist already (a claim whose owner is new
    # writes its rows first, and takes the path of separate statements).
    assert api128.put(f"/allocations/{new_uuid()}", json=body(claim(seed_provider(app, {"VCPU": 1}), VCPU=1))
                      ).status == 204
    app.conf.set_override("allocation_conflict_retry_count", 1, group="placement")
    losses = {"left": 2}
    _stale_reads(monkeypatch, losses, which)
    consumer = new_uuid()
    r = api128.put(f"/allocations/{consumer}", json=body({**claim(a, VCPU=1), **claim(b, VCPU=2)}))
    assert r.status == 409 and r.error()["code"] == "placement.concurrent_update", r.body
    assert losses["left"] == 0
    assert (provider_generation(api128, a), provider_generation(api128, b)) == (0, 0)
    assert usages(api128, a)["VCPU"] == usages(api128, b)["VCPU"] == 0
    assert api128.get(f"/allocations/{consumer}").json == {"allocations": {}}
    with app.db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.consumers)
                            .where(tables.consumers.c.uuid == consumer)).scalar_one() == 0
    r = api128.put(f"/allocations/{consumer}", json=body({**claim(a, VCPU=1), **claim(b, VCPU=2)}))
    assert r.status == 204, r.body
    assert (provider_generation(api128, a), provider_generation(api128, b)) == (1, 1)
    assert usages(api128, a)["VCPU"] == 1 and usages(api128, b)["VCPU"] == 2


# -- DELETE ---------------------------------------------------------------------


def test_delete_removes_everything_then_404(api, rp):
    consumer = new_uuid()
    api.put(f"/allocations/{consumer}", version="1.28", json=body(claim(rp, VCPU=2, MEMORY_MB=256)))
    assert api.delete(f"/allocations/{consumer}").status == 204
    assert usages(api, rp) == {"VCPU": 0, "MEMORY_MB": 0, "DISK_GB": 0}
    r = api.delete(f"/allocations/{consumer}")
    assert r.status == 404
    assert f"No allocations for consumer '{consumer}'" in r.error()["detail"]
    assert api.delete(f"/allocations/{new_uuid()}").status == 404


def test_get_allocations_is_not_allowed(api):
    r = api.get("/allocations")
    assert r.status == 405 and r.headers["allow"] == "POST"


# -- POST /allocations (1.13) ---------------------------------------------------


def post_entry(allocations: dict, generation=None, *, project="proj", user="user") -> dict:
    return {"allocations": allocations, "project_id": project, "user_id": user, "consumer_generation": generation}


def test_post_is_404_before_1_13(api, rp):
    assert api.post("/allocations", version="1.12", json={}).status == 404


def test_post_writes_several_consumers_and_empties_others(api128, app):
    compute = seed_provider(app, {"VCPU": 16, "MEMORY_MB": 2048})
    disk = seed_provider(app, {"DISK_GB": 4096})
    instance, migration = new_uuid(), new_uuid()
    r = api128.post("/allocations", json={
        instance: post_entry({**claim(compute, VCPU=2, MEMORY_MB=1024), **claim(disk, DISK_GB=5)}),
        migration: post_entry(claim(compute, VCPU=2, MEMORY_MB=1024)),
    })
    assert r.status == 204
    assert api128.get("/usages?project_id=proj").json["usages"] == {"VCPU": 4, "MEMORY_MB": 2048, "DISK_GB": 5}
    r = api128.post("/allocations", json={
        instance: post_entry({**claim(compute, VCPU=2, MEMORY_MB=1024), **claim(disk, DISK_GB=5)}, 1),
        migration: post_entry({}, 1),
    })
    assert r.status == 204
    assert api128.get(f"/allocations/{migration}").json == {"allocations": {}}
    assert api128.get(f"/allocations/{instance}").json["consumer_generation"] == 2
    assert api128.get("/usages?project_id=proj").json["usages"] == {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 5}


def test_post_is_all_or_nothing(api128, app):
    provider = seed_provider(app, {"VCPU": 2})
    consumers = [new_uuid() for _ in range(3)]
    # Each claim fits alone; together they exceed the capacity.
    r = api128.post("/allocations", json={c: post_entry(claim(provider, VCPU=1)) for c in consumers})
    assert r.status == 409
    assert "The requested amount would exceed the capacity" in r.error()["detail"]
    assert usages(api128, provider) == {"VCPU": 0}
    good, bad = new_uuid(), new_uuid()
    r = api128.post("/allocations", json={good: post_entry(claim(provider, VCPU=1)),
                                          bad: post_entry(claim(provider, CUSTOM_PONY=1))})
    assert r.status == 400
    assert "Unable to allocate inventory No such resource class CUSTOM_PONY" in r.error()["detail"]
    assert api128.get(f"/allocations/{good}").json == {"allocations": {}}
    r = api128.post("/allocations", json={good: post_entry(claim(provider, VCPU=1)),
                                          bad: post_entry(claim(provider, VCPU=1), 4)})
    assert r.status == 409 and "expected null but got 4" in r.error()["detail"]
    assert api128.get(f"/allocations/{good}").json == {"allocations": {}}


@pytest.mark.parametrize("data", [{}, {"cow": {}}, {new_uuid(): {"cow": "moo"}}])
def test_post_refuses_malformed_bodies(api128, data):
    assert api128.post("/allocations", json=data).status == 400


def test_post_generation_is_required_from_1_28(api, rp):
    entry = {"allocations": claim(rp, VCPU=1), "project_id": "p", "user_id": "u"}
    r = api.post("/allocations", version="1.28", json={new_uuid(): entry})
    assert r.status == 400 and "'consumer_generation' is a required property" in r.error()["detail"]
    assert api.post("/allocations", version="1.27", json={new_uuid(): entry}).status == 204


def test_post_consumer_type_from_1_38(api, rp):
    consumer = new_uuid()
    entry = post_entry(claim(rp, VCPU=1))
    r = api.post("/allocations", version="1.38", json={consumer: entry})
    assert r.status == 400 and "'consumer_type' is a required property" in r.error()["detail"]
    r = api.post("/allocations", version="1.38", json={consumer: {**entry, "consumer_type": "INSTANCE"}})
    assert r.status == 204
    assert api.get(f"/allocations/{consumer}", version="1.38").json["consumer_type"] == "INSTANCE"


# -- GET /resource_providers/{uuid}/allocations ------------------------------


def test_provider_allocations_by_consumer(api, app, rp):
    first, second = new_uuid(), new_uuid()
    api.put(f"/allocations/{first}", version="1.28", json=body(claim(rp, VCPU=2, DISK_GB=10)))
    api.put(f"/allocations/{second}", version="1.28", json=body(claim(rp, VCPU=1)))
    r = api.get(f"/resource_providers/{rp}/allocations", version="1.27")
    assert r.json == {"resource_provider_generation": 2,
                      "allocations": {first: {"resources": {"VCPU": 2, "DISK_GB": 10}},
                                      second: {"resources": {"VCPU": 1}}}}
    assert "last-modified" not in api.get(f"/resource_providers/{rp}/allocations", version="1.14").headers
    r = api.get(f"/resource_providers/{rp}/allocations", version="1.28")
    assert r.json["allocations"][first]["consumer_generation"] == 1
    assert r.headers["cache-control"] == "no-cache"


def test_provider_allocations_of_unknown_provider_is_404(api):
    assert api.get(f"/resource_providers/{new_uuid()}/allocations").status == 404


# -- allocations written before consumer records existed ----------------------


def test_legacy_allocations_show_the_incomplete_owner_and_take_a_null_generation(api, app, rp):
    consumer = new_uuid()
    seed_legacy_allocation(app, rp, consumer, {"VCPU": 2})
    shown = api.get(f"/allocations/{consumer}", version="1.28").json
    assert shown["project_id"] == INCOMPLETE and shown["consumer_generation"] is None
    assert api.get(f"/resource_providers/{rp}/allocations", version="1.28").json["allocations"][consumer] == {
        "resources": {"VCPU": 2}, "consumer_generation": None}
    assert api.put(f"/allocations/{consumer}", version="1.28", json=body(claim(rp, VCPU=3), 0)).status == 409
    assert api.put(f"/allocations/{consumer}", version="1.28", json=body(claim(rp, VCPU=3))).status == 204
    assert usages(api, rp)["VCPU"] == 3
    shown = api.get(f"/allocations/{consumer}", version="1.28").json
    assert (shown["project_id"], shown["consumer_generation"]) == ("proj", 1)


def test_legacy_allocations_can_be_deleted(api, app, rp):
    consumer = new_uuid()
    seed_legacy_allocation(app, rp, consumer, {"VCPU": 2})
    assert api.delete(f"/allocations/{consumer}").status == 204
    assert usages(api, rp)["VCPU"] == 0


def test_canonical_uuid_helper_used_for_get_and_delete(api128, rp):
    consumer = new_uuid()
    api128.put(f"/allocations/{consumer}", json=body(claim(rp, VCPU=1)))
    upper = str(uuidlib.UUID(consumer)).upper().replace("-", "")
    assert api128.get(f"/allocations/{upper}").json["allocations"]
    assert api128.delete(f"/allocations/{upper}").status == 204


def test_several_providers_swap_together_or_not_at_all(app):
    """bump_providers: every generation read must still be current, else
    none moves (the transaction rolls back)."""
    a, b = seed_provider(app, {"VCPU": 8}), seed_provider(app, {"VCPU": 8})
    rp = tables.resource_providers
    with app.db.read() as conn:
        ids = dict(conn.execute(sa.select(rp.c.uuid, rp.c.id).where(rp.c.uuid.in_([a, b]))).all())
    with pytest.raises(generations.ConcurrentUpdate):
        with app.db.write() as conn:
            generations.bump_providers(conn, [(ids[a], 0), (ids[b], 7)])  # b's is stale
    with app.db.write() as conn:
        assert generations.bump_providers(conn, [(ids[a], 0), (ids[b], 0)]) == {ids[a]: 1, ids[b]: 1}
    with app.db.read() as conn:
        assert dict(conn.execute(sa.select(rp.c.id, rp.c.generation).where(rp.c.id.in_(ids.values()))).all()) \
            == {ids[a]: 1, ids[b]: 1}


def _blocked_write(app, api128, provider: str, consumer: str, wanted: dict) -> tuple:
    """PUT ``wanted`` for ``consumer`` while another transaction has swapped
    ``provider``'s generation and not yet committed; that transaction
    commits once the PUT waits for a lock.  (The answer, the provider's
    generation before.)"""
    before = provider_generation(api128, provider)
    other = sa.create_engine(app.db.engine.url)
    blocker = other.connect()
    blocker.execute(sa.update(tables.resource_providers).where(tables.resource_providers.c.uuid == provider)
                    .values(generation=tables.resource_providers.c.generation + 1))
    answers: list = []
    writer = threading.Thread(target=lambda: answers.append(api128.put(f"/allocations/{consumer}", json=wanted)))
    writer.start()
    try:
        with other.connect() as watcher:
            for _ in range(500):
                waiting = watcher.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")).scalar()
                if waiting:
                    break
                time.sleep(0.01)
            assert waiting == 1
    finally:
        blocker.commit()
        blocker.close()
        writer.join(30)
        other.dispose()
    return answers[0], before


@pytest.mark.skipif(os.environ.get("ALLOTMENT_TEST_BACKEND", "sqlite") != "postgresql",
                    reason="the locking first read is PostgreSQL's (MySQL / MariaDB lock on a re-run)")
@pytest.mark.parametrize("giving_up", [False, True])
def test_after_a_lost_swap_writes_wait_for_the_writer_of_their_provider_before_reading(app, api128, giving_up):
    """Another transaction has swapped the provider's generation and not yet
    committed.  A process whose writes have met no other writer reads
    without locking: its write loses the swap and runs again (a "race"
    retry).  That turns the locking read on (``SwapContention``): the next
    such write waits at its first read, reads the generation the other
    committed, and lands without running again.  Both swaps count each
    time.  Either claims naming the provider, or consumers giving up what
    they hold there (their swap goes with the others, though the provider
    is not named)."""
    provider = seed_provider(app, {"VCPU": 8})
    consumers = [new_uuid(), new_uuid()]
    if giving_up:
        for consumer in consumers:
            assert api128.put(f"/allocations/{consumer}", json=body(claim(provider, VCPU=1))).status == 204
    wanted = body({}, 1) if giving_up else body(claim(provider, VCPU=2))
    retries: list[str] = []
    app.db.on_retry = retries.append
    for consumer, expected in zip(consumers, (["race"], ["race"])):
        answer, before = _blocked_write(app, api128, provider, consumer, wanted)
        assert answer.status == 204, answer.body
        assert retries == expected
        assert provider_generation(api128, provider) == before + 2
    assert usages(api128, provider)["VCPU"] == (0 if giving_up else 4)


def test_writes_lock_at_their_first_read_for_a_while_after_a_lost_swap():
    contention = alloc_db.SwapContention()
    assert not contention.lock_read()
    contention.lost()
    assert [contention.lock_read() for _ in range(alloc_db.LOCKED_READS + 2)] \
        == [True] * alloc_db.LOCKED_READS + [False, False]
    contention.lost()
    assert contention.lock_read()
