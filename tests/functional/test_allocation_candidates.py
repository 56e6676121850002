"""GET /allocation_candidates, as the API reference describes it.

Providers, inventories, traits, aggregates and allocations are created
through the API (``Cloud``), then each test reads candidates: request ->
expected allocation requests and provider summaries, microversion by
microversion, then bad input (each answered with Placement's 400 and
message), then the configuration options and the bounds that keep huge
answers cheap.
"""

from __future__ import annotations

import logging
import time

import pytest

from allotment.api import allocation_candidates as handler
from allotment.db import allocation_candidates as db
from tests.conftest import new_uuid

AGG_A = "f918801a-5e54-4bee-9095-09a9d0c786b8"
AGG_B = "a893eb5c-e2a0-4251-ab26-f71d3b0cfc0b"
COMPUTE = {"VCPU": {"total": 8, "max_unit": 8}, "MEMORY_MB": {"total": 4096, "max_unit": 4096}}


class Cloud:
    """Builds providers through the API, as a deployment tool would."""

    def __init__(self, api):
        self.api = api
        self.names: dict[str, str] = {}

    def provider(self, name: str, parent: str | None = None, *, inventories: dict | None = None,
                 traits: tuple[str, ...] = (), aggregates: tuple[str, ...] = ()) -> str:
        body = {"name": name, "uuid": new_uuid()}
        if parent:
            body["parent_provider_uuid"] = self.names[parent]
        resp = self.api.post("/resource_providers", json=body, version="1.39")
        assert resp.status == 200, resp
        uuid = self.names[name] = resp.json["uuid"]
        if inventories:
            self.put(uuid, "inventories", {"inventories": {
                rc: spec if isinstance(spec, dict) else {"total": spec} for rc, spec in inventories.items()}})
        if traits:
            for trait in traits:
                if trait.startswith("CUSTOM_"):
                    assert self.api.put(f"/traits/{trait}", version="1.39").status in (201, 204)
            self.put(uuid, "traits", {"traits": list(traits)})
        if aggregates:
            self.put(uuid, "aggregates", {"aggregates": list(aggregates)})
        return uuid

    def put(self, uuid: str, what: str, body: dict) -> None:
        generation = self.api.get(f"/resource_providers/{uuid}", version="1.39").json["generation"]
        resp = self.api.put(f"/resource_providers/{uuid}/{what}",
                            json={**body, "resource_provider_generation": generation}, version="1.39")
        assert resp.status == 200, resp

    def allocate(self, allocations: dict[str, dict[str, int]]) -> str:
        consumer = new_uuid()
        resp = self.api.put(f"/allocations/{consumer}", version="1.39", json={
            "allocations": {self.names[name]: {"resources": res} for name, res in allocations.items()},
            "project_id": "p", "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"})
        assert resp.status == 204, resp
        return consumer

    def name_of(self, uuid: str) -> str:
        return {u: n for n, u in self.names.items()}[uuid]


@pytest.fixture
def cloud(api):
    return Cloud(api)


def candidates(api, query: str, version: str = "1.39", status: int = 200) -> dict:
    resp = api.get(f"/allocation_candidates?{query}", version=version)
    assert resp.status == status, resp
    return resp.json


def picks(cloud: Cloud, body: dict) -> list[dict[str, dict[str, int]]]:
    """Allocation requests (1.12+) as {provider name: resources}."""
    return [{cloud.name_of(uuid): alloc["resources"] for uuid, alloc in areq["allocations"].items()}
            for areq in body["allocation_requests"]]


def assert_400(api, query: str, fragment: str, version: str = "1.39") -> None:
    resp = api.get(f"/allocation_candidates?{query}", version=version)
    assert resp.status == 400, resp
    assert fragment in resp.error()["detail"], resp.error()["detail"]


# -- the answer, microversion by microversion -----------------------------------------

def test_one_compute_node_one_candidate(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE, traits=("HW_CPU_X86_AVX2",))
    body = candidates(api, "resources=VCPU:2,MEMORY_MB:1024")
    assert picks(cloud, body) == [{"cn1": {"VCPU": 2, "MEMORY_MB": 1024}}]
    assert body["allocation_requests"][0]["mappings"] == {"": [cloud.names["cn1"]]}
    assert body["provider_summaries"] == {cloud.names["cn1"]: {
        "resources": {"VCPU": {"capacity": 8, "used": 0}, "MEMORY_MB": {"capacity": 4096, "used": 0}},
        "traits": ["HW_CPU_X86_AVX2"],
        "parent_provider_uuid": None, "root_provider_uuid": cloud.names["cn1"]}}


def test_1_10_lists_allocations_and_shows_no_traits_or_cache_headers(api, cloud):
    cn = cloud.provider("cn1", inventories=COMPUTE, traits=("HW_CPU_X86_AVX2",))
    resp = api.get("/allocation_candidates?resources=VCPU:1", version="1.10")
    assert resp.status == 200
    assert resp.json["allocation_requests"] == [
        {"allocations": [{"resource_provider": {"uuid": cn}, "resources": {"VCPU": 1}}]}]
    # Before 1.27 only the requested classes; before 1.17 no traits.
    assert resp.json["provider_summaries"] == {cn: {"resources": {"VCPU": {"capacity": 8, "used": 0}}}}
    assert "last-modified" not in resp.headers and "cache-control" not in resp.headers


