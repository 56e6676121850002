"""``/resource_classes``: standard and custom classes, every microversion."""

from __future__ import annotations

import re

import sqlalchemy as sa

from allotment.db import tables
from tests.conftest import new_uuid

STANDARD_COUNT = 21
HTTP_DATE = r"^\w+, \d+ \w+ \d{4} [\d:]+ GMT$"


def names(resp) -> list[str]:
    return [rc["name"] for rc in resp.json["resource_classes"]]


def class_rows(app) -> dict[str, int]:
    with app.db.read() as conn:
        return dict(conn.execute(sa.select(tables.resource_classes.c.name, tables.resource_classes.c.id)).all())


# -- list and show ----------------------------------------------------------------

def test_list_has_the_standard_classes_in_id_order_with_links(api):
    resp = api.get("/resource_classes", version="1.2")
    assert resp.status == 200
    listed = resp.json["resource_classes"]
    assert len(listed) == STANDARD_COUNT
    assert listed[0] == {"name": "VCPU", "links": [{"rel": "self", "href": "/resource_classes/VCPU"}]}
    assert "DISK_GB" in names(resp)


def test_resource_classes_need_1_2(api):
    assert api.get("/resource_classes", version="1.1").status == 404
    assert api.post("/resource_classes", json={"name": "CUSTOM_A"}, version="1.1").status == 404
    assert api.get("/resource_classes/VCPU", version="1.1").status == 404
    assert api.delete("/resource_classes/VCPU", version="1.1").status == 404


def test_show_standard_class(api):
    resp = api.get("/resource_classes/VCPU")
    assert resp.status == 200
    assert resp.json == {"name": "VCPU", "links": [{"rel": "self", "href": "/resource_classes/VCPU"}]}


def test_show_unknown_class_is_404(api):
    resp = api.get("/resource_classes/CUSTOM_NOPE")
    assert resp.status == 404
    assert "No such resource class CUSTOM_NOPE." in resp.error()["detail"]


def test_cache_headers_on_reads_from_1_15_only(api):
    api.post("/resource_classes", json={"name": "CUSTOM_ALPHA"})
    for path in ("/resource_classes", "/resource_classes/VCPU", "/resource_classes/CUSTOM_ALPHA"):
        new = api.get(path, version="1.15")
        assert new.headers["Cache-Control"] == "no-cache"
        assert re.match(HTTP_DATE, new.headers["Last-Modified"])
        old = api.get(path, version="1.14")
        assert "Last-Modified" not in old.headers and "Cache-Control" not in old.headers


def test_non_admin_is_forbidden(api):
    resp = api.get("/resource_classes", token="user")
    assert resp.status == 403
    assert resp.error()["title"] == "Forbidden"


# -- create -------------------------------------------------------------------

def test_create_custom_class(api, app):
    resp = api.post("/resource_classes", json={"name": "CUSTOM_NFV_FOO"})
    assert resp.status == 201
    assert resp.headers["Location"].endswith("/resource_classes/CUSTOM_NFV_FOO")
    assert "Content-Type" not in resp.headers
    assert "Last-Modified" not in resp.headers
    assert class_rows(app)["CUSTOM_NFV_FOO"] >= tables.CUSTOM_RESOURCE_CLASS_MIN_ID
    assert len(names(api.get("/resource_classes"))) == STANDARD_COUNT + 1
    assert api.get("/resource_classes/CUSTOM_NFV_FOO").json["name"] == "CUSTOM_NFV_FOO"


def test_custom_ids_start_at_the_minimum_and_increase(app, api):
    api.post("/resource_classes", json={"name": "CUSTOM_A"})
    api.post("/resource_classes", json={"name": "CUSTOM_B"})
    rows = class_rows(app)
    assert rows["CUSTOM_A"] == tables.CUSTOM_RESOURCE_CLASS_MIN_ID
    assert rows["CUSTOM_B"] == tables.CUSTOM_RESOURCE_CLASS_MIN_ID + 1


def test_create_duplicate_is_409(api):
    api.post("/resource_classes", json={"name": "CUSTOM_DUP"})
    resp = api.post("/resource_classes", json={"name": "CUSTOM_DUP"})
    assert resp.status == 409
    assert "Conflicting resource class already exists: CUSTOM_DUP" in resp.error()["detail"]


