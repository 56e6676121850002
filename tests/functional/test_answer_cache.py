"""Reused allocation candidate answers are always those a fresh read gives.

``GET /allocation_candidates`` keeps answers while the database's change
number (kept by triggers, see ``allotment/db/changes.py``) stays the same,
and on SQLite computes them from a mirror of every provider kept current
from the providers the triggers note (``allotment/db/provider_mirror.py``).
Writes here come from outside the reading application: plain SQL on a
connection of its own (as the reference Placement or an operator's hand
SQL would write, with none of Allotment's code) and a second Allotment
application with its own pool (another API process).  After any
interleaving of such writes and reads, every answer of the caching
application, and of one that computes every answer from its mirror, must
equal the answer of an application that keeps nothing, reading the same
database at the same moment (the same JSON: the mirror may list the
provider summaries, a JSON object, in another order).
"""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allotment.api.app import Application
from allotment.db import allocation_candidates as allocation_candidates_db
from allotment.db import changes, provider_mirror, raw_rows, tables
from allotment.db.provider_mirror import MirrorAhead
from allotment.service import database_from_config
from tests.conftest import BACKEND, ApiClient, _empty_tables, make_conf, new_uuid

pytestmark = pytest.mark.skipif(BACKEND not in changes.BACKENDS,
                                reason="answers are reused on SQLite and PostgreSQL only")

QUERIES = (
    "resources=VCPU:1",
    "resources=VCPU:2,MEMORY_MB:512&required=CUSTOM_GOLD",
    "resources=VCPU:1&required=!CUSTOM_GOLD&limit=2",
    "resources=VCPU:4&member_of={agg}",
    "resources=VCPU:1,DISK_GB:10",
    "resources=VCPU:1&resources1=CUSTOM_MAGIC:1&group_policy=none",
    "resources=VCPU:1&resources1=CUSTOM_MAGIC2:1&group_policy=none",
    "resources=CUSTOM_MAGIC:1",
    "resources=DISK_GB:10",
    "resources=VCPU:1&resources1=DISK_GB:10&group_policy=none",
)
VERSIONS = ("1.10", "1.21", "1.39")
#: Random interleavings tried (more by hand: ALLOTMENT_PROPERTY_EXAMPLES=400).
EXAMPLES = int(os.environ.get("ALLOTMENT_PROPERTY_EXAMPLES", "40"))


def _application(db_url: str, cache_mb: int, mirror: bool = True) -> Application:
    conf = make_conf(db_url, allotment__candidates_cache_mb=cache_mb, allotment__provider_mirror=mirror)
    return Application(conf, database_from_config(conf))


@pytest.fixture(scope="module")
def apps(db_url):
    cached = _application(db_url, 8)
    fresh = _application(db_url, 0, mirror=False)
    other = _application(db_url, 8)
    mirrored = _application(db_url, 0)
    # A writer with nothing of Allotment: SQLAlchemy's plain engine.
    outside = sa.create_engine(db_url)
    yield cached, fresh, other, outside, mirrored
    outside.dispose()
    for application in (cached, fresh, other, mirrored):
        application.db.dispose()


class Cloud:
    """Ids of what the raw writer works on."""

    def __init__(self, conn):
        rc = tables.resource_classes
        self.classes = {name: ident for ident, name in conn.execute(sa.select(rc.c.id, rc.c.name))}
        self.gold = self._id(conn, tables.traits, name="CUSTOM_GOLD")
        traits = tables.traits
        self.sharing = conn.execute(sa.select(traits.c.id).where(
            traits.c.name == "MISC_SHARES_VIA_AGGREGATE")).scalar() or self._id(
                conn, traits, name="MISC_SHARES_VIA_AGGREGATE")
        self.magic = self._id(conn, rc, name="CUSTOM_MAGIC", id=tables.CUSTOM_RESOURCE_CLASS_MIN_ID)
        self.agg_uuid = new_uuid()
        self.agg = self._id(conn, tables.placement_aggregates, uuid=self.agg_uuid)
        self.providers = [self.provider(conn) for _ in range(3)]

    @staticmethod
    def _id(conn, table, **values) -> int:
        return conn.execute(table.insert().values(**values)).inserted_primary_key[0]

    def provider(self, conn, parent: int | None = None) -> int:
        rp = tables.resource_providers
        pid = self._id(conn, rp, uuid=new_uuid(), name=new_uuid(), generation=0, parent_provider_id=parent)
        root = pid if parent is None else conn.execute(
            sa.select(rp.c.root_provider_id).where(rp.c.id == parent)).scalar_one()
        conn.execute(rp.update().where(rp.c.id == pid).values(root_provider_id=root))
        for name, total in (("VCPU", 8), ("MEMORY_MB", 4096)):
            self.inventory(conn, pid, self.classes[name], total)
        return pid

    @staticmethod
    def inventory(conn, pid: int, class_id: int, total: int) -> None:
        conn.execute(tables.inventories.insert().values(
            resource_provider_id=pid, resource_class_id=class_id, total=total, reserved=0, min_unit=1,
            max_unit=total, step_size=1, allocation_ratio=1.0))


def _new_cloud(outside, more: int = 0) -> Cloud:
    """Every table emptied, then a :class:`Cloud` written by the outside
    writer, with ``more`` providers beside its three (enough that two
    changed are not more than half, when every provider is read again).

    On PostgreSQL the change log is then folded: a fold notes every provider
    the log held, the new cloud's among them, and a mirror that meets more
    than half of its providers changed reads them all.  Left to the reads of
    a test, whether a fold fell due there followed the writes of the tests
    before it (a read more or less whole, now and then)."""
    _empty_tables(outside)
    with outside.begin() as conn:
        cloud = Cloud(conn)
        cloud.providers += [cloud.provider(conn) for _ in range(more)]
    with outside.begin() as conn:
        changes.compact(conn)
    return cloud


