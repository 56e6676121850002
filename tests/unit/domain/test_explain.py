"""Explanations of allocation-candidates requests.

Clouds built in memory where the answer is known, one per kind of
elimination (capacity and unit rules, traits, aggregates, root traits,
in_tree, isolate, same_subtree, amounts summed on one provider, the
unsuffixed group's traits together, one provider per tree before 1.29),
nested and sharing included; then properties over random clouds: a
provider has no problem exactly when the solver accepts it, and the
explanation counts exactly the candidates the solver returns.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import parse_qsl

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allotment.domain import allocation_candidates as ac
from allotment.domain import explain as ex
from allotment.domain import request_groups as rg
from allotment.domain.provider_tree import SHARING_TRAIT
from tests.unit.domain.test_allocation_candidates import AGG_A, AGG_B, Trees, problems


def request_of(query: str, version=(1, 39)) -> rg.AllocationCandidatesRequest:
    return rg.parse_allocation_candidates(parse_qsl(query, keep_blank_values=True), version)


def explain(trees: Trees, query: str, version=(1, 39), **kw) -> tuple[ex.Explanation, dict]:
    snap = trees.snapshot()
    result = ex.explain(request_of(query, version), snap, snap.root_ids, trees_total=len(snap.root_ids),
                        providers_total=len(snap), **kw)
    return result, {p.id: p.name for p in snap}


def tree_of(result: ex.Explanation, names: dict, name: str) -> ex.TreeVerdict:
    return next(t for t in result.trees if names[t.root_id] == name)


def texts(tree: ex.TreeVerdict) -> list[str]:
    return [p.text for p in tree.problems]


def step(result: ex.Explanation, filter_name: str, group: str | None = None, rc: str | None = None,
         scope: str | None = None) -> ex.Step:
    return next(s for s in result.steps if s.filter == filter_name and (group is None or s.group == group)
                and (rc is None or s.resource_class == rc) and (scope is None or s.scope == scope))


# -- capacity and unit rules --------------------------------------------------------------

def test_capacity_problem_reads_like_the_inventory():
    t = Trees()
    t.add("cn1", inv={"VCPU": {"total": 16, "reserved": 2}}, used={"VCPU": 12})
    result, names = explain(t, "resources=VCPU:4")
    cn1 = tree_of(result, names, "cn1")
    assert texts(cn1) == ["VCPU: 4 requested, 2 free of 16 (12 used, reserved 2, ratio 1.0)"]
    assert cn1.stage == "slot0"
    assert result.verdict(0, None, 20000, "safety cap") == \
        "0/1 trees can serve this request: 1 not enough free VCPU."
    capacity = step(result, "capacity", "", "VCPU")
    assert (capacity.providers_left, capacity.providers_eliminated) == (0, 1)


@pytest.mark.parametrize("spec, amount, text", [
    ({"total": 32, "max_unit": 8}, 16, "VCPU: max_unit 8 < 16 requested"),
    ({"total": 32, "min_unit": 8}, 4, "VCPU: min_unit 8 > 4 requested"),
    ({"total": 32, "step_size": 4}, 6, "VCPU: step_size 4 does not divide 6"),
])
def test_unit_rules_name_the_rule(spec, amount, text):
    t = Trees()
    t.add("cn1", inv={"VCPU": spec})
    result, names = explain(t, f"resources=VCPU:{amount}")
    assert texts(tree_of(result, names, "cn1")) == [text]
    assert step(result, "units").providers_eliminated == 1


def test_every_broken_rule_is_listed_and_the_closest_comes_first():
    t = Trees()
    t.add("big", inv={"VCPU": {"total": 8, "max_unit": 2}}, used={"VCPU": 7})
    t.add("near", inv={"VCPU": 8}, used={"VCPU": 5})
    t.add("far", inv={"VCPU": 8}, used={"VCPU": 8})
    result, names = explain(t, "resources=VCPU:4")
    assert [names[tree.root_id] for tree in result.closest] == ["near", "far", "big"]
    assert [p.kind for p in tree_of(result, names, "big").problems] == ["max_unit", "capacity"]


# -- traits and aggregates ------------------------------------------------------------------

def test_missing_and_forbidden_traits_of_a_suffixed_group():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8}, traits=["HW_CPU_X86_AVX2"])
    t.add("cn2", inv={"VCPU": 8}, traits=["HW_CPU_X86_AVX512F", "CUSTOM_MAINT"])
    result, names = explain(t, "resources1=VCPU:1&required1=HW_CPU_X86_AVX512F,!CUSTOM_MAINT"
                               "&group_policy=none")
    assert texts(tree_of(result, names, "cn1")) == ["lacks trait HW_CPU_X86_AVX512F"]
    assert texts(tree_of(result, names, "cn2")) == ["has forbidden trait CUSTOM_MAINT"]
    required, forbidden = step(result, "required", "1"), step(result, "forbidden", "1")
    assert (required.providers_left, forbidden.providers_left) == (1, 0)
    assert ("lack trait HW_CPU_X86_AVX512F", 1) in result.reasons


def test_any_of_traits_are_named_as_such():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8}, traits=["HW_CPU_X86_AVX2"])
    result, names = explain(t, "resources1=VCPU:1&required1=in:HW_CPU_X86_SSE42,HW_CPU_X86_AESNI"
                               "&group_policy=none")
    assert texts(tree_of(result, names, "cn1")) == ["lacks trait any of HW_CPU_X86_AESNI, HW_CPU_X86_SSE42"]


def test_unsuffixed_traits_may_come_from_any_provider_used_but_must_be_there():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8})
    t.add("numa", "cn1", inv={"MEMORY_MB": 1024}, traits=["HW_NUMA_ROOT"])
    t.add("cn2", inv={"VCPU": 8, "MEMORY_MB": 1024})
    result, names = explain(t, "resources=VCPU:1,MEMORY_MB:512&required=HW_NUMA_ROOT")
    assert tree_of(result, names, "cn1").stage is None
    cn2 = tree_of(result, names, "cn2")
    assert cn2.stage == ac.TRAITS_TOGETHER
    assert texts(cn2) == ["lacks trait HW_NUMA_ROOT (none of the providers the unsuffixed group can use "
                          "here has it)"]
    assert result.available == 1


def test_not_in_aggregate_and_in_a_forbidden_one():
    t = Trees()
    t.add("in_a", inv={"VCPU": 8}, aggs=[AGG_A])
    t.add("in_b", inv={"VCPU": 8}, aggs=[AGG_B])
    t.add("nowhere", inv={"VCPU": 8})
    result, names = explain(t, f"resources=VCPU:1&member_of={AGG_A}")
    assert tree_of(result, names, "in_a").stage is None
    assert texts(tree_of(result, names, "nowhere")) == [f"not in aggregate {AGG_A}"]
    result, names = explain(t, f"resources=VCPU:1&member_of=!{AGG_B}")
    assert texts(tree_of(result, names, "in_b")) == [f"in forbidden aggregate {AGG_B}"]
    assert step(result, "forbidden_member_of").providers_eliminated == 1


def test_an_aggregate_on_the_root_spans_the_tree_of_the_unsuffixed_group():
    t = Trees()
    t.add("cn1", aggs=[AGG_A])
    t.add("numa0", "cn1", inv={"VCPU": 8})
    t.add("cn2")
    t.add("numa1", "cn2", inv={"VCPU": 8})
    result, names = explain(t, f"resources=VCPU:1&member_of={AGG_A}")
    assert tree_of(result, names, "cn1").stage is None
    assert texts(tree_of(result, names, "cn2")) == [f"not in aggregate {AGG_A} (nor is its root)"]


def test_root_required():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8}, traits=["COMPUTE_STATUS_DISABLED"])
    t.add("cn2", inv={"VCPU": 8})
    result, names = explain(t, "resources=VCPU:1&root_required=!COMPUTE_STATUS_DISABLED,HW_CPU_X86_AVX2")
    cn1 = tree_of(result, names, "cn1")
    assert cn1.stage == ex.ROOT_REQUIRED
    assert texts(cn1) == ["root lacks trait HW_CPU_X86_AVX2", "root has forbidden trait COMPUTE_STATUS_DISABLED"]
    assert step(result, ex.ROOT_REQUIRED).trees_eliminated == 2


def test_in_tree_eliminates_other_trees_without_offering_them_as_near_misses():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8})
    t.add("cn2", inv={"VCPU": 1})
    snap = t.snapshot()
    cn2 = snap.by_uuid(next(p.uuid for p in snap if p.name == "cn2"))
    result, names = explain(t, f"resources=VCPU:4&in_tree={cn2.uuid}")
    assert tree_of(result, names, "cn1").stage == ex.IN_TREE
    assert [names[tree.root_id] for tree in result.closest] == ["cn2"]
    assert step(result, ex.IN_TREE, scope=ex.TREES).trees_left == 1
    # cn2 lacks room first; cn1 has room but is in the wrong tree.
    in_tree = step(result, ex.IN_TREE, scope=ex.PROVIDERS)
    assert (in_tree.providers_left, in_tree.providers_eliminated) == (0, 1)


def test_an_in_tree_provider_that_does_not_exist():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8})
    result, _ = explain(t, "resources=VCPU:1&in_tree=00000000-0000-0000-0000-000000000099")
    assert result.notes == ["in_tree: there is no provider 00000000-0000-0000-0000-000000000099"]
    assert result.serving == 0 and result.reasons == [("in_tree names no provider", 1)]


# -- nested trees: groups, isolate, same_subtree, sums ------------------------------------------

def numa_host(t: Trees, name: str, *, vf=(8, 8), gpu_under: int | None = None) -> None:
    t.add(name, inv={"DISK_GB": 100})
    for i in range(2):
        numa = t.add(f"{name}_numa{i}", name, inv={"VCPU": 8, "MEMORY_MB": 4096}, traits=["HW_NUMA_ROOT"])
        if vf[i]:
            t.add(f"{name}_pf{i}", numa, inv={"SRIOV_NET_VF": vf[i]}, traits=["CUSTOM_PHYSNET0"])
        if gpu_under == i:
            t.add(f"{name}_gpu", numa, inv={"VGPU": 4})


def test_isolate_names_the_groups_that_need_one_provider():
    t = Trees()
    numa_host(t, "cn1", vf=(8, 0))
    result, names = explain(t, "resources1=SRIOV_NET_VF:1&resources2=SRIOV_NET_VF:1&group_policy=isolate")
    cn1 = tree_of(result, names, "cn1")
    assert cn1.stage == ac.ISOLATE
    assert texts(cn1) == ["isolate: groups 1 and 2 could only be satisfied by the same provider"]
    assert names[cn1.problems[0].provider_id] == "cn1_pf0"
    assert step(result, ac.ISOLATE).trees_eliminated == 1
    # Without isolate the same tree serves.
    result, names = explain(t, "resources1=SRIOV_NET_VF:1&resources2=SRIOV_NET_VF:1&group_policy=none")
    assert tree_of(result, names, "cn1").stage is None


def test_same_subtree_without_a_common_ancestor():
    t = Trees()
    numa_host(t, "cn1", vf=(8, 0), gpu_under=1)
    numa_host(t, "cn2", vf=(8, 0), gpu_under=0)
    query = ("resources_NET=SRIOV_NET_VF:1&resources_GPU=VGPU:1&resources_CPU=VCPU:2"
             "&same_subtree=_NET,_GPU,_CPU&group_policy=none")
    result, names = explain(t, query)
    assert tree_of(result, names, "cn2").stage is None
    cn1 = tree_of(result, names, "cn1")
    assert cn1.stage == ac.SAME_SUBTREE
    assert texts(cn1) == ["same_subtree _NET,_GPU,_CPU: no common ancestor among the providers that could "
                          "serve these groups"]
    assert result.available == 1


def test_amounts_of_several_groups_summed_on_one_provider():
    t = Trees()
    t.add("cn1", inv={"VCPU": {"total": 8}}, used={"VCPU": 2})
    t.add("cn2", inv={"VCPU": 16})
    result, names = explain(t, "resources=VCPU:4&resources1=VCPU:4&group_policy=none")
    cn1 = tree_of(result, names, "cn1")
    assert cn1.stage == ac.COMBINED_CAPACITY
    assert texts(cn1) == ["VCPU: the unsuffixed group and group 1 together need 8 from one provider, which "
                          "has 6 free (max_unit 8)"]
    assert tree_of(result, names, "cn2").stage is None


def test_nested_closest_names_the_child_that_lacks():
    t = Trees()
    numa_host(t, "cn1")
    t.use("cn1_numa0", "VCPU", 7)
    t.use("cn1_numa1", "VCPU", 6)
    result, names = explain(t, "resources1=VCPU:4,MEMORY_MB:1024&group_policy=none")
    cn1 = tree_of(result, names, "cn1")
    assert [(names[p.provider_id], p.text) for p in cn1.problems] == [
        ("cn1_numa1", "VCPU: 4 requested, 2 free of 8 (6 used, reserved 0, ratio 1.0)")]


def test_before_1_29_one_provider_per_tree():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8})
    t.add("numa", "cn1", inv={"MEMORY_MB": 1024})
    result, names = explain(t, "resources=VCPU:1,MEMORY_MB:512", version=(1, 28))
    cn1 = tree_of(result, names, "cn1")
    assert cn1.stage == ac.ONE_PROVIDER_PER_TREE
    assert result.available == 0
    result, _ = explain(t, "resources=VCPU:1,MEMORY_MB:512", version=(1, 29))
    assert result.available == 1


# -- sharing providers ---------------------------------------------------------------------

def sharing_cloud() -> Trees:
    t = Trees()
    t.add("cn1", inv={"VCPU": 8}, aggs=[AGG_A])
    t.add("cn2", inv={"VCPU": 8}, aggs=[AGG_B])
    t.add("cn3", inv={"VCPU": 8})
    t.add("ss_a", inv={"DISK_GB": {"total": 100}}, used={"DISK_GB": 90}, aggs=[AGG_A], traits=[SHARING_TRAIT])
    t.add("ss_b", inv={"DISK_GB": 1000}, aggs=[AGG_B], traits=[SHARING_TRAIT])
    return t


def test_sharing_provider_without_room_and_a_tree_nobody_lends_to():
    result, names = explain(sharing_cloud(), "resources=VCPU:1,DISK_GB:50")
    assert tree_of(result, names, "cn2").stage is None
    cn1 = tree_of(result, names, "cn1")
    assert [(names[p.provider_id], p.text) for p in cn1.problems] == [
        ("ss_a", "DISK_GB: 50 requested, 10 free of 100 (90 used, reserved 0, ratio 1.0)")]
    cn3 = tree_of(result, names, "cn3")
    assert texts(cn3) == ["no provider in the tree has DISK_GB inventory, nor does a sharing provider lend it"]
    assert result.available == 1
    disk = step(result, "capacity", "", "DISK_GB")
    # ss_b still lends to cn2 (and is in its own tree).
    assert (disk.providers_left, disk.trees_left) == (1, 2)


def test_candidates_of_sharing_providers_alone_are_counted_once():
    result, names = explain(sharing_cloud(), "resources=DISK_GB:5")
    # ss_a's 5 GB and ss_b's 5 GB: the same two candidates from every tree
    # that reaches them (cn3 is in no aggregate).
    assert result.available == 2
    assert result.serving == 4
    assert texts(tree_of(result, names, "cn3")) == [
        "no provider in the tree has DISK_GB inventory, nor does a sharing provider lend it"]


# -- counting -------------------------------------------------------------------------------

def test_limit_and_cap():
    t = Trees()
    for i in range(5):
        t.add(f"cn{i}", inv={"VCPU": 8})
    result, _ = explain(t, "resources=VCPU:1&limit=2")
    assert (result.available, result.capped) == (5, False)
    assert result.verdict(2, 2, 20000, "safety cap") == \
        "5/5 trees can serve this request (2 candidates: limit=2 of 5)."
    result, _ = explain(t, "resources=VCPU:1", max_candidates=3)
    assert (result.available, result.capped) == (3, True)
    assert result.verdict(3, None, 3, "max_allocation_candidates") == \
        "5/5 trees can serve this request (3 candidates, cut at the max_allocation_candidates of 3)."


def test_a_search_too_large_is_said_to_be_undecided():
    t = Trees()
    t.add("cn1")
    t.add("dev0", "cn1", inv={"VGPU": 2})
    result, names = explain(t, "resources1=VGPU:1&resources2=VGPU:1&group_policy=isolate", budget=0)
    cn1 = tree_of(result, names, "cn1")
    assert cn1.stage == ex.UNDECIDED
    assert texts(cn1) == ["not decided: searching this tree took more than 0 placements"]
    result, names = explain(t, "resources1=VGPU:1&resources2=VGPU:1&group_policy=isolate")
    assert tree_of(result, names, "cn1").stage == ac.ISOLATE


def test_verdict_when_some_trees_serve():
    t = Trees()
    t.add("cn1", inv={"VCPU": 8})
    t.add("cn2", inv={"VCPU": {"total": 2, "max_unit": 8}})
    t.add("cn3", inv={"MEMORY_MB": 2})
    result, _ = explain(t, "resources=VCPU:4")
    assert result.verdict(1, None, 20000, "safety cap") == (
        "1/3 trees can serve this request (1 candidate); the other 2: 1 no VCPU inventory, "
        "1 not enough free VCPU.")


# -- the same engine: properties over random clouds -------------------------------------------

@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_a_provider_has_no_problem_exactly_when_the_solver_takes_it(problem):
    snap, request = problem
    plan = ac.Plan.build(request, snap)
    if plan is None:
        return
    for slot in plan.slots:
        for prov in snap:
            anchors = [prov.root_id] + [root for root, lenders in plan.lenders.items() if prov.id in lenders]
            for anchor in anchors:
                problems_found = ex.provider_problems(plan, slot, prov, anchor)
                assert (not problems_found) == ex._serves(plan, slot, prov, anchor), (slot, prov, anchor,
                                                                                      problems_found)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.none() | st.integers(1, 5), st.sampled_from([-1, 0, 2, 5]))
def test_the_explanation_counts_what_the_solver_returns(problem, limit, cap):
    snap, request = problem
    request = dataclasses.replace(request, limit=limit)
    answer = ac.find_allocation_candidates(request, snap, max_candidates=cap)
    result = ex.explain(request, snap, snap.root_ids, trees_total=len(snap.root_ids), providers_total=len(snap),
                        max_candidates=cap)
    returned = len(answer.allocation_requests)
    expected_available = answer.generated if limit is None else len(list(
        itertools_islice(ac.iter_allocation_requests(request, snap), cap)))
    assert result.available == expected_available
    assert returned == (result.available if limit is None else min(limit, result.available))
    # Every anchor of a candidate can serve; a tree that cannot has a reason.
    anchors = {areq.anchor_root_id for areq in answer.allocation_requests}
    serving = {tree.root_id for tree in result.trees if tree.stage is None}
    assert anchors <= serving
    for tree in result.trees:
        assert (tree.stage is None) == (not tree.problems)
    # The funnel ends where the trees end.
    assert result.steps[-1].trees_left == len(serving)


def itertools_islice(stream, cap):
    import itertools

    return itertools.islice(stream, max(cap, 1)) if cap >= 0 else stream
