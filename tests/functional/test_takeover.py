"""Taking over a database the reference Placement created, and handing it back.

For each of the reference's schema revisions, a database is laid out from
the DDL the reference's migrations produced (stored once under
``tests/data/reference_ddl`` by ``tools/reference_schema_ddl``) and filled,
with SQL matching that revision, with a small cloud: a provider tree with a
custom resource class, a sharing provider in an aggregate, standard and
custom traits, consumers with project and user (and, from 422ece571366 on,
a consumer type); at the two oldest revisions also allocations whose
consumer has no record and a provider without a root, which the reference
would refuse to upgrade past.

Allotment takes it over (refusing first, with one line naming the online
data migrations, where the reference would refuse), every row stays, and
its answers are the ones this data implies, written out below
(``expect_answers``).  Then Allotment writes, and the database must still
carry everything Placement 16.0.0's layout has, with its ``alembic_version``
at a082b8bb98d0: what the reference needs to take it back.

The reference itself is needed by none of these.  With
``ALLOTMENT_REFERENCE_TESTS=1`` (and its venv, which ``shared/reference/serve``
builds), opt-in tests also let the real reference serve the same data and
compare its answers with Allotment's, and run ``placement-manage db sync``
and the reference's API on a database Allotment has served.  They are never
run under CI.

Each revision's database is built once per session and copied per test
(SQLite: the file; PostgreSQL: ``CREATE DATABASE ... TEMPLATE``; MariaDB:
each table's own DDL, then its rows).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time
import uuid as uuidlib

import pytest
import sqlalchemy as sa

from tests import reference
from tests.conftest import BACKEND, ApiClient, make_conf
from tests.functional.test_server import run_allotment, write_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WITH_REFERENCE = os.environ.get("ALLOTMENT_REFERENCE_TESTS") == "1"


def needs_reference() -> None:
    """Skip (with the reason) unless the opt-in reference comparison was asked for and can run."""
    if not WITH_REFERENCE:
        pytest.skip("comparison with the real reference Placement is opt-in: set "
                    "ALLOTMENT_REFERENCE_TESTS=1 (needs shared/reference/serve's venv)")
    if reference.venv() is None or reference.serve_script() is None:
        pytest.skip("ALLOTMENT_REFERENCE_TESTS=1 but the reference Placement's venv is absent "
                    "(run shared/reference/serve once to build it)")


CONSUMERS_AT = "b5c396305c25"   # from here on every allocation has a consumer record
TYPES_AT = "422ece571366"       # consumer types exist from here on

U = {name: str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{name}.takeover.test")) for name in
     ("cn1", "numa0", "numa1", "cn2", "ss1", "old", "agg1", "agg2", "c1", "c2", "c3", "orphan")}
VCPU, MEMORY_MB, DISK_GB = 0, 1, 2   # standard classes' ids: their place in os-resource-classes
CREATED = datetime.datetime(2019, 4, 10, 12, 30, 5)
MAGIC = 10000                        # the first custom class, as the reference numbers it


def _is_before(revision: str, other: str) -> bool:
    return reference.REVISIONS.index(revision) < reference.REVISIONS.index(other)


def fill(url: str, revision: str) -> None:
    """The test cloud, written with SQL as the reference would have at ``revision``."""
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine)
    t = meta.tables
    old = _is_before(revision, CONSUMERS_AT)
    with engine.begin() as conn:
        if engine.dialect.name == "mysql":  # VCPU's id is 0: keep it, as the reference does
            conn.exec_driver_sql("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_AUTO_VALUE_ON_ZERO')")

        def add(table, **row):
            if "created_at" in t[table].c:
                row = {"created_at": CREATED, "updated_at": CREATED, **row}
            conn.execute(sa.insert(t[table]).values(**row))

        names = conn.execute(sa.select(t["resource_classes"].c.name)).scalars().all()
        for rc_id, name in ((VCPU, "VCPU"), (MEMORY_MB, "MEMORY_MB"), (DISK_GB, "DISK_GB")):
            if name not in names:
                add("resource_classes", id=rc_id, name=name)
        add("resource_classes", id=MAGIC, name="CUSTOM_MAGIC")
        traits = {}
        for name in ("HW_CPU_X86_AVX2", "MISC_SHARES_VIA_AGGREGATE", "CUSTOM_GOLD", "CUSTOM_SILVER_1"):
            add("traits", name=name)
            traits[name] = conn.execute(sa.select(t["traits"].c.id)
                                        .where(t["traits"].c.name == name)).scalar_one()
        ids = {}

        def provider(name, parent=None, generation=1, root=True):
            root_id = None
            if parent is not None:
                root_id = conn.execute(sa.select(t["resource_providers"].c.root_provider_id)
                                       .where(t["resource_providers"].c.id == ids[parent])).scalar_one()
            add("resource_providers", uuid=U[name], name=f"{name}-takeover", generation=generation,
                parent_provider_id=ids.get(parent))
            ids[name] = conn.execute(sa.select(t["resource_providers"].c.id)
                                     .where(t["resource_providers"].c.uuid == U[name])).scalar_one()
            if root:
                conn.execute(sa.update(t["resource_providers"])
                             .where(t["resource_providers"].c.id == ids[name])
                             .values(root_provider_id=root_id or ids[name]))

        provider("cn1", generation=5)
        provider("numa0", "cn1", generation=3)
        provider("numa1", "cn1", generation=2)
        provider("cn2", generation=1)
        provider("ss1", generation=4)
        provider("old", generation=0, root=not old)  # before 611cd6dffd7b: a provider without its root

        def inventory(name, rc, total, reserved=0, min_unit=1, max_unit=None, step=1, ratio=1.0):
            add("inventories", resource_provider_id=ids[name], resource_class_id=rc, total=total,
                reserved=reserved, min_unit=min_unit, max_unit=max_unit or total, step_size=step,
                allocation_ratio=ratio)

        inventory("cn1", VCPU, 16, reserved=2, ratio=4.0)
        inventory("cn1", MEMORY_MB, 8192, reserved=512, max_unit=4096, step=256, ratio=1.5)
        inventory("numa0", MAGIC, 10, max_unit=5)
        inventory("numa1", MAGIC, 6)
        inventory("cn2", VCPU, 4)
        inventory("cn2", MEMORY_MB, 2048)
        inventory("ss1", DISK_GB, 1000, reserved=100, step=10)
        for name, trait in (("cn1", "HW_CPU_X86_AVX2"), ("numa0", "CUSTOM_GOLD"),
                            ("numa1", "CUSTOM_SILVER_1"), ("ss1", "MISC_SHARES_VIA_AGGREGATE"),
                            ("cn2", "HW_CPU_X86_AVX2")):
            add("resource_provider_traits", resource_provider_id=ids[name], trait_id=traits[trait])
        for agg in ("agg1", "agg2"):
            add("placement_aggregates", uuid=U[agg])
        agg_ids = {agg: conn.execute(sa.select(t["placement_aggregates"].c.id)
                                     .where(t["placement_aggregates"].c.uuid == U[agg])).scalar_one()
                   for agg in ("agg1", "agg2")}
        for name, agg in (("cn1", "agg1"), ("ss1", "agg1"), ("cn2", "agg2"), ("ss1", "agg2")):
            add("resource_provider_aggregates", resource_provider_id=ids[name], aggregate_id=agg_ids[agg])
        add("projects", external_id="project-a")
        add("projects", external_id="project-b")
        add("users", external_id="user-a")
        add("users", external_id="user-b")
        owner = {name: conn.execute(sa.select(t[table].c.id).where(t[table].c.external_id == name))
                 .scalar_one()
                 for table, name in (("projects", "project-a"), ("projects", "project-b"),
                                     ("users", "user-a"), ("users", "user-b"))}
        extra = {}
        if not _is_before(revision, TYPES_AT):
            add("consumer_types", name="INSTANCE")
            extra = {"consumer_type_id": conn.execute(sa.select(t["consumer_types"].c.id)).scalar_one()}
        add("consumers", uuid=U["c1"], project_id=owner["project-a"], user_id=owner["user-a"],
            generation=3, **extra)
        add("consumers", uuid=U["c2"], project_id=owner["project-b"], user_id=owner["user-b"],
            generation=1)
        add("consumers", uuid=U["c3"], project_id=owner["project-a"], user_id=owner["user-b"],
            generation=0)

        def allocate(consumer, name, rc, used):
            add("allocations", consumer_id=U[consumer], resource_provider_id=ids[name],
                resource_class_id=rc, used=used)

        allocate("c1", "cn1", VCPU, 4)
        allocate("c1", "cn1", MEMORY_MB, 2048)
        allocate("c1", "ss1", DISK_GB, 100)
        allocate("c1", "numa0", MAGIC, 2)
        allocate("c2", "cn2", VCPU, 1)
        allocate("c2", "ss1", DISK_GB, 20)
        allocate("c3", "numa1", MAGIC, 1)
        if old:  # written before consumer records existed
            allocate("orphan", "cn2", MEMORY_MB, 512)
            allocate("orphan", "cn2", VCPU, 1)
    engine.dispose()


# -- databases -------------------------------------------------------------

class Templates:
    """One filled database per revision, built on first use; copies handed out per test."""

    def __init__(self, directory: str):
        self.directory = directory
        self.built: dict[str, str] = {}
        self.drops: list = []
        self.timings: dict[str, float] = {}

    def _build(self, revision: str, label: str, *, filled: bool = True) -> str:
        started = time.monotonic()
        url, drop = reference.scratch_database(BACKEND, label, self.directory)
        self.drops.append(drop)
        reference.create_from_ddl(url, revision)
        if filled:
            fill(url, revision)
        self.timings[label] = time.monotonic() - started
        return url

    def head_layout(self) -> dict:
        """Reflected facts of an empty database laid out from 16.0.0's stored DDL (built once)."""
        if "layout" not in self.built:
            self.built["layout"] = self._build(reference.HEAD, "layout", filled=False)
        return reference.reflect(self.built["layout"])

    def copy(self, revision: str) -> str:
        if revision not in self.built:
            self.built[revision] = self._build(revision, f"tpl{revision[:6]}")
        source = self.built[revision]
        url, drop = reference.scratch_database(BACKEND, f"tk{revision[:6]}", self.directory)
        if BACKEND == "sqlite":
            shutil.copyfile(source.removeprefix("sqlite:///"), url.removeprefix("sqlite:///"))
        elif BACKEND == "mysql":
            _copy_mysql(source, url)
        else:
            drop()
            name = url.rsplit("/", 1)[1]
            admin = sa.create_engine(reference.SERVER_URLS["postgresql"].format(name="postgres"),
                                     isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{source.rsplit("/", 1)[1]}"')
            admin.dispose()
        self.drops.append(drop)
        return url

    def close(self) -> None:
        for drop in reversed(self.drops):
            drop()


def _copy_mysql(source: str, target: str) -> None:
    """MariaDB has no template databases: the same DDL (SHOW CREATE TABLE), then the rows."""
    engine = sa.create_engine(source)
    copy = sa.create_engine(target)
    source_db = source.rsplit("/", 1)[1]
    with engine.connect() as conn, copy.begin() as into:
        into.exec_driver_sql("SET SESSION foreign_key_checks = 0")
        into.exec_driver_sql("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_AUTO_VALUE_ON_ZERO')")
        for table in sa.inspect(conn).get_table_names():
            into.exec_driver_sql(conn.exec_driver_sql(f"SHOW CREATE TABLE `{table}`").one()[1])
            into.exec_driver_sql(f"INSERT INTO `{table}` SELECT * FROM `{source_db}`.`{table}`")
    engine.dispose()
    copy.dispose()


@pytest.fixture(scope="session")
def templates(tmp_path_factory):
    built = Templates(str(tmp_path_factory.mktemp("reference-dbs")))
    yield built
    built.close()


def rows(url: str, columns: dict[str, list[str]] | None = None) -> dict[str, set]:
    """Every row of every table (as comparable tuples), by table; only ``columns`` when given."""
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine)
    found = {}
    with engine.connect() as conn:
        for name, table in meta.tables.items():
            if name in ("alembic_version", "allotment_version"):
                continue
            if columns is not None and name not in columns:
                continue
            kept = columns[name] if columns else list(table.c.keys())
            found[name] = {tuple((k, str(row._mapping[k])) for k in kept)
                           for row in conn.execute(sa.select(table))}
    engine.dispose()
    return found


