"""tools/cloudgen: a synthetic cloud written straight into the database.

The generator must give the same rows for the same seed, write a cloud
Allotment serves as it would one built through the API (usages, providers,
candidates), and leave Allotment's bookkeeping (change number, provider
notes) consistent with the rows, so that the provider mirror and kept
answers see the writes that follow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from allotment.db import changes, tables
from tests.conftest import BACKEND, ApiClient, create_database, make_conf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "cloudgen"))

import cloud  # noqa: E402

SHAPES = [("nested", 12), ("flat", 6), ("sharing", 6)]
#: Rows compared between two generations (ids included).
COMPARED = ("resource_providers", "inventories", "resource_provider_traits", "resource_provider_aggregates",
            "placement_aggregates", "projects", "users", "consumers", "allocations")


def _dump(url: str) -> dict[str, list[tuple]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {name: [tuple(row) for row in conn.execute(
                sa.select(tables.metadata.tables[name]).order_by(*tables.metadata.tables[name].primary_key))]
                for name in COMPARED}
    finally:
        engine.dispose()


@pytest.fixture
def generated(tmp_path_factory):
    made = []

    def make(shapes=SHAPES, seed=42, full_first=0.0, **kwargs):
        url, drop = create_database(tmp_path_factory, "cloudgen")
        made.append(drop)
        return url, cloud.generate(url, cloud.Spec(shapes, seed, full_first), **kwargs)

    yield make
    for drop in made:
        drop()


def test_the_same_seed_gives_the_same_rows_and_another_seed_others(generated):
    first_url, first = generated()
    second_url, _ = generated()
    other_url, _ = generated(seed=7)
    rows = _dump(first_url)
    assert rows == _dump(second_url)
    other = _dump(other_url)
    assert {row[1] for row in rows["resource_providers"]}.isdisjoint(row[1] for row in other["resource_providers"])
    counts = {s.shape: s.providers for s in first.shapes}
    # 4.3 providers a nested root on average, one a flat host, one a
    # sharing host plus the shared disks (one or two per 50 hosts).
    assert 12 * 3 <= counts["nested"] <= 12 * 5 and counts["flat"] == 6 and counts["sharing"] in (7, 8)
    assert len(rows["resource_providers"]) == sum(counts.values())
    assert first.rows["allocations"] == len(rows["allocations"]) == sum(s.allocations for s in first.shapes)


def test_refuses_a_database_that_is_not_empty(generated, tmp_path_factory):
    url, _ = generated(shapes=[("flat", 2)])
    with pytest.raises(SystemExit, match="not empty"):
        cloud.generate(url, cloud.Spec([("flat", 2)]))
    with pytest.raises(ValueError, match="unknown shape"):
        cloud.Spec([("round", 2)])


def test_placement_only_leaves_no_bookkeeping_and_a_take_over_starts_it(generated):
    url, _ = generated(shapes=[("flat", 3)], placement_only=True)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            assert changes.COUNTER not in names and "allotment_version" not in names
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == "a082b8bb98d0"
    finally:
        engine.dispose()


def test_allotment_serves_the_cloud_and_sees_writes_after_it(generated):
    url, result = generated()
    conf = make_conf(url, allotment__candidates_cache_mb=0)
    from allotment.api.app import Application
    from allotment.service import database_from_config, prepare_database

    db = database_from_config(conf)
    prepare_database(db)
    app = Application(conf, db)
    try:
        api = ApiClient(app, version="1.39")
        providers = api.get("/resource_providers").json["resource_providers"]
        assert len(providers) == sum(s.providers for s in result.shapes)
        for summary in result.shapes:
            for project, expected in summary.usages.items():
                usages = api.get(f"/usages?project_id={project}").json["usages"]
                assert usages == {"INSTANCE": {"consumer_count": usages["INSTANCE"]["consumer_count"],
                                               **expected}}, (summary.shape, project)
        query = "/allocation_candidates?resources=VCPU:2,MEMORY_MB:4096,DISK_GB:20"
        before = api.get(query).json
        assert before["allocation_requests"]
        # Nothing is over capacity: every provider's usage fits.
        for uuid, summary in before["provider_summaries"].items():
            for rc, figures in summary["resources"].items():
                assert figures["used"] <= figures["capacity"], (uuid, rc)
        # A claim through the API: the next answer (from the mirror, when
        # there is one) shows the new usage.
        pick = before["allocation_requests"][0]["allocations"]
        consumer = "9a3c1b9e-0000-4000-8000-000000000001"
        assert api.put(f"/allocations/{consumer}", json={
            "allocations": pick, "project_id": "p", "user_id": "u", "consumer_generation": None,
            "consumer_type": "INSTANCE"}).status == 204
        after = api.get(query).json
        provider, resources = next(iter(pick.items()))
        for rc, amount in resources["resources"].items():
            assert (after["provider_summaries"][provider]["resources"][rc]["used"]
                    == before["provider_summaries"][provider]["resources"][rc]["used"] + amount)
        if BACKEND in changes.NOTING_BACKENDS:
            assert app.state.mirror.full_reads == 1 and app.state.mirror.partial_reads == 1
    finally:
        db.dispose()


def test_full_first_fills_the_first_roots_of_each_shape(generated):
    """``full_first``: a cloud that filled in the order candidates are
    given.  The first half of each shape's roots give no candidate for a
    scheduler's query, the others still do, and nothing is over capacity."""
    url, result = generated(shapes=[("nested", 10), ("flat", 10)], full_first=0.5)
    conf = make_conf(url, allotment__candidates_cache_mb=0)
    from allotment.api.app import Application
    from allotment.service import database_from_config, prepare_database

    db = database_from_config(conf)
    prepare_database(db)
    try:
        with db.engine.connect() as conn:
            over = conn.exec_driver_sql(
                "SELECT count(*) FROM inventories i JOIN (SELECT resource_provider_id, resource_class_id, "
                "sum(used) AS used FROM allocations GROUP BY resource_provider_id, resource_class_id) a "
                "ON a.resource_provider_id = i.resource_provider_id AND a.resource_class_id = i.resource_class_id "
                "WHERE a.used > (i.total - i.reserved) * i.allocation_ratio").scalar()
        assert over == 0
        api = ApiClient(Application(conf, db), version="1.39")
        names = {rp["uuid"]: rp["name"] for rp in api.get("/resource_providers").json["resource_providers"]}
        found = api.get("/allocation_candidates?resources=VCPU:2,MEMORY_MB:4096,DISK_GB:20").json
        roots = {names[summary["root_provider_uuid"]] for summary in found["provider_summaries"].values()}
        numbers = {int(name[-6:]) for name in roots}
        assert numbers and min(numbers) >= 5, sorted(roots)
        assert len({name[:-6] for name in roots}) == 2  # candidates left in both shapes
    finally:
        db.dispose()
