"""GET /allotment/explain and ``allotment explain``: an explanation of the
query string of GET /allocation_candidates.

Clouds are built through the API where the answer is known (flat, nested,
sharing); the explanation's count must be what GET /allocation_candidates
returns, over clouds and requests drawn at random too; bad input gets the
very 400 GET /allocation_candidates gives; the endpoint has a policy rule
of its own.  The command is run in-process against the test database.
"""

from __future__ import annotations

import itertools
import json
import textwrap
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allotment import cli
from allotment.domain import request_groups as rg
from tests.conftest import _empty_tables
from tests.functional.test_allocation_candidates import AGG_A, AGG_B, COMPUTE, Cloud
from tests.unit.domain.test_allocation_candidates import random_requests, random_snapshots


@pytest.fixture
def cloud(api):
    return Cloud(api)


def explain(api, query: str, version: str = "1.39", status: int = 200) -> dict:
    resp = api.get(f"/allotment/explain?{query}", version=version)
    assert resp.status == status, resp
    return resp.json


def count(api, query: str, version: str = "1.39") -> int:
    resp = api.get(f"/allocation_candidates?{query}", version=version)
    assert resp.status == 200, resp
    return len(resp.json["allocation_requests"])


def near(body: dict) -> list[tuple[str, list[str]]]:
    """The near misses as (tree name, [provider name: text])."""
    return [(entry["tree"]["name"],
             [f"{p['provider']['name']}: {p['text']}" if p["provider"] else p["text"] for p in entry["problems"]])
            for entry in body["closest"]]


# -- what it says -------------------------------------------------------------------------

def test_flat_cloud_verdict_funnel_and_near_misses(api, cloud):
    cloud.provider("cn1", inventories={"VCPU": {"total": 16, "reserved": 2}, "MEMORY_MB": 4096},
                   traits=("HW_CPU_X86_AVX512F",))
    cloud.provider("cn2", inventories={"VCPU": {"total": 8, "max_unit": 2}, "MEMORY_MB": 4096},
                   traits=("HW_CPU_X86_AVX512F",))
    cloud.provider("cn3", inventories=COMPUTE, traits=("HW_CPU_X86_AVX2",))
    cloud.provider("disk", inventories={"DISK_GB": 100})
    cloud.allocate({"cn1": {"VCPU": 12}})
    query = "resources=VCPU:4,MEMORY_MB:1024&required=HW_CPU_X86_AVX512F"
    body = explain(api, query)
    assert body["verdict"] == ("0/4 trees can serve this request: 1 VCPU max_unit too small, "
                               "1 lack trait HW_CPU_X86_AVX512F, 1 no VCPU or MEMORY_MB inventory, "
                               "1 not enough free VCPU.")
    assert body["candidates"] == {"returned": 0, "available": 0, "capped": False, "limit": None, "limited": False,
                                  "cap": 20000, "cap_source": "safety cap", "trees": 0}
    assert body["cloud"] == {"trees": 4, "providers": 4}
    assert near(body) == [  # each half way there (2 of 4): in tree order
        ("cn1", ["cn1: VCPU: 4 requested, 2 free of 16 (12 used, reserved 2, ratio 1.0)"]),
        ("cn2", ["cn2: VCPU: max_unit 2 < 4 requested"]),
        ("cn3", ["lacks trait HW_CPU_X86_AVX512F (none of the providers the unsuffixed group can use here "
                 "has it)"]),
    ]
    capacity = next(s for s in body["steps"] if s["filter"] == "capacity" and s["resource_class"] == "VCPU")
    assert capacity["providers"] == {"left": 1, "eliminated": 1}
    assert body["request"]["groups"] == [{
        "suffix": "", "resources": {"VCPU": 4, "MEMORY_MB": 1024}, "required": [["HW_CPU_X86_AVX512F"]],
        "forbidden": [], "member_of": [], "forbidden_aggregates": [], "in_tree": None}]
    assert body["microversion"] == "1.39" and body["explain_version"] == 1