def _write_raw(cloud: Cloud, conn, kind: str, pick: int, amount: int) -> None:
    """One write of ``kind`` in plain SQL (``pick`` chooses the provider)."""
    inv, alloc = tables.inventories, tables.allocations
    pid = cloud.providers[pick % len(cloud.providers)]
    vcpu = cloud.classes["VCPU"]
    if kind == "total":
        conn.execute(inv.update().where(inv.c.resource_provider_id == pid, inv.c.resource_class_id == vcpu)
                     .values(total=amount, max_unit=amount))
    elif kind == "allocate":
        conn.execute(alloc.insert().values(resource_provider_id=pid, resource_class_id=vcpu,
                                           consumer_id=new_uuid(), used=amount))
    elif kind == "allocate_disk":  # a sharing provider's disk, lent to other trees
        conn.execute(alloc.insert().values(resource_provider_id=pid, resource_class_id=cloud.classes["DISK_GB"],
                                           consumer_id=new_uuid(), used=5 * amount))
    elif kind == "free":
        conn.execute(alloc.delete().where(alloc.c.resource_provider_id == pid))
    elif kind == "trait":
        rpt = tables.resource_provider_traits
        if conn.execute(sa.select(rpt).where(rpt.c.resource_provider_id == pid)).first():
            conn.execute(rpt.delete().where(rpt.c.resource_provider_id == pid))
        else:
            conn.execute(rpt.insert().values(resource_provider_id=pid, trait_id=cloud.gold))
    elif kind == "share":
        # A provider starts or stops sharing with its aggregate's trees.
        rpt = tables.resource_provider_traits
        mine = (rpt.c.resource_provider_id == pid, rpt.c.trait_id == cloud.sharing)
        if conn.execute(sa.select(rpt).where(*mine)).first():
            conn.execute(rpt.delete().where(*mine))
        else:
            conn.execute(rpt.insert().values(resource_provider_id=pid, trait_id=cloud.sharing))
    elif kind == "aggregate":
        rpa = tables.resource_provider_aggregates
        if conn.execute(sa.select(rpa).where(rpa.c.resource_provider_id == pid)).first():
            conn.execute(rpa.delete().where(rpa.c.resource_provider_id == pid))
        else:
            conn.execute(rpa.insert().values(resource_provider_id=pid, aggregate_id=cloud.agg))
    elif kind == "provider":
        parent = pid if amount % 2 else None
        child = cloud.provider(conn, parent)
        cloud.inventory(conn, child, cloud.magic, amount)
        cloud.providers.append(child)
    elif kind == "disk":
        disk = cloud.classes["DISK_GB"]
        conn.execute(inv.delete().where(inv.c.resource_provider_id == pid, inv.c.resource_class_id == disk))
        cloud.inventory(conn, pid, disk, 10 * amount)
    elif kind == "drop_inventory":
        conn.execute(inv.delete().where(inv.c.resource_provider_id == pid, inv.c.resource_class_id != vcpu))
    elif kind == "delete_provider":
        # The newest provider without children, with everything of its own.
        rp = tables.resource_providers
        parents = {row[0] for row in conn.execute(sa.select(rp.c.parent_provider_id))}
        gone = next((p for p in reversed(cloud.providers) if p not in parents), None)
        if gone is not None and len(cloud.providers) > 1:
            for table in (alloc, inv, tables.resource_provider_traits, tables.resource_provider_aggregates):
                conn.execute(table.delete().where(table.c.resource_provider_id == gone))
            conn.execute(rp.delete().where(rp.c.id == gone))
            cloud.providers.remove(gone)
    elif kind == "new_class":
        # A class made after the mirror read the names (which notes no
        # provider), then inventory of it: the summaries show it.
        rc = tables.resource_classes
        top = conn.execute(sa.select(sa.func.max(rc.c.id))).scalar_one()
        made = cloud._id(conn, rc, name=f"CUSTOM_NEW_{top + 1}", id=top + 1)
        cloud.inventory(conn, pid, made, amount)
    elif kind == "rename_class":
        # A custom class renamed (as PUT /resource_classes/{name} allows before 1.7):
        # no provider row changes.
        rc = tables.resource_classes
        name = conn.execute(sa.select(rc.c.name).where(rc.c.id == cloud.magic)).scalar_one()
        renamed = "CUSTOM_MAGIC2" if name == "CUSTOM_MAGIC" else "CUSTOM_MAGIC"
        conn.execute(rc.update().where(rc.c.id == cloud.magic).values(name=renamed))
    if kind in BUMPING:
        # As Placement's writers (and any client of the API) do: the
        # per-provider records of allotment/db/allocation_candidates.py
        # rely on it, with or without reuse of whole answers.
        rp = tables.resource_providers
        conn.execute(rp.update().where(rp.c.id == pid).values(generation=rp.c.generation + 1))


#: Writes that change a provider's generation with its inventories or
#: traits; "generation" alone changes no answer, and must not break reuse.
BUMPING = ("total", "trait", "share", "disk", "drop_inventory", "generation", "new_class")


def _write_api(cloud: Cloud, api: ApiClient, pick: int, amount: int, providers: int = 1) -> int:
    """An allocation through an Allotment application (of VCPU, and with
    ``providers=2`` of MEMORY_MB from the next provider too): its status."""
    with api.application.db.read() as conn:
        uuids = dict(conn.execute(sa.select(tables.resource_providers.c.id,
                                            tables.resource_providers.c.uuid)).all())
    picked = [uuids[cloud.providers[(pick + i) % len(cloud.providers)]] for i in range(providers)]
    allocations = {picked[0]: {"resources": {"VCPU": 1 + amount % 3}}}
    if len(picked) > 1:
        allocations.setdefault(picked[1], {"resources": {}})["resources"]["MEMORY_MB"] = 64 * (1 + amount)
    response = api.put(f"/allocations/{new_uuid()}", json={
        "allocations": allocations, "project_id": "p", "user_id": "u", "consumer_generation": None},
        version="1.28")
    assert response.status in (204, 409), response.json  # 409: no room left, or no such inventory
    return response.status


RAW_KINDS = ("total", "allocate", "allocate_disk", "free", "trait", "aggregate", "provider", "disk", "drop_inventory",
             "generation", "delete_provider", "rename_class", "share", "new_class")