def test_create_bad_bodies_are_400_and_create_nothing(api, app):
    before = class_rows(app)
    cases = [
        ({"name": "IRON_NFV"}, "JSON does not validate"),
        ({"name": "CUSTOM_Illegal&@!Name?"}, "JSON does not validate"),
        ({"name": "CUSTOM_" + "S" * 249}, "Failed validating 'maxLength'"),
        ({"name": "CUSTOM_OK", "additional": 1}, "Additional properties are not allowed"),
        ({"name": 5}, "5 is not of type 'string'"),
        ({}, "'name' is a required property"),
    ]
    for body, message in cases:
        resp = api.post("/resource_classes", json=body)
        assert resp.status == 400, body
        assert message in resp.error()["detail"], body
    malformed = api.post("/resource_classes", body=b'{"foo": }', headers={"Content-Type": "application/json"})
    assert malformed.status == 400
    assert "Malformed JSON:" in malformed.error()["detail"]
    assert class_rows(app) == before


def test_create_needs_json_content_type(api):
    resp = api.post("/resource_classes", body=b"data", headers={"Content-Type": "text/plain"}, version="1.2")
    assert resp.status == 415


# -- PUT before 1.7: rename ------------------------------------------------------

def test_rename_custom_class(api):
    api.post("/resource_classes", json={"name": "CUSTOM_OLD"})
    resp = api.put("/resource_classes/CUSTOM_OLD", json={"name": "CUSTOM_NEW"}, version="1.6")
    assert resp.status == 200
    assert resp.json == {"name": "CUSTOM_NEW",
                         "links": [{"rel": "self", "href": "/resource_classes/CUSTOM_NEW"}]}
    assert api.get("/resource_classes/CUSTOM_OLD").status == 404
    assert api.get("/resource_classes/CUSTOM_NEW").status == 200


def test_rename_keeps_the_class_id_so_inventories_follow(api, app):
    api.post("/resource_classes", json={"name": "CUSTOM_OLD"})
    old_id = class_rows(app)["CUSTOM_OLD"]
    api.put("/resource_classes/CUSTOM_OLD", json={"name": "CUSTOM_NEW"}, version="1.6")
    assert class_rows(app)["CUSTOM_NEW"] == old_id


def test_rename_standard_class_is_400(api):
    resp = api.put("/resource_classes/VCPU", json={"name": "CUSTOM_X"}, version="1.6")
    assert resp.status == 400
    assert "Cannot update standard resource class VCPU" in resp.error()["detail"]
    assert api.get("/resource_classes/VCPU").status == 200


def test_rename_to_existing_name_is_409(api):
    api.post("/resource_classes", json={"name": "CUSTOM_ONE"})
    api.post("/resource_classes", json={"name": "CUSTOM_TWO"})
    resp = api.put("/resource_classes/CUSTOM_TWO", json={"name": "CUSTOM_ONE"}, version="1.6")
    assert resp.status == 409
    assert "Resource class already exists: CUSTOM_ONE" in resp.error()["detail"]
    assert api.get("/resource_classes/CUSTOM_TWO").status == 200