def test_an_unknown_trait_the_answer_passes_over_is_still_named(api, cloud):
    # No provider has VCPU: the first group finds nothing, so the answer is an
    # empty 200 before the second group's trait is looked up (as Placement);
    # explain refuses the misspelt trait instead of explaining "nothing found".
    cloud.provider("disk", inventories={"DISK_GB": 100})
    query = "resources=VCPU:1&resources2=VCPU:1&required2=CUSTOM_NOT_A_TRAIT&group_policy=none"
    assert count(api, query) == 0
    got = api.get(f"/allotment/explain?{query}", version="1.39")
    assert got.status == 400, got
    assert got.error()["detail"].endswith("No such trait(s): CUSTOM_NOT_A_TRAIT."), got.error()


def test_candidates_and_the_limit(api, cloud):
    for name in ("cn1", "cn2", "cn3"):
        cloud.provider(name, inventories=COMPUTE)
    body = explain(api, "resources=VCPU:1&limit=2")
    assert body["candidates"]["returned"] == 2 == count(api, "resources=VCPU:1&limit=2")
    assert (body["candidates"]["available"], body["candidates"]["limited"]) == (3, True)
    assert body["verdict"] == "3/3 trees can serve this request (2 candidates: limit=2 of 3)."


def test_nested_isolate_and_same_subtree(api, cloud):
    cloud.provider("cn1", inventories={"DISK_GB": 100})
    cloud.provider("numa0", "cn1", inventories={"VCPU": 8}, traits=("HW_NUMA_ROOT",))
    cloud.provider("numa1", "cn1", inventories={"VCPU": 8}, traits=("HW_NUMA_ROOT",))
    cloud.provider("pf0", "numa0", inventories={"SRIOV_NET_VF": 8})
    cloud.provider("gpu1", "numa1", inventories={"VGPU": 4})
    body = explain(api, "resources1=SRIOV_NET_VF:1&resources2=SRIOV_NET_VF:1&group_policy=isolate")
    assert near(body) == [("cn1", ["pf0: isolate: groups 1 and 2 could only be satisfied by the same provider"])]
    assert body["closest"][0]["stage"] == "isolate"
    body = explain(api, "resources_NET=SRIOV_NET_VF:1&resources_GPU=VGPU:1&same_subtree=_NET,_GPU"
                        "&group_policy=none")
    assert near(body) == [("cn1", ["same_subtree _NET,_GPU: no common ancestor among the providers that could "
                                   "serve these groups"])]
    assert body["candidates"]["returned"] == 0


def test_sharing_provider_lending_too_little(api, cloud):
    cloud.provider("cn1", inventories={"VCPU": 8}, aggregates=(AGG_A,))
    cloud.provider("cn2", inventories={"VCPU": 8}, aggregates=(AGG_B,))
    cloud.provider("ss", inventories={"DISK_GB": 100}, traits=("MISC_SHARES_VIA_AGGREGATE",),
                   aggregates=(AGG_A,))
    cloud.allocate({"ss": {"DISK_GB": 80}})
    body = explain(api, "resources=VCPU:1,DISK_GB:50")
    assert near(body)[0] == ("cn1", ["ss: DISK_GB: 50 requested, 20 free of 100 (80 used, reserved 0, ratio 1.0)"])
    assert ("cn2", ["no provider in the tree has DISK_GB inventory, nor does a sharing provider lend it"]) \
        in near(body)
    assert body["candidates"]["returned"] == 0 == count(api, "resources=VCPU:1,DISK_GB:50")
    body = explain(api, "resources=VCPU:1,DISK_GB:10")
    assert body["candidates"]["returned"] == 1 == count(api, "resources=VCPU:1,DISK_GB:10")


def test_member_of_an_aggregate_nobody_is_in(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE)
    body = explain(api, f"resources=VCPU:1&member_of={AGG_B}")
    assert body["notes"] == [f"aggregate {AGG_B} has no providers"]
    assert near(body) == [("cn1", [f"cn1: not in aggregate {AGG_B}"])]