# -- what is asked -----------------------------------------------------------

def questions() -> list[tuple[str, str]]:
    """(microversion, path) pairs whose answers must match the reference's."""
    asked = [("1.0", "/resource_providers"), ("latest", "/resource_providers"),
             ("latest", "/resource_classes"), ("latest", "/traits?name=startswith:CUSTOM"),
             ("latest", "/resource_providers?in_tree=" + U["cn1"]),
             ("latest", "/resource_providers?member_of=" + U["agg1"]),
             ("latest", "/resource_providers?required=CUSTOM_GOLD"),
             ("latest", "/resource_providers?required=HW_CPU_X86_AVX2&resources=VCPU:1"),
             ("latest", "/resource_providers/" + U["old"]),
             ("1.9", "/usages?project_id=project-a"),
             ("1.9", "/usages?project_id=project-a&user_id=user-b"),
             ("1.9", "/usages?project_id=incomplete-project"),
             ("latest", "/traits/CUSTOM_GOLD"), ("latest", "/traits/custom_gold"),
             ("latest", "/resource_classes/CUSTOM_MAGIC"), ("latest", "/resource_classes/custom_magic"),
             ("latest", "/allocation_candidates?resources=VCPU:1,DISK_GB:10"),
             ("latest", "/allocation_candidates?resources=VCPU:1,MEMORY_MB:256"
                        "&resources1=CUSTOM_MAGIC:1&required1=CUSTOM_GOLD&group_policy=isolate"),
             ("1.10", "/allocation_candidates?resources=VCPU:2")]
    for name in ("cn1", "numa0", "numa1", "cn2", "ss1", "old"):
        base = "/resource_providers/" + U[name]
        asked += [("latest", base), ("latest", base + "/inventories"), ("latest", base + "/traits"),
                  ("latest", base + "/aggregates"), ("1.1", base + "/aggregates"),
                  ("latest", base + "/usages"), ("latest", base + "/allocations")]
    for consumer in ("c1", "c2", "c3", "orphan"):
        asked += [("1.0", "/allocations/" + U[consumer]), ("1.12", "/allocations/" + U[consumer]),
                  ("latest", "/allocations/" + U[consumer])]
    if BACKEND != "postgresql":
        # From 1.38 (usages by consumer type) the reference answers 500 on
        # PostgreSQL (its query lacks a GROUP BY column), so there is
        # nothing to compare with there.
        asked += [("1.38", "/usages?project_id=project-a"), ("latest", "/usages?project_id=project-b")]
    return asked