def test_shapes_by_microversion(api, cloud):
    cn = cloud.provider("cn1", inventories=COMPUTE, traits=("HW_CPU_X86_AVX2",))
    body = candidates(api, "resources=VCPU:1", version="1.12")
    assert body["allocation_requests"] == [{"allocations": {cn: {"resources": {"VCPU": 1}}}}]
    assert candidates(api, "resources=VCPU:1", version="1.17")["provider_summaries"][cn] == {
        "resources": {"VCPU": {"capacity": 8, "used": 0}}, "traits": ["HW_CPU_X86_AVX2"]}
    assert set(candidates(api, "resources=VCPU:1", version="1.27")["provider_summaries"][cn]["resources"]) == {
        "VCPU", "MEMORY_MB"}
    assert "parent_provider_uuid" not in candidates(api, "resources=VCPU:1", version="1.28")["provider_summaries"][cn]
    assert "mappings" not in candidates(api, "resources=VCPU:1", version="1.33")["allocation_requests"][0]
    assert "mappings" in candidates(api, "resources=VCPU:1", version="1.34")["allocation_requests"][0]


def test_cache_headers_from_1_15(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE)
    resp = api.get("/allocation_candidates?resources=VCPU:1", version="1.15")
    assert resp.headers["cache-control"] == "no-cache"
    assert resp.headers["last-modified"].endswith("GMT")


def test_usage_and_capacity_rules_decide(api, cloud):
    cloud.provider("full", inventories={"VCPU": 4})
    cloud.provider("reserved", inventories={"VCPU": {"total": 4, "reserved": 3}})
    cloud.provider("big_steps", inventories={"VCPU": {"total": 8, "step_size": 4}})
    cloud.provider("min4", inventories={"VCPU": {"total": 8, "min_unit": 4}})
    cloud.provider("max1", inventories={"VCPU": {"total": 8, "max_unit": 1}})
    cloud.provider("overcommit", inventories={"VCPU": {"total": 1, "allocation_ratio": 2.0}})
    cloud.allocate({"full": {"VCPU": 3}})
    assert {name for p in picks(cloud, candidates(api, "resources=VCPU:2")) for name in p} == {
        "overcommit"}
    assert {name for p in picks(cloud, candidates(api, "resources=VCPU:1")) for name in p} == {
        "full", "reserved", "max1", "overcommit"}
    assert {name for p in picks(cloud, candidates(api, "resources=VCPU:4")) for name in p} == {
        "big_steps", "min4"}
    summary = candidates(api, "resources=VCPU:1")["provider_summaries"][cloud.names["full"]]
    assert summary["resources"]["VCPU"] == {"capacity": 4, "used": 3}


def test_summaries_follow_trait_and_inventory_changes(api, cloud):
    cn = cloud.provider("cn1", inventories=COMPUTE, traits=("HW_CPU_X86_AVX2",))
    assert candidates(api, "resources=VCPU:1")["provider_summaries"][cn]["traits"] == ["HW_CPU_X86_AVX2"]
    assert api.put("/traits/CUSTOM_GOLD", version="1.39").status == 201
    cloud.put(cn, "traits", {"traits": ["HW_CPU_X86_SSE", "CUSTOM_GOLD"]})
    summary = candidates(api, "resources=VCPU:1")["provider_summaries"][cn]
    assert sorted(summary["traits"]) == ["CUSTOM_GOLD", "HW_CPU_X86_SSE"]
    cloud.put(cn, "traits", {"traits": []})
    assert candidates(api, "resources=VCPU:1")["provider_summaries"][cn]["traits"] == []
    cloud.put(cn, "inventories", {"inventories": {"VCPU": {"total": 2}}})
    assert candidates(api, "resources=VCPU:1")["provider_summaries"][cn]["resources"] == {
        "VCPU": {"capacity": 2, "used": 0}}


def test_summaries_follow_a_deletion_and_a_renamed_class(api, cloud):
    """Neither changes the provider's generation."""
    assert api.post("/resource_classes", json={"name": "CUSTOM_A"}, version="1.2").status == 201
    cn = cloud.provider("cn1", inventories={**COMPUTE, "CUSTOM_A": 5})
    consumer = cloud.allocate({"cn1": {"VCPU": 2, "CUSTOM_A": 1}})
    summary = candidates(api, "resources=VCPU:1")["provider_summaries"][cn]["resources"]
    assert summary["VCPU"] == {"capacity": 8, "used": 2} and summary["CUSTOM_A"] == {"capacity": 5, "used": 1}
    assert api.delete(f"/allocations/{consumer}", version="1.39").status == 204
    summary = candidates(api, "resources=VCPU:1")["provider_summaries"][cn]["resources"]
    assert summary["VCPU"] == {"capacity": 8, "used": 0} and summary["CUSTOM_A"] == {"capacity": 5, "used": 0}
    resp = api.put("/resource_classes/CUSTOM_A", json={"name": "CUSTOM_B"}, version="1.2")
    assert resp.status == 200, resp
    summary = candidates(api, "resources=VCPU:1")["provider_summaries"][cn]["resources"]
    assert summary == {"VCPU": {"capacity": 8, "used": 0}, "MEMORY_MB": {"capacity": 4096, "used": 0},
                       "CUSTOM_B": {"capacity": 5, "used": 0}}


