"""/resource_providers/{uuid}/inventories, as the API reference describes it.

Providers and allocations are written straight into the tables here, so
these tests depend only on the inventory endpoints.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from allotment.db import inventories as inventory_db
from allotment.db import tables
from allotment.domain import errors as domain
from allotment.domain.inventories import Inventory, ResourceClassNotFound
from tests.conftest import BACKEND, new_uuid

BASE = "/resource_providers/{}/inventories"
DISK = {"resource_class": "DISK_GB", "total": 2048, "reserved": 512, "min_unit": 10,
        "max_unit": 1024, "step_size": 10, "allocation_ratio": 1.0}
HTTP_DATE = r"^\w+, \d+ \w+ \d{4} [\d:]+ GMT$"


@pytest.fixture
def provider(app):
    """A provider row (uuid), generation 0, no inventory."""
    return _insert_provider(app)


def _insert_provider(app, generation: int = 0) -> str:
    uuid = new_uuid()
    with app.db.write() as conn:
        conn.execute(tables.resource_providers.insert().values(
            uuid=uuid, name=f"rp-{uuid}", generation=generation))
    return uuid


def _provider_row(app, uuid: str):
    with app.db.read() as conn:
        return inventory_db.get_provider(conn, uuid)


def _allocate(app, uuid: str, resource_class: str, used: int) -> None:
    """An allocation row against ``uuid`` (the allocation API is not needed)."""
    with app.db.write() as conn:
        provider = inventory_db.get_provider(conn, uuid)
        class_id = inventory_db.resource_class_ids(conn, [resource_class])[resource_class]
        conn.execute(tables.allocations.insert().values(
            resource_provider_id=provider.id, consumer_id=new_uuid(),
            resource_class_id=class_id, used=used))


def _put_all(api, uuid, generation, inventories, **kw):
    return api.put(BASE.format(uuid), json={"resource_provider_generation": generation,
                                            "inventories": inventories}, **kw)


def _state(api, uuid):
    return api.get(BASE.format(uuid)).json


def _assert_error(response, status, *fragments, code=None):
    assert response.status == status, response
    error = response.error()
    for fragment in fragments:
        assert fragment in error["detail"], (fragment, error["detail"])
    if code is not None:
        assert error["code"] == code


# -- GET ------------------------------------------------------------------


def test_list_of_missing_provider_is_404(api):
    uuid = new_uuid()
    response = api.get(BASE.format(uuid))
    _assert_error(response, 404, f"No resource provider with uuid {uuid} found")
    assert response.error()["title"] == "Not Found"


def test_new_provider_has_empty_inventory(api, provider):
    response = api.get(BASE.format(provider))
    assert response.status == 200
    assert response.json == {"resource_provider_generation": 0, "inventories": {}}


def test_show_missing_class_and_unknown_class_are_404(api, provider):
    for name in ("IPV4_ADDRESS", "HOUSE"):
        response = api.get(BASE.format(provider) + "/" + name)
        _assert_error(response, 404, f"No inventory of class {name} for {provider}")


def test_show_on_missing_provider_is_404(api):
    assert api.get(BASE.format(new_uuid()) + "/VCPU").status == 404


# -- POST -----------------------------------------------------------------


def test_create_returns_201_location_and_the_record(api, provider):
    response = api.post(BASE.format(provider), json=DISK)
    assert response.status == 201
    assert response.headers["Location"].endswith(f"/resource_providers/{provider}/inventories/DISK_GB")
    expected = {key: value for key, value in DISK.items() if key != "resource_class"}
    assert response.json == {**expected, "resource_provider_generation": 1}

    shown = api.get(response.headers["Location"].split("localhost", 1)[1], version="1.15")
    assert shown.status == 200
    assert shown.json == {**expected, "resource_provider_generation": 1}
    assert shown.headers["Cache-Control"] == "no-cache"
    assert shown.headers["Last-Modified"].endswith("GMT")


def test_cache_headers_only_from_1_15(api, provider):
    api.post(BASE.format(provider), json=DISK)
    for path in (BASE.format(provider), BASE.format(provider) + "/DISK_GB"):
        old = api.get(path, version="1.14")
        assert "Cache-Control" not in old.headers and "Last-Modified" not in old.headers
        new = api.get(path, version="1.15")
        assert new.headers["Cache-Control"] == "no-cache"


def test_an_empty_inventory_list_has_no_last_modified(api, provider):
    # Placement sends Cache-Control but no Last-Modified for an empty list,
    # on GET and on the PUT that empties it; a non-empty one has both.
    for response in (api.get(BASE.format(provider), version="1.15"),
                     _put_all(api, provider, 0, {}, version="1.15")):
        assert response.status == 200
        assert response.headers["Cache-Control"] == "no-cache"
        assert "Last-Modified" not in response.headers
    filled = _put_all(api, provider, 1, {"VCPU": {"total": 2}}, version="1.39")
    assert filled.headers["Last-Modified"].endswith("GMT")
    assert api.get(BASE.format(provider), version="1.39").headers["Last-Modified"].endswith("GMT")


def test_create_fills_in_defaults(api, provider):
    response = api.post(BASE.format(provider), json={"resource_class": "VCPU", "total": 8})
    assert response.status == 201
    assert _state(api, provider)["inventories"]["VCPU"] == {
        "total": 8, "reserved": 0, "min_unit": 1, "max_unit": 2147483647,
        "step_size": 1, "allocation_ratio": 1.0}


@pytest.mark.parametrize("body, fragments", [
    ({"resource_class": "DISK_GB"}, ["JSON does not validate", "'total' is a required property"]),
    ({"resource_class": "DISK_GB", "total": -1}, ["-1 is less than the minimum of 1"]),
    ({**DISK, "total": 0}, ["JSON does not validate: 0 is less than the minimum of 1",
                            "Failed validating 'minimum' in schema['properties']['total']"]),
    ({**DISK, "min_unit": 0}, ["Failed validating 'minimum' in schema['properties']['min_unit']"]),
    ({**DISK, "max_unit": 0}, ["Failed validating 'minimum' in schema['properties']['max_unit']"]),
    ({**DISK, "step_size": 0}, ["Failed validating 'minimum' in schema['properties']['step_size']"]),
    ({**DISK, "reserved": -1}, ["-1 is less than the minimum of 0"]),
    ({**DISK, "total": 2147483648}, ["Failed validating 'maximum'"]),
    ({**DISK, "reserved": 2147483648}, ["Failed validating 'maximum'"]),
    ({**DISK, "step_size": 2147483648}, ["Failed validating 'maximum'"]),
    ({**DISK, "allocation_ratio": 3.40282e+39}, ["Failed validating 'maximum'"]),
    ({**DISK, "total": "2048"}, ["'2048' is not of type 'integer'"]),
    ({**DISK, "total": 20.5}, ["20.5 is not of type 'integer'"]),
    ({**DISK, "colour": "red"}, ["Additional properties are not allowed"]),
    ({"resource_class": "bad_class", "total": 2048}, ["does not match"]),
    ({"resource_class": "NO_CLASS_14", "total": 2048},
     ["Unable to create inventory for resource provider", "No such resource class NO_CLASS_14"]),
    ({"resource_class": "DISK_GB", "total": 256, "reserved": 512},
     ["Unable to create inventory for resource provider",
      "The reserved value is greater than or equal to total."]),
    ({"resource_class": "DISK_GB", "total": 256, "reserved": 256},
     ["The reserved value is greater than or equal to total."]),
    ({"resource_class": "DISK_GB", "total": 10, "allocation_ratio": -1.0},
     ["The reserved value is greater than or equal to total."]),
])
def test_create_rejects_bad_records(api, provider, body, fragments):
    response = api.post(BASE.format(provider), json=body, version="1.25")
    _assert_error(response, 400, *fragments)
    assert _state(api, provider) == {"resource_provider_generation": 0, "inventories": {}}


def test_create_rejects_malformed_json(api, provider):
    response = api.post(BASE.format(provider), body=b'{"foo": }',
                        headers={"Content-Type": "application/json"})
    _assert_error(response, 400, "Malformed JSON")


def test_create_needs_json_content(api, provider):
    response = api.post(BASE.format(provider), body=b"total=1",
                        headers={"Content-Type": "text/plain"})
    assert response.status == 415


def test_reserved_may_equal_total_from_1_26(api, provider):
    body = {"resource_class": "DISK_GB", "total": 256, "reserved": 256}
    assert api.post(BASE.format(provider), json=body, version="1.25").status == 400
    assert api.post(BASE.format(provider), json=body, version="1.26").status == 201
    over = {"resource_class": "VCPU", "total": 4, "reserved": 5}
    _assert_error(api.post(BASE.format(provider), json=over, version="1.26"), 400,
                  "The reserved value is greater than total.")


def test_create_duplicate_class_is_409(api, provider):
    assert api.post(BASE.format(provider), json=DISK).status == 201
    response = api.post(BASE.format(provider), json=DISK, version="1.23")
    _assert_error(response, 409, "Update conflict", code="placement.concurrent_update")
    assert _state(api, provider)["resource_provider_generation"] == 1


def test_create_on_missing_provider_is_404_even_with_a_bad_body(api):
    uuid = new_uuid()
    _assert_error(api.post(BASE.format(uuid), json=DISK), 404, f"No resource provider with uuid {uuid}")
    _assert_error(api.post(BASE.format(uuid), json={"x": 1}), 404)


# -- PUT one --------------------------------------------------------------


def test_update_one_changes_it_and_bumps_the_generation(api, provider):
    api.post(BASE.format(provider), json=DISK)
    body = {**DISK, "reserved": 1024, "resource_provider_generation": 1}
    del body["resource_class"]
    response = api.put(BASE.format(provider) + "/DISK_GB", json=body)
    assert response.status == 200
    assert response.json["reserved"] == 1024
    assert response.json["resource_provider_generation"] == 2
    shown = api.get(BASE.format(provider) + "/DISK_GB").json
    assert shown["reserved"] == 1024 and shown["resource_provider_generation"] == 2


def test_update_one_with_stale_generation_is_409(api, provider):
    api.post(BASE.format(provider), json=DISK)
    response = api.put(BASE.format(provider) + "/DISK_GB",
                       json={"resource_provider_generation": 5, "total": 4096}, version="1.23")
    _assert_error(response, 409, "resource provider generation conflict",
                  code="placement.concurrent_update")
    assert response.error()["title"] == "Conflict"
    assert _state(api, provider)["inventories"]["DISK_GB"]["total"] == 2048


def test_update_one_without_inventory_of_that_class_is_400(api, provider):
    api.post(BASE.format(provider), json=DISK)
    response = api.put(BASE.format(provider) + "/MEMORY_MB",
                       json={"resource_provider_generation": 1, "total": 2048})
    _assert_error(response, 400, "No inventory record with resource class for resource provider "
                  f"{provider}: No inventory of class MEMORY_MB found.")


def test_update_one_of_unknown_class_is_404(api, provider):
    response = api.put(BASE.format(provider) + "/HOUSE",
                       json={"resource_provider_generation": 0, "total": 2048})
    _assert_error(response, 404, "No such resource class HOUSE.")


@pytest.mark.parametrize("body, status, fragment", [
    ({"resource_provider_generation": 1, "total": 2048, "reserved": 4096}, 400,
     "Unable to update inventory for resource provider {uuid}"),
    ({"house": "red", "car": "blue"}, 400, "JSON does not validate"),
    ({"total": 2048}, 400, "'resource_provider_generation' is a required property"),
    ({"resource_provider_generation": "1", "total": 2048}, 400, "is not of type 'integer'"),
    ({"resource_provider_generation": 1, "total": 2048, "resource_class": "DISK_GB"}, 400,
     "Additional properties are not allowed"),
])
def test_update_one_rejects_bad_bodies(api, provider, body, status, fragment):
    api.post(BASE.format(provider), json=DISK)
    response = api.put(BASE.format(provider) + "/DISK_GB", json=body)
    _assert_error(response, status, fragment.format(uuid=provider))
    assert _state(api, provider)["resource_provider_generation"] == 1


def test_update_one_reserved_equal_to_total(api, provider):
    api.post(BASE.format(provider), json={"resource_class": "IPV4_ADDRESS", "total": 253})
    body = {"resource_provider_generation": 1, "total": 253, "reserved": 253}
    _assert_error(api.put(BASE.format(provider) + "/IPV4_ADDRESS", json=body, version="1.25"), 400,
                  "Unable to update inventory", "greater than or equal to total")
    assert api.put(BASE.format(provider) + "/IPV4_ADDRESS", json=body, version="1.26").status == 200


def test_update_one_on_missing_provider_is_404(api):
    response = api.put(BASE.format(new_uuid()) + "/VCPU",
                       json={"resource_provider_generation": 0, "total": 1})
    assert response.status == 404


# -- PUT all --------------------------------------------------------------


def test_replace_all_adds_updates_and_removes(api, provider):
    api.post(BASE.format(provider), json=DISK)
    api.post(BASE.format(provider), json={"resource_class": "VCPU", "total": 8})
    response = _put_all(api, provider, 2, {"IPV4_ADDRESS": {"total": 253},
                                           "DISK_GB": {"total": 1024}}, version="1.15")
    assert response.status == 200
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.json["resource_provider_generation"] == 3
    assert response.json["inventories"]["IPV4_ADDRESS"]["reserved"] == 0
    assert response.json["inventories"]["DISK_GB"] == {
        "total": 1024, "reserved": 0, "min_unit": 1, "max_unit": 2147483647,
        "step_size": 1, "allocation_ratio": 1.0}
    state = _state(api, provider)
    assert state["resource_provider_generation"] == 3
    assert set(state["inventories"]) == {"IPV4_ADDRESS", "DISK_GB"}
    assert state["inventories"]["DISK_GB"]["total"] == 1024


def test_replace_all_with_same_records_still_bumps_generation(api, provider):
    assert _put_all(api, provider, 0, {"VCPU": {"total": 4}}).status == 200
    response = _put_all(api, provider, 1, {"VCPU": {"total": 4}})
    assert response.json["resource_provider_generation"] == 2


def test_replace_all_with_nothing_removes_everything(api, provider):
    api.post(BASE.format(provider), json=DISK)
    response = _put_all(api, provider, 1, {}, version="1.4")
    assert response.status == 200
    assert response.json == {"resource_provider_generation": 2, "inventories": {}}
    assert _state(api, provider) == {"resource_provider_generation": 2, "inventories": {}}


def test_replace_all_with_stale_generation_is_409(api, provider):
    response = _put_all(api, provider, 99, {"VCPU": {"total": 1}}, version="1.23")
    _assert_error(response, 409, "resource provider generation conflict",
                  code="placement.concurrent_update")
    assert _state(api, provider)["inventories"] == {}


def test_replace_all_with_unknown_class_is_400_and_changes_nothing(api, provider):
    api.post(BASE.format(provider), json=DISK)
    response = _put_all(api, provider, 1, {"VCPU": {"total": 1}, "HOUSE": {"total": 253}})
    _assert_error(response, 400, "Unknown resource class in inventory for resource provider "
                  f"{provider}: No such resource class HOUSE.")
    state = _state(api, provider)
    assert state["resource_provider_generation"] == 1 and list(state["inventories"]) == ["DISK_GB"]


@pytest.mark.parametrize("version, reserved, status, fragment", [
    ("1.25", 512, 400, "greater than or equal to total"),
    ("1.25", 253, 400, "greater than or equal to total"),
    ("1.26", 253, 200, None),
    ("1.26", 512, 400, "The reserved value is greater than total."),
])
def test_replace_all_capacity_rule_by_version(api, provider, version, reserved, status, fragment):
    response = _put_all(api, provider, 0, {"IPV4_ADDRESS": {"total": 253, "reserved": reserved}},
                        version=version)
    assert response.status == status, response
    if fragment:
        _assert_error(response, 400, "Unable to update inventory for resource provider", fragment)


@pytest.mark.parametrize("body, fragment", [
    ({"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": 2147483648}}},
     "Failed validating 'maximum'"),
    ({"resource_provider_generation": 0,
      "inventories": {"DISK_GB": {"total": 1, "allocation_ratio": 3.40282e+39}}},
     "Failed validating 'maximum'"),
    ({"resource_provider_generation": 0, "inventories": {"DISK_GB": {"reserved": 1}}},
     "'total' is a required property"),
    ({"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": 1, "size": 2}}},
     "Additional properties are not allowed"),
    ({"resource_provider_generation": 0}, "'inventories' is a required property"),
    ({"resource_provider_generation": 0, "inventories": []}, "[] is not of type 'object'"),
    ({"inventories": {}}, "'resource_provider_generation' is a required property"),
    ({"resource_provider_generation": 0, "inventories": {}, "x": 1},
     "Additional properties are not allowed"),
])
def test_replace_all_rejects_bad_bodies(api, provider, body, fragment):
    response = api.put(BASE.format(provider), json=body)
    _assert_error(response, 400, "JSON does not validate", fragment)
    assert _state(api, provider)["resource_provider_generation"] == 0


def test_replace_all_on_missing_provider_is_404(api):
    assert _put_all(api, new_uuid(), 0, {}).status == 404


# -- DELETE ---------------------------------------------------------------


def test_delete_one(api, provider):
    api.post(BASE.format(provider), json=DISK)
    response = api.delete(BASE.format(provider) + "/DISK_GB")
    assert response.status == 204
    assert "Content-Type" not in response.headers
    assert _state(api, provider) == {"resource_provider_generation": 2, "inventories": {}}


def test_delete_one_missing_is_404(api, provider):
    response = api.delete(BASE.format(provider) + "/IPV4_ADDRESS")
    _assert_error(response, 404, "No inventory of class IPV4_ADDRESS found for delete")
    response = api.delete(BASE.format(provider) + "/HOUSE")
    _assert_error(response, 404, "No inventory of class HOUSE found for delete: "
                                 "No such resource class HOUSE.")
    assert _state(api, provider)["resource_provider_generation"] == 0


def test_delete_one_on_missing_provider_is_404(api):
    uuid = new_uuid()
    _assert_error(api.delete(BASE.format(uuid) + "/VCPU"), 404, f"No resource provider with uuid {uuid}")


def test_delete_all_from_1_5(api, provider):
    _put_all(api, provider, 0, {"VCPU": {"total": 4}, "DISK_GB": {"total": 10}})
    assert api.delete(BASE.format(provider), version="1.4").status == 405
    response = api.delete(BASE.format(provider), version="1.5")
    assert response.status == 204
    assert "Content-Type" not in response.headers
    assert api.delete(BASE.format(provider), version="1.5").status == 204
    assert _state(api, provider) == {"resource_provider_generation": 3, "inventories": {}}


def test_delete_all_on_missing_provider_is_404(api):
    assert api.delete(BASE.format(new_uuid()), version="1.5").status == 404


# -- inventory in use ----------------------------------------------------


@pytest.fixture
def busy_provider(api, app, provider):
    """VCPU and DISK_GB inventory, both with allocations; generation 1."""
    _put_all(api, provider, 0, {"VCPU": {"total": 96}, "DISK_GB": {"total": 2048},
                                "MEMORY_MB": {"total": 1024}})
    _allocate(app, provider, "DISK_GB", 1020)
    _allocate(app, provider, "VCPU", 10)
    return provider


def test_delete_all_in_use_is_409(api, busy_provider):
    response = api.delete(BASE.format(busy_provider), version="1.23")
    _assert_error(response, 409, f"Inventory for 'VCPU, DISK_GB' on resource provider "
                                 f"'{busy_provider}' in use.", code="placement.inventory.inuse")
    assert len(_state(api, busy_provider)["inventories"]) == 3


def test_replace_all_removing_a_class_in_use_is_409(api, busy_provider):
    response = _put_all(api, busy_provider, 1, {"VCPU": {"total": 96}}, version="1.23")
    _assert_error(response, 409, f"update conflict: Inventory for 'DISK_GB' on resource provider "
                                 f"'{busy_provider}' in use.", code="placement.inventory.inuse")
    state = _state(api, busy_provider)
    assert state["resource_provider_generation"] == 1 and len(state["inventories"]) == 3


def test_delete_one_in_use_is_409_with_placements_code(api, busy_provider):
    response = api.delete(BASE.format(busy_provider) + "/DISK_GB", version="1.23")
    _assert_error(response, 409, "Unable to delete inventory of class DISK_GB: Inventory for "
                                 f"'DISK_GB' on resource provider '{busy_provider}' in use.",
                  code="placement.concurrent_update")
    assert "DISK_GB" in _state(api, busy_provider)["inventories"]


def test_unused_class_can_go_while_others_are_in_use(api, busy_provider):
    assert api.delete(BASE.format(busy_provider) + "/MEMORY_MB").status == 204


def test_shrinking_below_usage_is_allowed(api, busy_provider):
    response = _put_all(api, busy_provider, 1, {"DISK_GB": {"total": 1019}, "VCPU": {"total": 9}})
    assert response.status == 200
    body = {"resource_provider_generation": 2, "total": 5}
    assert api.put(BASE.format(busy_provider) + "/VCPU", json=body).status == 200


# -- the db API the reshaper reuses ---------------------------------------


def test_replace_inventories_can_defer_the_in_use_check(app, busy_provider):
    provider = _provider_row(app, busy_provider)
    with pytest.raises(domain.InventoryInUse):
        with app.db.write() as conn:
            inventory_db.replace_inventories(conn, provider.id, provider.generation, {},
                                             provider_uuid=provider.uuid)
    with app.db.write() as conn:
        generation = inventory_db.replace_inventories(
            conn, provider.id, provider.generation, {"VCPU": {"total": 16}}, check_in_use=False)
        assert generation == provider.generation + 1
        assert inventory_db.classes_without_inventory(conn, [provider.id]) == {provider.id: ["DISK_GB"]}
        conn.rollback()
    assert _provider_row(app, busy_provider).generation == provider.generation


def test_replace_inventories_with_a_stale_generation_writes_nothing(app, provider):
    row = _provider_row(app, provider)
    with pytest.raises(domain.ConcurrentUpdate):
        with app.db.write() as conn:
            inventory_db.replace_inventories(conn, row.id, row.generation + 1,
                                             {"VCPU": Inventory("VCPU", total=4)})
    with app.db.read() as conn:
        assert inventory_db.list_inventories(conn, row.id) == []
        assert inventory_db.classes_without_inventory(conn, [row.id]) == {}


@pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite lets only one writer in at a time")
def test_writer_that_read_before_another_commit_loses_the_swap(api, app, provider):
    with app.db.write() as conn:
        row = inventory_db.get_provider(conn, provider)
        # Another client replaces the inventory and commits meanwhile.
        assert _put_all(api, provider, 0, {"VCPU": {"total": 4}}).status == 200
        with pytest.raises(domain.ConcurrentUpdate):
            inventory_db.replace_inventories(conn, row.id, row.generation, {"VCPU": {"total": 8}})
    assert _state(api, provider)["inventories"]["VCPU"]["total"] == 4


@pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite lets only one writer in at a time")
def test_delete_racing_a_new_allocation_loses_the_swap(api, app, provider):
    _put_all(api, provider, 0, {"VCPU": {"total": 4}})
    with app.db.write() as conn:
        row = inventory_db.get_provider(conn, provider)
        # An allocation arrives (and bumps the generation, as every writer must).
        _allocate(app, provider, "VCPU", 1)
        with app.db.write() as other:
            other.execute(tables.resource_providers.update()
                          .where(tables.resource_providers.c.uuid == provider)
                          .values(generation=row.generation + 1))
        with pytest.raises(domain.ConcurrentUpdate):
            inventory_db.delete_inventory(conn, row, "VCPU")
    assert "VCPU" in _state(api, provider)["inventories"]


def test_replace_inventories_rejects_unknown_classes(app, provider):
    row = _provider_row(app, provider)
    with pytest.raises(ResourceClassNotFound, match="No such resource class CUSTOM_NOPE."):
        with app.db.write() as conn:
            inventory_db.replace_inventories(conn, row.id, row.generation, {"CUSTOM_NOPE": {"total": 1}})


def test_inventory_of_custom_class(api, app, provider):
    with app.db.write() as conn:
        conn.execute(tables.resource_classes.insert().values(
            id=tables.CUSTOM_RESOURCE_CLASS_MIN_ID + 7, name="CUSTOM_GOLD"))
    response = _put_all(api, provider, 0, {"CUSTOM_GOLD": {"total": 3, "allocation_ratio": 2.5}})
    assert response.status == 200
    shown = api.get(BASE.format(provider) + "/CUSTOM_GOLD").json
    assert shown["allocation_ratio"] == 2.5 and shown["total"] == 3
    with app.db.read() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(tables.inventories)).scalar()
    assert count == 1
