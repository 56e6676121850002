"""The allocation-candidate solver.

Scenario tests build, in memory, the provider layouts the conformance
fixtures create (see shared/conformance/placement_fixtures.py) and check the
candidates the functional suite expects.  A property-based test then
compares the solver with a brute-force enumerator on random trees.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import uuid as uuidlib
from urllib.parse import parse_qsl

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from allotment.domain import allocation_candidates as ac
from allotment.domain import request_groups as rg
from allotment.domain.provider_tree import (
    RUN, SHARING_TRAIT, KeptResults, Provider, ProviderInventory, ProviderSnapshot, RunCapacity)


# ---------------------------------------------------------------------------
# Building snapshots
# ---------------------------------------------------------------------------

class Trees:
    """Small DSL: add providers by name, get a snapshot."""

    def __init__(self):
        self._rows: dict[str, dict] = {}
        self._ids: dict[str, int] = {}

    def add(self, name, parent=None, *, aggs=(), traits=(), inv=None,
            used=None):
        pid = len(self._ids) + 1
        self._ids[name] = pid
        root = self._rows[parent]["root"] if parent else name
        self._rows[name] = dict(
            parent=parent, root=root, aggs=set(aggs), traits=tuple(traits),
            inv=dict(inv or {}), used=dict(used or {}))
        return name

    def inventory(self, name, rc, total, **kw):
        self._rows[name]["inv"][rc] = dict(total=total, **kw)

    def use(self, name, rc, amount):
        used = self._rows[name]["used"]
        used[rc] = used.get(rc, 0) + amount

    def traits(self, name, *traits):
        self._rows[name]["traits"] = tuple(traits)

    def aggregates(self, name, *aggs):
        self._rows[name]["aggs"] = set(aggs)

    def snapshot(self) -> ProviderSnapshot:
        providers = []
        for name, row in self._rows.items():
            inventories = {}
            for rc, spec in row["inv"].items():
                spec = dict(spec) if isinstance(spec, dict) else {
                    "total": spec}
                spec.setdefault("max_unit", spec["total"])
                inventories[rc] = ProviderInventory(
                    used=row["used"].get(rc, 0), **spec)
            providers.append(Provider(
                id=self._ids[name], uuid=uuid_of(name), name=name,
                parent_id=self._ids[row["parent"]] if row["parent"] else None,
                root_id=self._ids[row["root"]],
                traits=row["traits"], aggregates=row["aggs"],
                inventories=inventories))
        return ProviderSnapshot(providers)


def uuid_of(name: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name))


AGG_A, AGG_B, AGG_C = uuid_of("agg-a"), uuid_of("agg-b"), uuid_of("agg-c")


def solve(snapshot, query, version=(1, 39), **kw):
    request = rg.parse_allocation_candidates(
        parse_qsl(query, keep_blank_values=True), version)
    return ac.find_allocation_candidates(request, snapshot, **kw)


def named(snapshot, result):
    """Candidates as (allocations, mappings) with provider names."""
    name = {p.uuid: p.name for p in snapshot}
    out = []
    for areq in result.allocation_requests:
        allocs = {name[u]: dict(res) for u, res in areq.allocations.items()}
        maps = {s: sorted(name[u] for u in us)
                for s, us in areq.mappings.items()}
        out.append((allocs, maps))
    return out


def allocs(snapshot, result):
    """Sorted list of allocation dicts keyed by provider name."""
    items = [a for a, _ in named(snapshot, result)]
    return sorted(items, key=lambda a: sorted(
        (k, sorted(v.items())) for k, v in a.items()))


def summary_names(result):
    return {s.provider.name for s in result.provider_summaries}


def amounts(snapshot, result, provider, rc):
    """What `$..allocations[provider].resources[rc]` collects."""
    return sorted(a[provider][rc] for a, _ in named(snapshot, result)
                  if provider in a and rc in a[provider])


# ---------------------------------------------------------------------------
# The conformance fixtures, in memory
# ---------------------------------------------------------------------------

def shared_storage():
    t = Trees()
    for cn in ("cn1", "cn2"):
        t.add(cn, aggs=[AGG_A])
    for ss in ("ss", "ss2"):
        t.add(ss, aggs=[AGG_A], traits=[SHARING_TRAIT])
        t.inventory(ss, "DISK_GB", 2000, reserved=100)
    for i in (1, 2):
        for j in (1, 2):
            t.add("numa%d_%d" % (i, j), "cn%d" % i)
            t.add("pf%d_%d" % (i, j), "numa%d_%d" % (i, j))
            t.inventory("pf%d_%d" % (i, j), "SRIOV_NET_VF", 8)
    for cn in ("cn1", "cn2"):
        t.inventory(cn, "VCPU", 24, allocation_ratio=16.0)
        t.inventory(cn, "MEMORY_MB", 128 * 1024, allocation_ratio=1.5)
    t.traits("cn1", "HW_CPU_X86_SSE", "HW_CPU_X86_SSE2")
    t.inventory("cn2", "DISK_GB", 2000, reserved=100)
    return t.snapshot()


def granular():
    t = Trees()
    t.add("cn_left", aggs=[AGG_A], traits=[
        "HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_GPU_API_DXVA",
        "HW_NIC_DCB_PFC", "CUSTOM_FOO"])
    for rc, total in (("VCPU", 8), ("MEMORY_MB", 4096), ("DISK_GB", 500),
                      ("VGPU", 8), ("SRIOV_NET_VF", 8),
                      ("CUSTOM_NET_MBPS", 4000)):
        t.inventory("cn_left", rc, total)
    t.add("cn_middle", aggs=[AGG_A, AGG_B], traits=[
        "HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_CPU_X86_SSE",
        "HW_NIC_ACCEL_TLS"])
    for rc, total in (("VCPU", 8), ("MEMORY_MB", 4096), ("SRIOV_NET_VF", 8),
                      ("CUSTOM_NET_MBPS", 4000)):
        t.inventory("cn_middle", rc, total)
    t.add("cn_right", aggs=[AGG_B, AGG_C], traits=[
        "HW_CPU_X86_MMX", "HW_GPU_API_DXVA", "CUSTOM_DISK_SSD"])
    t.inventory("cn_right", "VCPU", 8)
    t.inventory("cn_right", "MEMORY_MB", 4096)
    t.inventory("cn_right", "DISK_GB", 500)
    t.inventory("cn_right", "VGPU", 8, max_unit=2)
    t.add("shr_disk_1", aggs=[AGG_A],
          traits=[SHARING_TRAIT, "CUSTOM_DISK_SSD"])
    t.inventory("shr_disk_1", "DISK_GB", 1000)
    t.add("shr_disk_2", aggs=[AGG_A, AGG_B], traits=[SHARING_TRAIT])
    t.inventory("shr_disk_2", "DISK_GB", 1000)
    t.add("shr_net", aggs=[AGG_C], traits=[SHARING_TRAIT])
    t.inventory("shr_net", "SRIOV_NET_VF", 16)
    t.inventory("shr_net", "CUSTOM_NET_MBPS", 40000)
    return t.snapshot()


def numa_network(deep=False):
    t = Trees()
    t.add("ss1", aggs=[AGG_A], traits=[SHARING_TRAIT])
    t.inventory("ss1", "DISK_GB", 2000)
    if deep:
        t.add("gp1")
        t.add("p1", "gp1")
        t.add("p2", "gp1")
        t.add("cn1", "p1")
        t.add("cn2", "p2")
    else:
        t.add("cn1")
    t.aggregates("cn1", AGG_A)
    t.traits("cn1", "COMPUTE_VOLUME_MULTI_ATTACH")
    for i in (0, 1):
        numa = t.add("numa%d" % i, "cn1", traits=["HW_NUMA_ROOT"] + (
            ["CUSTOM_FOO"] if i else []))
        t.inventory(numa, "VCPU", 4)
    t.inventory("numa0", "MEMORY_MB", 2048, min_unit=512, step_size=256)
    t.inventory("numa1", "MEMORY_MB", 2048, min_unit=256, max_unit=1024)
    t.use("numa0", "VCPU", 2)
    t.add("fpga0", "numa0", inv={"FPGA": 1})
    t.add("pgpu0", "numa0", inv={"VGPU": 8})
    for i in (0, 1):
        t.add("fpga1_%d" % i, "numa1", inv={"FPGA": 1})
    t.add("sriov_agent", "cn1", traits=["CUSTOM_VNIC_TYPE_DIRECT"])
    for i in (1, 2):
        t.add("esn%d" % i, "sriov_agent", traits=["CUSTOM_PHYSNET%d" % i],
              inv={"NET_BW_EGR_KILOBIT_PER_SEC": 10000 * i})
    t.add("ovs_agent", "cn1", traits=["CUSTOM_VNIC_TYPE_NORMAL"])
    t.add("br_int", "ovs_agent", traits=["CUSTOM_PHYSNET0"],
          inv={"NET_BW_EGR_KILOBIT_PER_SEC": 1000})
    if not deep:
        t.add("cn2")
    t.aggregates("cn2", AGG_A)
    t.inventory("cn2", "VCPU", 8)
    t.use("cn2", "VCPU", 3)
    t.inventory("cn2", "MEMORY_MB", 2048, min_unit=1024, step_size=128)
    t.inventory("cn2", "DISK_GB", 1000)
    t.traits("cn2", "CUSTOM_FOO")
    for i in (1, 2, 3):
        t.add("nic%d" % i, "cn2", traits=["CUSTOM_HW_NIC_ROOT"])
    for i in (1, 2):
        t.add("pf1_%d" % i, "nic1", traits=["CUSTOM_PHYSNET%d" % i],
              inv={"CUSTOM_VF": 4})
    for i in range(4):
        t.add("pf2_%d" % (i + 1), "nic2",
              traits=["CUSTOM_PHYSNET%d" % ((i % 2) + 1)],
              inv={"CUSTOM_VF": 2})
    t.add("pf3_1", "nic3", traits=["CUSTOM_PHYSNET1"], inv={"CUSTOM_VF": 8})
    return t.snapshot()


def numa_aggregate():
    t = Trees()
    t.add("cn1", aggs=[AGG_A])
    t.add("cn2", aggs=[AGG_A, AGG_B])
    t.add("ss1", aggs=[AGG_A], traits=[SHARING_TRAIT])
    t.add("ss2", aggs=[AGG_C], traits=[SHARING_TRAIT])
    t.add("numa1_1", "cn1", aggs=[AGG_C])
    t.add("numa1_2", "cn1")
    t.add("numa2_1", "cn2")
    t.add("numa2_2", "cn2")
    for numa in ("numa1_1", "numa1_2", "numa2_1", "numa2_2"):
        t.inventory(numa, "VCPU", 24, allocation_ratio=16.0)
    for ss in ("ss1", "ss2"):
        t.inventory(ss, "DISK_GB", 2000, reserved=100)
    return t.snapshot()


def non_shared_storage(cn1_aggs=(), cn2_aggs=()):
    t = Trees()
    for i, aggs in ((1, cn1_aggs), (2, cn2_aggs), (3, ())):
        t.add("cn%d" % i, aggs=aggs, inv={
            "VCPU": 24, "MEMORY_MB": 128 * 1024, "DISK_GB": 2000})
    return t.snapshot()


def neutron_qos():
    t = Trees()
    direct = ["CUSTOM_VNIC_TYPE_DIRECT", "CUSTOM_VNIC_TYPE_DIRECT_PHYSICAL",
              "CUSTOM_VNIC_TYPE_MACVTAP"]

    def device(name, parent, bw, traits):
        t.add(name, parent, traits=traits, inv={
            "NET_BW_EGR_KILOBIT_PER_SEC": bw,
            "NET_BW_IGR_KILOBIT_PER_SEC": bw})

    def compute(idx, physnets, bw_ovs, bw_sriov):
        cn = t.add("compute%d" % idx, inv={
            "VCPU": 8, "MEMORY_MB": 4096, "DISK_GB": 500})
        ovs = t.add(cn + ":ovs", cn, traits=["CUSTOM_VNIC_TYPE_NORMAL"],
                    inv={"NET_PACKET_RATE_KILOPACKET_PER_SEC": 1000})
        for br, _, physnet in physnets:
            device(cn + ":br_ex" + br, ovs, bw_ovs,
                   ["CUSTOM_VNIC_TYPE_NORMAL", physnet])
        sriov = t.add(cn + ":sriov", cn, traits=direct)
        for _, pf, physnet in physnets:
            device(cn + ":pf" + pf, sriov, bw_sriov, direct + [physnet])

    compute(0, [("", "0", "CUSTOM_PHYSNET_OTHER")], 5000, 10000)
    compute(1, [("", "0", "CUSTOM_PHYSNET_MSN_S1")], 5000, 10000)
    compute(2, [("", "0", "CUSTOM_PHYSNET_MSN_S2")], 5000, 10000)
    compute(3, [("", "0", "CUSTOM_PHYSNET_MSN_S1"),
                ("2", "1", "CUSTOM_PHYSNET_MSN_S2")], 1000, 1000)
    return t.snapshot()


# ---------------------------------------------------------------------------
# The snapshot itself
# ---------------------------------------------------------------------------

class TestSnapshot:
    def test_trees_must_be_complete(self):
        with pytest.raises(ValueError):
            ProviderSnapshot([Provider(id=2, uuid="b", parent_id=1,
                                       root_id=1)])

    def test_child_needs_root(self):
        with pytest.raises(ValueError):
            Provider(id=2, uuid="b", parent_id=1)

    def test_ancestry(self):
        snap = numa_network(deep=True)
        pid = {p.name: p.id for p in snap}
        assert [snap.get(i).name for i in snap.lineage(pid["pf1_1"])] == [
            "pf1_1", "nic1", "cn2", "p2", "gp1"]
        assert snap.lowest_common_ancestor(
            [pid["pf1_1"], pid["pf2_1"]]) == pid["cn2"]
        assert snap.lowest_common_ancestor(
            [pid["pf1_1"], pid["numa0"]]) == pid["gp1"]
        assert snap.lowest_common_ancestor(
            [pid["pf1_1"], pid["ss1"]]) is None
        assert snap.in_same_subtree([pid["cn2"], pid["pf1_1"], pid["nic2"]])
        assert not snap.in_same_subtree([pid["nic1"], pid["pf2_1"]])

    def test_sharing_anchors(self):
        snap = numa_aggregate()
        pid = {p.name: p.id for p in snap}
        anchors = {snap.get(r).name for r in snap.sharing_anchors(pid["ss2"])}
        assert anchors == {"ss2", "cn1"}  # via numa1_1's aggregate
        by_anchor = snap.sharing_providers_by_anchor()
        assert {snap.get(p).name for p in by_anchor[pid["cn1"]]} == {
            "ss1", "ss2"}
        assert {snap.get(p).name for p in by_anchor[pid["cn2"]]} == {"ss1"}


# ---------------------------------------------------------------------------
# allocation-candidates.yaml (SharedStorageFixture)
# ---------------------------------------------------------------------------

class TestSharedStorage:
    snap = shared_storage()

    def test_sharing_and_local_disk(self):
        res = solve(self.snap, "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100",
                    (1, 10))
        assert len(res.allocation_requests) == 5
        assert summary_names(res) == {"cn1", "cn2", "ss", "ss2"}
        assert amounts(self.snap, res, "cn2", "VCPU") == [1, 1, 1]
        assert amounts(self.snap, res, "cn2", "DISK_GB") == [100]
        assert amounts(self.snap, res, "ss", "DISK_GB") == [100, 100]
        assert amounts(self.snap, res, "ss2", "DISK_GB") == [100, 100]
        assert {"cn1": {"VCPU": 1, "MEMORY_MB": 1024},
                "ss": {"DISK_GB": 100}} in allocs(self.snap, res)

    def test_summaries_are_whole_trees_from_1_29(self):
        res = solve(self.snap, "resources=VCPU:1", (1, 29))
        assert len(res.allocation_requests) == 2
        assert len(res.provider_summaries) == 10
        by_name = {s.provider.name: s for s in res.provider_summaries}
        assert by_name["pf1_1"].parent_provider_uuid == uuid_of("numa1_1")
        assert by_name["pf1_1"].root_provider_uuid == uuid_of("cn1")
        assert by_name["cn1"].parent_provider_uuid is None

    def test_limit(self):
        res = solve(self.snap, "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
                    "&limit=1", (1, 16))
        assert len(res.allocation_requests) == 1

    def test_required_trait(self):
        res = solve(self.snap, "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
                    "&required=HW_CPU_X86_SSE", (1, 17))
        assert len(res.allocation_requests) == 2
        assert summary_names(res) == {"cn1", "ss", "ss2"}

    def test_forbidden_trait(self):
        res = solve(self.snap, "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
                    "&required=!HW_CPU_X86_SSE", (1, 22))
        assert len(res.allocation_requests) == 3
        assert amounts(self.snap, res, "cn2", "VCPU") == [1, 1, 1]

    def test_no_match(self):
        res = solve(self.snap, "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
                    "&required=HW_CPU_X86_SSE3", (1, 17))
        assert res.allocation_requests == [] and res.provider_summaries == []

    def test_nested_provider_old_microversion(self):
        res = solve(self.snap, "resources=SRIOV_NET_VF:4", (1, 28))
        assert len(res.allocation_requests) == 4
        assert len(res.provider_summaries) == 4
        res = solve(self.snap, "resources=SRIOV_NET_VF:4", (1, 29))
        assert len(res.allocation_requests) == 4
        assert len(res.provider_summaries) == 10

    def test_root_and_nested(self):
        res = solve(self.snap, "resources=VCPU:1,SRIOV_NET_VF:4", (1, 28))
        assert res.allocation_requests == []
        res = solve(self.snap, "resources=VCPU:1,SRIOV_NET_VF:4", (1, 29))
        assert len(res.allocation_requests) == 4
        assert amounts(self.snap, res, "pf1_2", "SRIOV_NET_VF") == [4]

    def test_nested_limit_keeps_whole_tree_summaries(self):
        res = solve(self.snap, "resources=VCPU:1,SRIOV_NET_VF:4&limit=1",
                    (1, 29))
        assert len(res.allocation_requests) == 1
        assert len(res.allocation_requests[0].allocations) == 2
        assert len(res.provider_summaries) == 5

    def test_shared_and_nested_old_microversion(self):
        res = solve(self.snap, "resources=DISK_GB:10,SRIOV_NET_VF:4", (1, 28))
        assert len(res.allocation_requests) == 8
        assert len(res.provider_summaries) == 6

    @pytest.mark.parametrize("tree,count", [("cn1", 2), ("pf1_2", 2)])
    def test_in_tree(self, tree, count):
        res = solve(self.snap, "resources=VCPU:1,SRIOV_NET_VF:4&in_tree=%s"
                    % uuid_of(tree), (1, 31))
        assert len(res.allocation_requests) == count
        assert len(res.provider_summaries) == 5

    def test_in_tree_excludes_sharing(self):
        query = "resources=VCPU:1,DISK_GB:10&in_tree=%s"
        assert solve(self.snap, query % uuid_of("cn1"),
                     (1, 31)).allocation_requests == []
        res = solve(self.snap, query % uuid_of("cn2"), (1, 31))
        assert allocs(self.snap, res) == [{"cn2": {"VCPU": 1, "DISK_GB": 10}}]
        assert solve(self.snap, query % uuid_of("ss"),
                     (1, 31)).allocation_requests == []

    def test_in_tree_unknown_provider(self):
        assert solve(self.snap, "resources=VCPU:1&in_tree=%s"
                     % uuid_of("nowhere"), (1, 31)).allocation_requests == []

    @pytest.mark.parametrize("query,expected", [
        ("resources1=VCPU:1&in_tree1={cn1}", [{"cn1": {"VCPU": 1}}]),
        ("resources1=VCPU:1&in_tree1={pf1_1}", [{"cn1": {"VCPU": 1}}]),
        ("resources1=SRIOV_NET_VF:4&in_tree1={cn1}",
         [{"pf1_1": {"SRIOV_NET_VF": 4}}, {"pf1_2": {"SRIOV_NET_VF": 4}}]),
        ("resources=VCPU:1&resources1=DISK_GB:10&in_tree1={cn1}", []),
        ("resources=VCPU:1&resources1=DISK_GB:10&in_tree1={cn2}",
         [{"cn2": {"VCPU": 1, "DISK_GB": 10}}]),
        ("resources=VCPU:1&resources1=DISK_GB:10&in_tree1={ss}",
         [{"cn1": {"VCPU": 1}, "ss": {"DISK_GB": 10}},
          {"cn2": {"VCPU": 1}, "ss": {"DISK_GB": 10}}]),
        ("resources=VCPU:1&in_tree={cn1}&resources1=DISK_GB:10",
         [{"cn1": {"VCPU": 1}, "ss": {"DISK_GB": 10}},
          {"cn1": {"VCPU": 1}, "ss2": {"DISK_GB": 10}}]),
        ("resources1=VCPU:1&in_tree1={cn1}&resources2=DISK_GB:10"
         "&in_tree2={ss}&group_policy=none",
         [{"cn1": {"VCPU": 1}, "ss": {"DISK_GB": 10}}]),
    ])
    def test_granular_in_tree(self, query, expected):
        names = {n: uuid_of(n) for n in ("cn1", "cn2", "ss", "pf1_1")}
        res = solve(self.snap, query.format(**names), (1, 31))
        assert allocs(self.snap, res) == sorted(
            expected, key=lambda a: sorted(
                (k, sorted(v.items())) for k, v in a.items()))

    def test_in_tree_unnumbered_with_local_or_shared_disk(self):
        res = solve(self.snap, "resources=VCPU:1&in_tree=%s"
                    "&resources1=DISK_GB:10" % uuid_of("cn2"), (1, 31))
        assert len(res.allocation_requests) == 3


# ---------------------------------------------------------------------------
# granular.yaml and allocation-candidates-mappings-sharing.yaml
# ---------------------------------------------------------------------------

class TestGranular:
    snap = granular()

    def test_different_groups_policy_none(self):
        res = solve(self.snap, "resources1=VCPU:1&resources2=MEMORY_MB:1024"
                    "&group_policy=none", (1, 25))
        assert allocs(self.snap, res) == [
            {cn: {"VCPU": 1, "MEMORY_MB": 1024}}
            for cn in ("cn_left", "cn_middle", "cn_right")]
        assert len(res.provider_summaries) == 3

    def test_different_groups_isolated(self):
        res = solve(self.snap, "resources1=VCPU:1&resources2=MEMORY_MB:1024"
                    "&group_policy=isolate", (1, 25))
        assert res.allocation_requests == [] and res.provider_summaries == []

    def test_resources_combine(self):
        res = solve(self.snap, "resources=VCPU:3,MEMORY_MB:512"
                    "&resources1=VCPU:1,MEMORY_MB:1024&resources2=VCPU:2"
                    "&group_policy=none", (1, 25))
        assert allocs(self.snap, res) == [
            {cn: {"VCPU": 6, "MEMORY_MB": 1536}}
            for cn in ("cn_left", "cn_middle", "cn_right")]

    def test_one_numbered_group(self):
        res = solve(self.snap, "resources=VCPU:1&resources1=MEMORY_MB:2048",
                    (1, 25))
        assert len(res.allocation_requests) == 3

    @pytest.mark.parametrize("policy,count", [("isolate", 5), ("none", 7)])
    def test_disk_sharing(self, policy, count):
        res = solve(self.snap, "resources1=VCPU:1,MEMORY_MB:1024"
                    "&resources2=DISK_GB:100&group_policy=" + policy,
                    (1, 25))
        assert len(res.allocation_requests) == count
        assert len(res.provider_summaries) == 5

    @pytest.mark.parametrize("query", ["resources1=DISK_GB:800",
                                       "resources=DISK_GB:800"])
    def test_disk_alone_deduplicated_across_anchors(self, query):
        res = solve(self.snap, query, (1, 25))
        assert allocs(self.snap, res) == [{"shr_disk_1": {"DISK_GB": 800}},
                                          {"shr_disk_2": {"DISK_GB": 800}}]
        assert summary_names(res) == {"shr_disk_1", "shr_disk_2"}

    def test_isolated_ssd(self):
        res = solve(self.snap, "resources1=VCPU:1,MEMORY_MB:1024"
                    "&resources2=DISK_GB:100&required2=CUSTOM_DISK_SSD"
                    "&group_policy=isolate", (1, 25))
        assert allocs(self.snap, res) == [
            {"cn_left": {"VCPU": 1, "MEMORY_MB": 1024},
             "shr_disk_1": {"DISK_GB": 100}},
            {"cn_middle": {"VCPU": 1, "MEMORY_MB": 1024},
             "shr_disk_1": {"DISK_GB": 100}}]
        assert summary_names(res) == {"cn_left", "cn_middle", "shr_disk_1"}

    def test_no_isolation_forbid_ssd(self):
        res = solve(self.snap, "resources1=VCPU:1&resources2=DISK_GB:100"
                    "&required2=!CUSTOM_DISK_SSD&group_policy=none", (1, 25))
        assert len(res.allocation_requests) == 4
        assert amounts(self.snap, res, "cn_left", "VCPU") == [1, 1]
        assert amounts(self.snap, res, "shr_disk_2", "DISK_GB") == [100] * 3
        assert summary_names(res) == {"cn_left", "cn_middle", "cn_right",
                                      "shr_disk_2"}

    def test_member_of_filters(self):
        res = solve(self.snap, "resources1=VCPU:1&resources2=DISK_GB:100"
                    "&member_of2=%s&group_policy=none" % AGG_C, (1, 25))
        assert allocs(self.snap, res) == [
            {"cn_right": {"VCPU": 1, "DISK_GB": 100}}]

    @pytest.mark.parametrize("query,version", [
        ("resources1=VCPU:1&required1=!HW_CPU_X86_SSE&resources2=DISK_GB:100"
         "&required2=CUSTOM_DISK_SSD&member_of2=in:{a},{c}"
         "&group_policy=none", (1, 25)),
        ("resources_compute=VCPU:1&required_compute=!HW_CPU_X86_SSE"
         "&resources_disk=DISK_GB:100&required_disk=CUSTOM_DISK_SSD"
         "&member_of_disk=in:{a},{c}&group_policy=none", (1, 33)),
    ])
    def test_required_forbidden_member_of_in(self, query, version):
        res = solve(self.snap, query.format(a=AGG_A, c=AGG_C), version)
        assert allocs(self.snap, res) == [
            {"cn_left": {"VCPU": 1}, "shr_disk_1": {"DISK_GB": 100}},
            {"cn_right": {"VCPU": 1, "DISK_GB": 100}}]
        assert len(res.provider_summaries) == 3

    def test_multiple_member_of(self):
        res = solve(self.snap, "resources1=VCPU:1&resources2=DISK_GB:100"
                    "&member_of2=in:%s,%s&member_of2=%s&group_policy=isolate"
                    % (AGG_B, AGG_C, AGG_A), (1, 25))
        assert len(res.allocation_requests) == 3
        assert amounts(self.snap, res, "shr_disk_2", "DISK_GB") == [100] * 3
        assert len(res.provider_summaries) == 4

    def test_multiple_disks_multiple_networks(self):
        res = solve(self.snap, "resources1=VCPU:1&resources2=VGPU:1"
                    "&required2=HW_GPU_API_DXVA&resources3=MEMORY_MB:1024"
                    "&resources4=DISK_GB:100&required4=CUSTOM_DISK_SSD"
                    "&resources5=DISK_GB:50&required5=!CUSTOM_DISK_SSD"
                    "&resources6=SRIOV_NET_VF:1,CUSTOM_NET_MBPS:1000"
                    "&resources7=SRIOV_NET_VF:2,CUSTOM_NET_MBPS:2000"
                    "&group_policy=none", (1, 25))
        left = {"VCPU": 1, "MEMORY_MB": 1024, "VGPU": 1, "SRIOV_NET_VF": 3,
                "CUSTOM_NET_MBPS": 3000}
        assert allocs(self.snap, res) == sorted([
            {"cn_left": dict(left, DISK_GB=50),
             "shr_disk_1": {"DISK_GB": 100}},
            {"cn_left": left, "shr_disk_1": {"DISK_GB": 100},
             "shr_disk_2": {"DISK_GB": 50}},
            {"cn_right": {"VCPU": 1, "MEMORY_MB": 1024, "VGPU": 1,
                          "DISK_GB": 100},
             "shr_disk_2": {"DISK_GB": 50},
             "shr_net": {"SRIOV_NET_VF": 3, "CUSTOM_NET_MBPS": 3000}},
        ], key=lambda a: sorted((k, sorted(v.items())) for k, v in a.items()))
        assert len(res.provider_summaries) == 5

    def test_combined_groups_exceed_capacity(self):
        res = solve(self.snap, "resources=VCPU:2,MEMORY_MB:2048,SRIOV_NET_VF:1"
                    ",CUSTOM_NET_MBPS:2000"
                    "&resources1=SRIOV_NET_VF:1,CUSTOM_NET_MBPS:3000",
                    (1, 25))
        assert allocs(self.snap, res) == [
            {"cn_right": {"VCPU": 2, "MEMORY_MB": 2048},
             "shr_net": {"SRIOV_NET_VF": 2, "CUSTOM_NET_MBPS": 5000}}]

    def test_combined_groups_exceed_max_unit(self):
        res = solve(self.snap, "resources=VGPU:1&resources1=VGPU:1"
                    "&resources2=VGPU:1&group_policy=none", (1, 25))
        assert allocs(self.snap, res) == [{"cn_left": {"VGPU": 3}}]

    # allocation-candidates-mappings-sharing.yaml
    def test_mapping_non_granular(self):
        res = solve(self.snap, "resources=VCPU:1&required=HW_CPU_X86_SSE",
                    (1, 34))
        assert named(self.snap, res) == [
            ({"cn_middle": {"VCPU": 1}}, {"": ["cn_middle"]})]

    def test_mapping_with_shared(self):
        res = solve(self.snap, "resources=VCPU:1,DISK_GB:1"
                    "&required=HW_CPU_X86_SSE", (1, 34))
        assert len(res.allocation_requests) == 2
        for _, maps in named(self.snap, res):
            assert list(maps) == [""] and len(maps[""]) == 2

    def test_group_mapping_with_shared(self):
        res = solve(self.snap, "resources=VCPU:1&resources_DISK_A=DISK_GB:1"
                    "&resources_DISK_B=DISK_GB:1&required=HW_CPU_X86_SSE"
                    "&group_policy=isolate", (1, 34))
        assert sorted((m["_DISK_A"], m["_DISK_B"])
                      for _, m in named(self.snap, res)) == [
            (["shr_disk_1"], ["shr_disk_2"]), (["shr_disk_2"], ["shr_disk_1"])]

    # allocation-candidates-any-traits.yaml
    def test_any_traits_and_forbidden(self):
        res = solve(self.snap, "required=in:HW_GPU_API_DXVA,HW_NIC_ACCEL_TLS"
                    "&required=HW_CPU_X86_AVX,!CUSTOM_FOO"
                    "&resources=VCPU:1,DISK_GB:1")
        assert allocs(self.snap, res) == [
            {"cn_middle": {"VCPU": 1}, "shr_disk_1": {"DISK_GB": 1}},
            {"cn_middle": {"VCPU": 1}, "shr_disk_2": {"DISK_GB": 1}}]

    def test_multiple_any_traits(self):
        res = solve(self.snap, "required=in:HW_CPU_X86_MMX,HW_NIC_ACCEL_TLS"
                    "&required=in:CUSTOM_DISK_SSD,CUSTOM_FOO"
                    "&resources=VCPU:1,DISK_GB:1")
        assert allocs(self.snap, res) == [
            {"cn_middle": {"VCPU": 1}, "shr_disk_1": {"DISK_GB": 1}},
            {"cn_right": {"VCPU": 1, "DISK_GB": 1}},
            {"cn_right": {"VCPU": 1}, "shr_disk_2": {"DISK_GB": 1}}]

    def test_required_overwritten_before_1_39(self):
        res = solve(self.snap, "required=CUSTOM_FOO&required=HW_CPU_X86_MMX"
                    "&resources=VCPU:1", (1, 38))
        assert allocs(self.snap, res) == [{"cn_right": {"VCPU": 1}}]
        res = solve(self.snap, "requiredX=CUSTOM_FOO"
                    "&requiredX=HW_CPU_X86_MMX&resourcesX=VCPU:1", (1, 38))
        assert allocs(self.snap, res) == [{"cn_right": {"VCPU": 1}}]


# ---------------------------------------------------------------------------
# Mappings, same_subtree and root_required (NUMANetworkFixture)
# ---------------------------------------------------------------------------

class TestNumaNetwork:
    snap = numa_network()

    def test_simple_mapping(self):
        res = solve(self.snap, "resources=VCPU:1", (1, 34))
        assert len(res.allocation_requests) == 3
        assert len(res.provider_summaries) == 23
        for _, maps in named(self.snap, res):
            assert len(maps[""]) == 1

    def test_isolated_swaps_are_distinct(self):
        res = solve(self.snap, "resources_LEFT=VCPU:1&resources_RIGHT=VCPU:1"
                    "&group_policy=isolate", (1, 34))
        assert sorted((m["_LEFT"], m["_RIGHT"])
                      for _, m in named(self.snap, res)) == [
            (["numa0"], ["numa1"]), (["numa1"], ["numa0"])]
        assert len(res.provider_summaries) == 12

    def test_granular_plus_not_granular(self):
        res = solve(self.snap, "required_NET1=CUSTOM_PHYSNET1"
                    "&resources_NET1=NET_BW_EGR_KILOBIT_PER_SEC:10"
                    "&required_NET2=CUSTOM_PHYSNET2"
                    "&resources_NET2=NET_BW_EGR_KILOBIT_PER_SEC:20"
                    "&resources=VCPU:1&group_policy=isolate", (1, 34))
        assert len(res.allocation_requests) == 2
        for _, maps in named(self.snap, res):
            assert maps["_NET1"] == ["esn1"] and maps["_NET2"] == ["esn2"]
            assert maps[""] in (["numa0"], ["numa1"])

    def test_non_isolated_mapping_shows_both_groups(self):
        res = solve(self.snap, "resources_BWA=NET_BW_EGR_KILOBIT_PER_SEC:10"
                    "&required_BWA=CUSTOM_PHYSNET1"
                    "&resources_BWB=NET_BW_EGR_KILOBIT_PER_SEC:20"
                    "&required_BWB=CUSTOM_PHYSNET1&group_policy=none",
                    (1, 34))
        assert named(self.snap, res) == [(
            {"esn1": {"NET_BW_EGR_KILOBIT_PER_SEC": 30}},
            {"_BWA": ["esn1"], "_BWB": ["esn1"]})]

    def test_two_classes_one_suffix(self):
        res = solve(self.snap, "required_NET1=CUSTOM_PHYSNET1"
                    "&resources_NET1=NET_BW_EGR_KILOBIT_PER_SEC:10"
                    "&required_NET2=CUSTOM_PHYSNET2"
                    "&resources_NET2=NET_BW_EGR_KILOBIT_PER_SEC:20"
                    "&resources_COMPUTE=VCPU:1,MEMORY_MB:1024"
                    "&group_policy=isolate", (1, 34))
        assert len(res.allocation_requests) == 2
        for _, maps in named(self.snap, res):
            assert len(maps["_COMPUTE"]) == 1

    # granular-same-subtree.yaml
    @pytest.mark.parametrize("subtree,count", [
        ("", 6), ("&same_subtree=_COMPUTE", 6),
        ("&same_subtree=_COMPUTE,_ACCEL", 3)])
    def test_compute_and_accel(self, subtree, count):
        res = solve(self.snap, "resources_COMPUTE=VCPU:1"
                    "&resources_ACCEL=FPGA:1&group_policy=none" + subtree,
                    (1, 36))
        assert len(res.allocation_requests) == count

    @pytest.mark.parametrize("policy,count", [("none", 3), ("isolate", 0)])
    def test_same_subtree_same_provider(self, policy, count):
        res = solve(self.snap, "resources_COMPUTE1=VCPU:1"
                    "&resources_COMPUTE2=MEMORY_MB:1024"
                    "&same_subtree=_COMPUTE1,_COMPUTE2&group_policy=" + policy,
                    (1, 36))
        assert len(res.allocation_requests) == count

    def test_resourceful_without_same_subtree(self):
        res = solve(self.snap, "resources=VCPU:1"
                    "&resources_PORT1=CUSTOM_VF:4&required_PORT1=CUSTOM_PHYSNET1"
                    "&resources_PORT2=CUSTOM_VF:4&required_PORT2=CUSTOM_PHYSNET2"
                    "&group_policy=none", (1, 36))
        assert len(res.allocation_requests) == 2
        assert amounts(self.snap, res, "pf1_2", "CUSTOM_VF") == [4, 4]

    def test_resourceless_same_subtree_4vfs(self):
        res = solve(self.snap, "resources=VCPU:1"
                    "&required_NIC=CUSTOM_HW_NIC_ROOT"
                    "&resources_PORT1=CUSTOM_VF:4&required_PORT1=CUSTOM_PHYSNET1"
                    "&resources_PORT2=CUSTOM_VF:4&required_PORT2=CUSTOM_PHYSNET2"
                    "&same_subtree=_NIC,_PORT1,_PORT2&group_policy=none",
                    (1, 36))
        assert named(self.snap, res) == [(
            {"cn2": {"VCPU": 1}, "pf1_1": {"CUSTOM_VF": 4},
             "pf1_2": {"CUSTOM_VF": 4}},
            {"": ["cn2"], "_NIC": ["nic1"], "_PORT1": ["pf1_1"],
             "_PORT2": ["pf1_2"]})]

    @pytest.mark.parametrize("policy", ["none", "isolate"])
    def test_resourceless_same_subtree_2vfs(self, policy):
        res = solve(self.snap, "resources=VCPU:1"
                    "&required_NIC=CUSTOM_HW_NIC_ROOT"
                    "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
                    "&resources_PORT2=CUSTOM_VF:2&required_PORT2=CUSTOM_PHYSNET2"
                    "&same_subtree=_NIC,_PORT1,_PORT2&group_policy=" + policy,
                    (1, 36))
        assert len(res.allocation_requests) == 5
        assert amounts(self.snap, res, "pf2_4", "CUSTOM_VF") == [2, 2]

    @pytest.mark.parametrize("policy,count", [("none", 9), ("isolate", 4)])
    def test_resourceless_same_subtree_2_1_1(self, policy, count):
        res = solve(self.snap, "resources=VCPU:1"
                    "&required_NIC=CUSTOM_HW_NIC_ROOT"
                    "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
                    "&resources_PORT2A=CUSTOM_VF:1"
                    "&required_PORT2A=CUSTOM_PHYSNET2"
                    "&resources_PORT2B=CUSTOM_VF:1"
                    "&required_PORT2B=CUSTOM_PHYSNET2"
                    "&same_subtree=_NIC,_PORT1,_PORT2A,_PORT2B"
                    "&group_policy=" + policy, (1, 36))
        assert len(res.allocation_requests) == count
        if policy == "none":
            assert amounts(self.snap, res, "pf2_2", "CUSTOM_VF") == [
                1, 1, 1, 1, 2, 2]
        else:
            assert amounts(self.snap, res, "pf2_2", "CUSTOM_VF") == [1] * 4

    @pytest.mark.parametrize("policy,count", [("none", 1), ("isolate", 0)])
    def test_resourceless_same_provider(self, policy, count):
        res = solve(self.snap, "resources_PORT1=CUSTOM_VF:8"
                    "&required_PORT2=CUSTOM_PHYSNET1"
                    "&same_subtree=_PORT1,_PORT2&group_policy=" + policy,
                    (1, 36))
        assert len(res.allocation_requests) == count
        if count:
            assert named(self.snap, res) == [(
                {"pf3_1": {"CUSTOM_VF": 8}},
                {"_PORT1": ["pf3_1"], "_PORT2": ["pf3_1"]})]

    @pytest.mark.parametrize("policy,count", [("none", 1), ("isolate", 0)])
    def test_several_resourceless_same_provider(self, policy, count):
        res = solve(self.snap, "resources_COMPUTE1=VCPU:1"
                    "&required_COMPUTE2=CUSTOM_FOO"
                    "&required_COMPUTE3=HW_NUMA_ROOT"
                    "&same_subtree=_COMPUTE1,_COMPUTE2,_COMPUTE3"
                    "&group_policy=" + policy, (1, 36))
        assert len(res.allocation_requests) == count

    @pytest.mark.parametrize("named_by,count", [
        ("required_PORT2=CUSTOM_PHYSNET1", 1),
        ("required_PORT2=in:CUSTOM_PHYSNET1,CUSTOM_PHYSNET2", 1),
        # Nothing to look a provider up by: none found, as by Placement
        # (asked of the reference: 200 with no candidates).
        ("required_PORT2=!CUSTOM_PHYSNET2", 0),
        ("in_tree_PORT2=cn3", 0),
        ("member_of_PORT2=!11111111-2222-3333-4444-555555555555", 0),
    ])
    def test_resourceless_group_is_found_by_what_it_requires(self, named_by, count):
        pf = next(p for p in self.snap if p.name == "pf3_1")
        tree = self.snap.get(pf.root_id).uuid
        res = solve(self.snap, "resources_PORT1=CUSTOM_VF:8&" + named_by.replace("cn3", tree)
                    + "&same_subtree=_PORT1,_PORT2&group_policy=none", (1, 39))
        assert len(res.allocation_requests) == count

    @pytest.mark.parametrize("tree,count", [("cn2", 1), ("cn1", 0)])
    def test_resourceless_group_keeps_to_its_in_tree(self, tree, count):
        """``in_tree_PORT2`` confines the resourceless group as it does a group
        of resources.  Placement 16.0.0 disregards it on a resourceless group
        and answers the cn2 candidate for either tree (docs/differences.md)."""
        uuid = next(p.uuid for p in self.snap if p.name == tree)
        res = solve(self.snap, "resources_PORT1=CUSTOM_VF:8&required_PORT2=CUSTOM_PHYSNET1"
                    f"&in_tree_PORT2={uuid}&same_subtree=_PORT1,_PORT2&group_policy=none", (1, 39))
        assert len(res.allocation_requests) == count

    def test_resourceless_two_fpgas(self):
        res = solve(self.snap, "required_NUMA=HW_NUMA_ROOT"
                    "&resources_ACCEL1=FPGA:1&resources_ACCEL2=FPGA:1"
                    "&same_subtree=_NUMA,_ACCEL1,_ACCEL2"
                    "&group_policy=isolate", (1, 36))
        assert sorted((m["_NUMA"], m["_ACCEL1"], m["_ACCEL2"])
                      for _, m in named(self.snap, res)) == [
            (["numa1"], ["fpga1_0"], ["fpga1_1"]),
            (["numa1"], ["fpga1_1"], ["fpga1_0"])]
        res = solve(self.snap, "required_NUMA=HW_NUMA_ROOT,!CUSTOM_FOO"
                    "&resources_ACCEL1=FPGA:1&resources_ACCEL2=FPGA:1"
                    "&same_subtree=_NUMA,_ACCEL1,_ACCEL2"
                    "&group_policy=isolate", (1, 36))
        assert res.allocation_requests == []

    def test_multiple_same_subtrees(self):
        res = solve(self.snap, "required_NUMA=HW_NUMA_ROOT"
                    "&resources_COMPUTE=VCPU:2,MEMORY_MB:512"
                    "&resources_FPGA=FPGA:1&resources_GPU=VGPU:1"
                    "&required_SRIOV=CUSTOM_VNIC_TYPE_DIRECT"
                    "&resources_NET1=NET_BW_EGR_KILOBIT_PER_SEC:100"
                    "&required_NET1=CUSTOM_PHYSNET1"
                    "&resources_NET2=NET_BW_EGR_KILOBIT_PER_SEC:100"
                    "&required_NET2=CUSTOM_PHYSNET2"
                    "&same_subtree=_NUMA,_COMPUTE,_GPU,_FPGA"
                    "&same_subtree=_SRIOV,_NET1,_NET2&group_policy=none",
                    (1, 36))
        assert named(self.snap, res) == [(
            {"numa0": {"VCPU": 2, "MEMORY_MB": 512}, "fpga0": {"FPGA": 1},
             "pgpu0": {"VGPU": 1},
             "esn1": {"NET_BW_EGR_KILOBIT_PER_SEC": 100},
             "esn2": {"NET_BW_EGR_KILOBIT_PER_SEC": 100}},
            {"_NUMA": ["numa0"], "_COMPUTE": ["numa0"], "_FPGA": ["fpga0"],
             "_GPU": ["pgpu0"], "_SRIOV": ["sriov_agent"],
             "_NET1": ["esn1"], "_NET2": ["esn2"]})]

    @pytest.mark.parametrize("subtrees,count", [
        ("&same_subtree=_NIC,_COMPUTE&same_subtree=_NIC,_PORT1", 4),
        ("&same_subtree=_NIC,_COMPUTE,_PORT1", 12)])
    def test_overlapping_or_combined_same_subtree(self, subtrees, count):
        res = solve(self.snap, "resources_COMPUTE=VCPU:1"
                    "&required_NIC=CUSTOM_HW_NIC_ROOT"
                    "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
                    "&group_policy=none" + subtrees, (1, 36))
        assert len(res.allocation_requests) == count
        assert len(res.provider_summaries) == 11
        assert all(m["_COMPUTE"] == ["cn2"] for _, m in named(self.snap, res))

    def test_same_subtree_ancestry_hole(self):
        res = solve(self.snap, "required_MULTI_ATTACH=COMPUTE_VOLUME_MULTI_ATTACH"
                    "&resources_BW=NET_BW_EGR_KILOBIT_PER_SEC:100"
                    "&resources_COMPUTE=VCPU:4"
                    "&same_subtree=_MULTI_ATTACH,_BW,_COMPUTE"
                    "&group_policy=isolate", (1, 36))
        assert len(res.allocation_requests) == 3

    # allocation-candidates-root-required.yaml
    @pytest.mark.parametrize("query,count", [
        ("resources=VCPU:1&root_required=HW_NUMA_ROOT", 0),
        ("resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
         "&root_required=MISC_SHARES_VIA_AGGREGATE", 0),
        ("resources=VCPU:1,MEMORY_MB:1024"
         "&root_required=COMPUTE_VOLUME_MULTI_ATTACH", 4),
        ("resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=none"
         "&root_required=COMPUTE_VOLUME_MULTI_ATTACH", 4),
        ("resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=isolate"
         "&root_required=COMPUTE_VOLUME_MULTI_ATTACH", 2),
        ("resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
         "&root_required=COMPUTE_VOLUME_MULTI_ATTACH", 4),
        ("resources1=VCPU:1,MEMORY_MB:1024&resources2=DISK_GB:100"
         "&group_policy=none&root_required=COMPUTE_VOLUME_MULTI_ATTACH", 2),
        ("resources=VCPU:1,DISK_GB:100&required=CUSTOM_FOO", 3),
        ("resources=VCPU:1,DISK_GB:100&root_required=CUSTOM_FOO", 2),
        ("resources1=VCPU:1&required1=CUSTOM_FOO&resources2=DISK_GB:100"
         "&group_policy=none", 3),
        ("resources1=VCPU:1&resources2=DISK_GB:100&group_policy=none"
         "&root_required=CUSTOM_FOO", 2),
        ("resources=VCPU:3&root_required=!HW_NUMA_ROOT", 2),
        ("resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
         "&root_required=!MISC_SHARES_VIA_AGGREGATE", 6),
        ("resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
         "&root_required=CUSTOM_FOO,!HW_NUMA_ROOT", 2),
        ("resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
         "&root_required=CUSTOM_FOO,!COMPUTE_VOLUME_MULTI_ATTACH", 2),
        ("resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"
         "&root_required=!CUSTOM_FOO,!COMPUTE_VOLUME_MULTI_ATTACH", 0),
        ("resources1=VCPU:1,MEMORY_MB:1024&resources2=DISK_GB:100"
         "&group_policy=none&root_required=!CUSTOM_FOO", 2),
        ("resources=VCPU:1&required=CUSTOM_FOO&root_required=CUSTOM_FOO", 1),
        ("resources1=VCPU:1&required1=CUSTOM_FOO&root_required=CUSTOM_FOO",
         1),
        ("resources1=VCPU:1&required1=CUSTOM_FOO&root_required=!CUSTOM_FOO",
         1),
        ("resources1=VCPU:1&required1=!CUSTOM_FOO&root_required=CUSTOM_FOO",
         0),
    ])
    def test_root_required(self, query, count):
        res = solve(self.snap, query, (1, 35))
        assert len(res.allocation_requests) == count

    def test_summary_traits_keep_the_given_order(self):
        t = Trees()
        t.add("cn", traits=("HW_NUMA_ROOT", "CUSTOM_FOO"), inv={"VCPU": 1})
        snap = t.snapshot()
        res = solve(snap, "resources=VCPU:1&required=CUSTOM_FOO")
        assert list(res.provider_summaries[0].provider.traits) == [
            "HW_NUMA_ROOT", "CUSTOM_FOO"]

    def test_required_foo_tied_to_resources(self):
        res = solve(self.snap, "resources=VCPU:1,DISK_GB:100"
                    "&required=CUSTOM_FOO", (1, 35))
        assert allocs(self.snap, res) == [
            {"cn2": {"VCPU": 1, "DISK_GB": 100}},
            {"cn2": {"VCPU": 1}, "ss1": {"DISK_GB": 100}},
            {"numa1": {"VCPU": 1}, "ss1": {"DISK_GB": 100}}]


class TestDeepNumaNetwork:
    snap = numa_network(deep=True)

    @pytest.mark.parametrize("query", [
        "resources_COMPUTE=VCPU:1&required_COMPUTE=CUSTOM_FOO"
        "&required_NIC=CUSTOM_HW_NIC_ROOT&resources_PORT1=CUSTOM_VF:2"
        "&required_PORT1=CUSTOM_PHYSNET1&same_subtree=_NIC,_COMPUTE"
        "&same_subtree=_NIC,_PORT1&group_policy=none",
        "resources_COMPUTE=VCPU:1&required_COMPUTE=CUSTOM_FOO"
        "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
        "&same_subtree=_COMPUTE,_PORT1&group_policy=none",
        "resources_COMPUTE=VCPU:1&resources_PORT1=CUSTOM_VF:2"
        "&required_PORT1=CUSTOM_PHYSNET1&same_subtree=_COMPUTE,_PORT1"
        "&group_policy=none",
    ])
    def test_deep_subtree(self, query):
        res = solve(self.snap, query, (1, 36))
        assert len(res.allocation_requests) == 4
        assert len(res.provider_summaries) == 26
        assert all(m["_COMPUTE"] == ["cn2"] for _, m in named(self.snap, res))
        assert sorted(amounts(self.snap, res, pf, "CUSTOM_VF")
                      for pf in ("pf1_1", "pf3_1", "pf2_1", "pf2_3")) == [
            [2]] * 4


# ---------------------------------------------------------------------------
# Aggregates (NUMAAggregateFixture, NonSharedStorageFixture)
# ---------------------------------------------------------------------------

class TestNumaAggregate:
    snap = numa_aggregate()

    @pytest.mark.parametrize("query,expected", [
        ("resources=VCPU:1", {"numa1_1", "numa1_2", "numa2_1", "numa2_2"}),
        ("resources=VCPU:1&member_of={a}",
         {"numa1_1", "numa1_2", "numa2_1", "numa2_2"}),
        ("resources1=VCPU:1&member_of1={a}", set()),
        ("resources=VCPU:1&member_of={b}", {"numa2_1", "numa2_2"}),
        ("resources=VCPU:1&member_of={c}", {"numa1_1"}),
        ("resources1=VCPU:1&member_of1={c}", {"numa1_1"}),
    ])
    def test_aggregate_on_root_spans_tree_for_unsuffixed(self, query,
                                                         expected):
        res = solve(self.snap, query.format(a=AGG_A, b=AGG_B, c=AGG_C),
                    (1, 32))
        got = [set(a) for a in allocs(self.snap, res)]
        assert len(got) == len(expected)
        assert set().union(*got) == expected

    @pytest.mark.parametrize("member_of,expected", [
        ("", [("numa1_1", "ss1"), ("numa1_2", "ss1"), ("numa2_1", "ss1"),
              ("numa2_2", "ss1"), ("numa1_1", "ss2"), ("numa1_2", "ss2")]),
        ("&member_of={a}", [("numa1_1", "ss1"), ("numa1_2", "ss1"),
                            ("numa2_1", "ss1"), ("numa2_2", "ss1")]),
        ("&member_of={b}", []),
        ("&member_of={c}", [("numa1_1", "ss2")]),
        ("&member_of=!{a}", []),
        ("&member_of=!{b}", [("numa1_1", "ss1"), ("numa1_2", "ss1"),
                             ("numa1_1", "ss2"), ("numa1_2", "ss2")]),
        ("&member_of=!{c}", [("numa1_2", "ss1"), ("numa2_1", "ss1"),
                             ("numa2_2", "ss1")]),
        ("&member_of=in:{a},{b}&member_of=!{c}",
         [("numa1_2", "ss1"), ("numa2_1", "ss1"), ("numa2_2", "ss1")]),
        ("&member_of={a}&member_of=!in:{b},{c}", [("numa1_2", "ss1")]),
    ])
    def test_shared_storage_and_aggregates(self, member_of, expected):
        res = solve(self.snap, "resources=VCPU:1,DISK_GB:1000" +
                    member_of.format(a=AGG_A, b=AGG_B, c=AGG_C), (1, 32))
        got = sorted((next(n for n in a if n.startswith("numa")),
                      next(n for n in a if n.startswith("ss")))
                     for a in allocs(self.snap, res))
        assert got == sorted(expected)


class TestNonSharedStorage:
    def test_member_of_combinations(self):
        query = "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100&member_of="
        snap = non_shared_storage()
        assert solve(snap, query + AGG_A, (1, 24)).allocation_requests == []
        snap = non_shared_storage(cn1_aggs=[AGG_A])
        res = solve(snap, query + "in:%s,%s" % (AGG_A, AGG_B), (1, 24))
        assert len(res.allocation_requests) == 1
        snap = non_shared_storage(cn1_aggs=[AGG_A, AGG_C], cn2_aggs=[AGG_B])
        assert len(solve(snap, query + "in:%s,%s" % (AGG_A, AGG_B),
                         (1, 24)).allocation_requests) == 2
        assert solve(snap, query + "%s&member_of=%s" % (AGG_A, AGG_B),
                     (1, 24)).allocation_requests == []
        snap = non_shared_storage(cn1_aggs=[AGG_A, AGG_C],
                                  cn2_aggs=[AGG_A, AGG_B])
        assert len(solve(snap, query + "%s&member_of=%s" % (AGG_A, AGG_B),
                         (1, 24)).allocation_requests) == 1

    @pytest.mark.parametrize("member_of,expected", [
        ("!{c}", {"cn2", "cn3"}),
        ("!in:{b},{c}", {"cn3"}),
        ("!{b}&member_of={c}", {"cn1"}),
        ("!in:{b},{c}&member_of={a}", set()),
        ("!{b}&member_of=in:{b},{c}", {"cn1"}),
        ("!{b}&member_of={b}", set()),
    ])
    def test_forbidden_aggregates(self, member_of, expected):
        snap = non_shared_storage(cn1_aggs=[AGG_A, AGG_C],
                                  cn2_aggs=[AGG_A, AGG_B])
        res = solve(snap, "resources=VCPU:1&member_of=" + member_of.format(
            a=AGG_A, b=AGG_B, c=AGG_C), (1, 32))
        assert {n for a in allocs(snap, res) for n in a} == expected
        assert summary_names(res) == expected


# ---------------------------------------------------------------------------
# Multi-segment QoS (allocation-candidates-any-traits-groups.yaml)
# ---------------------------------------------------------------------------

class TestNeutronQos:
    snap = neutron_qos()
    base = ("resources=VCPU:1,MEMORY_MB:1024,DISK_GB:10&group_policy=none")

    def port(self, name, bw, pps, physnet):
        return ("&resources-{n}-pps=NET_PACKET_RATE_KILOPACKET_PER_SEC:{pps}"
                "&required-{n}-pps=CUSTOM_VNIC_TYPE_NORMAL"
                "&resources-{n}-bw=NET_BW_EGR_KILOBIT_PER_SEC:{bw},"
                "NET_BW_IGR_KILOBIT_PER_SEC:{bw}"
                "&required-{n}-bw=CUSTOM_VNIC_TYPE_NORMAL"
                "&required-{n}-bw={physnet}"
                "&same_subtree=-{n}-pps,-{n}-bw").format(
                    n=name, bw=bw, pps=pps, physnet=physnet)

    def test_single_port_plain_network(self):
        res = solve(self.snap, self.base + self.port(
            "p", 1000, 1000, "CUSTOM_PHYSNET_OTHER"))
        assert len(res.allocation_requests) == 1
        assert "compute0" in allocs(self.snap, res)[0]

    def test_single_port_multi_segment(self):
        res = solve(self.snap, self.base + self.port(
            "p", 1000, 1000, "in:CUSTOM_PHYSNET_MSN_S1,CUSTOM_PHYSNET_MSN_S2"))
        assert len(res.allocation_requests) == 4
        assert amounts(self.snap, res, "compute3", "VCPU") == [1, 1]

    @pytest.mark.parametrize("bw,count", [(1000, 4), (100, 6)])
    def test_two_ports_multi_segment(self, bw, count):
        physnets = "in:CUSTOM_PHYSNET_MSN_S1,CUSTOM_PHYSNET_MSN_S2"
        res = solve(self.snap, self.base + self.port("p1", bw, 100, physnets)
                    + self.port("p2", bw, 100, physnets))
        assert len(res.allocation_requests) == count
        assert amounts(self.snap, res, "compute3:ovs",
                       "NET_PACKET_RATE_KILOPACKET_PER_SEC") == [200] * (
            count - 2)
        if bw == 100:
            assert amounts(self.snap, res, "compute3:br_ex",
                           "NET_BW_IGR_KILOBIT_PER_SEC") == [100, 100, 200]


# ---------------------------------------------------------------------------
# shared-resources.yaml and capacity details
# ---------------------------------------------------------------------------

class TestSharingNeedsTraitAndAggregate:
    def build(self, shared_aggs=(), shared_traits=()):
        t = Trees()
        t.add("cn1", aggs=[AGG_A], inv={"VCPU": 20, "MEMORY_MB": 100000})
        t.add("cn2", inv={"VCPU": 20, "MEMORY_MB": 100000,
                          "DISK_GB": 100000})
        t.add("magic", aggs=shared_aggs, traits=shared_traits,
              inv={"CUSTOM_MAGIC": 5})
        return t.snapshot()

    @pytest.mark.parametrize("aggs,traits,count", [
        ((), (), 0), ((AGG_A,), (), 0), ((AGG_A,), (SHARING_TRAIT,), 1)])
    def test_sharing(self, aggs, traits, count):
        snap = self.build(aggs, traits)
        res = solve(snap, "resources=VCPU:1,CUSTOM_MAGIC:1")
        assert len(res.allocation_requests) == count
        assert len(res.provider_summaries) == 2 * count


class TestCapacityRules:
    def snap(self, **inv):
        t = Trees()
        t.add("rp", inv={"DISK_GB": dict(inv)}, used={"DISK_GB": 1000})
        return t.snapshot()

    @pytest.mark.parametrize("amount,count", [
        (1, 0), (10, 1), (11, 0), (1000, 1), (1010, 0), (1050, 0)])
    def test_units_and_capacity(self, amount, count):
        snap = self.snap(total=2048, step_size=10, min_unit=10, max_unit=1000)
        res = solve(snap, "resources=DISK_GB:%d" % amount)
        assert len(res.allocation_requests) == count

    def test_summary_capacity(self):
        res = solve(shared_storage(), "resources=VCPU:1", (1, 27))
        inv = {s.provider.name: s.provider.inventories
               for s in res.provider_summaries}
        assert inv["cn1"]["VCPU"].capacity == 384
        assert inv["cn1"]["MEMORY_MB"].capacity == 196608
        assert inv["cn2"]["DISK_GB"].capacity == 1900


# ---------------------------------------------------------------------------
# Limits, caps, strategies, randomisation
# ---------------------------------------------------------------------------

def flat(n_roots=5, vcpu=4):
    t = Trees()
    for i in range(n_roots):
        t.add("cn%d" % i, inv={"VCPU": vcpu})
        for j in range(2):
            t.add("cn%d_numa%d" % (i, j), "cn%d" % i, inv={"VGPU": 1})
    return t.snapshot()


class TestGenerationPolicy:
    snap = flat()
    query = "resources=VCPU:1&resources1=VGPU:1&group_policy=none"

    def roots(self, res):
        return [a.anchor_root_id for a in res.allocation_requests]

    def test_depth_first_fills_first_root(self):
        res = solve(self.snap, self.query, max_candidates=3)
        assert self.roots(res) == [1, 1, 4]

    def test_breadth_first_round_robin(self):
        res = solve(self.snap, self.query, max_candidates=3,
                    strategy=ac.BREADTH_FIRST)
        assert self.roots(res) == [1, 4, 7]

    def test_breadth_first_all_same_set(self):
        depth = solve(self.snap, self.query)
        breadth = solve(self.snap, self.query, strategy=ac.BREADTH_FIRST)
        assert sorted(map(repr, depth.allocation_requests)) == sorted(
            map(repr, breadth.allocation_requests))

    def test_zero_cap_still_lets_one_through(self):
        assert len(solve(self.snap, self.query,
                         max_candidates=0).allocation_requests) == 1

    def test_limit_after_cap(self):
        res = solve(self.snap, self.query + "&limit=2", max_candidates=5)
        assert len(res.allocation_requests) == 2
        assert {s.provider.name for s in res.provider_summaries} == {
            "cn0", "cn0_numa0", "cn0_numa1"}

    def test_unknown_strategy(self):
        with pytest.raises(ValueError):
            solve(self.snap, self.query, strategy="sideways")

    def test_randomized_sample(self):
        everything = {repr(a) for a in solve(
            self.snap, self.query).allocation_requests}
        picked = solve(self.snap, self.query + "&limit=4", randomize=True,
                       rng=random.Random(7)).allocation_requests
        assert len(picked) == 4 and {repr(a) for a in picked} <= everything
        roots = {a.anchor_root_id for a in picked}
        summaries = solve(self.snap, self.query + "&limit=4", randomize=True,
                          rng=random.Random(7)).provider_summaries
        assert {s.provider.root_id for s in summaries} == roots

    def test_randomized_shuffle_without_limit(self):
        ordered = solve(self.snap, self.query).allocation_requests
        shuffled = solve(self.snap, self.query, randomize=True,
                         rng=random.Random(3)).allocation_requests
        assert sorted(map(repr, ordered)) == sorted(map(repr, shuffled))
        assert list(map(repr, ordered)) != list(map(repr, shuffled))


# ---------------------------------------------------------------------------
# Speed: wide symmetric trees
# ---------------------------------------------------------------------------

def wide(n_roots, gpus=8, vgpus=16):
    providers = []
    pid = 0
    for _ in range(n_roots):
        pid += 1
        root = pid
        providers.append(Provider(
            id=root, uuid=str(uuidlib.UUID(int=root)), traits={"HW_CPU_X86_AVX2"},
            inventories={
                "VCPU": ProviderInventory(total=64, allocation_ratio=4.0),
                "MEMORY_MB": ProviderInventory(total=262144, reserved=512),
                "DISK_GB": ProviderInventory(total=2000, min_unit=10,
                                             step_size=10)}))
        for _ in range(gpus):
            pid += 1
            gpu = pid
            providers.append(Provider(
                id=gpu, uuid=str(uuidlib.UUID(int=gpu)), parent_id=root,
                root_id=root, traits={"CUSTOM_GPU_A100"}))
            for _ in range(vgpus):
                pid += 1
                providers.append(Provider(
                    id=pid, uuid=str(uuidlib.UUID(int=pid)), parent_id=gpu,
                    root_id=root, traits={"CUSTOM_GPU_A100"},
                    inventories={"VGPU": ProviderInventory(total=1)}))
    return ProviderSnapshot(providers)


class TestWideTrees:
    @staticmethod
    def checks_made(monkeypatch, request, snap, **kw):
        """(result, how many partial assignments the search checked): a
        measure of the search's work that does not depend on the machine's
        load, unlike a stopwatch."""
        calls = [0]
        consistent = ac.Search.consistent

        def counting(search, depth):
            calls[0] += 1
            return consistent(search, depth)

        with monkeypatch.context() as patch:
            patch.setattr(ac.Search, "consistent", counting)
            res = ac.find_allocation_candidates(request, snap, **kw)
        return res, calls[0]

    def test_four_isolated_groups_with_limit_is_fast(self, monkeypatch):
        snap = wide(100)
        request = rg.parse_allocation_candidates(parse_qsl(
            "resources=VCPU:1,MEMORY_MB:512&resources1=VGPU:1"
            "&resources2=VGPU:1&resources3=VGPU:1&resources4=VGPU:1"
            "&group_policy=isolate&limit=1000"), (1, 39))
        res, checks = self.checks_made(monkeypatch, request, snap)
        assert len(res.allocation_requests) == 1000
        assert len(res.provider_summaries) == 137
        for areq in res.allocation_requests:
            vgpus = [areq.mappings[s][0] for s in ("1", "2", "3", "4")]
            assert len(set(vgpus)) == 4
        # Each candidate found without a detour (1,012 checks today); an
        # enumeration of the 128^4 assignments would never get here.
        assert checks < 5 * len(res.allocation_requests), checks

    def test_breadth_first_touches_every_root_linearly(self, monkeypatch):
        request = rg.parse_allocation_candidates(parse_qsl(
            "resources=VCPU:1&resources1=VGPU:1&resources2=VGPU:1"
            "&group_policy=isolate&limit=1000"), (1, 39))
        work = {}
        for roots in (50, 100):
            res, work[roots] = self.checks_made(monkeypatch, request, wide(roots),
                                                strategy=ac.BREADTH_FIRST)
            assert len({a.anchor_root_id for a in res.allocation_requests}) == roots
        # Twice the roots, at most twice the work (today: 1,100 -> 1,200).
        assert work[100] <= 2 * work[50], work

    GPU_AFFINITY = ("required_GPU=CUSTOM_GPU_A100&resources_1=VGPU:1"
                    "&resources_2=VGPU:1&resources_3=VGPU:1&resources_4=VGPU:1"
                    "&same_subtree=_GPU,_1,_2,_3,_4&group_policy=isolate")

    @staticmethod
    def leaves_first(snap):
        """Same trees, but each tree lists its leaves before its inner
        providers: the order that makes a naive search try hopeless
        branches first (a leaf also carries the GPU trait)."""
        return ProviderSnapshot(sorted(snap, key=lambda p: (
            p.root_id, "VGPU" not in p.inventories)))

    def test_same_subtree_prunes_early(self, monkeypatch):
        snap = self.leaves_first(wide(3))
        request = rg.parse_allocation_candidates(parse_qsl(
            self.GPU_AFFINITY + "&limit=10"), (1, 39))
        res, checks = self.checks_made(monkeypatch, request, snap)
        assert len(res.allocation_requests) == 10
        # Without pruning, 4 isolated VGPUs among a tree's 128 is a search of
        # some 10^8 assignments; with it, about 16,000 partial ones today.
        assert checks < 50_000, checks

    def test_same_subtree_exact_count(self):
        # 2 GPUs x (4 VGPUs in 4! orders) per root.
        for snap in (wide(2, gpus=2, vgpus=4),
                     self.leaves_first(wide(2, gpus=2, vgpus=4))):
            request = rg.parse_allocation_candidates(parse_qsl(
                self.GPU_AFFINITY), (1, 39))
            res = ac.find_allocation_candidates(request, snap)
            assert len(res.allocation_requests) == 2 * 2 * 24
            for areq in res.allocation_requests:
                gpu = snap.by_uuid(areq.mappings["_GPU"][0])
                assert "VGPU" not in gpu.inventories
                for s in ("_1", "_2", "_3", "_4"):
                    vgpu = snap.by_uuid(areq.mappings[s][0])
                    assert vgpu.parent_id == gpu.id

    def test_impossible_group_answers_at_once(self, monkeypatch):
        snap = wide(100)
        request = rg.parse_allocation_candidates(parse_qsl(
            "resources=VCPU:1&resources1=VGPU:2&group_policy=none"), (1, 39))
        res, checks = self.checks_made(monkeypatch, request, snap)
        assert res.allocation_requests == []
        # No group-1 provider anywhere: no search is even started.
        assert checks == 0


# ---------------------------------------------------------------------------
# Property-based: the solver against brute force
# ---------------------------------------------------------------------------

TRAITS = ("T1", "T2", "T3")
AGGS = (AGG_A, AGG_B)
RCS = ("VCPU", "DISK_GB", "VGPU")


@st.composite
def random_snapshots(draw):
    """1-3 roots with up to two levels of children, some sharing roots.

    Biased towards roomy inventories so most requests have candidates.
    """
    providers = []
    n_roots = draw(st.integers(1, 3))
    for _ in range(n_roots):
        root_id = len(providers) + 1
        stack = [(None, 0)]
        while stack:
            parent, depth = stack.pop(0)
            pid = len(providers) + 1
            sharing = draw(st.integers(0, 2 if parent is None else 8)) == 0
            traits = set(draw(st.sets(st.sampled_from(TRAITS), max_size=2)))
            if sharing:
                traits.add(SHARING_TRAIT)
            inventories = {}
            for rc in draw(st.sets(st.sampled_from(RCS), min_size=0,
                                   max_size=2)):
                total = draw(st.integers(1, 6))
                odd = draw(st.integers(0, 4)) == 0
                inventories[rc] = ProviderInventory(
                    total=total,
                    reserved=draw(st.integers(0, 1)) if odd else 0,
                    min_unit=draw(st.integers(1, 2)) if odd else 1,
                    max_unit=draw(st.integers(1, total)) if odd else total,
                    step_size=draw(st.sampled_from([1, 2])) if odd else 1,
                    allocation_ratio=draw(st.sampled_from([1.0, 1.5])),
                    used=draw(st.integers(0, 2)) if odd else 0)
            if draw(st.booleans()):
                traits = tuple(sorted(traits))  # ordered, as for display
            providers.append(Provider(
                id=pid, uuid=str(uuidlib.UUID(int=pid)),
                parent_id=parent, root_id=root_id, traits=traits,
                aggregates=draw(st.sets(st.sampled_from(AGGS),
                                        min_size=1 if sharing else 0,
                                        max_size=2)),
                inventories=inventories))
            if depth < 2:
                for _ in range(draw(st.integers(0, 3 - depth))):
                    stack.append((pid, depth + 1))
    return ProviderSnapshot(providers)


@st.composite
def trait_exprs(draw):
    if draw(st.integers(0, 2)):
        return rg.TraitExpression()
    required = tuple(frozenset(draw(st.sets(st.sampled_from(TRAITS),
                                            min_size=1, max_size=2)))
                     for _ in range(draw(st.integers(0, 2))))
    forbidden = frozenset(draw(st.sets(st.sampled_from(TRAITS), max_size=1)))
    forbidden -= set().union(*[s for s in required if len(s) == 1])
    return rg.TraitExpression(required=required, forbidden=forbidden)


@st.composite
def agg_exprs(draw):
    if draw(st.integers(0, 3)):
        return rg.AggregateExpression()
    required = tuple(frozenset(draw(st.sets(st.sampled_from(AGGS),
                                            min_size=1, max_size=2)))
                     for _ in range(draw(st.integers(0, 1))))
    forbidden = frozenset(draw(st.sets(st.sampled_from(AGGS), max_size=1)))
    return rg.AggregateExpression(required=required, forbidden=forbidden)


@st.composite
def random_requests(draw, snapshot):
    uuids = [p.uuid for p in snapshot]
    offered = sorted({rc for p in snapshot for rc in p.inventories}) or ["VCPU"]
    groups = []

    def resources():
        rcs = draw(st.lists(st.sampled_from(offered), min_size=1,
                            max_size=2, unique=True))
        return {rc: draw(st.integers(1, 2)) for rc in rcs}

    def in_tree():
        return draw(st.sampled_from(uuids)) if draw(
            st.integers(0, 5)) == 0 else None

    if draw(st.booleans()):
        groups.append(rg.RequestGroup(
            "", resources(), draw(trait_exprs()), draw(agg_exprs()),
            in_tree()))
    n_suffixed = draw(st.integers(0 if groups else 1, 3))
    for i in range(n_suffixed):
        resourceless = i > 0 and draw(st.integers(0, 3)) == 0
        groups.append(rg.RequestGroup(
            "_G%d" % i, {} if resourceless else resources(),
            draw(trait_exprs()), draw(agg_exprs()), in_tree()))
    suffixes = [g.suffix for g in groups if g.suffix]
    subtrees = []
    needed = {g.suffix for g in groups if g.suffix and not g.resources}
    if len(suffixes) > 1 and (needed or draw(st.booleans())):
        chosen = set(draw(st.lists(st.sampled_from(suffixes), min_size=2,
                                   max_size=len(suffixes), unique=True)))
        subtrees.append(frozenset(chosen | needed))
    elif needed:
        subtrees.append(frozenset(set(suffixes)))
    root_traits = rg.TraitExpression()
    if draw(st.integers(0, 3)) == 0:
        root_traits = rg.TraitExpression(
            required=tuple(frozenset({t}) for t in draw(
                st.sets(st.sampled_from(TRAITS), max_size=1))),
            forbidden=frozenset(draw(st.sets(
                st.sampled_from(TRAITS + (SHARING_TRAIT,)), max_size=1))))
    version = draw(st.sampled_from([(1, 28), (1, 39), (1, 39), (1, 39)]))
    if version < (1, 36):
        groups = [g for g in groups if g.resources]
        subtrees, root_traits = [], rg.TraitExpression()
        if not groups:
            groups = [rg.RequestGroup("", {offered[0]: 1})]
    return rg.AllocationCandidatesRequest(
        groups=tuple(groups),
        group_policy=draw(st.sampled_from(["none", "isolate"])),
        root_traits=root_traits,
        same_subtrees=tuple(subtrees),
        version=version)


def brute_force(request, snap):
    """Every candidate, by trying every provider for every decision."""
    providers = list(snap)
    by_id = {p.id: p for p in providers}
    in_tree = {}
    for grp in request.groups:
        if grp.in_tree:
            found = snap.by_uuid(grp.in_tree)
            if found is None:
                return set()
            in_tree[grp.in_tree] = found.root_id

    def tree_of(root):
        return [p for p in providers if p.root_id == root]

    def reachable(prov, root):
        """Can prov lend to a candidate anchored at root, and how?"""
        if prov.root_id == root:
            return "tree"
        if prov.is_sharing and any(set(prov.aggregates) & set(q.aggregates)
                                   for q in tree_of(root)):
            return "shared"
        return None

    decisions = []  # (suffix, amounts, group)
    unsuffixed = request.group("")
    if unsuffixed:
        for rc, amount in unsuffixed.resources.items():
            decisions.append(("", ((rc, amount),), unsuffixed))
    for grp in request.groups:
        if grp.suffix:
            decisions.append((grp.suffix, tuple(grp.resources.items()), grp))

    # Only a provider with inventory of every class of a decision can take
    # it; trying the others is pointless even for brute force.
    # A resourceless group naming no required trait or aggregate finds no
    # provider (as Placement looks them up by those).
    options = [[p for p in providers
                if all(rc in p.inventories for rc, _ in amounts)]
               if amounts or grp.traits.required or grp.aggregates.required else []
               for _, amounts, grp in decisions]
    found = set()
    for root in snap.root_ids:
        root_prov = by_id[root]
        if not request.root_traits.matches(root_prov.traits):
            continue
        # Likewise only providers reachable from this anchor.
        here = [[p for p in opts if reachable(p, root)] for opts in options]
        for combo in itertools.product(*here):
            if valid(request, snap, root, decisions, combo, reachable,
                     in_tree):
                found.add(key_of(decisions, combo))
    return found


def valid(request, snap, root, decisions, combo, reachable, in_tree):
    root_prov = snap.get(root)
    load = {}
    unsuffixed_traits = set()
    for (suffix, amounts, grp), prov in zip(decisions, combo):
        how = reachable(prov, root)
        if how is None:
            return False
        for rc, amount in amounts:
            inv = prov.inventories.get(rc)
            if inv is None or not inv.fits(amount):
                return False
            load[prov.id, rc] = load.get((prov.id, rc), 0) + amount
        if suffix:
            if not grp.traits.matches(prov.traits):
                return False
            if grp.aggregates and not grp.aggregates.matches(prov.aggregates):
                return False
            if grp.in_tree and prov.root_id != in_tree[grp.in_tree]:
                return False
        else:
            if grp.traits.forbids_any(prov.traits):
                return False
            unsuffixed_traits.update(prov.traits)
            aggs = grp.aggregates
            if aggs.forbids_any(prov.aggregates) or aggs.forbids_any(
                    root_prov.aggregates):
                return False
            if grp.in_tree and (how != "tree"
                                or root != in_tree[grp.in_tree]):
                return False
            if aggs.required:
                if how == "tree":
                    if not (aggs.satisfied_by(prov.aggregates)
                            or aggs.satisfied_by(root_prov.aggregates)):
                        return False
                elif not aggs.satisfied_by(prov.aggregates):
                    return False
    unsuffixed = request.group("")
    if unsuffixed and not unsuffixed.traits.satisfied_by(unsuffixed_traits):
        return False
    for (pid, rc), total in load.items():
        if total > snap.get(pid).inventories[rc].combined_limit:
            return False
    single = [prov.id for (suffix, _, _), prov in zip(decisions, combo)
              if suffix]
    if request.isolate and len(set(single)) != len(single):
        return False
    chosen = {suffix: prov.id for (suffix, _, _), prov in zip(decisions, combo)
              if suffix}
    for suffixes in request.same_subtrees:
        members = {chosen[s] for s in suffixes}
        if not any(all(m in snap.ancestors(other) for other in members)
                   for m in members):
            return False
    if not request.nested_aware:
        roots = {}
        for (_, amounts, _), prov in zip(decisions, combo):
            if amounts and roots.setdefault(prov.root_id, prov.id) != prov.id:
                return False
    return True


def key_of(decisions, combo):
    allocations = {}
    mappings = {}
    for (suffix, amounts, _), prov in zip(decisions, combo):
        for rc, amount in amounts:
            k = (prov.uuid, rc)
            allocations[k] = allocations.get(k, 0) + amount
        mappings.setdefault(suffix, set()).add(prov.uuid)
    return (frozenset(allocations.items()),
            frozenset((s, frozenset(u)) for s, u in mappings.items()))


def solver_keys(result):
    keys = []
    for areq in result.allocation_requests:
        keys.append((
            frozenset(((u, rc), n) for u, res in areq.allocations.items()
                      for rc, n in res.items()),
            frozenset((s, frozenset(u)) for s, u in areq.mappings.items())))
    return keys


@st.composite
def problems(draw):
    snap = draw(random_snapshots())
    request = draw(random_requests(snap))
    return snap, request


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(ac.STRATEGIES))
def test_solver_matches_brute_force(problem, strategy):
    snap, request = problem
    result = ac.find_allocation_candidates(request, snap, strategy=strategy)
    keys = solver_keys(result)
    assert len(keys) == len(set(keys)), "duplicate candidates"
    expected = brute_force(request, snap)
    assert set(keys) == expected
    # Summaries: whole trees of resource holders (1.29+), else the holders.
    holders = {snap.by_uuid(u).id for key in keys for (u, _), _ in key[0]}
    if request.nested_aware:
        roots = {snap.get(pid).root_id for pid in holders}
        want = {p.id for p in snap if p.root_id in roots}
    else:
        want = holders
    assert {s.provider.id for s in result.provider_summaries} == want


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(1, 4))
def test_limit_returns_a_prefix(problem, limit):
    snap, request = problem
    everything = solver_keys(ac.find_allocation_candidates(request, snap))
    limited = dataclasses.replace(request, limit=limit)
    got = solver_keys(ac.find_allocation_candidates(limited, snap))
    assert got == everything[:limit]


# ---------------------------------------------------------------------------
# Trees added as the search goes (the database layer's rounds under a limit)
# ---------------------------------------------------------------------------

def _lazy_twin(snap: ProviderSnapshot, request: rg.AllocationCandidatesRequest):
    """An empty snapshot told the lenders up front, and anchors that add
    each root's tree (and its lenders' trees) just before yielding it."""
    lenders = snap.sharing_providers_by_anchor()
    lazy = ProviderSnapshot(sharing_lenders=lenders)
    added: set[int] = set()

    def add(root):
        if root not in added:
            added.add(root)
            lazy.add(snap.get(pid) for pid in snap.tree(root))

    for grp in request.groups:
        if grp.in_tree and snap.by_uuid(grp.in_tree) is not None:
            add(snap.by_uuid(grp.in_tree).root_id)

    def anchors():
        for root in snap.root_ids:
            add(root)
            for lender in lenders.get(root, ()):
                add(snap.get(lender).root_id)
            yield root

    return lazy, anchors()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.none() | st.integers(1, 4))
def test_lazily_added_trees_give_the_same_answer(problem, limit):
    snap, request = problem
    request = dataclasses.replace(request, limit=limit)
    eager = ac.find_allocation_candidates(request, snap)
    lazy_snap, anchors = _lazy_twin(snap, request)
    lazy = ac.find_allocation_candidates(request, lazy_snap, anchors=anchors)
    assert solver_keys(lazy) == solver_keys(eager)
    assert {s.uuid for s in lazy.provider_summaries} == {
        s.uuid for s in eager.provider_summaries}


class TestSnapshotAdd:
    def test_add_checks_completeness_and_keeps_order(self):
        snap = ProviderSnapshot()
        snap.add([Provider(id=5, uuid="e")])
        snap.add([Provider(id=2, uuid="b"),
                  Provider(id=3, uuid="c", parent_id=2, root_id=2)])
        assert snap.root_ids == (5, 2)
        assert snap.tree(2) == [2, 3]
        with pytest.raises(ValueError):
            snap.add([Provider(id=9, uuid="i", parent_id=8, root_id=8)])
        with pytest.raises(ValueError):
            snap.add([Provider(id=5, uuid="e")])

    def test_given_lenders_replace_the_aggregate_derivation(self):
        snap = ProviderSnapshot(sharing_lenders={1: [7]})
        snap.add([Provider(id=1, uuid="a")])
        assert snap.sharing_providers_by_anchor() == {1: (7,)}

    def test_derived_lenders_follow_added_trees(self):
        snap = ProviderSnapshot([Provider(
            id=1, uuid="ss", traits=(SHARING_TRAIT,), aggregates={AGG_A},
            inventories={"DISK_GB": ProviderInventory(total=10)})])
        assert snap.sharing_providers_by_anchor() == {}
        snap.add([Provider(id=2, uuid="cn", aggregates={AGG_A})])
        assert snap.sharing_providers_by_anchor() == {2: (1,)}


# ---------------------------------------------------------------------------
# Candidates kept across requests (the provider mirror's snapshot)
# ---------------------------------------------------------------------------

def _changed(snapshot: ProviderSnapshot, kept: KeptResults, provider: Provider):
    """The snapshot with ``provider`` in place of its older self, and the results still kept."""
    changed, change = snapshot.successor([provider], {provider.id})
    return changed, kept.after(change)


def test_kept_candidates_follow_the_sharing_provider_that_lends_to_them():
    cloud = Trees()
    for host in ("h1", "h2"):
        cloud.add(host, aggs=(AGG_A,), inv={"VCPU": 8})
    cloud.add("nfs", aggs=(AGG_A,), traits=(SHARING_TRAIT,), inv={"DISK_GB": 100})
    cloud.add("h3", inv={"VCPU": 8})  # lent nothing
    before, kept = cloud.snapshot(), KeptResults(1000)
    query = "resources=VCPU:1,DISK_GB:50"
    first = solve(before, query, kept=kept)
    assert len(first.allocation_requests) == 2
    assert first.kept_ids() == {id(areq) for areq in first.allocation_requests}
    again = solve(before, query, kept=kept)
    assert list(map(id, again.allocation_requests)) == list(map(id, first.allocation_requests))  # given again
    cloud.use("nfs", "DISK_GB", 60)
    nfs = next(prov for prov in cloud.snapshot() if prov.name == "nfs")
    after, kept_after = _changed(before, kept, nfs)
    assert solve(after, query, kept=kept_after).allocation_requests == []
    assert len(solve(before, query, kept=kept).allocation_requests) == 2  # the older results stay


def test_kept_candidates_pass_over_trees_that_give_nothing_until_they_change():
    cloud = Trees()
    for host in ("h1", "h2", "h3"):
        cloud.add(host, inv={"VCPU": 8})
    cloud.traits("h2", "CUSTOM_GOLD")
    snapshot, kept = cloud.snapshot(), KeptResults(1000)
    query = "resources=VCPU:1&required=CUSTOM_GOLD"
    first = solve(snapshot, query, kept=kept)
    assert [a for a, _ in named(snapshot, first)] == [{"h2": {"VCPU": 1}}]
    again = solve(snapshot, query, kept=kept)
    assert [a for a, _ in named(snapshot, again)] == [{"h2": {"VCPU": 1}}]
    assert again.allocation_requests[0] is first.allocation_requests[0]  # the kept candidate, given again
    assert again.kept_ids() == {id(first.allocation_requests[0])}
    cloud.traits("h3", "CUSTOM_GOLD")
    h3 = next(prov for prov in cloud.snapshot() if prov.name == "h3")
    after, kept_after = _changed(snapshot, kept, h3)
    result = solve(after, query, kept=kept_after)
    assert [a for a, _ in named(after, result)] == [{"h2": {"VCPU": 1}}, {"h3": {"VCPU": 1}}]
    assert result.allocation_requests[0] is first.allocation_requests[0]  # h2's tree did not change


class _CountedGets:
    """A memo's entries, counting the lookups made in them."""

    def __init__(self, entries):
        self.inner, self.gets = entries, 0

    def get(self, key, default=None):
        self.gets += 1
        return self.inner.get(key, default)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _filled_cloud(full: int, free: int) -> Trees:
    """Flat hosts, the first ``full`` of them with no VCPU left."""
    cloud = Trees()
    for i in range(full + free):
        cloud.add(f"h{i}", inv={"VCPU": 8}, used={"VCPU": 8} if i < full else None)
    return cloud