def test_summaries_follow_tree_and_aggregate_changes_that_keep_the_generation(api, cloud, app):
    """Providers are reused from an earlier request only while their place in
    the tree, usage and aggregates are the same: here each changes by SQL
    that leaves the generation alone."""
    import sqlalchemy as sa

    from allotment.db import tables

    cn1 = cloud.provider("cn1", inventories=COMPUTE)
    cn2 = cloud.provider("cn2", inventories=COMPUTE, aggregates=(AGG_A,))
    numa = cloud.provider("numa", "cn1", inventories={"VCPU": 4})
    assert picks(cloud, candidates(api, f"resources=VCPU:1&member_of={AGG_A}")) == [{"cn2": {"VCPU": 1}}]
    assert set(candidates(api, "resources=VCPU:1")["provider_summaries"]) == {cn1, cn2, numa}
    rp, rp_agg, agg = tables.resource_providers, tables.resource_provider_aggregates, tables.placement_aggregates
    with app.db.write() as conn:
        ids = dict(conn.execute(sa.select(rp.c.uuid, rp.c.id)).all())
        conn.execute(sa.update(rp).where(rp.c.uuid == numa).values(parent_provider_id=ids[cn2],
                                                                    root_provider_id=ids[cn2]))
        agg_id = conn.execute(sa.select(agg.c.id).where(agg.c.uuid == AGG_A)).scalar_one()
        conn.execute(sa.insert(rp_agg).values(resource_provider_id=ids[cn1], aggregate_id=agg_id))
        conn.execute(sa.insert(tables.allocations).values(
            resource_provider_id=ids[cn2], consumer_id=new_uuid(), resource_class_id=0, used=3))
    summaries = candidates(api, "resources=VCPU:1")["provider_summaries"]
    assert summaries[numa]["parent_provider_uuid"] == cn2 and summaries[numa]["root_provider_uuid"] == cn2
    assert summaries[cn2]["resources"]["VCPU"] == {"capacity": 8, "used": 3}
    assert picks(cloud, candidates(api, f"resources=VCPU:1&member_of={AGG_A}")) == [
        {"cn1": {"VCPU": 1}}, {"cn2": {"VCPU": 1}}, {"numa": {"VCPU": 1}}]


def test_a_root_written_without_its_root_id_is_its_own_root(api, cloud, app):
    import sqlalchemy as sa

    from allotment.db import tables

    cn = cloud.provider("cn1")
    cloud.provider("numa0", "cn1", inventories=COMPUTE)
    with app.db.write() as conn:
        rp = tables.resource_providers
        conn.execute(sa.update(rp).where(rp.c.uuid == cn).values(root_provider_id=None))
    body = candidates(api, "resources=VCPU:1")
    assert picks(cloud, body) == [{"numa0": {"VCPU": 1}}]
    assert set(body["provider_summaries"]) == {cn, cloud.names["numa0"]}


def test_limit_takes_the_first_and_summarises_only_them(api, cloud):
    for i in range(6):
        cloud.provider(f"cn{i}", inventories=COMPUTE)
    everything = candidates(api, "resources=VCPU:1")
    assert len(everything["allocation_requests"]) == 6
    limited = candidates(api, "resources=VCPU:1&limit=2")
    assert limited["allocation_requests"] == everything["allocation_requests"][:2]
    assert set(limited["provider_summaries"]) == {
        uuid for areq in limited["allocation_requests"] for uuid in areq["allocations"]}


@pytest.fixture
def database_reads(app, monkeypatch):
    """Candidates read from the database at every request, as without a
    provider mirror (PostgreSQL, MySQL): the tests of how it reads."""
    monkeypatch.setattr(app.state, "mirror", None)


def test_limit_over_many_roots_reads_trees_in_rounds_and_keeps_the_order(database_reads, api, cloud, monkeypatch):
    for i in range(40):
        cloud.provider(f"cn{i}", inventories=COMPUTE)
    everything = candidates(api, "resources=VCPU:1")["allocation_requests"]
    loads = []
    real_load = db._Trees.load

    def counting_load(self, anchors):
        anchors = list(anchors)
        loads.append(len(anchors))
        return real_load(self, anchors)

    monkeypatch.setattr(db._Trees, "load", counting_load)
    for limit in (1, 3, 13, 40, 100):
        loads.clear()
        got = candidates(api, f"resources=VCPU:1&limit={limit}")["allocation_requests"]
        assert got == everything[:limit]
        # Never more trees than candidates asked for (each root yields one).
        assert sum(loads) <= limit, (limit, loads)


def test_a_small_limit_over_big_trees_reads_only_the_first(database_reads, api, cloud, monkeypatch):
    for h in range(4):
        cloud.provider(f"host{h}", inventories=COMPUTE)
        for d in range(6):
            cloud.provider(f"dev{h}.{d}", f"host{h}", inventories={"VGPU": 1})
    loads = []
    real_load = db._Trees.load

    def counting_load(self, anchors):
        anchors = list(anchors)
        loads.append(len(anchors))
        return real_load(self, anchors)

    monkeypatch.setattr(db._Trees, "load", counting_load)
    monkeypatch.setattr(db, "FIRST_ROUND", 4)  # candidate inventories: a host has 7
    body = candidates(api, "resources=VCPU:1&resources1=VGPU:1&resources2=VGPU:1&group_policy=isolate&limit=20")
    assert len(body["allocation_requests"]) == 20  # 6*5 = 30 on the first host alone
    assert sum(loads) == 1
    assert {cloud.name_of(uuid)[:5] for uuid in body["provider_summaries"]} == {"host0", "dev0."}


