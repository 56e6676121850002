"""POST /reshaper, as the API reference describes it.

The scene of most tests: a compute node with VCPU and VGPU inventory, two
instances each holding VCPU and VGPU on it, and two GPU child providers
without inventory, ready to receive the VGPU.  Providers are written
straight into the tables (only the reshaper, inventory and allocation
endpoints are under test); inventories and allocations go through the API.

Every refused reshape must leave the database exactly as it was: each
error test compares a snapshot of every table it could have touched.
"""

from __future__ import annotations

import copy

import pytest
import sqlalchemy as sa

from allotment.db import tables
from allotment.db.engine import utcnow
from tests.conftest import ApiClient, make_conf, new_uuid

PROJECT, USER = "proj", "user"


class ServiceClient(ApiClient):
    """The admin token with the ``service`` role too: under the new policy
    defaults ``placement:reshaper:reshape`` wants ``role:service``."""

    def request(self, method, path, *, headers=None, **kw):
        return super().request(method, path, headers={"X-Roles": "admin,service", **(headers or {})}, **kw)


@pytest.fixture
def api(app):
    return ServiceClient(app)


# -- seeding and reading helpers ----------------------------------------------


def insert_provider(app, parent: str | None = None) -> str:
    """A provider row (generation 0, no inventory), child of ``parent`` if given."""
    uuid = new_uuid()
    rp = tables.resource_providers
    with app.db.write() as conn:
        parent_row = None
        if parent is not None:
            parent_row = conn.execute(sa.select(rp.c.id, rp.c.root_provider_id)
                                      .where(rp.c.uuid == parent)).one()
        pid = conn.execute(sa.insert(rp).values(
            uuid=uuid, name=f"rp-{uuid}", generation=0, created_at=utcnow(),
            parent_provider_id=parent_row.id if parent_row else None)).inserted_primary_key[0]
        conn.execute(sa.update(rp).where(rp.c.id == pid).values(
            root_provider_id=parent_row.root_provider_id if parent_row else pid))
    return uuid


def put_inventories(api, provider: str, inventories: dict) -> None:
    generation = api.get(f"/resource_providers/{provider}/inventories").json["resource_provider_generation"]
    r = api.put(f"/resource_providers/{provider}/inventories",
                json={"resource_provider_generation": generation, "inventories": inventories})
    assert r.status == 200, r


def allocate(api, consumer: str, allocations: dict, generation=None, **extra) -> None:
    r = api.put(f"/allocations/{consumer}", version="1.38",
                json=consumer_entry(allocations, generation, consumer_type="INSTANCE", **extra))
    assert r.status == 204, r


def consumer_entry(allocations: dict, generation, **extra) -> dict:
    """One consumer in the reshaper's allocations (1.30 form, plus ``extra``)."""
    return {"allocations": {rp: {"resources": resources} for rp, resources in allocations.items()},
            "project_id": PROJECT, "user_id": USER, "consumer_generation": generation, **extra}


def generation(api, provider: str) -> int:
    return api.get(f"/resource_providers/{provider}/inventories").json["resource_provider_generation"]


def inventories(api, provider: str) -> dict:
    return {rc: record["total"] for rc, record in
            api.get(f"/resource_providers/{provider}/inventories").json["inventories"].items()}


def held(api, consumer: str) -> dict:
    """{provider: resources} of a consumer."""
    return {rp: entry["resources"] for rp, entry in
            api.get(f"/allocations/{consumer}").json["allocations"].items()}


def consumer_generation(api, consumer: str):
    return api.get(f"/allocations/{consumer}").json.get("consumer_generation")