def test_rename_bad_body_or_unknown_class(api):
    api.post("/resource_classes", json={"name": "CUSTOM_ONE"})
    assert api.put("/resource_classes/CUSTOM_ONE", json={"name": "VCPU"}, version="1.6").status == 400
    resp = api.put("/resource_classes/CUSTOM_ONE", json={"name": "CUSTOM_B", "x": 1}, version="1.6")
    assert "Additional properties are not allowed" in resp.error()["detail"]
    resp = api.put("/resource_classes/CUSTOM_ONE", body=b"", version="1.6",
                   headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert "Malformed JSON:" in resp.error()["detail"]
    assert api.put("/resource_classes/CUSTOM_NONE", json={"name": "CUSTOM_B"}, version="1.6").status == 404
    assert api.put("/resource_classes/CUSTOM_ONE", body=b"x", version="1.6",
                   headers={"Content-Type": "text/plain"}).status == 415


def test_rename_to_own_name_is_a_no_op(api):
    api.post("/resource_classes", json={"name": "CUSTOM_SAME"})
    resp = api.put("/resource_classes/CUSTOM_SAME", json={"name": "CUSTOM_SAME"}, version="1.6")
    assert resp.status == 200


# -- PUT from 1.7: ensure --------------------------------------------------------

def test_put_creates_then_confirms(api):
    first = api.put("/resource_classes/CUSTOM_COW", version="1.7")
    assert first.status == 201
    assert first.headers["Location"].endswith("/resource_classes/CUSTOM_COW")
    second = api.put("/resource_classes/CUSTOM_COW", version="1.7")
    assert second.status == 204
    assert second.headers["Location"].endswith("/resource_classes/CUSTOM_COW")
    assert "Last-Modified" not in api.put("/resource_classes/CUSTOM_COW", version="1.15").headers


def test_put_validates_the_name(api):
    for name, message in (("COW", "'COW' does not match '^CUSTOM_[A-Z0-9_]+$'"),  # Placement's text
                          ("VCPU", "Failed validating 'pattern'"),
                          ("CUSTOM_" + "S" * 249, "Failed validating 'maxLength'")):
        resp = api.put(f"/resource_classes/{name}", version="1.7")
        assert resp.status == 400
        assert message in resp.error()["detail"]
    assert len(names(api.get("/resource_classes"))) == STANDARD_COUNT


def test_post_quotes_the_pattern_as_placement_does(api):
    resp = api.post("/resource_classes", json={"name": "CUSTOM_lower"}, version="1.2")
    assert resp.status == 400
    assert ("JSON does not validate: 'CUSTOM_lower' does not match '^CUSTOM_[A-Z0-9_]+$'"
            in resp.error()["detail"])
    assert "'pattern': '^CUSTOM_[A-Z0-9_]+$'" in resp.error()["detail"]


# -- delete ---------------------------------------------------------------------

def test_delete_custom_class(api):
    api.post("/resource_classes", json={"name": "CUSTOM_GONE"})
    resp = api.delete("/resource_classes/CUSTOM_GONE")
    assert resp.status == 204
    assert "Content-Type" not in resp.headers
    assert api.get("/resource_classes/CUSTOM_GONE").status == 404
    assert api.delete("/resource_classes/CUSTOM_GONE").status == 404


def test_delete_standard_class_is_400(api):
    resp = api.delete("/resource_classes/VCPU")
    assert resp.status == 400
    assert ("Error in delete resource class: Cannot delete standard resource class VCPU."
            in resp.error()["detail"])


def _provider_with(app, class_name: str, *, allocated: bool) -> None:
    """A provider with inventory (and maybe an allocation) of ``class_name``, written directly."""
    with app.db.write() as conn:
        class_id = conn.execute(sa.select(tables.resource_classes.c.id)
                                .where(tables.resource_classes.c.name == class_name)).scalar_one()
        rp_id = conn.execute(tables.resource_providers.insert().values(
            uuid=new_uuid(), name="rp-" + new_uuid(), generation=0)).inserted_primary_key[0]
        conn.execute(tables.inventories.insert().values(
            resource_provider_id=rp_id, resource_class_id=class_id, total=5, reserved=0, min_unit=1,
            max_unit=5, step_size=1, allocation_ratio=1.0))
        if allocated:
            conn.execute(tables.allocations.insert().values(
                resource_provider_id=rp_id, consumer_id=new_uuid(), resource_class_id=class_id, used=1))


def test_delete_class_in_use_is_409(api, app):
    api.put("/resource_classes/CUSTOM_GOLD", version="1.7")
    _provider_with(app, "CUSTOM_GOLD", allocated=True)
    resp = api.delete("/resource_classes/CUSTOM_GOLD")
    assert resp.status == 409
    assert "Error in delete resource class" in resp.error()["detail"]
    assert "Class is in use in inventory" in resp.error()["detail"]
    assert api.get("/resource_classes/CUSTOM_GOLD").status == 200
    # Without the allocation the inventory alone still holds it.
    with app.db.write() as conn:
        conn.execute(tables.allocations.delete())
    assert api.delete("/resource_classes/CUSTOM_GOLD").status == 409
    with app.db.write() as conn:
        conn.execute(tables.inventories.delete())
    assert api.delete("/resource_classes/CUSTOM_GOLD").status == 204


def test_delete_class_with_allocations_only_is_409(api, app):
    api.put("/resource_classes/CUSTOM_SILVER", version="1.7")
    _provider_with(app, "CUSTOM_SILVER", allocated=True)
    with app.db.write() as conn:
        conn.execute(tables.inventories.delete())
    assert api.delete("/resource_classes/CUSTOM_SILVER").status == 409


def test_concurrent_creates_all_succeed_with_distinct_ids(api, app):
    """Creators racing for the next custom id re-run their transaction instead of failing."""
    from concurrent.futures import ThreadPoolExecutor

    wanted = [f"CUSTOM_RACE_{n}" for n in range(24)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = list(pool.map(lambda name: api.post("/resource_classes", json={"name": name}).status,
                                 wanted))
    assert statuses == [201] * len(wanted)
    rows = class_rows(app)
    ids = [rows[name] for name in wanted]
    assert len(set(ids)) == len(wanted)
    assert min(ids) >= tables.CUSTOM_RESOURCE_CLASS_MIN_ID


def test_concurrent_ensures_of_one_name_create_it_once(api):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = sorted(pool.map(lambda _: api.put("/resource_classes/CUSTOM_ONCE", version="1.7").status,
                                   range(12)))
    assert statuses == [201] + [204] * 11