def _mixed_cloud(cloud: Cloud, app) -> list[str]:
    """Flat hosts (some full, some in an aggregate with a sharing provider
    that lends disk), nested hosts, and a tree whose root row has no root
    id: what the windowed reading must see exactly as the whole."""
    import sqlalchemy as sa

    from allotment.db import tables

    queries = ["resources=VCPU:1", "resources=VCPU:1,DISK_GB:10", "resources=DISK_GB:10",
               "resources1=VCPU:1&resources2=VGPU:1&group_policy=isolate",
               "resources=VCPU:1&required=HW_CPU_X86_AVX2&member_of=" + AGG_A]
    for i in range(12):
        cloud.provider(f"cn{i}", inventories={"VCPU": 4, "DISK_GB": 100} if i % 3 else COMPUTE,
                       traits=("HW_CPU_X86_AVX2",) if i % 2 else (),
                       aggregates=(AGG_A,) if i % 4 == 1 else ())
        if i % 5 == 0:
            cloud.allocate({f"cn{i}": {"VCPU": 4 if i % 3 else 8}})  # full
        if i % 4 == 3:
            cloud.provider(f"gpu{i}", f"cn{i}", inventories={"VGPU": 2})
        if i == 6:
            cloud.provider("ss", inventories={"DISK_GB": 1000}, traits=("MISC_SHARES_VIA_AGGREGATE",),
                           aggregates=(AGG_A,))
    cloud.provider("lost", inventories=COMPUTE)
    cloud.provider("lostgpu", "lost", inventories={"VGPU": 4})
    with app.db.write() as conn:
        rp = tables.resource_providers
        conn.execute(sa.update(rp).where(rp.c.uuid == cloud.names["lost"]).values(root_provider_id=None))
    return queries


@pytest.mark.parametrize("first_window, rest_share", [(1, 0), (3, 0), (2, 1), (32, 4), (1, 10_000)])
def test_a_limit_reads_root_windows_and_answers_as_the_whole(database_reads, api, cloud, app, monkeypatch,
                                                               first_window, rest_share):
    queries = _mixed_cloud(cloud, app)
    wholes = {query: candidates(api, query)["allocation_requests"] for query in queries}
    assert all(wholes.values())
    monkeypatch.setattr(db, "FIRST_WINDOW", first_window)
    monkeypatch.setattr(db, "REST_SHARE", rest_share)
    searched = []
    real_in_rounds = db._Trees.in_rounds

    def recording_in_rounds(self, anchors, wanted, **options):
        for root in real_in_rounds(self, anchors, wanted, **options):
            searched.append(root)
            yield root

    monkeypatch.setattr(db._Trees, "in_rounds", recording_in_rounds)
    windows = []
    real_in_windows = db._Trees.in_windows

    def recording_in_windows(self, given, wanted):
        windows[:] = [list(window) for window in given]  # every window, read to the end
        return real_in_windows(self, iter(windows), wanted)

    monkeypatch.setattr(db._Trees, "in_windows", recording_in_windows)
    for query, whole in wholes.items():
        windows.clear()
        candidates(api, f"{query}&limit=1")
        # Each root in one window only, the windows in root id order.
        found = [root for window in windows for root in window]
        assert found == sorted(set(found)), (query, windows)
        for limit in (1, 2, 5, len(whole), len(whole) + 3):
            searched.clear()
            got = candidates(api, f"{query}&limit={limit}")
            assert got["allocation_requests"] == whole[:limit], (query, limit)
            # Each anchor searched once, in root id order, window after window.
            assert searched == sorted(set(searched)), (query, limit, searched)
            assert set(got["provider_summaries"]) >= {
                uuid for areq in got["allocation_requests"] for uuid in areq["allocations"]}


def test_a_small_limit_reads_the_inventories_of_few_trees(database_reads, api, cloud, monkeypatch):
    for i in range(300):
        cloud.provider(f"cn{i}", inventories=COMPUTE)
    read = []
    real_rows = db._rows

    def counting_rows(conn, statement, params):
        rows = real_rows(conn, statement, params)
        if "c0" in params:  # a candidate statement
            read.append(len(rows))
        return rows

    monkeypatch.setattr(db, "_rows", counting_rows)
    body = candidates(api, "resources=VCPU:1,MEMORY_MB:64&limit=3")
    assert len(body["allocation_requests"]) == 3
    # The first window: FIRST_WINDOW ids at most, two rows (classes) per host.
    assert sum(read) <= 2 * db.FIRST_WINDOW, read
    read.clear()
    assert len(candidates(api, "resources=VCPU:1,MEMORY_MB:64")["allocation_requests"]) == 300
    assert sum(read) == 600


def test_nested_tree_summaries_list_the_whole_tree(api, cloud):
    cloud.provider("cn", inventories={"DISK_GB": 100})
    cloud.provider("numa0", "cn", inventories=COMPUTE)
    cloud.provider("numa1", "cn", inventories=COMPUTE)
    cloud.provider("pf0", "numa0", inventories={"SRIOV_NET_VF": 8}, traits=("CUSTOM_PHYSNET1",))
    body = candidates(api, "resources=VCPU:1,SRIOV_NET_VF:1&limit=1")
    assert picks(cloud, body) == [{"numa0": {"VCPU": 1}, "pf0": {"SRIOV_NET_VF": 1}}]
    summaries = body["provider_summaries"]
    assert {cloud.name_of(uuid) for uuid in summaries} == {"cn", "numa0", "numa1", "pf0"}
    assert summaries[cloud.names["pf0"]]["parent_provider_uuid"] == cloud.names["numa0"]
    assert summaries[cloud.names["pf0"]]["root_provider_uuid"] == cloud.names["cn"]
    # Providers not holding requested classes are summarised with all their inventory.
    assert summaries[cloud.names["cn"]]["resources"] == {"DISK_GB": {"capacity": 100, "used": 0}}
    assert summaries[cloud.names["pf0"]]["traits"] == ["CUSTOM_PHYSNET1"]
    # Before 1.29 a candidate may not combine providers of one tree.
    assert candidates(api, "resources=VCPU:1,SRIOV_NET_VF:1", version="1.28")["allocation_requests"] == []