STEPS = st.lists(st.one_of(
    st.tuples(st.just("read"), st.integers(0, len(QUERIES) - 1), st.sampled_from(VERSIONS)),
    st.tuples(st.sampled_from(RAW_KINDS), st.integers(0, 20), st.integers(1, 8)),
    st.tuples(st.just("api"), st.integers(0, 20), st.integers(0, 8)),
    # A claim through the reading applications themselves, whose mirrors
    # may follow it without reading it back (PostgreSQL).
    st.tuples(st.just("own"), st.integers(0, 20), st.integers(0, 8), st.integers(1, 2)),
), min_size=1, max_size=25)


def _answer(api: ApiClient, query: str, version: str) -> tuple[int, object]:
    """(status, JSON body); of an error, its title and detail (not its request id)."""
    response = api.get(f"/allocation_candidates?{query}", version=version)
    if response.status != 200:
        return response.status, (response.error()["title"], response.error()["detail"])
    return response.status, response.json


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=STEPS)
def test_reused_answers_match_fresh_reads(apps, steps):
    _reads_match_after_writes(apps, steps, lender=False)


#: Queries that ask for disk, and writes that change who lends it.
DISK_QUERIES = tuple(i for i, query in enumerate(QUERIES) if "DISK_GB" in query)
LENDER_STEPS = st.lists(st.one_of(
    st.tuples(st.just("read"), st.sampled_from(DISK_QUERIES), st.sampled_from(VERSIONS)),
    st.tuples(st.sampled_from(("allocate_disk", "free", "disk", "share", "aggregate", "total")),
              st.integers(0, 20), st.integers(1, 8)),
), min_size=1, max_size=25)


@settings(max_examples=max(EXAMPLES, 100), deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=LENDER_STEPS)
def test_reused_answers_match_fresh_reads_where_a_provider_lends_disk(apps, steps):
    _reads_match_after_writes(apps, steps, lender=True)


def _lend_disk(cloud: Cloud, conn) -> None:
    """The first provider becomes a sharing provider of 20 GB of disk (and
    nothing else) in the aggregate of every provider."""
    for kind in ("share", "disk"):
        _write_raw(cloud, conn, kind, 0, 2)
    inv = tables.inventories
    conn.execute(inv.delete().where(inv.c.resource_provider_id == cloud.providers[0],
                                    inv.c.resource_class_id != cloud.classes["DISK_GB"]))
    for pick in range(len(cloud.providers)):
        _write_raw(cloud, conn, "aggregate", pick, 0)


def _reads_match_after_writes(apps, steps, *, lender: bool) -> None:
    """``lender``: the first provider starts as a sharing provider of disk
    in the aggregate of every host, which the other writes may change."""
    cached, fresh, other, outside, mirrored = apps
    _empty_tables(outside)
    with outside.begin() as conn:
        cloud = Cloud(conn)
        if lender:
            _lend_disk(cloud, conn)
    reader, checker, writer = ApiClient(cached), ApiClient(fresh), ApiClient(other)
    mirror_reader = ApiClient(mirrored)
    for step in steps:
        if step[0] == "read":
            query = QUERIES[step[1]].format(agg=cloud.agg_uuid)
            # Each query twice: the second may be reused.
            for _ in range(2):
                expected = _answer(checker, query, step[2])
                assert _answer(reader, query, step[2]) == expected
                assert _answer(mirror_reader, query, step[2]) == expected
        elif step[0] == "api":
            _write_api(cloud, writer, step[1], step[2])
        elif step[0] == "own":
            _write_api(cloud, (reader, mirror_reader)[step[1] % 2], *step[1:])
        else:
            with outside.begin() as conn:
                _write_raw(cloud, conn, *step)


def test_answers_are_reused_until_someone_writes(apps):
    cached, _, _, outside, _ = apps
    cloud = _new_cloud(outside)
    api, cache = ApiClient(cached), cached.state.answers
    first = api.get("/allocation_candidates?resources=VCPU:1").json
    hits = cache.hits
    assert api.get("/allocation_candidates?resources=VCPU:1").json == first
    assert cache.hits == hits + 1
    with outside.begin() as conn:
        _write_raw(cloud, conn, "total", 0, 3)
    after = api.get("/allocation_candidates?resources=VCPU:1").json
    assert cache.hits == hits + 1
    summary = after["provider_summaries"]
    assert sorted(s["resources"]["VCPU"]["capacity"] for s in summary.values()) == [3, 8, 8]


def test_a_missing_trigger_turns_reuse_off(apps):
    cached, _, _, outside, _ = apps
    _new_cloud(outside)
    api, cache = ApiClient(cached), cached.state.answers
    name = f"{changes.TRIGGER_PREFIX}allocations" + ("_insert" if BACKEND == "sqlite" else "")
    with outside.begin() as conn:
        conn.exec_driver_sql(f"DROP TRIGGER {name}" + (" ON allocations" if BACKEND != "sqlite" else ""))
    try:
        api.get("/allocation_candidates?resources=VCPU:1")
        hits = cache.hits
        api.get("/allocation_candidates?resources=VCPU:1")
        assert cache.hits == hits
    finally:
        with outside.begin() as conn:
            changes.drop(conn)
            changes.create(conn)


def test_the_log_is_folded_into_the_counter(apps):
    """PostgreSQL: compaction keeps the number and empties the log."""
    cached, _, _, outside, _ = apps
    if BACKEND != "postgresql":
        pytest.skip("the log exists on PostgreSQL only")
    cloud = _new_cloud(outside)
    for pick in range(3):
        with outside.begin() as conn:
            _write_raw(cloud, conn, "generation", pick, 1)
    with outside.connect() as conn:
        before, _ = changes.read_number(conn)
        assert conn.execute(sa.text(f"SELECT count(*) FROM {changes.LOG}")).scalar() > 0
    with outside.begin() as conn:
        changes.compact(conn)
    with outside.connect() as conn:
        assert changes.read_number(conn)[0] == before
        assert conn.execute(sa.text(f"SELECT count(*) FROM {changes.LOG}")).scalar() == 0