def snapshot(app) -> dict:
    """Everything a reshape may change, in comparable form."""
    t = tables
    queries = {
        "providers": sa.select(t.resource_providers.c.uuid, t.resource_providers.c.generation),
        "inventories": sa.select(t.inventories.c.resource_provider_id, t.inventories.c.resource_class_id,
                                 t.inventories.c.total, t.inventories.c.reserved, t.inventories.c.min_unit,
                                 t.inventories.c.max_unit, t.inventories.c.step_size,
                                 t.inventories.c.allocation_ratio),
        "allocations": sa.select(t.allocations.c.resource_provider_id, t.allocations.c.consumer_id,
                                 t.allocations.c.resource_class_id, t.allocations.c.used),
        "consumers": sa.select(t.consumers.c.uuid, t.consumers.c.generation, t.consumers.c.project_id,
                               t.consumers.c.user_id, t.consumers.c.consumer_type_id),
        "projects": sa.select(t.projects.c.external_id),
        "users": sa.select(t.users.c.external_id),
        "consumer_types": sa.select(t.consumer_types.c.name),
    }
    with app.db.read() as conn:
        return {name: sorted(tuple(row) for row in conn.execute(query)) for name, query in queries.items()}


def assert_error(response, status, *fragments, code=None):
    assert response.status == status, response
    error = response.error()
    for fragment in fragments:
        assert fragment in error["detail"], (fragment, error["detail"])
    if code is not None:
        assert error["code"] == code, error


# -- the scene --------------------------------------------------------------------


class Scene:
    """A compute node whose VGPU is about to move to two GPU children."""

    def __init__(self, app, api):
        self.app, self.api = app, api
        self.compute = insert_provider(app)
        self.gpu0 = insert_provider(app, parent=self.compute)
        self.gpu1 = insert_provider(app, parent=self.compute)
        put_inventories(api, self.compute, {"VCPU": {"total": 16}, "VGPU": {"total": 4}})
        self.instances = [new_uuid(), new_uuid()]
        for instance in self.instances:
            allocate(api, instance, {self.compute: {"VCPU": 2, "VGPU": 2}})

    def payload(self) -> dict:
        """The reshape that moves VGPU to one child per instance (valid now)."""
        api = self.api
        return {
            "inventories": {
                self.compute: {"resource_provider_generation": generation(api, self.compute),
                               "inventories": {"VCPU": {"total": 16}}},
                self.gpu0: {"resource_provider_generation": generation(api, self.gpu0),
                            "inventories": {"VGPU": {"total": 2}}},
                self.gpu1: {"resource_provider_generation": generation(api, self.gpu1),
                            "inventories": {"VGPU": {"total": 2}}},
            },
            "allocations": {
                instance: consumer_entry({self.compute: {"VCPU": 2}, gpu: {"VGPU": 2}},
                                         consumer_generation(api, instance))
                for instance, gpu in zip(self.instances, (self.gpu0, self.gpu1))
            },
        }


@pytest.fixture
def scene(app, api):
    api.version = "1.30"
    return Scene(app, api)


# -- success --------------------------------------------------------------------


def test_moves_inventory_and_allocations_to_children(api, scene):
    compute, gpu0, gpu1 = scene.compute, scene.gpu0, scene.gpu1
    r = api.post("/reshaper", json=scene.payload())
    assert r.status == 204, r
    assert r.text == ""
    assert "content-type" not in r.headers
    assert inventories(api, compute) == {"VCPU": 16}
    assert inventories(api, gpu0) == {"VGPU": 2}
    assert inventories(api, gpu1) == {"VGPU": 2}
    assert held(api, scene.instances[0]) == {compute: {"VCPU": 2}, gpu0: {"VGPU": 2}}
    assert held(api, scene.instances[1]) == {compute: {"VCPU": 2}, gpu1: {"VGPU": 2}}
    assert api.get(f"/resource_providers/{compute}/usages").json["usages"] == {"VCPU": 4}
    assert api.get(f"/resource_providers/{gpu0}/usages").json["usages"] == {"VGPU": 2}
    # Each consumer was rewritten once.
    assert [consumer_generation(api, c) for c in scene.instances] == [2, 2]