# -- the same 400s, the same version rules, its own policy -------------------------------------

BAD_QUERIES = [
    ("resources=MCPU:1", "1.39"),
    ("resources=VCPU:1&required=CUSTOM_NOPE", "1.39"),
    ("resources=VCPU:1&root_required=CUSTOM_NOPE", "1.39"),
    ("", "1.24"),
    ("resources=", "1.39"),
    ("resources=VCPU:0", "1.39"),
    ("resources=VCPU:x", "1.39"),
    ("resources=VCPU:1&limit=0", "1.39"),
    ("resources=VCPU:1&limit=1", "1.15"),
    ("resources=VCPU:1&bogus=1", "1.39"),
    ("resources=VCPU:1&in_tree=not-a-uuid", "1.39"),
    ("resources=VCPU:1&member_of=not-a-uuid", "1.39"),
    ("resources1=VCPU:1&resources2=VCPU:1", "1.39"),
    ("resources_X=VCPU:1&same_subtree=_X,_Y&group_policy=none", "1.39"),
    ("resources=VCPU:1&required=CUSTOM_X,!CUSTOM_X", "1.39"),
    ("resources=VCPU:1&required=in:A,B", "1.38"),
    ("resources=VCPU:1&root_required=A&root_required=B", "1.39"),
    ("resources_X=VCPU:1", "1.32"),
    ("resources=VCPU:1&member_of=!" + AGG_A, "1.31"),
    ("resources=VCPU:1&required=%ff", "1.39"),
]


@pytest.mark.parametrize("query, version", BAD_QUERIES)
def test_bad_input_gets_the_400_of_allocation_candidates(api, cloud, query, version):
    expected = api.get(f"/allocation_candidates?{query}", version=version)
    got = api.get(f"/allotment/explain?{query}", version=version)
    assert expected.status == 400, expected
    assert got.status == 400
    strip = lambda error: {k: v for k, v in error.items() if k != "request_id"}  # noqa: E731
    assert [strip(e) for e in got.json["errors"]] == [strip(e) for e in expected.json["errors"]]


def test_needs_microversion_1_10(api):
    resp = api.get("/allotment/explain?resources=VCPU:1", version="1.9")
    assert resp.status == 400
    assert "needs microversion 1.10 or later" in resp.error()["detail"]


def test_admin_only_by_default(api, cloud):
    cloud.provider("cn1", inventories=COMPUTE)
    assert api.get("/allotment/explain?resources=VCPU:1", token="demo").status == 403
    resp = api.get("/allotment/explain?resources=VCPU:1", token="nova", headers={"X-Roles": "service"})
    assert resp.status == 403
    assert "allotment:explain" in resp.error()["detail"]


def test_a_policy_file_opens_it(db_url, tmp_path):
    from allotment.api.app import Application
    from allotment.service import database_from_config
    from tests.conftest import ApiClient, make_conf

    policy = tmp_path / "policy.yaml"
    policy.write_text('"allotment:explain": "role:reader"\n')
    conf = make_conf(db_url)
    conf.set_override("policy_file", str(policy), group="oslo_policy")
    app = Application(conf, database_from_config(conf))
    try:
        resp = ApiClient(app).get("/allotment/explain?resources=VCPU:1", token="demo",
                                  headers={"X-Roles": "reader"})
        assert resp.status == 200, resp
    finally:
        app.db.dispose()


def test_no_placement_route_of_that_name(api):
    assert api.get("/allotment").status == 404
    assert api.post("/allotment/explain?resources=VCPU:1", json={}).status == 405


# -- the count is GET /allocation_candidates' over random clouds ---------------------------------

def _trait(name: str) -> str:
    return name if name.isupper() and "_" in name else f"CUSTOM_{name}"


