"""Reads by long lists of ids hold no more parameters in one statement
than SQLite takes (32,766): candidates read from the database (no provider
mirror) over a cloud whose first trees are full, where the search loads
trees in rounds that double while trees give nothing (a round of 100,000
hosts failed with `too many SQL variables`), and the provider mirror's
read of the providers changed since it was read, up to half of them.
Here SQLite's limit and the readers' are made small, so that a small cloud
crosses them."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from allotment.api.app import Application
from allotment.db import allocation_candidates as candidates_db
from allotment.db import provider_mirror, raw_rows
from allotment.service import database_from_config, prepare_database
from tests.conftest import BACKEND, ApiClient, create_database, make_conf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "cloudgen"))

import cloud  # noqa: E402

pytestmark = pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's parameter limit, made small")

#: SQLite's parameter limit here, and the loader's, to match it.
VARIABLES = 256


def _app(url: str, **overrides) -> Application:
    conf = make_conf(url, allotment__candidates_cache_mb=0, **overrides)
    db = database_from_config(conf)
    prepare_database(db)
    return Application(conf, db)


def _limited(app: Application, monkeypatch) -> Application:
    """``app``, its connections taking :data:`VARIABLES` parameters a
    statement, and the readers' lists cut to match."""

    @sa.event.listens_for(app.db.engine, "connect")
    def _small(dbapi_conn, _record):
        dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, VARIABLES)

    app.db.engine.dispose()
    monkeypatch.setattr(raw_rows, "IDS_PER_STATEMENT", 64)
    monkeypatch.setattr(candidates_db, "LOAD_TREES", 64)
    monkeypatch.setattr(provider_mirror, "ID_WINDOW", 64)
    return app


def test_a_long_run_of_full_trees_is_read_within_the_parameter_limit(tmp_path_factory, monkeypatch):
    url, drop = create_database(tmp_path_factory, "limits")
    try:
        cloud.generate(url, cloud.Spec([("flat", 1200)], 42, full_first=0.95))
        mirrored = ApiClient(_app(url), version="1.39")
        direct = ApiClient(_limited(_app(url, allotment__provider_mirror=False), monkeypatch), version="1.39")
        for query in ("resources=VCPU:2,MEMORY_MB:4096,DISK_GB:20&limit=1",
                      "resources=VCPU:2,MEMORY_MB:4096,DISK_GB:20&limit=50"):
            expected = mirrored.get(f"/allocation_candidates?{query}").json
            assert expected["allocation_requests"]
            assert direct.get(f"/allocation_candidates?{query}").json == expected
    finally:
        drop()