def test_generations_advance_as_placement_advances_them(api, scene):
    """A non-empty new inventory counts two writes, an emptied one one, and
    the allocation writer adds one to every provider it allocates from (or
    that an emptied consumer leaves), as Placement does."""
    before = {rp: generation(api, rp) for rp in (scene.compute, scene.gpu0, scene.gpu1)}
    assert api.post("/reshaper", json=scene.payload()).status == 204
    assert generation(api, scene.compute) == before[scene.compute] + 3
    assert generation(api, scene.gpu0) == before[scene.gpu0] + 3
    # Move everything back; gpu1 is emptied, and its only consumer goes away.
    gen = {rp: generation(api, rp) for rp in (scene.compute, scene.gpu0, scene.gpu1)}
    payload = {
        "inventories": {
            scene.compute: {"resource_provider_generation": gen[scene.compute],
                            "inventories": {"VCPU": {"total": 16}, "VGPU": {"total": 4}}},
            scene.gpu1: {"resource_provider_generation": gen[scene.gpu1], "inventories": {}},
        },
        "allocations": {
            scene.instances[1]: consumer_entry({}, consumer_generation(api, scene.instances[1])),
        },
    }
    # gpu0 still holds instance 0's VGPU: give it its inventory back too.
    payload["inventories"][scene.gpu0] = {"resource_provider_generation": gen[scene.gpu0],
                                          "inventories": {"VGPU": {"total": 2}}}
    r = api.post("/reshaper", json=payload)
    assert r.status == 204, r
    # Two inventory writes, and one release: the emptied consumer left it.
    assert generation(api, scene.compute) == gen[scene.compute] + 3
    assert generation(api, scene.gpu1) == gen[scene.gpu1] + 2  # one write, one release
    assert generation(api, scene.gpu0) == gen[scene.gpu0] + 2
    # A consumer left with no allocations has no record any more.
    assert api.get(f"/allocations/{scene.instances[1]}").json == {"allocations": {}}


def test_intermediate_states_are_not_checked(api, scene):
    """Two full children swap their consumers: done one by one, each move
    would overfill the other child; as one reshape it is fine."""
    assert api.post("/reshaper", json=scene.payload()).status == 204
    first, second = scene.instances
    payload = scene.payload()
    payload["allocations"][first]["allocations"] = {scene.compute: {"resources": {"VCPU": 2}},
                                                    scene.gpu1: {"resources": {"VGPU": 2}}}
    payload["allocations"][second]["allocations"] = {scene.compute: {"resources": {"VCPU": 2}},
                                                     scene.gpu0: {"resources": {"VGPU": 2}}}
    r = api.post("/reshaper", json=payload)
    assert r.status == 204, r
    assert held(api, first)[scene.gpu1] == {"VGPU": 2}
    assert held(api, second)[scene.gpu0] == {"VGPU": 2}


def test_inventory_only_reshape(api, app):
    provider = insert_provider(app)
    r = api.post("/reshaper", version="1.30", json={
        "inventories": {provider: {"resource_provider_generation": 0,
                                   "inventories": {"DISK_GB": {"total": 100, "reserved": 100}}}},
        "allocations": {}})
    assert r.status == 204, r
    assert inventories(api, provider) == {"DISK_GB": 100}


def test_a_reshape_may_leave_a_provider_over_capacity_but_not_more_so(api, app):
    # As Placement: lowering the inventory under its usage while rewriting
    # the consumer with the same (or a smaller) amount is accepted; an
    # amount larger than before on the over-capacity provider is not.
    provider = insert_provider(app)
    put_inventories(api, provider, {"VCPU": {"total": 8}})
    consumer = new_uuid()
    allocate(api, consumer, {provider: {"VCPU": 6}})
    lowered = {provider: {"resource_provider_generation": generation(api, provider),
                          "inventories": {"VCPU": {"total": 4}}}}
    r = api.post("/reshaper", version="1.30", json={
        "inventories": lowered, "allocations": {consumer: consumer_entry({provider: {"VCPU": 6}}, 1)}})
    assert r.status == 204, r
    lowered[provider]["resource_provider_generation"] = generation(api, provider)
    r = api.post("/reshaper", version="1.30", json={
        "inventories": lowered, "allocations": {consumer: consumer_entry({provider: {"VCPU": 7}}, 2)}})
    assert_error(r, 409, "would exceed the capacity")
    assert held(api, consumer) == {provider: {"VCPU": 6}}