def query_of(request: rg.AllocationCandidatesRequest) -> list[tuple[str, str]]:
    """A query string meaning ``request`` (traits made custom names); for
    a microversion before 1.33, numbered groups and only what it allows."""
    old = request.version < (1, 33)
    numbers = {group.suffix: str(i) for i, group in enumerate(request.groups, 1)}
    pairs: list[tuple[str, str]] = []
    for group in request.groups:
        s = numbers[group.suffix] if old and group.suffix else group.suffix
        if group.resources:
            pairs.append((f"resources{s}", ",".join(f"{rc}:{n}" for rc, n in group.resources.items())))
        single = [_trait(next(iter(any_of))) for any_of in group.traits.required if len(any_of) == 1]
        single += [f"!{_trait(name)}" for name in sorted(group.traits.forbidden)]
        if single:
            pairs.append((f"required{s}", ",".join(single)))
        for any_of in group.traits.required:
            if len(any_of) > 1 and not old:
                pairs.append((f"required{s}", "in:" + ",".join(sorted(_trait(t) for t in any_of))))
        for any_of in group.aggregates.required:
            pairs.append((f"member_of{s}", "in:" + ",".join(sorted(any_of))))
        if group.aggregates.forbidden and not old:
            pairs.append((f"member_of{s}", "!in:" + ",".join(sorted(group.aggregates.forbidden))))
        if group.in_tree and not old:
            pairs.append((f"in_tree{s}", group.in_tree))
    if request.group_policy and any(g.suffix for g in request.groups):
        pairs.append(("group_policy", request.group_policy))
    root = [_trait(next(iter(a))) for a in request.root_traits.required]
    root += [f"!{_trait(t)}" for t in sorted(request.root_traits.forbidden)]
    if root:
        pairs.append(("root_required", ",".join(root)))
    for suffixes in request.same_subtrees:
        pairs.append(("same_subtree", ",".join(sorted(suffixes))))
    if request.limit:
        pairs.append(("limit", str(request.limit)))
    return pairs


_GENERATIONS = itertools.count(1000)


def build(engine, snapshot) -> None:
    """The random snapshot's providers, inventories, traits, aggregates and
    usage, written in one transaction (through the API, a commit per write
    would make each example cost a third of a second).  Providers get a
    generation never used before, as writers bump it: an id and uuid may
    come again in the next example, and what only changes with the
    generation is kept per process."""
    import sqlalchemy as sa

    from allotment.db import tables

    generation = next(_GENERATIONS)

    with engine.begin() as conn:
        classes = dict(conn.execute(sa.select(tables.resource_classes.c.name, tables.resource_classes.c.id)).all())
        trait_ids = dict(conn.execute(sa.select(tables.traits.c.name, tables.traits.c.id)).all())
        names = {_trait(t) for prov in snapshot for t in prov.traits}
        for name in sorted(names - trait_ids.keys()):
            trait_ids[name] = conn.execute(tables.traits.insert().values(name=name)).inserted_primary_key[0]
        aggregate_ids = {}
        for uuid in sorted({a for prov in snapshot for a in prov.aggregates}):
            aggregate_ids[uuid] = conn.execute(
                tables.placement_aggregates.insert().values(uuid=uuid)).inserted_primary_key[0]
        ids: dict[int, int] = {}
        rp = tables.resource_providers
        for prov in snapshot:  # parents before children
            pid = conn.execute(rp.insert().values(uuid=prov.uuid, name=f"p{prov.id}", generation=generation)
                               ).inserted_primary_key[0]
            ids[prov.id] = pid
            parent = ids[prov.parent_id] if prov.parent_id is not None else None
            conn.execute(rp.update().where(rp.c.id == pid).values(
                parent_provider_id=parent, root_provider_id=ids[prov.root_id]))
            for rc, inv in prov.inventories.items():
                conn.execute(tables.inventories.insert().values(
                    resource_provider_id=pid, resource_class_id=classes[rc], total=inv.total,
                    reserved=inv.reserved, min_unit=inv.min_unit, max_unit=inv.max_unit,
                    step_size=inv.step_size, allocation_ratio=inv.allocation_ratio))
                if inv.used:
                    conn.execute(tables.allocations.insert().values(
                        resource_provider_id=pid, consumer_id=prov.uuid, resource_class_id=classes[rc],
                        used=inv.used))
            for name in prov.traits:
                conn.execute(tables.resource_provider_traits.insert().values(
                    resource_provider_id=pid, trait_id=trait_ids[_trait(name)]))
            for uuid in prov.aggregates:
                conn.execute(tables.resource_provider_aggregates.insert().values(
                    resource_provider_id=pid, aggregate_id=aggregate_ids[uuid]))