def test_kept_candidates_pass_over_runs_of_full_trees_until_one_changes():
    """A cloud whose first trees are full: a query asked again passes each
    run of trees that all gave nothing with one lookup, not one per tree,
    until a tree of that run changes."""
    cloud = _filled_cloud(2 * RUN + 3, RUN)
    snapshot, kept = cloud.snapshot(), KeptResults(100_000)
    query = "resources=VCPU:1&limit=2"
    first = solve(snapshot, query, kept=kept)
    expected = [{f"h{i}": {"VCPU": 1}} for i in (2 * RUN + 3, 2 * RUN + 4)]
    assert [a for a, _ in named(snapshot, first)] == expected
    runs = kept.trees.runs_of(snapshot)
    key = next(iter(runs[0]))
    assert key in runs[1] and 2 not in runs  # run 2 holds the candidates
    kept.trees.entries = counted = _CountedGets(kept.trees.entries)
    again = solve(snapshot, query, kept=kept)
    assert again.allocation_requests == first.allocation_requests
    assert counted.gets <= 5  # the trees of run 2 up to the second candidate: one each, not 2 * RUN + 5
    kept.trees.entries = counted.inner
    # A host of the first run is freed: that run is searched again, the second is still passed over.
    cloud.use("h5", "VCPU", -8)
    h5 = next(prov for prov in cloud.snapshot() if prov.name == "h5")
    after, kept_after = _changed(snapshot, kept, h5)
    assert [a for a, _ in named(after, solve(after, query, kept=kept_after))] == [{"h5": {"VCPU": 1}}, expected[0]]
    runs_after = kept_after.trees.runs_of(after)
    assert 0 not in runs_after and key in runs_after[1]
    assert key in kept.trees.runs_of(snapshot)[0]  # the older results stay as they were
    assert [a for a, _ in named(snapshot, solve(snapshot, query, kept=kept))] == expected