def test_new_consumers_are_created(api, scene):
    payload = scene.payload()
    newcomer = new_uuid()
    payload["allocations"][newcomer] = consumer_entry({scene.compute: {"VCPU": 1}}, None)
    assert api.post("/reshaper", json=payload).status == 204
    assert held(api, newcomer) == {scene.compute: {"VCPU": 1}}
    assert consumer_generation(api, newcomer) == 1


def test_mappings_accepted_from_1_34(api, scene):
    payload = scene.payload()
    instance = scene.instances[0]
    payload["allocations"][instance]["mappings"] = {"": [scene.compute], "_GPU": [scene.gpu0]}
    assert_error(api.post("/reshaper", version="1.33", json=payload), 400,
                 "Additional properties are not allowed")
    assert api.post("/reshaper", version="1.34", json=payload).status == 204


def test_consumer_type_from_1_38(api, scene):
    payload = scene.payload()
    for entry in payload["allocations"].values():
        entry["consumer_type"] = "RESHAPED"
    assert_error(api.post("/reshaper", version="1.37", json=payload), 400,
                 "Additional properties are not allowed", "'consumer_type' was unexpected")
    untyped = scene.payload()
    assert_error(api.post("/reshaper", version="1.38", json=untyped), 400,
                 "'consumer_type' is a required property")
    assert api.post("/reshaper", version="1.38", json=payload).status == 204
    shown = api.get(f"/allocations/{scene.instances[0]}", version="1.38").json
    assert shown["consumer_type"] == "RESHAPED"


def test_before_1_38_consumers_keep_their_type(api, scene):
    assert api.post("/reshaper", version="1.30", json=scene.payload()).status == 204
    shown = api.get(f"/allocations/{scene.instances[0]}", version="1.38").json
    assert shown["consumer_type"] == "INSTANCE"


# -- routing and policy ---------------------------------------------------------


def test_only_post(api):
    r = api.get("/reshaper")
    assert r.status == 405
    assert r.headers["allow"] == "POST"


def test_absent_before_1_30(api, scene):
    assert api.post("/reshaper", version="1.29", json=scene.payload()).status == 404


@pytest.mark.parametrize("token,roles", [("user", None), ("user", "member,reader"), ("admin", "admin")])
def test_needs_the_service_role_under_new_defaults(app, api, scene, token, roles):
    before = snapshot(app)
    r = api.post("/reshaper", json=scene.payload(), token=token, headers={"X-Roles": roles})
    assert r.status == 403
    assert "placement:reshaper:reshape" in r.error()["detail"]
    assert snapshot(app) == before


def test_service_role_alone_may_reshape(api, scene):
    assert api.post("/reshaper", json=scene.payload(), token="nova", headers={"X-Roles": "service"}).status == 204


def test_admin_may_reshape_under_legacy_defaults(app, db_url, scene):
    from allotment.api.app import Application

    legacy = Application(make_conf(db_url, oslo_policy__enforce_new_defaults=False), app.db)
    client = ApiClient(legacy, version="1.30")
    assert client.post("/reshaper", json=scene.payload(), headers={"X-Roles": "member"},
                       token="user").status == 403
    assert client.post("/reshaper", json=scene.payload()).status == 204