@pytest.mark.parametrize("mirror", [True, False])
def test_the_log_is_folded_without_reused_answers(db_url, mirror):
    """PostgreSQL: with answers never reused (``candidates_cache_mb = 0``,
    or ``randomize_allocation_candidates``), candidate requests still fold
    the log once it is due, so that it does not grow without end."""
    if BACKEND != "postgresql":
        pytest.skip("the log exists on PostgreSQL only")
    application = _application(db_url, 0, mirror=mirror)
    outside = sa.create_engine(db_url)
    try:
        cloud = _new_cloud(outside)
        api = ApiClient(application)
        for pick in range(changes.COMPACT_AT + 1):
            with outside.begin() as conn:
                _write_raw(cloud, conn, "generation", pick, 1)
        api.get("/allocation_candidates?resources=VCPU:1")
        with outside.connect() as conn:
            assert conn.execute(sa.text(f"SELECT count(*) FROM {changes.LOG}")).scalar() == 0
    finally:
        outside.dispose()
        application.db.dispose()


def test_memory_stays_within_its_bound():
    from allotment.api.answer_cache import ENTRY_OVERHEAD, Answer, AnswerCache

    cache = AnswerCache(10_000)
    assert cache.get(("a",), 1) is None
    for i in range(100):
        cache.put((i,), 1, Answer(b"x" * 500, 1))
        assert cache.size <= 10_000
    assert len(cache) == 10_000 // (500 + ENTRY_OVERHEAD)
    assert cache.get((99,), 1) is not None and cache.get((0,), 1) is None
    cache.put(("big",), 1, Answer(b"x" * 5_000, 1))  # over a quarter: not kept
    assert cache.get(("big",), 1) is None
    assert cache.get((99,), 2) is None and len(cache) == 0  # a new number retires everything
    cache.put((1,), 1, Answer(b"{}", 0))  # computed at an older number: not kept
    assert len(cache) == 0


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
def test_the_mirror_reads_again_only_what_changed(apps, monkeypatch):
    _, fresh, other, outside, mirrored = apps
    cloud = _new_cloud(outside, more=5)
    mirror, api, checker = mirrored.state.mirror, ApiClient(mirrored), ApiClient(fresh)
    query = "resources=VCPU:1,MEMORY_MB:512"

    def same() -> None:
        assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")

    same()
    full, partial = mirror.full_reads, mirror.partial_reads
    same()  # nothing written: nothing read
    assert (mirror.full_reads, mirror.partial_reads) == (full, partial)
    with outside.begin() as conn:
        _write_raw(cloud, conn, "allocate", 1, 3)
    _write_api(cloud, ApiClient(other), 2, 1)
    same()
    assert (mirror.full_reads, mirror.partial_reads) == (full, partial + 1)
    with outside.begin() as conn:
        _write_raw(cloud, conn, "delete_provider", 0, 1)
    same()
    assert (mirror.full_reads, mirror.partial_reads) == (full, partial + 2)
    with outside.begin() as conn:
        _write_raw(cloud, conn, "rename_class", 0, 1)
    same()
    assert (mirror.full_reads, mirror.partial_reads) == (full + 1, partial + 2)
    # A cloud over the bound: no mirror, the database is read.
    monkeypatch.setattr("allotment.db.provider_mirror.MAX_PROVIDERS", 1)
    with outside.begin() as conn:
        _write_raw(cloud, conn, "total", 0, 5)
    try:
        same()
        assert mirror.too_big and mirror._state is None
        same()
        assert mirror.full_reads == full + 1 and mirror.partial_reads == partial + 3
    finally:
        mirror.too_big = False


@pytest.mark.skipif(BACKEND != "postgresql", reason="the single statement is PostgreSQL's")
def test_postgresql_brings_the_mirror_up_to_date_in_one_statement(apps, monkeypatch):
    """After a write, the notes and the changed providers' rows come in one
    statement (no transaction); what it cannot bring (too many providers, a
    class the mirror does not know) goes the transaction's way, and every
    answer is the fresh one."""
    _, fresh, other, outside, mirrored = apps
    cloud = _new_cloud(outside, more=5)
    mirror, api, checker = mirrored.state.mirror, ApiClient(mirrored), ApiClient(fresh)
    query = "resources=VCPU:1,MEMORY_MB:512"
    calls = {"one_row": 0, "pg_notes": 0}
    for module, name in ((raw_rows, "one_row"), (changes, "pg_notes")):
        def counted(*args, _real=getattr(module, name), _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)

    def read() -> tuple[int, int]:
        before = dict(calls)
        assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")
        return calls["one_row"] - before["one_row"], calls["pg_notes"] - before["pg_notes"]

    read()
    partial = mirror.partial_reads
    _write_api(cloud, ApiClient(other), 2, 1)
    with outside.begin() as conn:
        _write_raw(cloud, conn, "allocate", 3, 2)
    assert read() == (1, 0)  # one statement, no transaction
    assert mirror.partial_reads == partial + 1
    assert read() == (0, 0)  # nothing written since: nothing read
    # More providers changed than the statement brings: the transaction's reads.
    monkeypatch.setattr(provider_mirror, "PG_AT_ONCE", 1)
    with outside.begin() as conn:
        _write_raw(cloud, conn, "allocate", 0, 1)
        _write_raw(cloud, conn, "allocate", 1, 1)
    assert read() == (1, 1)
    assert mirror.partial_reads == partial + 2
    # One provider noted by two transactions: two notes, over the bound too
    # (the statement counts notes, not providers).
    for _ in range(2):
        with outside.begin() as conn:
            _write_raw(cloud, conn, "allocate", 4, 1)
    assert read() == (1, 1)
    assert mirror.partial_reads == partial + 3
    monkeypatch.setattr(provider_mirror, "PG_AT_ONCE", 4096)
    # A class made after the mirror read the names: the transaction's reads too.
    with outside.begin() as conn:
        _write_raw(cloud, conn, "new_class", 1, 4)
    assert read() == (1, 1)
    assert mirror.partial_reads == partial + 4