def test_the_mirror_reads_many_changed_providers_within_the_parameter_limit(tmp_path_factory, monkeypatch):
    url, drop = create_database(tmp_path_factory, "mirror-limits")
    try:
        cloud.generate(url, cloud.Spec([("flat", 1200)], 43))
        app = _limited(_app(url), monkeypatch)
        api = ApiClient(app, version="1.39")
        query = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:512&limit=2000"
        before = api.get(query).json
        mirror = app.state.mirror
        assert mirror.full_reads == 1
        # One write changes a third of the providers: more ids than a
        # statement takes, fewer than half (read again one by one, not whole).
        providers = sorted(before["provider_summaries"])[:400]
        claims = {f"00000000-0000-4000-8000-{n:012d}": {
            "allocations": {rp: {"resources": {"VCPU": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}
            for n, rp in enumerate(providers)}
        assert api.post("/allocations", claims).status == 204
        after = api.get(query).json
        assert (mirror.full_reads, mirror.partial_reads) == (1, 1)
        fresh = ApiClient(_app(url), version="1.39").get(query).json
        assert after == fresh
        used = [after["provider_summaries"][rp]["resources"]["VCPU"]["used"] for rp in providers]
        assert used == [before["provider_summaries"][rp]["resources"]["VCPU"]["used"] + 1 for rp in providers]
        emptied = {consumer: {**claim, "allocations": {}, "consumer_generation": 1}
                   for consumer, claim in claims.items()}
        assert api.post("/allocations", emptied).status == 204
        assert api.get(query).json == before
        assert (mirror.full_reads, mirror.partial_reads) == (1, 2)
    finally:
        drop()


def test_long_lists_of_aggregates_and_traits_are_written_within_the_parameter_limit(tmp_path_factory,
                                                                                    monkeypatch):
    url, drop = create_database(tmp_path_factory, "body-limits")
    try:
        api = ApiClient(_limited(_app(url), monkeypatch), version="1.39")
        rp = "7d2c3a6e-2f55-4b0e-9a57-0c1d2e3f4a5b"
        assert api.post("/resource_providers", {"uuid": rp, "name": "wide"}).status == 200

        def put(what: str, values: list[str]) -> dict:
            generation = api.get(f"/resource_providers/{rp}/{what}").json["resource_provider_generation"]
            answer = api.put(f"/resource_providers/{rp}/{what}",
                             {what: values, "resource_provider_generation": generation})
            assert answer.status == 200, answer.text
            assert api.get(f"/resource_providers/{rp}/{what}").json == answer.json
            return answer.json

        first = [f"00000000-0000-4000-8000-{n:012d}" for n in range(300)]
        second = first[150:] + [f"00000000-0000-4000-9000-{n:012d}" for n in range(300)]
        assert sorted(put("aggregates", first)["aggregates"]) == first
        assert sorted(put("aggregates", second)["aggregates"]) == sorted(second)
        names = [f"CUSTOM_WIDE_{n:04d}" for n in range(300)]
        for name in names:
            assert api.put(f"/traits/{name}").status == 201
        assert put("traits", names[::-1])["traits"] == names
        assert put("traits", names[:10])["traits"] == names[:10]
        unknown = api.put(f"/resource_providers/{rp}/traits", {
            "traits": names + ["CUSTOM_NOT_THERE"],
            "resource_provider_generation": api.get(f"/resource_providers/{rp}/traits").json[
                "resource_provider_generation"]})
        assert unknown.status == 400 and "CUSTOM_NOT_THERE" in unknown.text
    finally:
        drop()


def test_a_large_tree_is_read_moved_and_freed_within_the_parameter_limit(tmp_path_factory, monkeypatch):
    """Lists as long as a tree is large, or a consumer's allocations are
    many: the capacity view of a tree of 301 providers (and of a provider
    in 300 aggregates, each with a sharing provider), a subtree of 300
    providers made a tree of its own, a consumer of 300 allocations
    deleted, and a reshape of 300 providers, each past a limit of 256
    parameters a statement."""
    url, drop = create_database(tmp_path_factory, "tree-limits")
    try:
        api = ApiClient(_limited(_app(url, allotment__ui=True), monkeypatch), version="1.39")
        root, mid = "10000000-0000-4000-8000-000000000000", "20000000-0000-4000-8000-000000000000"
        assert api.post("/resource_providers", {"uuid": root, "name": "root"}).status == 200
        assert api.post("/resource_providers", {"uuid": mid, "name": "mid", "parent_provider_uuid": root}).status == 200
        assert api.put("/traits/CUSTOM_WIDE").status == 201
        leaves = [f"30000000-0000-4000-8000-{n:012d}" for n in range(300)]
        aggregates = [f"40000000-0000-4000-8000-{n:012d}" for n in range(300)]
        for n, leaf in enumerate(leaves):
            assert api.post("/resource_providers", {"uuid": leaf, "name": f"leaf-{n:03d}",
                                                    "parent_provider_uuid": mid}).status == 200
            assert api.put(f"/resource_providers/{leaf}/inventories", {
                "resource_provider_generation": 0, "inventories": {"VCPU": {"total": 4}}}).status == 200
            assert api.put(f"/resource_providers/{leaf}/traits", {
                "resource_provider_generation": 1, "traits": ["CUSTOM_WIDE"]}).status == 200
        consumer = "50000000-0000-4000-8000-000000000000"
        assert api.put(f"/allocations/{consumer}", {
            "allocations": {leaf: {"resources": {"VCPU": 1}} for leaf in leaves},
            "project_id": "p", "user_id": "u", "consumer_generation": None,
            "consumer_type": "INSTANCE"}).status == 204

        (tree,) = api.get("/allotment/capacity/trees").json["trees"]
        assert len(tree["providers"]) == 302
        by_uuid = {provider["uuid"]: provider for provider in tree["providers"]}
        assert all(by_uuid[leaf]["inventories"]["VCPU"]["used"] == 1 for leaf in leaves)
        assert all(by_uuid[leaf]["traits"] == ["CUSTOM_WIDE"] for leaf in leaves)

        # The root in 300 aggregates, a sharing provider in each of them.
        assert api.put(f"/resource_providers/{root}/aggregates", {
            "resource_provider_generation": 0, "aggregates": aggregates}).status == 200
        for n, aggregate in enumerate(aggregates):
            nfs = f"60000000-0000-4000-8000-{n:012d}"
            assert api.post("/resource_providers", {"uuid": nfs, "name": f"nfs-{n:03d}"}).status == 200
            assert api.put(f"/resource_providers/{nfs}/aggregates", {
                "resource_provider_generation": 0, "aggregates": [aggregate]}).status == 200
            assert api.put(f"/resource_providers/{nfs}/traits", {
                "resource_provider_generation": 1, "traits": ["MISC_SHARES_VIA_AGGREGATE"]}).status == 200
        sharing = api.get(f"/allotment/capacity/providers/{root}").json["sharing_providers"]
        assert [entry["name"] for entry in sharing] == [f"nfs-{n:03d}" for n in range(300)]

        # The middle provider and its 300 leaves made a tree of their own (1.37).
        moved = api.put(f"/resource_providers/{mid}", {"name": "mid", "parent_provider_uuid": None},
                        headers={"OpenStack-API-Version": "placement 1.37"})
        assert moved.status == 200, moved.text
        in_tree = api.get(f"/resource_providers?in_tree={mid}").json["resource_providers"]
        assert len(in_tree) == 301 and {rp["root_provider_uuid"] for rp in in_tree} == {mid}

        assert api.delete(f"/allocations/{consumer}").status == 204
        assert api.get(f"/allocations/{consumer}").json["allocations"] == {}

        # A reshape of the 300 leaves' inventories (their allocations gone).
        inventories = {leaf: {"resource_provider_generation": api.get(f"/resource_providers/{leaf}").json[
            "generation"], "inventories": {"VCPU": {"total": 8}}} for leaf in leaves}
        reshaped = api.post("/reshaper", {"inventories": inventories, "allocations": {}},
                            headers={"OpenStack-API-Version": "placement 1.30", "X-Roles": "admin,service"})
        assert reshaped.status == 204, reshaped.text
        assert api.get(f"/resource_providers/{leaves[-1]}/inventories").json["inventories"]["VCPU"]["total"] == 8
    finally:
        drop()