def test_granular_groups_isolation_and_same_subtree(api, cloud):
    cloud.provider("cn")
    cloud.provider("numa0", "cn", inventories=COMPUTE)
    cloud.provider("numa1", "cn", inventories=COMPUTE)
    cloud.provider("gpu0", "numa0", inventories={"VGPU": 1})
    cloud.provider("gpu1", "numa1", inventories={"VGPU": 1})
    isolated = picks(cloud, candidates(
        api, "resources_A=VGPU:1&resources_B=VGPU:1&group_policy=isolate"))
    assert sorted(sorted(p) for p in isolated) == [["gpu0", "gpu1"], ["gpu0", "gpu1"]]
    affine = picks(cloud, candidates(
        api, "resources_CPU=VCPU:1&resources_GPU=VGPU:1&same_subtree=_CPU,_GPU&group_policy=none"))
    assert sorted(sorted(p) for p in affine) == [["gpu0", "numa0"], ["gpu1", "numa1"]]
    body = candidates(api, "resources_CPU=VCPU:1&resources_GPU=VGPU:1&same_subtree=_CPU,_GPU"
                           "&group_policy=none&limit=1")
    assert body["allocation_requests"][0]["mappings"] == {
        "_CPU": [cloud.names["numa0"]], "_GPU": [cloud.names["gpu0"]]}


def test_sharing_provider_lends_through_an_aggregate(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE, aggregates=(AGG_A,))
    cloud.provider("cn2", inventories=COMPUTE, aggregates=(AGG_B,))
    cloud.provider("ss", inventories={"DISK_GB": 1000}, traits=("MISC_SHARES_VIA_AGGREGATE",),
                   aggregates=(AGG_A,))
    body = candidates(api, "resources=VCPU:1,DISK_GB:10")
    assert picks(cloud, body) == [{"cn1": {"VCPU": 1}, "ss": {"DISK_GB": 10}}]
    assert set(body["provider_summaries"]) == {cloud.names["cn1"], cloud.names["ss"]}
    # The same through lazily loaded rounds (a limit): the lender's tree comes along.
    assert picks(cloud, candidates(api, "resources=VCPU:1,DISK_GB:10&limit=5")) == picks(cloud, body)
    # Disk alone: the sharing provider once, not once per tree it serves.
    assert picks(cloud, candidates(api, "resources=DISK_GB:10")) == [{"ss": {"DISK_GB": 10}}]


def test_traits_aggregates_and_roots_filter(api, cloud):
    cloud.provider("fast", inventories=COMPUTE, traits=("HW_CPU_X86_AVX2",), aggregates=(AGG_A,))
    cloud.provider("slow", inventories=COMPUTE, traits=("CUSTOM_MAINTENANCE",), aggregates=(AGG_B,))

    def names(query):
        return sorted(name for p in picks(cloud, candidates(api, query)) for name in p)

    assert names("resources=VCPU:1&required=HW_CPU_X86_AVX2") == ["fast"]
    assert names("resources=VCPU:1&required=!CUSTOM_MAINTENANCE") == ["fast"]
    assert names("resources=VCPU:1&required=in:HW_CPU_X86_AVX2,CUSTOM_MAINTENANCE") == ["fast", "slow"]
    assert names(f"resources=VCPU:1&member_of={AGG_B}") == ["slow"]
    assert names(f"resources=VCPU:1&member_of=!{AGG_B}") == ["fast"]
    assert names(f"resources=VCPU:1&member_of=in:{AGG_A},{AGG_B}") == ["fast", "slow"]
    assert names(f"resources=VCPU:1&member_of={new_uuid()}") == []
    assert names("resources=VCPU:1&root_required=!CUSTOM_MAINTENANCE") == ["fast"]
    assert names(f"resources=VCPU:1&in_tree={cloud.names['slow']}") == ["slow"]
    # An in_tree provider that does not exist: no candidates, not an error.
    assert names(f"resources=VCPU:1&in_tree={new_uuid()}") == []


def test_resourceless_group_names_a_provider_of_the_subtree(api, cloud):
    cloud.provider("cn")
    cloud.provider("numa0", "cn", inventories=COMPUTE, traits=("CUSTOM_NUMA",))
    cloud.provider("pf0", "numa0", inventories={"SRIOV_NET_VF": 4})
    body = candidates(api, "resources_NET=SRIOV_NET_VF:1&required_NUMA=CUSTOM_NUMA"
                           "&same_subtree=_NET,_NUMA&group_policy=none")
    assert picks(cloud, body) == [{"pf0": {"SRIOV_NET_VF": 1}}]
    assert body["allocation_requests"][0]["mappings"] == {
        "_NET": [cloud.names["pf0"]], "_NUMA": [cloud.names["numa0"]]}