@pytest.mark.skipif(BACKEND != "postgresql", reason="the snapshot of the notes is PostgreSQL's")
def test_postgresql_refresh_sends_a_snapshot_however_long_the_log(apps, monkeypatch):
    """The refresh says what it saw before by its snapshot, not by the ids
    of the transactions in the log: its parameters stay a few bytes
    whether the log holds 2 transactions or 200.  A write that was in
    progress when a refresh read is seen by the next one."""
    _, fresh, other, outside, mirrored = apps
    cloud = _new_cloud(outside, more=5)
    api, checker = ApiClient(mirrored), ApiClient(fresh)
    query = "resources=VCPU:1,MEMORY_MB:512"
    sent = []
    real = raw_rows.one_row

    def recorded(conn, statement, params):
        sent.append(len(repr(sorted(params.items()))))
        return real(conn, statement, params)

    monkeypatch.setattr(raw_rows, "one_row", recorded)

    def refresh_after(writes: int) -> int:
        """The size of the parameters of the refresh after ``writes`` writes
        and one more (when the mirror's notes hold them all)."""
        with mirrored.db.write() as conn:
            changes.compact(conn)  # an empty log to start from
        assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")
        for _ in range(writes):
            with outside.begin() as conn:
                _write_raw(cloud, conn, "generation", 0, 1)
        assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")
        _write_api(cloud, ApiClient(other), 1, 1)
        before = len(sent)
        assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")
        assert len(sent) == before + 1  # one statement brought the mirror up to date
        return sent[before]

    assert refresh_after(200) < refresh_after(2) + 16
    # In progress while the mirror is refreshed, committed after.
    with outside.connect() as slow:
        with slow.begin():
            _write_raw(cloud, slow, "allocate", 1, 7)
            _write_api(cloud, ApiClient(other), 2, 1)
            assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")
        assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")
    with mirrored.db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).where(
            tables.allocations.c.resource_provider_id == cloud.providers[1],
            tables.allocations.c.used == 7)).scalar_one() == 1


@pytest.mark.skipif(BACKEND != "postgresql", reason="the snapshot of the notes is PostgreSQL's")
def test_postgresql_notes_read_the_provider_log_from_the_snapshots_oldest(apps):
    """The notes read the provider log from the earlier snapshot's oldest
    running transaction on, a range of its key, not the whole log (under a
    stream of claims it holds hundreds of rows until it is folded), and
    still name the provider written since.  (EXPLAIN of the statement with
    its values in place: the plan the server makes for them.  The earlier
    snapshot is written out, all before the last write seen ended, so that
    transactions of other tests on the server cannot move its oldest.)"""
    import dataclasses

    _, _, _, outside, mirrored = apps
    cloud = _new_cloud(outside, more=5)
    with mirrored.db.write() as conn:
        changes.compact(conn)
    for k in range(120):
        with outside.begin() as conn:
            _write_raw(cloud, conn, "allocate", 2 + k % 5, 1)
            last = conn.execute(sa.text("SELECT txid_current()")).scalar_one()
    with mirrored.db.read() as conn:
        notes, _ = changes.pg_notes(conn, None)
    notes = dataclasses.replace(notes, snapshot=f"{last + 1}:{last + 1}:")
    with outside.begin() as conn:
        _write_raw(cloud, conn, "allocate", 1, 1)
    with mirrored.db.engine.connect() as conn:
        logged = conn.execute(sa.text(f"SELECT count(*) FROM {changes.PROVIDER_LOG}")).scalar_one()
        (plan,) = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + changes._PG_NOTES,
                                       changes.pg_since(notes)).one()
        _, changed = changes.pg_notes(conn, notes)
    assert changed == {cloud.providers[1]}

    def read_of_the_log(node: dict) -> int:
        rows = 0
        if node.get("Relation Name") == changes.PROVIDER_LOG:
            rows += node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        return rows + sum(read_of_the_log(child) for child in node.get("Plans", []))

    assert logged >= 120
    assert read_of_the_log(plan[0]["Plan"]) <= 2


@pytest.mark.skipif(BACKEND != "sqlite", reason="reads without a transaction on PostgreSQL")
def test_a_transaction_older_than_the_mirror_is_told_to_begin_again(apps):
    """The mirror holds a write the older transaction does not see: it is not
    given to it (what else the request reads in that transaction would be
    older than it), but the caller is told that a transaction begun now is
    served from it."""
    _, _, _, outside, mirrored = apps
    cloud = _new_cloud(outside)
    mirror = mirrored.state.mirror
    with mirrored.db.read() as old:
        number, _ = changes.read_number(old)
        with outside.begin() as conn:
            _write_raw(cloud, conn, "allocate", 0, 2)
        with mirrored.db.read() as new:
            newer, _ = changes.read_number(new)
            assert newer != number and mirror.snapshot(new, newer) is not None
        with pytest.raises(MirrorAhead):
            mirror.snapshot(old, number)
    with mirrored.db.read() as again:
        assert mirror.snapshot(again, changes.read_number(again)[0]) is not None


def test_a_lender_filling_up_takes_its_disk_out_of_kept_candidates(apps):
    _, fresh, _, outside, mirrored = apps
    _empty_tables(outside)
    with outside.begin() as conn:
        cloud = Cloud(conn)
        _lend_disk(cloud, conn)
    query = "/allocation_candidates?resources=VCPU:1,DISK_GB:10"
    api, checker = ApiClient(mirrored), ApiClient(fresh)
    for _ in range(2):  # the second from what the mirror kept
        assert api.get(query).json == checker.get(query).json
    assert len(api.get(query).json["allocation_requests"]) == 2  # each host with the lent disk
    with outside.begin() as conn:
        _write_raw(cloud, conn, "allocate_disk", 0, 3)  # 15 GB used: 10 no longer fit
    assert api.get(query).json == checker.get(query).json
    assert api.get(query).json["allocation_requests"] == []