def test_kept_runs_count_trees_without_the_root_traits_as_giving_nothing():
    cloud = _filled_cloud(RUN, RUN)
    for i in range(RUN, 2 * RUN):
        cloud.traits(f"h{i}", "CUSTOM_GOLD")
    cloud.use("h3", "VCPU", -8)  # free, but not gold
    snapshot, kept = cloud.snapshot(), KeptResults(100_000)
    query = "resources=VCPU:1&root_required=CUSTOM_GOLD&limit=1"
    for _ in range(2):
        assert [a for a, _ in named(snapshot, solve(snapshot, query, kept=kept))] == [{f"h{RUN}": {"VCPU": 1}}]
    assert 0 in kept.trees.runs_of(snapshot)


@pytest.mark.parametrize("limit", [100_000, 150])
def test_kept_runs_give_what_a_search_afresh_gives(limit):
    """Hosts filled and freed at random, one change at a time: the kept
    results (with their runs) answer as a search without them does, also
    when the memo is emptied again and again (``limit``)."""
    rng = random.Random(7)
    hosts = 5 * RUN
    cloud = Trees()
    for i in range(hosts):
        cloud.add(f"h{i}", inv={"VCPU": 4}, used={"VCPU": 4} if rng.random() < 0.9 else None)
    snapshot, kept = cloud.snapshot(), KeptResults(limit)
    queries = ["resources=VCPU:1&limit=3", "resources=VCPU:4&limit=1", "resources=VCPU:2"]
    for _ in range(60):
        for query in queries:
            assert allocs(snapshot, solve(snapshot, query, kept=kept)) == allocs(snapshot, solve(snapshot, query))
        name = f"h{rng.randrange(hosts)}"
        used = cloud._rows[name]["used"].get("VCPU", 0)
        cloud.use(name, "VCPU", -used if used else rng.randint(1, 4))
        changed = next(prov for prov in cloud.snapshot() if prov.name == name)
        snapshot, kept = _changed(snapshot, kept, changed)