def test_resourceless_group_is_looked_up_by_its_required_traits_or_aggregates(api, cloud):
    """As Placement (asked of the reference): a resourceless group naming no
    required trait nor aggregate -- only forbidden ones, or only in_tree --
    finds no provider, so there is no candidate; and such a group, searched
    before a later group's unknown name, ends the search (an empty answer,
    where this used to be a 500)."""
    cn = cloud.provider("cn", inventories={"DISK_GB": 10}, traits=("CUSTOM_X",), aggregates=(AGG_A,))
    cloud.provider("child", "cn", traits=("CUSTOM_X",))
    empty = {"allocation_requests": [], "provider_summaries": {}}
    base = "resources_G0=DISK_GB:1&group_policy=none&same_subtree=_G0,_G1"
    for group in (f"in_tree_G1={cn}", "required_G1=!HW_CPU_X86_AVX", f"member_of_G1=!{AGG_B}",
                  f"required_G1=!HW_CPU_X86_AVX&in_tree_G1={cn}"):
        assert candidates(api, f"{base}&{group}") == empty, group
    verdict = api.get(f"/allotment/explain?{base}&in_tree_G1={cn}", version="1.39").json["verdict"]
    assert verdict == "0/1 trees can serve this request: 1 group _G1 names no required trait or aggregate."
    for group, count in (("required_G1=CUSTOM_X", 2), (f"member_of_G1={AGG_A}", 1),  # cn and child; cn
                         (f"member_of_G1=!{AGG_B}&required_G1=CUSTOM_X", 2),
                         ("required_G1=in:CUSTOM_X,HW_CPU_X86_AVX", 2)):
        assert len(candidates(api, f"{base}&{group}")["allocation_requests"]) == count, group
    # Groups are searched in query order: G1 before G2.
    three = "resources_G0=DISK_GB:1&{}&required_G2=!CUSTOM_NOPE&group_policy=none&same_subtree=_G0,_G1,_G2"
    for group in (f"in_tree_G1={cn}", "required_G1=!HW_CPU_X86_AVX", "required_G1=HW_CPU_X86_AVX",
                  f"required_G1=CUSTOM_X&member_of_G1={AGG_B}"):
        assert candidates(api, three.format(group)) == empty, group
    for group in ("required_G1=CUSTOM_X", f"required_G1=CUSTOM_X&in_tree_G1={cloud.names['child']}"):
        assert_400(api, three.format(group), "No such trait(s): CUSTOM_NOPE.")


# -- bad input: Placement's 400s and messages ---------------------------------------------

def test_a_group_that_finds_nothing_ends_the_search_before_later_names_are_checked(api, cloud):
    # Placement checks root_required first, then searches group by group in
    # query order, checking a group's classes and traits just before its
    # search; a group that finds nothing ends it with an empty answer.
    cloud.provider("cn1", inventories=COMPUTE)
    empty = {"allocation_requests": [], "provider_summaries": {}}
    for query in ("resources=SRIOV_NET_VF:1&resources_ACCEL=CUSTOM_NOPE:100",
                  "resources_B=SRIOV_NET_VF:1&resources_A=CUSTOM_NOPE:1&group_policy=none",
                  "resources_A=SRIOV_NET_VF:1&resources=CUSTOM_NOPE:1&group_policy=none",
                  "resources=VCPU:100&resources1=CUSTOM_NOPE:1&group_policy=none",
                  "resources=VCPU:1&required=HW_CPU_X86_AVX&resources1=CUSTOM_NOPE:1&group_policy=none",
                  "resources=VCPU:1&root_required=HW_CPU_X86_AVX&resources1=CUSTOM_NOPE:1&group_policy=none",
                  f"resources=VCPU:1&member_of={AGG_A}&resources1=CUSTOM_NOPE:1&group_policy=none",
                  "resources=SRIOV_NET_VF:1&resources1=VCPU:1&required1=CUSTOM_NOPE&group_policy=none"):
        assert candidates(api, query, version="1.36") == empty, query
    # A group that does find something lets the search reach the bad name,
    # and a group's own names are checked before its search.
    assert_400(api, "resources=VCPU:1&resources_ACCEL=CUSTOM_NOPE:100", "No such resource class CUSTOM_NOPE.")
    assert_400(api, "resources_A=CUSTOM_NOPE:1&resources=SRIOV_NET_VF:1&group_policy=none",
               "No such resource class CUSTOM_NOPE.")
    assert_400(api, "resources=SRIOV_NET_VF:1&required=CUSTOM_NOPE", "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, "resources=SRIOV_NET_VF:1&root_required=CUSTOM_NOPE", "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, "resources=VCPU:1&resources1=VCPU:1&resources2=CUSTOM_NOPE:1&group_policy=isolate",
               "No such resource class CUSTOM_NOPE.")


def test_before_1_29_a_group_met_only_across_a_tree_does_not_end_the_search(api, cloud):
    """Placement leaves out candidates spread over a tree (before 1.29) only
    after every group was searched: a group met only that way still lets
    the search reach a later group's unknown class (checked against the
    reference: a 400 there, where a group met nowhere gives an empty 200)."""
    cloud.provider("cn1", inventories={"VCPU": {"total": 8}})
    cloud.provider("numa", parent="cn1", inventories={"MEMORY_MB": {"total": 8}})
    assert_400(api, "resources=VCPU:8,MEMORY_MB:1&resources1=CUSTOM_NOPE:1&group_policy=none",
               "No such resource class CUSTOM_NOPE.", version="1.28")
    assert candidates(api, "resources=VCPU:8,MEMORY_MB:1", version="1.28") == {
        "allocation_requests": [], "provider_summaries": {}}
    assert candidates(api, "resources=VCPU:9,MEMORY_MB:1&resources1=CUSTOM_NOPE:1&group_policy=none",
                      version="1.28") == {"allocation_requests": [], "provider_summaries": {}}