def test_the_names_of_a_request_are_read_again_once_the_number_moves(apps):
    _, _, _, outside, mirrored = apps
    _new_cloud(outside)
    api = ApiClient(mirrored)
    query = "/allocation_candidates?resources=VCPU:1&required=CUSTOM_NEWLY_MADE"
    for _ in range(2):  # the second with the names kept at this number
        response = api.get(query)
        assert response.status == 400 and "CUSTOM_NEWLY_MADE" in response.error()["detail"]
    with outside.begin() as conn:
        conn.execute(tables.traits.insert().values(name="CUSTOM_NEWLY_MADE"))
    response = api.get(query)
    assert response.status == 200 and response.json["allocation_requests"] == []


def test_names_known_to_the_mirror_are_not_read_again_after_a_write(apps, monkeypatch):
    """A read after a write needs no statement for names the mirror's
    lineage has seen (one round trip fewer on PostgreSQL); a name not seen
    yet, and every name after a class is renamed (a full read), is read
    again; every answer is the fresh one."""
    _, fresh, other, outside, mirrored = apps
    cloud = _new_cloud(outside)
    api, checker = ApiClient(mirrored), ApiClient(fresh)
    module = "allotment.db.allocation_candidates"
    calls = []
    real = allocation_candidates_db.resolve_names
    monkeypatch.setattr(f"{module}.resolve_names", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))

    def reads(query: str) -> int:
        """Names statements of one read (of the mirrored application)."""
        before = len(calls)
        got = _answer(api, query, "1.39")
        made = len(calls) - before
        assert got == _answer(checker, query, "1.39")
        return made

    query = f"resources=VCPU:1&required=CUSTOM_GOLD&member_of={cloud.agg_uuid}&in_tree={{tree}}"
    with outside.begin() as conn:
        tree = conn.execute(sa.select(tables.resource_providers.c.uuid).where(
            tables.resource_providers.c.id == cloud.providers[1])).scalar_one()
    query = query.format(tree=tree)
    reads("resources=VCPU:1")  # the first read of every provider: nothing learnt before it
    assert reads(query) == 1
    _write_api(cloud, ApiClient(other), 1, 1)
    assert reads(query) == 0  # known: no names statement after the write
    with outside.begin() as conn:
        _write_raw(cloud, conn, "allocate", 2, 1)
    assert reads("resources=VCPU:1,MEMORY_MB:64") == 1  # MEMORY_MB not seen yet
    _write_api(cloud, ApiClient(other), 2, 1)
    assert reads("resources=VCPU:1,MEMORY_MB:64") == 0
    # in_tree is looked up in the snapshot: a provider deleted since is no tree.
    with outside.begin() as conn:
        last = conn.execute(sa.select(tables.resource_providers.c.uuid).where(
            tables.resource_providers.c.id == cloud.providers[-1])).scalar_one()
    assert reads(query.replace(tree, last)) == 0
    with outside.begin() as conn:
        _write_raw(cloud, conn, "delete_provider", 0, 1)  # the newest: that one
    assert reads(query.replace(tree, last)) == 0
    assert _answer(api, query.replace(tree, last), "1.39") == (200, {"allocation_requests": [],
                                                                   "provider_summaries": {}})
    with outside.begin() as conn:
        _write_raw(cloud, conn, "rename_class", 0, 1)
    assert reads("resources=CUSTOM_MAGIC:1") == 1  # everything read again: names too
    with outside.begin() as conn:
        _write_raw(cloud, conn, "rename_class", 0, 1)
    assert reads("resources=CUSTOM_MAGIC:1") == 1
    # Names read before a full read are not learnt by the new lineage (a
    # change of everything may lie between); the next read teaches it.
    _write_api(cloud, ApiClient(other), 1, 1)
    assert reads("resources=CUSTOM_MAGIC:1") == 1
    _write_api(cloud, ApiClient(other), 2, 1)
    assert reads("resources=CUSTOM_MAGIC:1") == 0


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
def test_the_mirror_reads_providers_a_window_at_a_time(apps, monkeypatch):
    """Windows of two providers: the same providers as in one read, and
    the same answers as a fresh read, through full and partial reads."""
    _, fresh, _, outside, mirrored = apps
    _empty_tables(outside)
    with outside.begin() as conn:
        cloud = Cloud(conn)
        for step in range(6):
            _write_raw(cloud, conn, "provider", step, step + 1)
            _write_raw(cloud, conn, "trait", step, 1)
            _write_raw(cloud, conn, "allocate", step, 1)
    mirror, api, checker = mirrored.state.mirror, ApiClient(mirrored), ApiClient(fresh)
    record_reads = []  # the ids (or the range of ids) each read of inventory records was given
    real_rows = raw_rows.rows

    def counted_rows(conn, statement, params):
        if statement is provider_mirror._RECORDS[provider_mirror.LISTED]:
            record_reads.append(list(params["ids"]))
        elif statement is provider_mirror._RECORDS[provider_mirror.RANGE]:
            record_reads.append(range(params["lo"], params["hi"] + 1))
        return real_rows(conn, statement, params)

    monkeypatch.setattr(raw_rows, "rows", counted_rows)
    with mirrored.db.read() as conn:
        whole = mirror._providers(conn, None)
        assert record_reads == []  # a cloud within one window: the whole tables at once
        monkeypatch.setattr(provider_mirror, "WINDOW", 2)
        monkeypatch.setattr(provider_mirror, "ID_WINDOW", 2)
        windows = mirror._providers(conn, None)
    assert len(whole) > 6 and sorted(whole, key=lambda p: p.id) == sorted(windows, key=lambda p: p.id)
    # A read of everything asks for ranges of ids, each holding two providers.
    assert len(record_reads) == (len(whole) + 1) // 2 and all(isinstance(ids, range) for ids in record_reads)
    ids = {p.id for p in whole}
    assert all(len(ids.intersection(window)) <= 2 for window in record_reads)
    assert sorted(pid for window in record_reads for pid in ids.intersection(window)) == sorted(ids)

    def same() -> None:
        for query in QUERIES[:5]:
            assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")

    with outside.begin() as conn:
        _write_raw(cloud, conn, "rename_class", 0, 1)  # the next read is a full one
    full, partial = mirror.full_reads, mirror.partial_reads
    same()
    assert mirror.full_reads == full + 1
    with outside.begin() as conn:
        for pick in range(3):  # three providers changed: two windows
            _write_raw(cloud, conn, "allocate", pick, 2)
    same()
    assert mirror.partial_reads == partial + 1


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
def test_the_mirror_learns_a_class_made_after_its_names(apps):
    """The mirror keeps the class names of its last full read; a class
    made since (which notes no provider) is read when a partial read meets
    inventory of it, and the summaries show that inventory."""
    _, fresh, _, outside, mirrored = apps
    cloud = _new_cloud(outside)
    api, checker = ApiClient(mirrored), ApiClient(fresh)
    assert _answer(api, QUERIES[0], "1.39") == _answer(checker, QUERIES[0], "1.39")
    full = mirrored.state.mirror.full_reads
    with outside.begin() as conn:
        _write_raw(cloud, conn, "new_class", 0, 3)
    status, body = _answer(api, QUERIES[0], "1.39")
    assert (status, body) == _answer(checker, QUERIES[0], "1.39")
    assert mirrored.state.mirror.full_reads == full  # a partial read
    assert any(name.startswith("CUSTOM_NEW_") for summary in body["provider_summaries"].values()
               for name in summary["resources"])


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
def test_member_of_searches_only_the_trees_in_its_aggregates(apps, monkeypatch):
    """Without sharing providers, a member_of query searches the trees
    holding a member, not every tree of the cloud; its answer is the same."""
    from allotment.domain import allocation_candidates as solver

    _, fresh, _, outside, mirrored = apps
    _empty_tables(outside)
    with outside.begin() as conn:
        cloud = Cloud(conn)
        for _ in range(20):
            cloud.providers.append(cloud.provider(conn))
        for pick in (3, 11):
            _write_raw(cloud, conn, "aggregate", pick, 1)
    searched = []
    real = solver.Plan.candidates_at

    def counted(plan, root):
        searched.append(root)
        return real(plan, root)

    monkeypatch.setattr(solver.Plan, "candidates_at", counted)
    query = QUERIES[3].format(agg=cloud.agg_uuid)
    api, checker = ApiClient(mirrored), ApiClient(fresh)
    status, body = _answer(api, query, "1.39")
    assert status == 200 and len(body["allocation_requests"]) == 2
    assert sorted(set(searched)) == sorted(cloud.providers[pick] for pick in (3, 11))
    assert (status, body) == _answer(checker, query, "1.39")