def test_needs_json_content_type(api):
    r = api.post("/reshaper", body=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status == 415


# -- malformed bodies -------------------------------------------------------------


def _mangle(payload: dict, path: tuple, value) -> dict:
    payload = copy.deepcopy(payload)
    target = payload
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return payload


BAD_BODIES = [
    # (how to spoil scene.payload(), fragment of the 400's detail)
    (lambda s, p: {"cows": "moo"}, "JSON does not validate"),
    (lambda s, p: {"inventories": p["inventories"]}, "'allocations' is a required property"),
    (lambda s, p: {"allocations": {}}, "'inventories' is a required property"),
    (lambda s, p: {**p, "inventories": {}}, "should be non-empty"),
    (lambda s, p: {**p, "extra": 1}, "Additional properties are not allowed"),
    (lambda s, p: {**p, "inventories": {"not-a-uuid": p["inventories"][s.compute]}},
     "does not match any of the regexes"),
    (lambda s, p: _mangle(p, ("inventories", s.compute, "inventories", "VCPU", "bad_field"), "moo"),
     "'bad_field' was unexpected"),
    (lambda s, p: _mangle(p, ("inventories", s.compute, "resource_provider_generation"), "1"),
     "'1' is not of type 'integer'"),
    (lambda s, p: _mangle(p, ("inventories", s.compute, "inventories", "VCPU", "total"), 0),
     "0 is less than the minimum of 1"),
    (lambda s, p: _mangle(p, ("inventories", s.compute, "inventories", "VCPU", "total"), 2 ** 31),
     "is greater than the maximum of 2147483647"),
    (lambda s, p: _mangle(p, ("inventories", s.compute, "inventories"), []), "is not of type 'object'"),
    (lambda s, p: _mangle(p, ("allocations", s.instances[0], "bad_field"), "moo"),
     "'bad_field' was unexpected"),
    (lambda s, p: _mangle(p, ("allocations", s.instances[0], "project_id"), "x" * 256), "is too long"),
    (lambda s, p: _mangle(p, ("allocations", s.instances[0], "user_id"), ""), "should be non-empty"),
    (lambda s, p: {**p, "allocations": {s.instances[0]: {
        k: v for k, v in p["allocations"][s.instances[0]].items() if k != "consumer_generation"}}},
     "'consumer_generation' is a required property"),
    (lambda s, p: _mangle(p, ("allocations", s.instances[0], "allocations", s.compute, "resources", "VCPU"), 0),
     "0 is less than the minimum of 1"),
    (lambda s, p: _mangle(p, ("allocations", s.instances[0], "allocations", s.compute, "resources"), {}),
     "should be non-empty"),
    (lambda s, p: {**p, "allocations": {"nope": p["allocations"][s.instances[0]]}},
     "does not match any of the regexes"),
]


@pytest.mark.parametrize("spoil,fragment", BAD_BODIES)
def test_malformed_body_is_400_and_changes_nothing(app, api, scene, spoil, fragment):
    payload = spoil(scene, scene.payload())
    before = snapshot(app)
    r = api.post("/reshaper", json=payload)
    assert_error(r, 400, "JSON does not validate", fragment)
    assert snapshot(app) == before


def test_malformed_json_is_400(app, api, scene):
    before = snapshot(app)
    r = api.post("/reshaper", body=b'{"inventories": ', headers={"Content-Type": "application/json"})
    assert_error(r, 400, "Malformed JSON")
    assert snapshot(app) == before


def test_malformed_consumer_uuid_is_400(app, api, scene):
    payload = scene.payload()
    payload["allocations"]["-" * 36] = payload["allocations"].pop(scene.instances[0])
    before = snapshot(app)
    assert_error(api.post("/reshaper", json=payload), 400, "Malformed consumer_uuid")
    assert snapshot(app) == before


# -- refused reshapes change nothing ---------------------------------------------


def _refused(app, api, payload, status, *fragments, code=None, version=None):
    before = snapshot(app)
    r = api.post("/reshaper", json=payload, version=version)
    assert_error(r, status, *fragments, code=code)
    assert snapshot(app) == before
    return r


def test_unknown_provider_in_inventories_is_400(app, api, scene):
    payload = scene.payload()
    missing = new_uuid()
    payload["inventories"][missing] = {"resource_provider_generation": 0,
                                       "inventories": {"VGPU": {"total": 1}}}
    _refused(app, api, payload, 400, f"Resource provider {missing} in inventories not found",
             code="placement.resource_provider.not_found", version="1.30")


def test_unknown_provider_in_allocations_is_400(app, api, scene):
    # Placement words it as POST /allocations does, without a specific code.
    payload = scene.payload()
    missing = new_uuid()
    payload["allocations"][scene.instances[0]]["allocations"][missing] = {"resources": {"VCPU": 1}}
    _refused(app, api, payload, 400, f"Allocation for resource provider '{missing}' that does not exist.",
             code="placement.undefined_code", version="1.30")


def test_unknown_provider_in_allocations_keeps_the_new_consumers(api, scene):
    """As POST /allocations: Placement records new consumers before it looks
    the providers up, and this refusal leaves them (generation 0)."""
    payload = scene.payload()
    newcomer = new_uuid()
    payload["allocations"][newcomer] = consumer_entry({new_uuid(): {"VCPU": 1}}, None)
    assert_error(api.post("/reshaper", json=payload), 400, "that does not exist")
    r = api.put(f"/allocations/{newcomer}", version="1.30",
                json=consumer_entry({scene.compute: {"VCPU": 1}}, None))
    assert_error(r, 409, "consumer generation conflict - expected 0 but got None",
                 code="placement.concurrent_update")
    r = api.put(f"/allocations/{newcomer}", version="1.30",
                json=consumer_entry({scene.compute: {"VCPU": 1}}, 0))
    assert r.status == 204, r


def test_unknown_resource_class_is_400(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.compute]["inventories"]["DISK_OF_STEEL"] = {"total": 1}
    _refused(app, api, payload, 400, "No such resource class DISK_OF_STEEL")


def test_lower_case_resource_class_is_unknown(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.compute]["inventories"]["vcpu"] = {"total": 1}
    _refused(app, api, payload, 400, "malformed reshaper data: No such resource class vcpu.")


def test_unknown_resource_class_in_allocations_is_400(app, api, scene):
    payload = scene.payload()
    payload["allocations"][scene.instances[0]]["allocations"][scene.compute]["resources"]["CUSTOM_NOPE"] = 1
    _refused(app, api, payload, 400, "No such resource class CUSTOM_NOPE")


def test_stale_provider_generation_is_409(app, api, scene):
    payload = scene.payload()
    actual = payload["inventories"][scene.gpu1]["resource_provider_generation"]
    payload["inventories"][scene.gpu1]["resource_provider_generation"] = actual + 7
    _refused(app, api, payload, 409, "resource provider generation conflict",
             f"actual: {actual}, given: {actual + 7}", code="placement.concurrent_update",
             version="1.30")


def test_stale_consumer_generation_is_409(app, api, scene):
    payload = scene.payload()
    payload["allocations"][scene.instances[1]]["consumer_generation"] = 99
    _refused(app, api, payload, 409, "consumer generation conflict - expected 1 but got 99",
             code="placement.concurrent_update", version="1.30")


def test_new_consumer_with_a_generation_is_409(app, api, scene):
    payload = scene.payload()
    payload["allocations"][new_uuid()] = consumer_entry({scene.compute: {"VCPU": 1}}, 3)
    _refused(app, api, payload, 409, "consumer generation conflict - expected null but got 3",
             code="placement.concurrent_update", version="1.30")


def test_inventory_left_in_use_is_409(app, api, scene):
    """The VGPU leaves the compute node but its allocations are not moved."""
    payload = scene.payload()
    payload["allocations"] = {}
    _refused(app, api, payload, 409, "update conflict: Inventory for 'VGPU' on resource provider "
             f"'{scene.compute}' in use.", code="placement.inventory.inuse", version="1.30")


def test_allocations_rewritten_in_place_on_removed_inventory_are_in_use(app, api, scene):
    """Nova's case: the consumers are listed with the allocations they hold,
    unchanged, while the inventory under them goes away.  They fit the
    inventory as it was, so the answer is the in-use code nova looks for,
    not a capacity error."""
    payload = scene.payload()
    for instance in scene.instances:
        payload["allocations"][instance] = consumer_entry({scene.compute: {"VCPU": 2, "VGPU": 2}},
                                                          consumer_generation(api, instance))
    _refused(app, api, payload, 409, "update conflict: Inventory for 'VGPU' on resource provider "
             f"'{scene.compute}' in use.", code="placement.inventory.inuse", version="1.30")


def test_allocations_on_an_emptied_provider_are_in_use(app, api, scene):
    """A child emptied of inventory while its consumer keeps its allocations
    there; the classes are listed in class-id order."""
    assert api.post("/reshaper", json=scene.payload()).status == 204
    put_inventories(api, scene.compute, {"VCPU": {"total": 16}, "MEMORY_MB": {"total": 4096}})
    instance = scene.instances[0]
    allocate(api, instance, {scene.compute: {"VCPU": 2}, scene.gpu0: {"VGPU": 2}},
             generation=consumer_generation(api, instance))
    payload = {
        "inventories": {scene.gpu0: {"resource_provider_generation": generation(api, scene.gpu0),
                                     "inventories": {}}},
        "allocations": {instance: consumer_entry({scene.compute: {"VCPU": 2}, scene.gpu0: {"VGPU": 2}},
                                                 consumer_generation(api, instance))},
    }
    _refused(app, api, payload, 409, f"Inventory for 'VGPU' on resource provider '{scene.gpu0}' in use.",
             code="placement.inventory.inuse", version="1.30")


def test_allocation_moved_onto_a_class_going_away_is_in_use(app, api, scene):
    """A new allocation of a class the same reshape removes fits the old
    record, so the refusal is the in-use one."""
    payload = scene.payload()
    newcomer = new_uuid()
    payload["allocations"][newcomer] = consumer_entry({scene.compute: {"VGPU": 1}}, None)
    # VGPU leaves the compute node (payload), yet the newcomer asks for it there.
    _refused(app, api, payload, 409, f"Inventory for 'VGPU' on resource provider '{scene.compute}' in use.",
             code="placement.inventory.inuse", version="1.30")


def test_in_use_names_the_first_provider_of_the_body(app, api, scene):
    """Two providers left in use: the error names the one listed first."""
    assert api.post("/reshaper", json=scene.payload()).status == 204
    for first, second in ((scene.gpu1, scene.compute), (scene.compute, scene.gpu1)):
        payload = {"inventories": {
            first: {"resource_provider_generation": generation(api, first), "inventories": {}},
            second: {"resource_provider_generation": generation(api, second), "inventories": {}},
        }, "allocations": {}}
        held_classes = "VGPU" if first == scene.gpu1 else "VCPU"
        _refused(app, api, payload, 409, f"Inventory for '{held_classes}' on resource provider '{first}' in use.",
                 code="placement.inventory.inuse", version="1.30")


def test_capacity_of_an_emptied_provider_is_judged_on_its_old_inventory(app, api, scene):
    """A provider emptied by the reshape still has its old records when the
    allocations are checked: more than they hold is a capacity error."""
    payload = {
        "inventories": {scene.compute: {"resource_provider_generation": generation(api, scene.compute),
                                        "inventories": {}}},
        "allocations": {scene.instances[0]: consumer_entry(
            {scene.compute: {"VCPU": 2, "VGPU": 3}}, consumer_generation(api, scene.instances[0]))},
    }
    _refused(app, api, payload, 409, "Unable to allocate inventory: Unable to create allocation for 'VGPU' "
             f"on resource provider '{scene.compute}'. The requested amount would exceed the capacity.",
             code="placement.undefined_code", version="1.30")


def test_consumer_generations_are_checked_before_inventory_classes(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.gpu0]["inventories"]["CUSTOM_NOT_THERE"] = {"total": 1}
    payload["allocations"][scene.instances[1]]["consumer_generation"] = 99
    _refused(app, api, payload, 409, "consumer generation conflict - expected 1 but got 99",
             code="placement.concurrent_update", version="1.30")


def test_allocation_providers_are_checked_before_inventory_classes(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.gpu0]["inventories"]["CUSTOM_NOT_THERE"] = {"total": 1}
    missing = new_uuid()
    payload["allocations"][scene.instances[0]]["allocations"][missing] = {"resources": {"VCPU": 1}}
    _refused(app, api, payload, 400, f"Allocation for resource provider '{missing}' that does not exist.",
             version="1.30")


def test_inventory_classes_are_checked_before_allocation_classes(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.gpu0]["inventories"]["CUSTOM_NOT_THERE"] = {"total": 1}
    payload["allocations"][scene.instances[0]]["allocations"][scene.gpu0]["resources"]["CUSTOM_NOR_THIS"] = 1
    _refused(app, api, payload, 400, "malformed reshaper data: No such resource class CUSTOM_NOT_THERE.",
             version="1.30")


def test_allocations_over_capacity_is_409(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.gpu0]["inventories"]["VGPU"]["total"] = 1
    _refused(app, api, payload, 409, "Unable to allocate inventory",
             f"Unable to create allocation for 'VGPU' on resource provider '{scene.gpu0}'. "
             "The requested amount would exceed the capacity.")


def test_allocation_violating_max_unit_is_409(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.gpu1]["inventories"]["VGPU"]["max_unit"] = 1
    _refused(app, api, payload, 409, "Unable to allocate inventory", "would violate inventory constraints")


def test_allocation_on_class_without_inventory_is_409(app, api, scene):
    payload = scene.payload()
    payload["inventories"][scene.gpu1]["inventories"] = {"VCPU": {"total": 2}}
    _refused(app, api, payload, 409, "Unable to allocate inventory",
             f"Inventory for 'VGPU' on resource provider '{scene.gpu1}' invalid.")


def test_reserved_above_total_leaves_no_room(app, api, scene):
    """Unlike PUT .../inventories, Placement's reshaper takes a record whose
    reserved amount exceeds its total; nothing can be allocated from it."""
    payload = scene.payload()
    payload["inventories"][scene.gpu1]["inventories"]["VGPU"]["reserved"] = 3
    _refused(app, api, payload, 409, "Unable to allocate inventory: Unable to create allocation for 'VGPU' "
             f"on resource provider '{scene.gpu1}'. The requested amount would exceed the capacity.")
    del payload["allocations"][scene.instances[1]]
    payload["inventories"][scene.compute]["inventories"]["VGPU"] = {"total": 4}
    r = api.post("/reshaper", json=payload)
    assert r.status == 204, r
    record = api.get(f"/resource_providers/{scene.gpu1}/inventories/VGPU").json
    assert (record["total"], record["reserved"]) == (2, 3)
    r = api.get("/allocation_candidates?resources=VGPU:1", version="1.30")
    assert r.status == 200, r
    assert all(scene.gpu1 not in candidate["allocations"] for candidate in r.json["allocation_requests"])
    # Shown as Placement shows it: a negative capacity.
    assert r.json["provider_summaries"][scene.gpu1]["resources"]["VGPU"] == {"capacity": -1, "used": 0}


def test_failure_after_everything_was_written_changes_nothing(app, api, scene):
    """Inventories replaced, consumers (one new, with a new project, user and
    type) written, then the last check fails: all of it is rolled back."""
    payload = scene.payload()
    newcomer = new_uuid()
    payload["allocations"][newcomer] = consumer_entry({scene.gpu1: {"VGPU": 1}}, None,
                                                      consumer_type="BRAND_NEW")
    payload["allocations"][newcomer]["project_id"] = "another-project"
    payload["allocations"][newcomer]["user_id"] = "another-user"
    for entry in payload["allocations"].values():
        entry.setdefault("consumer_type", "INSTANCE")
    _refused(app, api, payload, 409, "The requested amount would exceed the capacity",
             version="1.38")
    # And the same reshape without the newcomer goes through afterwards.
    del payload["allocations"][newcomer]
    assert api.post("/reshaper", json=payload, version="1.38").status == 204