def _canonical(status: int, body: str):
    """Status and JSON with lists in a stable order and volatile fields removed."""
    if not body:
        return status, None
    data = json.loads(body)

    def clean(value):
        if isinstance(value, dict):
            # (The reference ends some error details with two spaces, Allotment
            # does not: not what these tests are about.)
            return {k: v.strip() if k == "detail" else clean(v)
                    for k, v in value.items() if k not in ("request_id",)}
        if isinstance(value, list):
            return sorted((clean(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
        return value

    return status, clean(data)


def ask_reference(server: reference.Server) -> dict:
    return {(v, p): _canonical(r.status_code, r.text) for v, p in questions()
            for r in [server.get(p, v)]}


def ask_allotment(client: ApiClient) -> dict:
    return {(v, p): _canonical(r.status, r.text) for v, p in questions()
            for r in [client.get(p, version=v)]}


def differences(ours: dict, theirs: dict) -> list[str]:
    return [f"{v} {p}:\n  reference {theirs[(v, p)]}\n  allotment {ours[(v, p)]}"
            for (v, p) in theirs if ours[(v, p)] != theirs[(v, p)]]


# -- what the data implies ------------------------------------------------------

#: name: (parent, root, generation); every provider has its root once taken over.
TREE = {"cn1": (None, "cn1", 5), "numa0": ("cn1", "cn1", 3), "numa1": ("cn1", "cn1", 2),
        "cn2": (None, "cn2", 1), "ss1": (None, "ss1", 4), "old": (None, "old", 0)}


def _inv(total, reserved=0, min_unit=1, max_unit=None, step_size=1, allocation_ratio=1.0):
    return {"total": total, "reserved": reserved, "min_unit": min_unit,
            "max_unit": max_unit or total, "step_size": step_size, "allocation_ratio": allocation_ratio}


INVENTORIES = {
    "cn1": {"VCPU": _inv(16, reserved=2, allocation_ratio=4.0),
            "MEMORY_MB": _inv(8192, reserved=512, max_unit=4096, step_size=256, allocation_ratio=1.5)},
    "numa0": {"CUSTOM_MAGIC": _inv(10, max_unit=5)}, "numa1": {"CUSTOM_MAGIC": _inv(6)},
    "cn2": {"VCPU": _inv(4), "MEMORY_MB": _inv(2048)},
    "ss1": {"DISK_GB": _inv(1000, reserved=100, step_size=10)}, "old": {}}
TRAITS = {"cn1": ["HW_CPU_X86_AVX2"], "numa0": ["CUSTOM_GOLD"], "numa1": ["CUSTOM_SILVER_1"],
          "cn2": ["HW_CPU_X86_AVX2"], "ss1": ["MISC_SHARES_VIA_AGGREGATE"], "old": []}
AGGREGATES = {"cn1": ["agg1"], "ss1": ["agg1", "agg2"], "cn2": ["agg2"], "numa0": [], "numa1": [],
              "old": []}
INCOMPLETE = "00000000-0000-0000-0000-000000000000"   # the default incomplete_consumer_*_id


def expected_consumers(revision: str) -> dict:
    """consumer: (project, user, generation, consumer type at 1.38+, {provider: {class: used}})."""
    typed = not _is_before(revision, TYPES_AT)
    found = {
        "c1": ("project-a", "user-a", 3, "INSTANCE" if typed else "unknown",
               {"cn1": {"VCPU": 4, "MEMORY_MB": 2048}, "ss1": {"DISK_GB": 100},
                "numa0": {"CUSTOM_MAGIC": 2}}),
        "c2": ("project-b", "user-b", 1, "unknown", {"cn2": {"VCPU": 1}, "ss1": {"DISK_GB": 20}}),
        "c3": ("project-a", "user-b", 0, "unknown", {"numa1": {"CUSTOM_MAGIC": 1}}),
    }
    if _is_before(revision, CONSUMERS_AT):  # its record made by the online data migrations
        found["orphan"] = (INCOMPLETE, INCOMPLETE, 0, "unknown", {"cn2": {"MEMORY_MB": 512, "VCPU": 1}})
    return found


def _sum(allocations) -> dict:
    total: dict = {}
    for resources in allocations:
        for rc, used in resources.items():
            total[rc] = total.get(rc, 0) + used
    return total


def expect_answers(client: ApiClient, revision: str, *, by_type: bool = True) -> None:
    """Allotment's answers are what the test data implies (the reference gives the same: see
    ``test_reference_answers_the_same``)."""
    consumers = expected_consumers(revision)
    by_uuid = {U[name]: name for name in TREE}

    def get(path, version="latest", status=200):
        answer = client.get(path, version=version)
        assert answer.status == status, (path, answer)
        return answer.json if answer.text else None

    # Providers: tree, names, generations; the 1.0 shape has no tree.
    listed = {by_uuid[p["uuid"]]: p for p in get("/resource_providers")["resource_providers"]}
    assert set(listed) == set(TREE)
    for name, (parent, root, generation) in TREE.items():
        p = listed[name]
        assert (p["name"], p["generation"], p["parent_provider_uuid"], p["root_provider_uuid"]) == (
            f"{name}-takeover", generation, U[parent] if parent else None, U[root]), name
        assert get(f"/resource_providers/{U[name]}")["root_provider_uuid"] == U[root]
    assert all("root_provider_uuid" not in p
               for p in get("/resource_providers", "1.0")["resource_providers"])

    def names(path):
        return sorted(by_uuid[p["uuid"]] for p in get(path)["resource_providers"])

    assert names("/resource_providers?in_tree=" + U["numa1"]) == ["cn1", "numa0", "numa1"]
    assert names("/resource_providers?member_of=" + U["agg1"]) == ["cn1", "ss1"]
    assert names("/resource_providers?member_of=in:" + U["agg1"] + "," + U["agg2"]) == ["cn1", "cn2", "ss1"]
    assert names("/resource_providers?required=CUSTOM_GOLD") == ["numa0"]
    assert names("/resource_providers?required=HW_CPU_X86_AVX2&resources=VCPU:1") == ["cn1", "cn2"]
    assert names("/resource_providers?resources=VCPU:4") == ["cn1"]   # cn2: 4 - 1 (+1) used
    assert names("/resource_providers?resources=CUSTOM_MAGIC:5") == ["numa0", "numa1"]

    # Classes and traits: the custom ones kept, names matched exactly.
    classes = {c["name"] for c in get("/resource_classes")["resource_classes"]}
    assert {"VCPU", "MEMORY_MB", "DISK_GB", "CUSTOM_MAGIC"} <= classes
    assert get("/traits?name=startswith:CUSTOM")["traits"] == ["CUSTOM_GOLD", "CUSTOM_SILVER_1"]
    get("/traits/CUSTOM_GOLD", status=204)
    get("/traits/custom_gold", status=404)
    assert get("/resource_classes/CUSTOM_MAGIC")["name"] == "CUSTOM_MAGIC"
    get("/resource_classes/custom_magic", status=404)

    # Per provider: inventories, traits, aggregates, usages, allocations.
    for name, (_, _, generation) in TREE.items():
        base = f"/resource_providers/{U[name]}"
        inventories = get(base + "/inventories")
        assert inventories == {"resource_provider_generation": generation,
                               "inventories": INVENTORIES[name]}, name
        traits = get(base + "/traits")
        assert sorted(traits["traits"]) == TRAITS[name] and traits["resource_provider_generation"] == generation
        aggregates = get(base + "/aggregates")
        assert sorted(aggregates["aggregates"]) == sorted(U[a] for a in AGGREGATES[name])
        assert aggregates["resource_provider_generation"] == generation
        assert sorted(get(base + "/aggregates", "1.1")["aggregates"]) == sorted(U[a] for a in AGGREGATES[name])
        here = {c: allocations[name] for c, (*_, allocations) in consumers.items() if name in allocations}
        usages = {rc: 0 for rc in INVENTORIES[name]}
        usages.update(_sum(here.values()))
        assert get(base + "/usages") == {"resource_provider_generation": generation, "usages": usages}, name
        assert get(base + "/allocations") == {
            "resource_provider_generation": generation,
            "allocations": {U[c]: {"resources": r, "consumer_generation": consumers[c][2]}
                            for c, r in here.items()}}, name

    # Per consumer, in three microversions' shapes.
    for consumer, (project, user, generation, ctype, allocations) in consumers.items():
        path = "/allocations/" + U[consumer]
        assert get(path, "1.0") == {"allocations": {
            U[p]: {"resources": r, "generation": TREE[p][2]} for p, r in allocations.items()}}
        assert get(path, "1.12") == {"allocations": {
            U[p]: {"resources": r, "generation": TREE[p][2]} for p, r in allocations.items()},
            "project_id": project, "user_id": user}
        assert get(path) == {"allocations": {
            U[p]: {"resources": r, "generation": TREE[p][2]} for p, r in allocations.items()},
            "project_id": project, "user_id": user, "consumer_generation": generation,
            "consumer_type": ctype}, consumer

    # Usages by project (and user, and consumer type).
    def owned(project, user=None):
        return [r for p, u, _, _, allocations in consumers.values()
                if p == project and user in (None, u) for r in allocations.values()]

    assert get("/usages?project_id=project-a", "1.9")["usages"] == _sum(owned("project-a"))
    assert get("/usages?project_id=project-a", "1.9")["usages"] == {
        "VCPU": 4, "MEMORY_MB": 2048, "DISK_GB": 100, "CUSTOM_MAGIC": 3}
    assert get("/usages?project_id=project-a&user_id=user-b", "1.9")["usages"] == {"CUSTOM_MAGIC": 1}
    assert get("/usages?project_id=project-b", "1.9")["usages"] == {"VCPU": 1, "DISK_GB": 20}
    assert get("/usages?project_id=incomplete-project", "1.9")["usages"] == {}
    grouped: dict = {}
    for p, _, _, ctype, allocations in consumers.values():
        if p == "project-a":
            group = grouped.setdefault(ctype, {"consumer_count": 0})
            group["consumer_count"] += 1
            for rc, used in _sum(allocations.values()).items():
                group[rc] = group.get(rc, 0) + used
    if by_type:
        assert get("/usages?project_id=project-a", "1.38")["usages"] == grouped

    # Allocation candidates: sharing through aggregates, nested, groups.
    def requests(path, version="latest"):
        answer = get(path, version)
        found = []
        for request in answer["allocation_requests"]:
            allocations = request["allocations"]
            if isinstance(allocations, list):  # the 1.10 shape
                allocations = {a["resource_provider"]["uuid"]: a for a in allocations}
            found.append({by_uuid[u]: a["resources"] for u, a in allocations.items()})
        return sorted(found, key=lambda r: json.dumps(r, sort_keys=True)), answer["provider_summaries"]

    found, summaries = requests("/allocation_candidates?resources=VCPU:1,DISK_GB:10")
    assert found == [{"cn1": {"VCPU": 1}, "ss1": {"DISK_GB": 10}},
                     {"cn2": {"VCPU": 1}, "ss1": {"DISK_GB": 10}}]
    assert {by_uuid[u] for u in summaries} == {"cn1", "numa0", "numa1", "cn2", "ss1"}
    assert summaries[U["cn1"]]["resources"]["VCPU"] == {"capacity": 56, "used": 4}
    assert summaries[U["ss1"]]["resources"]["DISK_GB"] == {"capacity": 900, "used": 120}
    assert summaries[U["ss1"]]["traits"] == ["MISC_SHARES_VIA_AGGREGATE"]
    found, _ = requests("/allocation_candidates?resources=VCPU:1,MEMORY_MB:256"
                        "&resources1=CUSTOM_MAGIC:1&required1=CUSTOM_GOLD&group_policy=isolate")
    assert found == [{"cn1": {"VCPU": 1, "MEMORY_MB": 256}, "numa0": {"CUSTOM_MAGIC": 1}}]
    found, summaries = requests("/allocation_candidates?resources=VCPU:2", "1.10")
    assert found == [{"cn1": {"VCPU": 2}}, {"cn2": {"VCPU": 2}}]
    assert summaries[U["cn2"]]["resources"]["VCPU"] == {
        "capacity": 4, "used": _sum(a.get("cn2", {}) for *_, a in consumers.values())["VCPU"]}
    assert requests("/allocation_candidates?resources=MEMORY_MB:4097")[0] == []   # max_unit 4096


def reference_answers(templates: Templates, revision: str, directory) -> dict:
    """What the reference answers for this revision's data, once upgraded by itself."""
    url = templates.copy(revision)
    conf = reference.write_conf(str(directory), url)
    if _is_before(revision, CONSUMERS_AT):
        done = reference.manage(conf, "db", "online_data_migrations")
        assert done.returncode == 0, done.stdout + done.stderr
    with reference.Server(url, str(directory)) as server:
        # Our written expectations are its answers (but for usages by consumer type
        # on PostgreSQL, where it answers 500: see ``questions``).
        expect_answers(_ReferenceClient(server), revision, by_type=BACKEND != "postgresql")
        return ask_reference(server)


class _ReferenceClient:
    """The reference's server seen as ``expect_answers`` sees an ApiClient (GETs only)."""

    def __init__(self, server: reference.Server):
        self.server = server

    def get(self, path: str, version: str = "latest"):
        answer = self.server.get(path, version)
        answer.status = answer.status_code
        answer.json = answer.json() if answer.text else None
        return answer


# -- the tests -----------------------------------------------------------------

def run_cli(capsys, *argv: str) -> tuple[int, str]:
    from allotment import cli

    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def take_over(url: str, revision: str, directory, capsys) -> None:
    """Allotment's sync on the reference's database, as an operator runs it; every row kept."""
    before = rows(url)
    config = str(write_config(directory / "etc", url))
    # The first command as an operator runs it: a process of its own.
    sync = run_allotment("db", "sync", "--config-file", config)
    assert "Traceback" not in sync.stdout + sync.stderr
    if _is_before(revision, CONSUMERS_AT):
        assert sync.returncode == 1
        said = sync.stdout.strip().splitlines()
        assert len(said) == 1 and "allotment db online-data-migrations" in said[0], said
        assert rows(url) == before  # refused before changing anything
        code, out = run_cli(capsys, "status", "--config-file", config)
        assert code == 1 and "allotment db online-data-migrations" in out, out
        code, out = run_cli(capsys, "db", "online-data-migrations", "--config-file", config)
        assert code == 0, out
        assert "set_root_provider_ids: 1 found, 1 migrated" in out
        assert "create_incomplete_consumers: 1 found, 1 migrated" in out
        code, out = run_cli(capsys, "db", "sync", "--config-file", config)
    else:
        code, out = sync.returncode, sync.stdout + sync.stderr
    assert code == 0, out
    assert "Placement schema a082b8bb98d0" in out
    code, out = run_cli(capsys, "status", "--config-file", config)
    assert code == 0, out
    assert "verdict: ready" in out

    # Every row kept (the online migrations fill in roots and consumer records; nothing else changes).
    after = rows(url, columns={name: [key for key, _ in next(iter(found), ())]
                               for name, found in before.items() if found})
    for table, kept in before.items():
        if table == "resource_providers" and _is_before(revision, CONSUMERS_AT):
            kept = {row for row in kept if ("uuid", U["old"]) not in row}
        assert kept <= after[table], table
    # ... and add nothing but the orphan's consumer record, with the incomplete project and user.
    completed = ("consumers", "projects", "users") if _is_before(revision, CONSUMERS_AT) else ()
    # (Standard classes and traits are synced in, as the reference does when it starts.)
    for table in before:
        if table in ("resource_classes", "traits"):
            added = {dict(row)["name"] for row in after[table] - before[table]}
            assert not {name for name in added if name.startswith("CUSTOM_")}, table
        else:
            assert len(after[table]) == len(before[table]) + (table in completed), table


def write_as_allotment(client: ApiClient) -> list[tuple[str, str]]:
    """A provider with inventory and an allocation to it and to the sharing provider; what to ask after."""
    new_rp = str(uuidlib.uuid4())
    assert client.post("/resource_providers", json={"name": "written-by-allotment",
                                                    "uuid": new_rp}).status == 200
    assert client.put(f"/resource_providers/{new_rp}/inventories", json={
        "resource_provider_generation": 0,
        "inventories": {"VCPU": {"total": 8}, "CUSTOM_MAGIC": {"total": 3}}}).status == 200
    consumer = str(uuidlib.uuid4())
    assert client.put(f"/allocations/{consumer}", json={
        "allocations": {new_rp: {"resources": {"VCPU": 2, "CUSTOM_MAGIC": 1}},
                        U["ss1"]: {"resources": {"DISK_GB": 30}}},
        "project_id": "project-a", "user_id": "user-a", "consumer_generation": None,
        "consumer_type": "MIGRATION"}).status == 204
    assert client.get(f"/resource_providers/{new_rp}/usages").json["usages"] == {"VCPU": 2, "CUSTOM_MAGIC": 1}
    assert client.get(f"/resource_providers/{U['ss1']}/usages").json["usages"] == {"DISK_GB": 150}
    assert client.get(f"/allocations/{consumer}").json["consumer_type"] == "MIGRATION"
    return [("latest", f"/resource_providers/{new_rp}/usages"), ("latest", f"/allocations/{consumer}")]


def reference_layout_problems(url: str, templates: Templates) -> list[str]:
    """What keeps the reference from taking ``url`` back: facts of 16.0.0's stored DDL it lacks,
    and its ``alembic_version`` if not a082b8bb98d0."""
    problems = reference.missing_facts(templates.head_layout(), reference.reflect(url))
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            versions = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    finally:
        engine.dispose()
    if versions != [reference.HEAD]:
        problems.append(f"alembic_version {versions}, the reference expects [{reference.HEAD!r}]")
    return problems


def assert_reference_layout(url: str, templates: Templates) -> None:
    problems = reference_layout_problems(url, templates)
    assert problems == [], "\n".join(problems)


def allotment_client(url: str):
    from allotment.api.app import Application
    from allotment.db.engine import database_from_config

    conf = make_conf(url)
    app = Application(conf, database_from_config(conf))
    return app, ApiClient(app)


@pytest.mark.parametrize("revision", reference.REVISIONS)
def test_take_over(revision, templates, tmp_path, capsys):
    """Taken over at each revision: rows kept, the answers the data implies, and after Allotment
    wrote, still the reference's layout (the way back)."""
    url = templates.copy(revision)
    take_over(url, revision, tmp_path, capsys)
    app, client = allotment_client(url)
    try:
        expect_answers(client, revision)
        write_as_allotment(client)
    finally:
        app.db.dispose()
    assert_reference_layout(url, templates)


def test_layout_check_notices_a_lost_column(templates, tmp_path, capsys):
    """The way-back check can fail: a database without one of the reference's columns is reported."""
    url = templates.copy(reference.HEAD)
    take_over(url, reference.HEAD, tmp_path, capsys)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE consumer_types DROP COLUMN updated_at")
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'elsewhere'")
    engine.dispose()
    problems = reference_layout_problems(url, templates)
    assert len(problems) == 2, problems
    assert "consumer_types.updated_at" in problems[0] and "'elsewhere'" in problems[1], problems


def test_database_allotment_created_keeps_the_reference_layout(templates, tmp_path):
    """Allotment from the start, then writes: the reference's layout and alembic_version are there."""
    from allotment import service

    url, drop = reference.scratch_database(BACKEND, "own", str(tmp_path))
    try:
        app = service.build_application(make_conf(url))
        try:
            _write_own(ApiClient(app))
        finally:
            app.db.dispose()
        assert_reference_layout(url, templates)
    finally:
        drop()


def _write_own(client: ApiClient) -> list[tuple[str, str]]:
    provider, consumer = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    assert client.post("/resource_providers", json={"name": "own", "uuid": provider}).status == 200
    assert client.put("/resource_classes/CUSTOM_OWN").status == 201
    assert client.put(f"/resource_providers/{provider}/inventories", json={
        "resource_provider_generation": 0,
        "inventories": {"VCPU": {"total": 4}, "CUSTOM_OWN": {"total": 2}}}).status == 200
    assert client.put("/traits/CUSTOM_OWN_TRAIT").status == 201
    assert client.put(f"/resource_providers/{provider}/traits", json={
        "resource_provider_generation": 1, "traits": ["CUSTOM_OWN_TRAIT"]}).status == 200
    assert client.put(f"/allocations/{consumer}", json={
        "allocations": {provider: {"resources": {"VCPU": 3, "CUSTOM_OWN": 1}}},
        "project_id": "p", "user_id": "u", "consumer_generation": None,
        "consumer_type": "INSTANCE"}).status == 204
    assert client.get(f"/resource_providers/{provider}/usages").json["usages"] == {"VCPU": 3, "CUSTOM_OWN": 1}
    return [("latest", "/resource_providers"), ("latest", f"/resource_providers/{provider}/usages"),
            ("latest", f"/resource_providers/{provider}/inventories"),
            ("latest", f"/resource_providers/{provider}/traits"),
            ("latest", f"/allocations/{consumer}"), ("1.9", "/usages?project_id=p"),
            ("latest", "/allocation_candidates?resources=VCPU:1,CUSTOM_OWN:1")]


# -- opt-in: the real reference (ALLOTMENT_REFERENCE_TESTS=1) ----------------------

#: The way back is the same from every revision once taken over: checked from
#: the oldest (the most converted) and the newest.
WAY_BACK = (reference.REVISIONS[0], reference.HEAD)


@pytest.mark.parametrize("revision", reference.REVISIONS)
def test_reference_answers_the_same(revision, templates, tmp_path, capsys):
    """The real reference, serving a copy of the same data, answers what Allotment answers;
    and (from WAY_BACK) takes the database back after Allotment wrote to it."""
    needs_reference()
    theirs = reference_answers(templates, revision, tmp_path / "reference")
    url = templates.copy(revision)
    take_over(url, revision, tmp_path, capsys)
    app, client = allotment_client(url)
    try:
        diff = differences(ask_allotment(client), theirs)
        assert not diff, "\n".join(diff)
        asked = questions() + write_as_allotment(client)
        ours = {(v, p): _canonical(r.status, r.text) for v, p in asked
                for r in [client.get(p, version=v)]}
    finally:
        app.db.dispose()
    if revision in WAY_BACK:
        assert_way_back(url, tmp_path, ours)


def assert_way_back(url: str, directory, ours: dict) -> None:
    """The reference's own sync accepts the database, and it then answers what Allotment answered."""
    back = reference.manage(reference.write_conf(str(directory), url), "db", "sync")
    assert back.returncode == 0, back.stdout + back.stderr
    with reference.Server(url, str(directory)) as server:
        theirs = {(v, p): _canonical(r.status_code, r.text) for v, p in ours
                  for r in [server.get(p, v)]}
    diff = differences(ours, theirs)
    assert not diff, "\n".join(diff)


def test_reference_takes_back_a_database_allotment_created(tmp_path):
    """Allotment from the start, then the real reference: it accepts the schema and sees the writes."""
    needs_reference()
    from allotment import service

    url, drop = reference.scratch_database(BACKEND, "own", str(tmp_path))
    try:
        app = service.build_application(make_conf(url))
        client = ApiClient(app)
        try:
            asked = _write_own(client)
            ours = {(v, p): _canonical(r.status, r.text) for v, p in asked for r in [client.get(p, version=v)]}
        finally:
            app.db.dispose()
        assert_way_back(url, tmp_path, ours)
    finally:
        drop()