def _mirror_matches_database(mirror, engine) -> None:
    """Every provider of the mirror has the generation, inventories and
    usage the database holds, and the mirror holds every provider."""
    inv, alloc, rp = tables.inventories, tables.allocations, tables.resource_providers
    rc = tables.resource_classes
    with engine.connect() as conn:
        generations = dict(conn.execute(sa.select(rp.c.id, rp.c.generation)).all())
        used = {(row[0], row[1]): row[2] for row in conn.execute(
            sa.select(alloc.c.resource_provider_id, rc.c.name, sa.func.sum(alloc.c.used))
            .join(rc, rc.c.id == alloc.c.resource_class_id)
            .group_by(alloc.c.resource_provider_id, rc.c.name))}
        records = {(row[0], row[1]): tuple(row[2:]) for row in conn.execute(
            sa.select(inv.c.resource_provider_id, rc.c.name, inv.c.total, inv.c.reserved, inv.c.min_unit,
                      inv.c.max_unit, inv.c.step_size, inv.c.allocation_ratio)
            .join(rc, rc.c.id == inv.c.resource_class_id))}
    snapshot = mirror._state[1].snapshot
    assert sorted(provider.id for provider in snapshot) == sorted(generations)
    for provider in snapshot:
        assert provider.generation == generations[provider.id]
        held = {(provider.id, name): (item.total, item.reserved, item.min_unit, item.max_unit, item.step_size,
                                      item.allocation_ratio) for name, item in provider.inventories.items()}
        assert held == {key: value for key, value in records.items() if key[0] == provider.id}
        for name, item in provider.inventories.items():
            assert item.used == used.get((provider.id, name), 0)


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
def test_the_mirror_follows_its_own_claims(db_url, monkeypatch):
    """A claim through the application itself, when nobody else committed
    since the mirror's number, is followed by the mirror without a
    statement beyond the number (its providers' generations and records
    come from the claim's own statements); any other commit between, before
    or after the claim, makes the next read bring the mirror up to date as
    before.  Every answer is the fresh one, and the mirror what the
    database holds."""
    mirrored, fresh, other = _application(db_url, 0), _application(db_url, 0, mirror=False), _application(db_url, 0)
    outside = sa.create_engine(db_url)
    monkeypatch.setattr(provider_mirror, "OWN_WRITES_PROBE", 1)  # every write tells, followed or not
    cloud = _new_cloud(outside, more=5)
    mirror, api, checker = mirrored.state.mirror, ApiClient(mirrored), ApiClient(fresh)
    query = "resources=VCPU:1,MEMORY_MB:512"
    refreshes = []
    # What reads the providers changed: PostgreSQL's one statement, SQLite's
    # read of the notes.
    module, name = (raw_rows, "one_row") if BACKEND == "postgresql" else (changes, "changed_providers")
    real = getattr(module, name)

    def recorded(*args):
        refreshes.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, recorded)

    def read() -> int:
        """Answer as a fresh read does; the refreshes this read made."""
        before = len(refreshes)
        assert _answer(api, query, "1.39") == _answer(checker, query, "1.39")
        return len(refreshes) - before

    read()
    assert _write_api(cloud, api, 0, 1) == 204  # PostgreSQL: the owner is made, not the one-statement claim
    read()
    followed = mirror.own_writes_followed
    assert _write_api(cloud, api, 1, 1) == 204  # one provider: the swap in the claim's statement
    assert read() == 0
    assert mirror.own_writes_followed == followed + 1
    _mirror_matches_database(mirror, outside)
    assert _write_api(cloud, api, 2, 2, providers=2) == 204  # a swap statement before the claim's
    assert read() == 0
    assert _write_api(cloud, api, 3, 1) == 204
    assert _write_api(cloud, api, 4, 3, providers=2) == 204  # two in a row, then a read
    assert read() == 0
    assert mirror.own_writes_followed == followed + 4
    _mirror_matches_database(mirror, outside)
    # A consumer's allocations moved to another provider (its rows replaced):
    # usage falls where it was, and the mirror reads.
    with mirrored.db.read() as conn:
        uuids = dict(conn.execute(sa.select(tables.resource_providers.c.id,
                                            tables.resource_providers.c.uuid)).all())
    moving = new_uuid()
    for generation, pick in ((None, 3), (1, 4)):
        response = api.put(f"/allocations/{moving}", json={
            "allocations": {uuids[cloud.providers[pick]]: {"resources": {"VCPU": 2}}},
            "project_id": "p", "user_id": "u", "consumer_generation": generation}, version="1.28")
        assert response.status == 204, response.json
        read()
    _mirror_matches_database(mirror, outside)
    followed = mirror.own_writes_followed
    # Another application's claim after this one's: read.
    assert _write_api(cloud, api, 5, 1) == 204
    assert _write_api(cloud, ApiClient(other), 6, 1) == 204
    assert read() == 1
    # A write in plain SQL before this application's claim: read.
    with outside.begin() as conn:
        _write_raw(cloud, conn, "allocate", 1, 1)
    assert _write_api(cloud, api, 2, 1) == 204
    assert read() == 1
    assert mirror.own_writes_followed == followed
    _mirror_matches_database(mirror, outside)
    outside.dispose()
    for application in (mirrored, fresh, other):
        application.db.dispose()


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
@pytest.mark.parametrize("cache_mb", [8, 0], ids=["answers kept", "answers computed"])
def test_a_request_marks_the_writes_it_knows_before_it_reads_the_number(db_url, monkeypatch, cache_mb):
    """The mirror follows a write only if the request knew of it before it
    read its change number (ProviderMirror.mark): a write told after may
    have committed after that number, in place of another writer's."""
    from allotment.api import allocation_candidates as candidates_api

    application = _application(db_url, cache_mb)
    calls: list[str] = []
    mirror = application.state.mirror
    marked = mirror.mark
    current, read = candidates_api.changes.current_number, candidates_api.changes.read_number
    monkeypatch.setattr(mirror, "mark", lambda: calls.append("mark") or marked())
    monkeypatch.setattr(candidates_api.changes, "current_number", lambda engine: calls.append("number") or current(engine))
    monkeypatch.setattr(candidates_api.changes, "read_number", lambda conn: calls.append("number") or read(conn))
    try:
        assert _answer(ApiClient(application), "resources=VCPU:1", "1.39")[0] == 200
    finally:
        application.db.dispose()
    assert calls and calls[0] == "mark" and "number" in calls, calls


