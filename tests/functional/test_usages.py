"""GET /resource_providers/{uuid}/usages and GET /usages (1.9, types 1.38)."""

from __future__ import annotations

import pytest

from tests.conftest import ApiClient, new_uuid
from tests.functional.test_allocations import body, claim, seed_legacy_allocation, seed_provider


def put(api, consumer, allocations, *, project="proj", user="user", consumer_type=None, version="1.28"):
    extra = {"consumer_type": consumer_type} if consumer_type else {}
    r = api.put(f"/allocations/{consumer}", version=version,
                json=body(allocations, project=project, user=user, **extra))
    assert r.status == 204, r


# -- per provider ------------------------------------------------------------


def test_provider_usages_unknown_provider_is_404(api):
    missing = new_uuid()
    r = api.get(f"/resource_providers/{missing}/usages")
    assert r.status == 404
    # Placement says it twice: its own message, then the lookup's.
    found = f"No resource provider with uuid {missing} found"
    assert r.error()["detail"].endswith(f"{found}: {found}")


def test_provider_usages_list_every_inventory_class(api, app):
    assert api.get(f"/resource_providers/{seed_provider(app)}/usages").json == {
        "resource_provider_generation": 0, "usages": {}}
    rp = seed_provider(app, {"VCPU": 8, "DISK_GB": 100})
    assert api.get(f"/resource_providers/{rp}/usages").json["usages"] == {"VCPU": 0, "DISK_GB": 0}
    put(api, new_uuid(), claim(rp, VCPU=2))
    put(api, new_uuid(), claim(rp, VCPU=3, DISK_GB=10))
    r = api.get(f"/resource_providers/{rp}/usages")
    assert r.json == {"resource_provider_generation": 2, "usages": {"VCPU": 5, "DISK_GB": 10}}


def test_provider_usages_cache_headers_from_1_15(api, app):
    rp = seed_provider(app)
    assert "cache-control" not in api.get(f"/resource_providers/{rp}/usages", version="1.14").headers
    r = api.get(f"/resource_providers/{rp}/usages", version="1.15")
    assert r.headers["cache-control"] == "no-cache" and r.headers["last-modified"].endswith(" GMT")


# -- per project and user ------------------------------------------------------


def test_total_usages_appear_in_1_9(api):
    assert api.get("/usages?project_id=p", version="1.8").status == 404
    assert api.get("/usages?project_id=p", version="1.9").json == {"usages": {}}


@pytest.mark.parametrize("query,expected", [
    ("", "'project_id' is a required property"),
    ("?project_id=", "Failed validating 'minLength'"),
    ("?project_id=p&user_id=", "Failed validating 'minLength'"),
    ("?project_id=" + "x" * 256, "Failed validating 'maxLength'"),
    ("?project_id=p&dummy=1", "Additional properties are not allowed"),
    ("?project_id=p&consumer_type=PONY", "Additional properties are not allowed"),
])
def test_total_usages_refuse_bad_queries(api, query, expected):
    r = api.get("/usages" + query, version="1.9")
    assert r.status == 400
    assert "Invalid query string parameters" in r.error()["detail"]
    assert expected in r.error()["detail"]


def test_total_usages_sum_a_project_and_a_user(api, app):
    a = seed_provider(app, {"VCPU": 16, "DISK_GB": 2048})
    b = seed_provider(app, {"VCPU": 16})
    put(api, new_uuid(), {**claim(a, VCPU=2, DISK_GB=1000), **claim(b, VCPU=4)})
    put(api, new_uuid(), claim(a, VCPU=1, DISK_GB=20), user="alt")
    put(api, new_uuid(), claim(b, VCPU=8), project="other")
    seed_legacy_allocation(app, a, new_uuid(), {"VCPU": 1})  # no consumer record: no project
    assert api.get("/usages?project_id=proj", version="1.9").json == {"usages": {"VCPU": 7, "DISK_GB": 1020}}
    assert api.get("/usages?project_id=proj&user_id=user", version="1.9").json["usages"] == {
        "VCPU": 6, "DISK_GB": 1000}
    assert api.get("/usages?project_id=proj&user_id=alt").json["usages"] == {
        "unknown": {"VCPU": 1, "DISK_GB": 20, "consumer_count": 1}}
    r = api.get("/usages?project_id=other", version="1.14")
    assert r.json["usages"] == {"VCPU": 8}
    assert "last-modified" not in r.headers
    assert api.get("/usages?project_id=other", version="1.15").headers["cache-control"] == "no-cache"


def test_total_usages_by_consumer_type(api, app):
    rp = seed_provider(app, {"VCPU": 16, "DISK_GB": 2048})
    put(api, new_uuid(), claim(rp, DISK_GB=10), consumer_type="PONY", version="1.38")
    put(api, new_uuid(), claim(rp, DISK_GB=10, VCPU=1), consumer_type="INSTANCE", version="1.38")
    put(api, new_uuid(), claim(rp, DISK_GB=5, VCPU=2), consumer_type="INSTANCE", version="1.38")
    put(api, new_uuid(), claim(rp, VCPU=3))
    get = lambda query: api.get(f"/usages?project_id=proj{query}", version="1.38").json["usages"]  # noqa: E731
    assert get("") == {"PONY": {"DISK_GB": 10, "consumer_count": 1},
                       "INSTANCE": {"DISK_GB": 15, "VCPU": 3, "consumer_count": 2},
                       "unknown": {"VCPU": 3, "consumer_count": 1}}
    assert get("&consumer_type=INSTANCE") == {"INSTANCE": {"DISK_GB": 15, "VCPU": 3, "consumer_count": 2}}
    assert get("&consumer_type=all") == {"all": {"DISK_GB": 25, "VCPU": 6, "consumer_count": 4}}
    assert get("&consumer_type=unknown") == {"unknown": {"VCPU": 3, "consumer_count": 1}}
    assert get("&consumer_type=COW") == {}
    assert get("&consumer_type=ALL") == {}
    assert get("&consumer_type=UNKNOWN") == {}
    assert api.get("/usages?project_id=nobody&consumer_type=all", version="1.38").json == {"usages": {}}
    r = api.get("/usages?project_id=proj&consumer_type=pony", version="1.38")
    assert r.status == 400


# -- policy: a reader sees their own project only ----------------------------


@pytest.fixture
def secure_api(app):
    app.conf.set_override("enforce_new_defaults", True, group="oslo_policy")
    from allotment.api import policy

    app.enforcer = policy.make_enforcer(app.conf)
    return ApiClient(app)


def _as(role: str, project: str) -> dict:
    return {"X-Roles": role, "X-Project-Id": project}


def test_readers_see_their_own_project_only(secure_api):
    own = secure_api.get("/usages?project_id=mine", token="user", headers=_as("reader", "mine"))
    assert own.status == 200
    other = secure_api.get("/usages?project_id=theirs", token="user", headers=_as("member,reader", "mine"))
    assert other.status == 403
    admin = secure_api.get("/usages?project_id=theirs", token="user", headers=_as("admin", "mine"))
    assert admin.status == 200
    system = secure_api.get("/usages?project_id=mine", token="user",
                            headers={"X-Roles": "admin", "OpenStack-System-Scope": "all"})
    assert system.status == 403
    assert secure_api.get(f"/resource_providers/{new_uuid()}/usages", token="user",
                          headers=_as("member,reader", "mine")).status == 403