@st.composite
def clouds_and_queries(draw):
    snapshot = draw(random_snapshots())
    request = draw(random_requests(snapshot))
    limit = draw(st.none() | st.integers(1, 3))
    return snapshot, query_of(rg.AllocationCandidatesRequest(**{**request.__dict__, "limit": limit})), \
        "%d.%d" % request.version


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(clouds_and_queries())
def test_explain_counts_what_allocation_candidates_returns(app, api, drawn):
    snapshot, pairs, version = drawn
    _empty_tables(app.db.engine)
    build(app.db.engine, snapshot)
    query = urllib.parse.urlencode(pairs)
    resp = api.get(f"/allocation_candidates?{query}", version=version)
    if resp.status == 400:  # a request the API refuses (conflicting traits...): the same 400
        got = api.get(f"/allotment/explain?{query}", version=version)
        assert (got.status, got.error()["detail"]) == (400, resp.error()["detail"])
        return
    assert resp.status == 200, (query, resp)
    got = api.get(f"/allotment/explain?{query}", version=version)
    if got.status == 400:
        # Explain names an unknown class or trait that the answer passed over:
        # Placement's search ended, empty, before it looked that name up.
        assert resp.json["allocation_requests"] == [], query
        detail = got.error()["detail"].split("\n\n", 1)[-1].strip()
        assert detail.startswith(("No such trait", "Invalid resource class")), got.error()
        return
    body = explain(api, query, version=version)
    returned = len(resp.json["allocation_requests"])
    assert body["candidates"]["returned"] == returned, query
    limit = body["request"]["limit"]
    assert returned == (body["candidates"]["available"] if limit is None
                        else min(limit, body["candidates"]["available"])), query
    assert (body["candidates"]["trees"] > 0) == (returned > 0), query


# -- allotment explain ---------------------------------------------------------------------

@pytest.fixture
def config(db_url, tmp_path):
    path = tmp_path / "placement.conf"
    path.write_text(textwrap.dedent(f"""\
        [placement_database]
        connection = {db_url}
        """))
    return str(path)


def test_command_reads_the_database_in_process(api, cloud, config, capsys):
    cloud.provider("cn1", inventories={"VCPU": {"total": 16, "reserved": 2}})
    cloud.allocate({"cn1": {"VCPU": 12}})
    assert cli.main(["explain", "--config-file", config, "resources=VCPU:4"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "0/1 trees can serve this request: 1 not enough free VCPU."
    assert "    cn1: VCPU: 4 requested, 2 free of 16 (12 used, reserved 2, ratio 1.0)" in lines
    assert any(line.startswith("  has VCPU:4 free") and line.split()[-4:] == ["0", "1", "0", "1"]
               for line in lines), out
    # JSON, and a pasted URL, microversion chosen.
    assert cli.main(["explain", "--config-file", config, "--json", "--microversion", "1.20",
                     "http://placement/allocation_candidates?resources=VCPU:1"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["microversion"] == "1.20" and body["candidates"]["returned"] == 1


def test_command_reports_a_bad_query_and_an_unreachable_server(config, capsys):
    assert cli.main(["explain", "--config-file", config, "resources=VCPU:1&required=CUSTOM_NOPE"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["400 Bad Request", "  placement.undefined_code: No such trait(s): CUSTOM_NOPE."]
    assert cli.main(["explain", "--url", "http://127.0.0.1:9", "resources=VCPU:1"]) == 2
    assert capsys.readouterr().err.startswith("allotment explain: cannot reach http://127.0.0.1:9")