def test_a_first_query_passes_over_runs_that_cannot_hold_it_without_searching_them(monkeypatch):
    """Runs of trees whose providers cannot take the amounts asked (full
    ones) are passed over on the query's first asking, whatever amounts
    it asks: no tree of them is searched."""
    cloud = _filled_cloud(3 * RUN, RUN)
    cloud.use("h1", "VCPU", -2)  # a run with room for VCPU:1 and VCPU:2, not for VCPU:3
    snapshot, kept = cloud.snapshot(), KeptResults(100_000)
    searched: list[int] = []
    candidates_at = ac.Plan.candidates_at
    monkeypatch.setattr(ac.Plan, "candidates_at", lambda plan, root: searched.append(root) or candidates_at(plan, root))
    h1 = next(prov.id for prov in snapshot if prov.name == "h1")
    for amount, first in ((1, "h1"), (2, "h1"), (3, f"h{3 * RUN}")):
        searched.clear()
        result = solve(snapshot, f"resources=VCPU:{amount}&limit=1", kept=kept)
        assert [a for a, _ in named(snapshot, result)] == [{first: {"VCPU": amount}}]
        assert searched == ([h1] if first == "h1" else [snapshot.root_ids[3 * RUN]])


def test_runs_worked_out_beforehand_are_not_worked_out_by_the_first_query(monkeypatch):
    """With every run worked out beforehand (as ``allotment serve``'s
    master does before it forks), a first query looks at no run's
    providers: it passes the full runs by what was worked out, and checks
    the trees of the run with room one by one, as before."""
    cloud = _filled_cloud(3 * RUN, RUN)
    snapshot, kept = cloud.snapshot(), KeptResults(100_000)
    snapshot.root_ids = order = _CountedSlices(snapshot.root_ids)
    kept.trees.work_out_every_run(snapshot)
    assert sorted(kept.trees.capacities) == [0, 1, 2, 3]
    order.slices = 0
    worked_out: list[int] = []
    real = RunCapacity.of.__func__

    def of(cls, trees, snap, lenders):
        trees = list(trees)
        worked_out.append(len(trees))
        return real(cls, trees, snap, lenders)

    monkeypatch.setattr(RunCapacity, "of", classmethod(of))
    result = solve(snapshot, "resources=VCPU:2&limit=2", kept=kept)
    assert [a for a, _ in named(snapshot, result)] == [{f"h{i}": {"VCPU": 2}} for i in (3 * RUN, 3 * RUN + 1)]
    assert worked_out == [1, 1]  # the two trees searched, each checked alone first
    # Only the run searched had its roots sliced out: in a worker, a slice
    # writes to the pages of the root ids it holds, shared with the master.
    assert order.slices == 1