def test_writes_tell_the_mirror_while_it_follows_them():
    """Finding out what a write changed costs the write: it is asked for
    while the mirror follows at least half of the writes told, and only as
    a probe, one write in OWN_WRITES_PROBE, while other writers commit
    between nearly every claim and its read."""
    from allotment.db.provider_cache import ProviderCaches

    mirror = provider_mirror.ProviderMirror(ProviderCaches())
    write = changes.OwnWrite(1, {}, {}, after=2)

    def asked(writes: int) -> int:
        return sum(mirror.wants_own_writes() for _ in range(writes))

    assert asked(16) == 16
    for _ in range(64):  # told, never followed
        mirror.wrote(write)
    assert asked(64) == 64 // provider_mirror.OWN_WRITES_PROBE
    for _ in range(64):  # told and followed
        mirror.wrote(write)
        mirror._followed += 1
    assert asked(16) == 16


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
def test_the_mirror_follows_claims_racing_other_writers(db_url, monkeypatch):
    """Threads of one application claim and read while another application
    and plain SQL write: whatever the mirror followed and read, it ends as
    the database is, and its answers as a fresh read's."""
    import threading

    monkeypatch.setattr(provider_mirror, "OWN_WRITES_PROBE", 1)  # every write tells, followed or not
    application = _application(db_url, 0)
    fresh = _application(db_url, 0, mirror=False)
    other = _application(db_url, 0)
    outside = sa.create_engine(db_url)
    try:
        cloud = _new_cloud(outside, more=13)
        with outside.begin() as conn:  # room for every claim
            for pid in cloud.providers:
                for name in ("VCPU", "MEMORY_MB"):
                    conn.execute(tables.inventories.update().where(
                        tables.inventories.c.resource_provider_id == pid,
                        tables.inventories.c.resource_class_id == cloud.classes[name]).values(
                            total=10**6, max_unit=10**6))
        mirror = application.state.mirror
        query = "resources=VCPU:1,MEMORY_MB:512"
        _answer(ApiClient(application), query, "1.39")
        failures: list[BaseException] = []

        def claimer(k: int) -> None:
            try:
                api = ApiClient(application)
                for i in range(25):
                    _write_api(cloud, api, k * 7 + i, i, providers=1 + i % 2)
                    _answer(api, query, "1.39")
            except BaseException as error:  # reported below
                failures.append(error)

        def elsewhere() -> None:
            try:
                for i in range(15):
                    _write_api(cloud, ApiClient(other), i, i)
                    with outside.begin() as conn:
                        _write_raw(cloud, conn, "allocate", i, 1)
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
        threads.append(threading.Thread(target=elsewhere))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        assert mirror.own_writes_followed > 0
        assert _answer(ApiClient(application), query, "1.39") == _answer(ApiClient(fresh), query, "1.39")
        _mirror_matches_database(mirror, outside)
    finally:
        outside.dispose()
        for app in (application, fresh, other):
            app.db.dispose()
