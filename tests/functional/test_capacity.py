"""The capacity view's JSON (``/allotment/capacity...``) and page files (``/allotment/ui``).

Every figure is checked against what Placement's own routes answer for the
same cloud (inventories, usages, allocations, ``GET /usages``), never
against numbers written here.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.browser.cloud import InProcess, seed
from tests.conftest import ApiClient, make_conf


@pytest.fixture
def cloud(api):
    return seed(InProcess(api))


def _providers(api) -> list[dict]:
    return api.get("/resource_providers").json["resource_providers"]


def _capacity(inv: dict) -> int:
    return int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])


def _sums_from_placement(api, providers) -> dict:
    sums: dict = defaultdict(lambda: {"total": 0, "reserved": 0, "capacity": 0, "used": 0})
    for rp in providers:
        inventories = api.get(f"/resource_providers/{rp['uuid']}/inventories").json["inventories"]
        usages = api.get(f"/resource_providers/{rp['uuid']}/usages").json["usages"]
        for rc, inv in inventories.items():
            sums[rc]["total"] += inv["total"]
            sums[rc]["reserved"] += inv["reserved"]
            sums[rc]["capacity"] += _capacity(inv)
            sums[rc]["used"] += usages.get(rc, 0)
    return {rc: dict(found, free=found["capacity"] - found["used"]) for rc, found in sums.items()}


def _consumers_on(api, providers) -> set[str]:
    found = set()
    for rp in providers:
        found |= set(api.get(f"/resource_providers/{rp['uuid']}/allocations").json["allocations"])
    return found


def _tree_members(api, roots) -> list[dict]:
    found = {}
    for root in roots:
        for rp in api.get(f"/resource_providers?in_tree={root}").json["resource_providers"]:
            found[rp["uuid"]] = rp
    return list(found.values())


# -- overview ---------------------------------------------------------------

def test_overview_sums_the_whole_cloud_as_placement_reports_it(api, cloud):
    providers = _providers(api)
    body = api.get("/allotment/capacity").json
    assert {row.pop("resource_class"): row for row in body["resource_classes"]} == _sums_from_placement(api, providers)
    assert body["providers"] == len(providers)
    assert body["roots"] == sum(1 for rp in providers if rp["root_provider_uuid"] == rp["uuid"])
    assert body["consumers"] == len(_consumers_on(api, providers))
    members = defaultdict(int)
    for rp in providers:
        for aggregate in api.get(f"/resource_providers/{rp['uuid']}/aggregates").json["aggregates"]:
            members[aggregate] += 1
    assert {a["uuid"]: a["providers"] for a in body["aggregates"]} == dict(members)
    assert {t["name"]: t["providers"] for t in body["traits"]}["CUSTOM_GOLD"] == len(
        api.get("/resource_providers?required=CUSTOM_GOLD").json["resource_providers"])


def test_overview_filtered_by_aggregate_covers_members_and_their_trees(api, cloud):
    aggregate = cloud["aggregates"]["rack-b"]
    members = api.get(f"/resource_providers?member_of={aggregate}").json["resource_providers"]
    selected = _tree_members(api, {rp["root_provider_uuid"] for rp in members if rp["root_provider_uuid"] == rp["uuid"]})
    selected += [rp for rp in members if rp["uuid"] not in {s["uuid"] for s in selected}]
    body = api.get(f"/allotment/capacity?member_of={aggregate}").json
    assert body["filter"] == {"member_of": aggregate, "trait": None}
    assert body["providers"] == len(selected)
    assert {row.pop("resource_class"): row for row in body["resource_classes"]} == _sums_from_placement(api, selected)
    assert body["consumers"] == len(_consumers_on(api, selected))


def test_overview_filtered_by_trait_and_aggregate_together(api, cloud):
    aggregate = cloud["aggregates"]["rack-a"]
    holders = api.get("/resource_providers?required=CUSTOM_GOLD").json["resource_providers"]
    in_rack = {rp["uuid"] for rp in api.get(f"/resource_providers?member_of={aggregate}").json["resource_providers"]}
    roots = {rp["root_provider_uuid"] for rp in holders}
    candidates = _tree_members(api, roots)
    holder_ids = {rp["uuid"] for rp in holders}
    selected = [rp for rp in candidates
                if (rp["uuid"] in holder_ids or rp["root_provider_uuid"] in holder_ids)
                and (rp["uuid"] in in_rack or rp["root_provider_uuid"] in in_rack)]
    body = api.get(f"/allotment/capacity?member_of={aggregate}&trait=CUSTOM_GOLD").json
    assert body["providers"] == len(selected) > 0
    assert {row.pop("resource_class"): row for row in body["resource_classes"]} == _sums_from_placement(api, selected)


def test_overview_of_an_unknown_aggregate_or_trait_is_empty(api, cloud):
    body = api.get("/allotment/capacity?member_of=7d1e3c6c-8c86-4f4b-a4c1-1f0f0e0f0e0f&trait=CUSTOM_NOPE").json
    assert (body["providers"], body["roots"], body["consumers"], body["resource_classes"]) == (0, 0, 0, [])


# -- trees ------------------------------------------------------------------

def test_trees_page_by_name_with_every_provider_parents_first(api, cloud):
    providers = _providers(api)
    roots = sorted((rp for rp in providers if rp["root_provider_uuid"] == rp["uuid"]), key=lambda rp: rp["name"])
    first = api.get("/allotment/capacity/trees?limit=10").json
    second = api.get("/allotment/capacity/trees?limit=10&offset=10").json
    assert first["total"] == second["total"] == len(roots)
    assert [t["name"] for t in first["trees"] + second["trees"]] == [rp["name"] for rp in roots[:20]]
    tree = next(t for t in first["trees"] if t["name"] == "cn-02")
    members = api.get(f"/resource_providers?in_tree={tree['root']}").json["resource_providers"]
    assert {p["uuid"] for p in tree["providers"]} == {rp["uuid"] for rp in members}
    seen = set()
    for provider in tree["providers"]:
        assert provider["parent"] is None or provider["parent"] in seen
        seen.add(provider["uuid"])
        inventories = api.get(f"/resource_providers/{provider['uuid']}/inventories").json["inventories"]
        usages = api.get(f"/resource_providers/{provider['uuid']}/usages").json["usages"]
        assert {rc: (inv["total"], inv["used"], inv["capacity"]) for rc, inv in provider["inventories"].items()} == {
            rc: (inv["total"], usages[rc], _capacity(inv)) for rc, inv in inventories.items()}
        assert provider["traits"] == sorted(api.get(f"/resource_providers/{provider['uuid']}/traits").json["traits"])
        assert sorted(provider["aggregates"]) == sorted(
            api.get(f"/resource_providers/{provider['uuid']}/aggregates").json["aggregates"])


def test_trees_sorted_by_fullness_fullest_first(api, cloud):
    body = api.get("/allotment/capacity/trees?sort=fullness&limit=200").json
    fullness = [t["fullness"] for t in body["trees"]]
    assert fullness == sorted(fullness, reverse=True) and fullness[0] > 0
    for tree in body["trees"][:3]:
        used: dict = defaultdict(int)
        cap: dict = defaultdict(int)
        for provider in tree["providers"]:
            for rc, inv in api.get(f"/resource_providers/{provider['uuid']}/inventories").json["inventories"].items():
                cap[rc] += _capacity(inv)
                used[rc] += api.get(f"/resource_providers/{provider['uuid']}/usages").json["usages"][rc]
        assert tree["fullness"] == round(max(used[rc] / cap[rc] for rc in cap), 4)


def test_trees_search_by_name_part_or_uuid_start(api, cloud):
    by_name = api.get("/allotment/capacity/trees?search=GPU0").json  # a child's name, any case
    assert sorted(t["name"] for t in by_name["trees"]) == ["cn-02", "cn-05"]
    uuid = cloud["cn-03-fpga0"]
    by_uuid = api.get(f"/allotment/capacity/trees?search={uuid[:8]}").json
    assert [t["root"] for t in by_uuid["trees"]] == [cloud["cn-03"]]
    assert api.get("/allotment/capacity/trees?search=100%25").json["total"] == 0  # % is literal


@pytest.mark.parametrize("query", ["sort=size", "limit=0", "limit=201", "limit=x", "offset=-1", "colour=blue"])
def test_trees_bad_query_is_400(api, query):
    response = api.get(f"/allotment/capacity/trees?{query}")
    assert response.status == 400, response
    assert "Invalid query string parameters" in response.error()["detail"]


# -- one provider -------------------------------------------------------------

def test_provider_detail_matches_placement(api, cloud):
    uuid = cloud["cn-02-numa0"]
    body = api.get(f"/allotment/capacity/providers/{uuid}").json
    rp = api.get(f"/resource_providers/{uuid}").json
    assert (body["name"], body["generation"], body["parent"]["uuid"], body["root"]["uuid"]) == (
        rp["name"], rp["generation"], rp["parent_provider_uuid"], rp["root_provider_uuid"])
    inventories = api.get(f"/resource_providers/{uuid}/inventories").json["inventories"]
    for rc, inv in inventories.items():
        shown = body["inventories"][rc]
        assert {k: shown[k] for k in inv} == inv
    allocations = api.get(f"/resource_providers/{uuid}/allocations").json["allocations"]
    assert {c["consumer"]: c["resources"] for c in body["consumers"]} == {
        consumer: found["resources"] for consumer, found in allocations.items()}
    for consumer in body["consumers"]:
        held = api.get(f"/allocations/{consumer['consumer']}").json
        assert (consumer["project_id"], consumer["user_id"], consumer["consumer_type"]) == (
            held["project_id"], held["user_id"], held["consumer_type"])
    children = api.get(f"/resource_providers?in_tree={uuid}").json["resource_providers"]
    assert {c["uuid"] for c in body["children"]} == {c["uuid"] for c in children if c["parent_provider_uuid"] == uuid}


def test_provider_sharing_providers_reachable_through_an_aggregate(api, cloud):
    body = api.get(f"/allotment/capacity/providers/{cloud['cn-05-numa0']}").json
    sharing = api.get("/resource_providers?required=MISC_SHARES_VIA_AGGREGATE"
                      f"&member_of={cloud['aggregates']['rack-b']}").json["resource_providers"]
    assert [s["uuid"] for s in body["sharing_providers"]] == [s["uuid"] for s in sharing]
    assert api.get(f"/allotment/capacity/providers/{cloud['cn-01']}").json["sharing_providers"] == []


def test_provider_names(api, cloud):
    wanted = [cloud["cn-01-numa0"], cloud["edge-01"]]
    body = api.get("/allotment/capacity/providers?uuid=" + ",".join(wanted)).json
    assert {p["uuid"]: (p["name"], p["root"]["uuid"]) for p in body["providers"]} == {
        u: (api.get(f"/resource_providers/{u}").json["name"], api.get(f"/resource_providers/{u}").json[
            "root_provider_uuid"]) for u in wanted}
    assert api.get("/allotment/capacity/providers?uuid=nope").status == 400


@pytest.mark.parametrize("path", ["/allotment/capacity/providers/7d1e3c6c-8c86-4f4b-a4c1-1f0f0e0f0e0f",
                                  "/allotment/capacity/providers/not-a-uuid"])
def test_unknown_provider_is_404(api, path):
    response = api.get(path)
    assert response.status == 404 and response.error()["title"] == "Not Found"


# -- projects ---------------------------------------------------------------

def test_projects_match_get_usages(api, cloud):
    body = api.get("/allotment/capacity/projects").json
    assert {p["project_id"] for p in body["projects"]} == {"proj-alpha", "proj-beta", "proj-gamma"}
    for project in body["projects"]:
        usages = api.get(f"/usages?project_id={project['project_id']}", version="1.38").json["usages"]
        summed: dict = defaultdict(int)
        for group in usages.values():  # one group per consumer type
            for rc, n in group.items():
                if rc != "consumer_count":
                    summed[rc] += n
        assert project["usages"] == dict(summed)
        assert project["consumers"] == sum(group["consumer_count"] for group in usages.values())
        for user in project["users"]:
            mine = api.get(f"/usages?project_id={project['project_id']}&user_id={user['user_id']}",
                           version="1.9").json["usages"]
            assert user["usages"] == mine
    overview = {row["resource_class"]: row for row in api.get("/allotment/capacity").json["resource_classes"]}
    assert body["cloud"] == {rc: {"capacity": row["capacity"], "used": row["used"]} for rc, row in overview.items()}


# -- access -----------------------------------------------------------------

CAPACITY_PATHS = ["/allotment/capacity", "/allotment/capacity/trees", "/allotment/capacity/projects",
                  "/allotment/capacity/providers?uuid=7d1e3c6c-8c86-4f4b-a4c1-1f0f0e0f0e0f",
                  "/allotment/capacity/providers/7d1e3c6c-8c86-4f4b-a4c1-1f0f0e0f0e0f"]


@pytest.mark.parametrize("path", CAPACITY_PATHS)
def test_capacity_needs_a_token_and_the_policy(api, path):
    assert api.get(path, token="").status == 401
    response = api.get(path, token="alice:proj-alpha")
    assert response.status == 403
    assert "allotment:capacity" in response.error()["detail"]


def test_page_files_are_public_and_the_page_is_locked_to_this_server(api):
    page = api.get("/allotment/ui", token="")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    policy = page.headers["Content-Security-Policy"]
    assert "connect-src 'self'" in policy and "script-src 'self'" in policy
    assert 'src="ui/app.js"' in page.text
    script = api.get("/allotment/ui/app.js", token="")
    assert script.status == 200 and script.headers["Content-Type"].startswith("text/javascript")
    assert "sessionStorage" in script.text and "://" not in script.text  # no other server named
    assert api.get("/allotment/ui/app.css", token="").headers["Content-Type"].startswith("text/css")


def test_trailing_slash_redirects_only_the_page_and_skips_no_token_check(api):
    redirect = api.get("/allotment/ui/", token="")
    assert redirect.status == 301 and redirect.headers["Location"].endswith("/allotment/ui")
    for path in ("/allotment/ui/app.js/", "/allotment/capacity/", "/allotment/ui//", "/allotment/ui/x"):
        assert api.get(path, token="").status == 401, path
    assert api.get("/allotment/capacity/").status == 404


def test_everything_is_404_when_the_ui_is_off(app):
    from allotment.api.app import Application

    conf = make_conf(app.conf.placement_database.connection, allotment__ui=False)
    off = ApiClient(Application(conf, app.db))
    for path in ["/allotment/ui", "/allotment/ui/app.js", *CAPACITY_PATHS]:
        assert off.get(path).status == 404, path
    assert off.get("/allotment/ui/", token="").status == 401  # no redirect: an unknown path


def test_ui_is_on_in_the_embedded_default_only(tmp_path, monkeypatch):
    from allotment import config

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("OS_PLACEMENT_CONFIG_DIR", str(tmp_path / "none"))
    if config.find_config_file():
        pytest.skip("this machine has /etc/placement/placement.conf")
    assert config.load(None, dev_defaults=True, args=[]).allotment.ui is True
    path = tmp_path / "placement.conf"
    path.write_text(f"[placement_database]\nconnection = sqlite:///{tmp_path}/x.sqlite\n")
    assert config.load(str(path), dev_defaults=True, args=[]).allotment.ui is False
    path.write_text(path.read_text() + "[allotment]\nui = true\n")
    assert config.load(str(path), dev_defaults=True, args=[]).allotment.ui is True