def test_no_root_meeting_root_required_ends_the_search_before_any_group_name(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE, traits=("HW_CPU_X86_AVX",))
    empty = {"allocation_requests": [], "provider_summaries": {}}
    for query in ("resources=CUSTOM_NOPE:1&root_required=HW_CPU_X86_SSE",
                  "resources=VCPU:1&required=!CUSTOM_NOPE&root_required=HW_CPU_X86_SSE",
                  "resources=VCPU:1&required=CUSTOM_NOPE&root_required=!HW_CPU_X86_AVX"):
        assert candidates(api, query, version="1.39") == empty, query
    # A root that meets it lets the search reach the bad names.
    assert_400(api, "resources=VCPU:1&required=CUSTOM_NOPE&root_required=HW_CPU_X86_AVX",
               "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, "resources=CUSTOM_NOPE:1&root_required=!HW_CPU_X86_SSE", "No such resource class CUSTOM_NOPE.")


def test_member_of_without_members_ends_the_search_before_the_groups_traits(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE, aggregates=(AGG_A,))
    nobody = "5f372617-f0ba-ef3a-86f0-ce2ea6ec39c1"
    empty = {"allocation_requests": [], "provider_summaries": {}}
    for query in (f"resources=VCPU:1&required=!CUSTOM_NOPE&member_of={nobody}",
                  f"resources=VCPU:1&required=CUSTOM_NOPE&member_of={nobody}&member_of=!{AGG_A}",
                  f"resources=VCPU:1&resources1=VCPU:1&required1=CUSTOM_NOPE&member_of1={nobody}"
                  "&group_policy=none"):
        assert candidates(api, query, version="1.39") == empty, query
    # A member anywhere in the aggregates lets it reach them; classes come first.
    assert_400(api, f"resources=VCPU:1&required=CUSTOM_NOPE&member_of=in:{AGG_A},{nobody}",
               "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, f"resources=CUSTOM_NOPE:1&member_of={nobody}", "No such resource class CUSTOM_NOPE.")


def test_unknown_required_traits_are_reported_before_unknown_forbidden_ones(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE)
    assert_400(api, "resources=VCPU:1&required=!CUSTOM_GONE,CUSTOM_NOPE", "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, "resources=VCPU:1&root_required=!CUSTOM_GONE,CUSTOM_NOPE", "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, "resources=VCPU:1&required=!CUSTOM_GONE,HW_CPU_X86_AVX", "No such trait(s): CUSTOM_GONE.")


def test_bad_queries_are_400_with_placement_messages(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE)
    assert_400(api, "resources=MCPU:1", "Invalid resource class in resources parameter: "
                                        "No such resource class MCPU.")
    assert_400(api, "resources=VCPU:1&required=CUSTOM_NOPE", "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, "resources=VCPU:1&root_required=CUSTOM_NOPE", "No such trait(s): CUSTOM_NOPE.")
    assert_400(api, "resources1=VCPU:1&required1=CUSTOM_A,CUSTOM_B&group_policy=none",
               "No such trait(s): CUSTOM_A, CUSTOM_B.")
    assert_400(api, "", "'resources' is a required property", version="1.24")
    assert_400(api, "resources=", "Badly formed resources parameter")
    assert_400(api, "resources=VCPU:0", "Requested resource VCPU requires amount >= 1. Got: 0.")
    assert_400(api, "resources=VCPU:x", "Requested resource VCPU expected positive integer amount")
    assert_400(api, "resources=VCPU:1&limit=0", "Invalid query string parameters")
    assert_400(api, "resources=VCPU:1&limit=1", "'limit' was unexpected", version="1.15")
    assert_400(api, "resources=VCPU:1&bogus=1", "Invalid query string parameters")
    assert_400(api, "resources=VCPU:1&in_tree=not-a-uuid", "Expected 'in_tree' parameter to be a format of uuid")
    assert_400(api, "resources=VCPU:1&member_of=not-a-uuid", "Expected 'member_of' parameter to contain valid UUID")
    assert_400(api, "resources1=VCPU:1&resources2=VCPU:1",
               'The "group_policy" parameter is required when specifying more than one "resources{N}" parameter.')
    assert_400(api, "resources_X=VCPU:1&same_subtree=_X,_Y&group_policy=none",
               "Real suffixes should be specified in `same_subtree`")
    assert_400(api, "resources=VCPU:1&required=CUSTOM_X,!CUSTOM_X", "Conflicting required and forbidden traits")


def test_before_1_10_there_is_no_such_resource(api):
    assert api.get("/allocation_candidates?resources=VCPU:1", version="1.9").status == 404


def test_reading_changes_nothing(api, cloud, app):
    cn = cloud.provider("cn1", inventories=COMPUTE)
    before = api.get(f"/resource_providers/{cn}", version="1.39").json["generation"]
    candidates(api, "resources=VCPU:1")
    assert_400(api, "resources=MCPU:1", "Invalid resource class")
    assert api.get(f"/resource_providers/{cn}", version="1.39").json["generation"] == before


# -- configuration -------------------------------------------------------------------------

def test_max_allocation_candidates_caps_generation(api, cloud, app):
    for i in range(5):
        cloud.provider(f"cn{i}", inventories=COMPUTE)
    app.conf.set_override("max_allocation_candidates", 3, group="placement")
    assert len(candidates(api, "resources=VCPU:1")["allocation_requests"]) == 3
    assert len(candidates(api, "resources=VCPU:1&limit=2")["allocation_requests"]) == 2


def test_breadth_first_spreads_a_cap_over_roots(api, cloud, app):
    for i in range(3):
        cloud.provider(f"cn{i}")
        for j in range(3):
            cloud.provider(f"gpu{i}{j}", f"cn{i}", inventories={"VGPU": 1})
    app.conf.set_override("max_allocation_candidates", 3, group="placement")
    depth = picks(cloud, candidates(api, "resources=VGPU:1"))
    assert {name[:4] for p in depth for name in p} == {"gpu0"}
    app.conf.set_override("allocation_candidates_generation_strategy", "breadth-first", group="placement")
    breadth = picks(cloud, candidates(api, "resources=VGPU:1"))
    assert {name[:4] for p in breadth for name in p} == {"gpu0", "gpu1", "gpu2"}


def test_randomize_picks_a_random_subset(api, cloud, app):
    for i in range(12):
        cloud.provider(f"cn{i}", inventories=COMPUTE)
    everything = candidates(api, "resources=VCPU:1")["allocation_requests"]
    app.conf.set_override("randomize_allocation_candidates", True, group="placement")
    seen = []
    for _ in range(5):
        got = candidates(api, "resources=VCPU:1&limit=4")["allocation_requests"]
        assert len(got) == 4 and all(areq in everything for areq in got)
        seen.append(got)
    assert any(got != seen[0] for got in seen[1:])


# -- combinatorial explosions stay cheap ------------------------------------------------------

def _wide_host(cloud: Cloud, gpus: int = 4, vgpus: int = 8) -> None:
    """One host, ``gpus`` GPUs of ``vgpus`` single-VGPU devices: 4 isolated
    groups have (gpus*vgpus)!/(gpus*vgpus-4)! candidates."""
    cloud.provider("host", inventories=COMPUTE)
    for g in range(gpus):
        cloud.provider(f"gpu{g}", "host", traits=("CUSTOM_GPU",))
        for v in range(vgpus):
            cloud.provider(f"vgpu{g}.{v}", f"gpu{g}", inventories={"VGPU": 1}, traits=("CUSTOM_GPU",))


FOUR_VGPUS = ("resources=VCPU:1&resources1=VGPU:1&resources2=VGPU:1&resources3=VGPU:1"
              "&resources4=VGPU:1&group_policy=isolate")


def test_wide_tree_with_a_limit_stops_early(api, cloud):
    _wide_host(cloud)  # 32*31*30*29 = 863,040 candidates
    started = time.monotonic()
    body = candidates(api, FOUR_VGPUS + "&limit=50")
    assert time.monotonic() - started < 5
    assert len(body["allocation_requests"]) == 50
    for p in picks(cloud, body):
        vgpus = [name for name in p if name.startswith("vgpu")]
        assert len(vgpus) == 4 and p["host"] == {"VCPU": 1}
    # The summaries describe the one tree, once.
    assert len(body["provider_summaries"]) == 1 + 4 + 32


def test_without_a_limit_the_safety_cap_bounds_the_answer_and_is_logged(api, cloud, monkeypatch, caplog):
    _wide_host(cloud)
    monkeypatch.setattr(handler, "SAFETY_CAP", 500)
    with caplog.at_level(logging.WARNING, logger=handler.__name__):
        body = candidates(api, FOUR_VGPUS)
    assert len(body["allocation_requests"]) == 500
    assert "safety cap of 500" in caplog.text
    caplog.clear()
    # A configured max_allocation_candidates is the operator's choice: no warning.
    api.application.conf.set_override("max_allocation_candidates", 200, group="placement")
    with caplog.at_level(logging.WARNING, logger=handler.__name__):
        assert len(candidates(api, FOUR_VGPUS)["allocation_requests"]) == 200
    assert "safety cap" not in caplog.text


def test_small_answers_do_not_log_the_safety_cap(api, cloud, caplog):
    cloud.provider("cn1", inventories=COMPUTE)
    with caplog.at_level(logging.WARNING, logger=handler.__name__):
        candidates(api, "resources=VCPU:1")
    assert "safety cap" not in caplog.text


def test_no_fitting_device_answers_without_search(api, cloud):
    _wide_host(cloud)
    body = candidates(api, "resources=VCPU:1&resources1=VGPU:2&group_policy=none")
    assert body == {"allocation_requests": [], "provider_summaries": {}}


def test_a_query_asked_again_is_parsed_once_and_a_bad_one_refused_every_time(api, cloud, monkeypatch):
    """Parsed requests are kept by endpoint, microversion and query string:
    the same query again is not parsed again (at another microversion it
    is: what it means depends on it), and a refused one is refused again."""
    cloud.provider("cn1", inventories=COMPUTE)
    parsed = []
    real = handler.parse_allocation_candidates
    monkeypatch.setattr(handler, "parse_allocation_candidates",
                        lambda *args: parsed.append(args[1]) or real(*args))
    monkeypatch.setattr(handler, "_PARSED", {})
    query = "resources=VCPU:1,MEMORY_MB:64&limit=5"
    first = candidates(api, query)
    cloud.allocate({"cn1": {"VCPU": 1}})  # a new answer, from the request kept
    second = candidates(api, query)
    assert len(parsed) == 1
    assert first["provider_summaries"] != second["provider_summaries"]
    candidates(api, query, version="1.29")
    assert len(parsed) == 2
    for _ in range(2):
        assert_400(api, "resources=VCPU:1&limit=-1", "limit")
        assert_400(api, "resources=VCPU:1&nonsense=1", "nonsense")
    assert len(parsed) == 2