class _CountedSlices(tuple):
    """A snapshot's roots, counting the slices taken of them."""

    slices = 0

    def __getitem__(self, index):
        if isinstance(index, slice):
            self.slices += 1
        return super().__getitem__(index)


@pytest.mark.parametrize("limit", [100_000, 150])
def test_runs_passed_over_by_capacity_give_what_a_search_afresh_gives(limit):
    """Nested trees filled and freed at random, some lent disk by a sharing
    provider that fills and frees too: the runs and trees passed over for
    their capacity never hide a candidate a search afresh finds."""
    rng = random.Random(11)
    hosts = 4 * RUN
    cloud = Trees()
    cloud.add("nfs", aggs=(AGG_A,), traits=(SHARING_TRAIT,), inv={"DISK_GB": 100}, used={"DISK_GB": 90})
    for i in range(hosts):
        full = rng.random() < 0.995
        cloud.add(f"h{i}", aggs=(AGG_A,) if i % 3 == 0 else (), inv={"MEMORY_MB": 4096, "DISK_GB": 40},
                  used={"MEMORY_MB": 4096} if full else None)
        cloud.add(f"h{i}-numa", f"h{i}", inv={"VCPU": 4}, used={"VCPU": 4} if full else None)
    snapshot, kept = cloud.snapshot(), KeptResults(limit)
    queries = ["resources=VCPU:1,MEMORY_MB:1024&limit=3", "resources=VCPU:4,DISK_GB:50&limit=2",
               "resources=DISK_GB:60", "resources1=VCPU:2&resources2=MEMORY_MB:2048&group_policy=none&limit=4"]
    for _ in range(50):
        for query in queries:
            assert allocs(snapshot, solve(snapshot, query, kept=kept)) == allocs(snapshot, solve(snapshot, query))
        host = f"h{rng.randrange(hosts)}"
        names = ["nfs"] if rng.random() < 0.1 else [host, f"{host}-numa"]
        for name in names:  # a host filled or freed whole, or the lender
            for rc, total in cloud._rows[name]["inv"].items():
                used = cloud._rows[name]["used"].get(rc, 0)
                cloud.use(name, rc, -used if used else rng.randint(1, total))
        changed = [prov for prov in cloud.snapshot() if prov.name in names]
        snapshot, change = snapshot.successor(changed, {prov.id for prov in changed})
        kept = kept.after(change)
