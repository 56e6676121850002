"""Statements run on the DBAPI cursor give what ``conn.execute`` gives."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from allotment.db import allocation_candidates as ac
from allotment.db import engine, raw_rows, tables
from tests.conftest import BACKEND, new_uuid, pg_statements_sent


@pytest.fixture
def cloud(api):
    """Three providers (one a child) with inventories, usage, traits and an aggregate."""
    assert api.put("/traits/CUSTOM_RAW").status == 201
    agg = new_uuid()
    uuids = []
    for k in range(3):
        body = {"name": f"rp{k}", "uuid": new_uuid()}
        if k == 2:
            body["parent_provider_uuid"] = uuids[0]
        assert api.post("/resource_providers", json=body).status == 200
        uuids.append(body["uuid"])
    for k, uuid in enumerate(uuids):
        inventories = {"VCPU": {"total": 8 + k, "allocation_ratio": 1.5},
                       "DISK_GB": {"total": 100, "reserved": 3, "step_size": 10}}
        assert api.put(f"/resource_providers/{uuid}/inventories",
                       json={"inventories": inventories, "resource_provider_generation": 0}).status == 200
        assert api.put(f"/resource_providers/{uuid}/traits",
                       json={"traits": ["CUSTOM_RAW", "HW_CPU_X86_AVX2"][:k + 1],
                             "resource_provider_generation": 1}).status == 200
        assert api.put(f"/resource_providers/{uuid}/aggregates",
                       json={"aggregates": [agg], "resource_provider_generation": 2}).status == 200
    consumer = {"allocations": {uuids[0]: {"resources": {"VCPU": 3, "DISK_GB": 20}}},
                "project_id": new_uuid(), "user_id": new_uuid(), "consumer_generation": None,
                "consumer_type": "INSTANCE"}
    assert api.put(f"/allocations/{new_uuid()}", json=consumer).status == 204
    return uuids, agg


def _both(app, statement, params):
    with app.db.read() as conn:
        raw = raw_rows.rows(conn, statement, params)
        expected = conn.execute(statement, params).all()
    return [tuple(row) for row in raw], [tuple(row) for row in expected]


def test_candidate_statements_same_rows(app, cloud):
    uuids, agg = cloud
    with app.db.read() as conn:
        ids = [row[0] for row in conn.execute(sa.select(tables.resource_providers.c.id)
                                              .order_by(tables.resource_providers.c.id))]
    cases = [
        (ac._NAMES, {"classes": ["VCPU", "DISK_GB", "NOPE"], "traits": ["CUSTOM_RAW"],
                     "aggregates": [agg], "trees": uuids[:1]}),
        (ac._NAMES, {"classes": [], "traits": [], "aggregates": [], "trees": []}),
        (ac._TREE_PROVIDERS, {"roots": ids[:1], "lost": []}),
        (ac._TREE_PROVIDERS, {"roots": ids, "lost": ids[1:]}),
        (ac._PROVIDER_USAGE, {"ids": ids}),
        (ac._PROVIDER_TRAITS, {"ids": ids}),
        (ac._PROVIDER_RECORDS, {"ids": ids[:3]}),
        (ac._SHARING_AGGREGATES, {"ids": ids}),
        (ac._EVERY_INVENTORY, {"classes": [0, 2]}),
    ]
    for statement, params in cases:
        raw, expected = _both(app, statement, params)
        assert sorted(raw) == sorted(expected), statement
        # Same values, same Python types (floats, ints, strings).
        assert sorted(map(repr, raw)) == sorted(map(repr, expected)), statement


def test_padded_lists_mean_the_same():
    assert raw_rows._padded([]) == []
    assert raw_rows._padded([1]) == [1]
    assert raw_rows._padded([1, 2]) == [1, 2]
    assert raw_rows._padded([1, 2, 3]) == [1, 2, 3, 3]
    assert raw_rows._padded(list(range(5))) == [0, 1, 2, 3, 4, 4, 4, 4]


class _Doubled(sa.types.TypeDecorator):
    """A type SQLAlchemy converts both ways."""

    impl = sa.Integer
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return None if value is None else value * 2

    def process_result_value(self, value, dialect):
        return None if value is None else value * 10


def test_converted_values_go_through_sqlalchemy(app):
    """A value SQLAlchemy converts (bound or selected) is converted."""
    selected = sa.select(sa.cast(sa.literal(4), _Doubled), sa.bindparam("n", type_=sa.Integer))
    assert _both(app, selected, {"n": 4}) == ([(40, 4)], [(40, 4)])
    bound = sa.select(sa.bindparam("n", type_=_Doubled) + 0)
    assert _both(app, bound, {"n": 4}) == ([(80,)], [(80,)])  # doubled, then times ten


def test_database_error_is_sqlalchemys(app):
    statement = sa.select(sa.text("x")).select_from(sa.table("no_such_table")).where(
        sa.column("x").in_(sa.bindparam("ids", expanding=True)))
    with pytest.raises(sa.exc.DBAPIError):
        with app.db.read() as conn:
            raw_rows.rows(conn, statement, {"ids": [1, 2, 3]})


def _statements_sent(engine_: sa.Engine) -> list[str]:
    """The statements SQLAlchemy sends from now on (the raw cursor's are not seen)."""
    sent: list[str] = []
    sa.event.listen(engine_, "before_cursor_execute", lambda *args: sent.append(args[2]))
    return sent


def test_failed_read_in_a_write_is_raised_not_run_again(app):
    """Inside a transaction a failed read is raised as SQLAlchemy raises it,
    and never run again: on MySQL/MariaDB a deadlock rolls the transaction
    back, and a statement run again would start a new one unseen."""
    statement = sa.select(sa.text("x")).select_from(sa.table("no_such_table"))
    sent = _statements_sent(app.db.engine)
    with pytest.raises(sa.exc.DBAPIError):
        with app.db.write() as conn:
            raw_rows.rows(conn, statement, {})
    assert [text for text in sent if "no_such_table" in text] == []


def test_writes_store_what_sqlalchemy_stores(app):
    """A row written on the cursor (one, and several at once) reads back as
    one written by ``conn.execute``: timestamps converted as SQLAlchemy
    converts them (SQLite keeps them as text), the touched rows counted."""
    when = engine.utcnow()
    names = [f"CUSTOM_RAW_WRITE_{k}" for k in range(4)]
    insert = sa.insert(tables.traits).values(name=sa.bindparam("name"), created_at=sa.bindparam("at"))
    with app.db.write() as conn:
        assert raw_rows.write(conn, insert, {"name": names[0], "at": when}) == 1
        raw_rows.write(conn, insert, [{"name": name, "at": when} for name in names[1:3]])
        conn.execute(insert, {"name": names[3], "at": when})
        rename = sa.update(tables.traits).where(tables.traits.c.name == sa.bindparam("old")).values(
            name=sa.bindparam("new"), updated_at=sa.bindparam("at"))
        assert raw_rows.write(conn, rename, {"old": names[2], "new": names[2] + "_X", "at": when}) == 1
        assert raw_rows.write(conn, rename, {"old": "CUSTOM_NO_SUCH", "new": "CUSTOM_Y", "at": when}) == 0
    with app.db.read() as conn:
        found = conn.execute(sa.select(tables.traits.c.name, tables.traits.c.created_at,
                                       sa.cast(tables.traits.c.created_at, sa.String))
                             .where(tables.traits.c.name.like("CUSTOM_RAW_WRITE_%"))
                             .order_by(tables.traits.c.name)).all()
    assert [row[0] for row in found] == [names[0], names[1], names[2] + "_X", names[3]]
    assert {row[1] for row in found} <= {when, when.replace(microsecond=0)}  # MySQL: whole seconds
    assert len({row[1] for row in found}) == len({row[2] for row in found}) == 1  # stored alike


def test_failed_write_is_sqlalchemys_error_and_not_run_again(app):
    insert = sa.insert(tables.traits).values(name=sa.bindparam("name"), created_at=sa.bindparam("at"))
    sent = _statements_sent(app.db.engine)
    with pytest.raises(sa.exc.IntegrityError):
        with app.db.write() as conn:
            raw_rows.write(conn, insert, {"name": "CUSTOM_RAW_TWICE", "at": engine.utcnow()})
            raw_rows.write(conn, insert, {"name": "CUSTOM_RAW_TWICE", "at": engine.utcnow()})
    assert [text for text in sent if "INSERT" in text] == []
    with app.db.read() as conn:  # the transaction rolled back whole
        assert conn.execute(sa.select(tables.traits.c.id).where(
            tables.traits.c.name == "CUSTOM_RAW_TWICE")).all() == []


@pytest.mark.skipif(BACKEND != "mysql", reason="a deadlock's victim is rolled back whole on MySQL/MariaDB")
def test_deadlock_victim_read_is_raised_and_its_writes_not_committed(app):
    """The transaction that loses a deadlock in a raw read is rolled back by
    the server; the error must reach the write's retry, and nothing of the
    transaction may be committed (re-running the read began a new
    transaction, and the write committed what followed it alone)."""
    import threading
    import time

    meta = sa.MetaData()
    cells = sa.Table(f"deadlock_{new_uuid()[:8]}", meta, sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("v", sa.Integer))
    meta.create_all(app.db.engine)
    try:
        with app.db.engine.begin() as conn:
            conn.execute(cells.insert(), [{"id": k, "v": 0} for k in range(1, 60)])
        other_ready, other_done = threading.Event(), threading.Event()

        def other():  # the heavier transaction: it wins the deadlock
            with app.db.engine.connect() as conn:
                with conn.begin():
                    conn.execute(cells.update().where(cells.c.id >= 3).values(v=cells.c.v + 1))
                    conn.execute(cells.update().where(cells.c.id == 2).values(v=1))
                    other_ready.set()
                    time.sleep(0.5)  # until the victim waits for row 2
                    conn.execute(cells.update().where(cells.c.id == 1).values(v=1))
            other_done.set()

        thread = threading.Thread(target=other)
        with pytest.raises(sa.exc.DBAPIError) as raised:
            with app.db.write() as conn:
                conn.execute(cells.update().where(cells.c.id == 1).values(v=100))
                thread.start()
                assert other_ready.wait(10)
                raw_rows.rows(conn, sa.select(cells.c.v).where(cells.c.id == 2).with_for_update(), {})
        thread.join(30)
        assert other_done.is_set()
        assert engine.is_transient(raised.value)
        with app.db.engine.connect() as conn:
            assert conn.execute(sa.select(cells.c.v).where(cells.c.id == 1)).scalar_one() == 1
    finally:
        meta.drop_all(app.db.engine)


@pytest.mark.skipif(BACKEND != "postgresql", reason="statements are prepared on PostgreSQL only")
def test_postgresql_statements_prepared_once_per_connection(app, cloud):
    statement = ac._TREE_PROVIDERS
    with app.db.read() as conn:
        ids = [row[0] for row in conn.execute(sa.select(tables.resource_providers.c.id))]
        known = conn.connection.info[engine._PREPARED]
        before = dict(known.names)
        first = raw_rows.rows(conn, statement, {"roots": ids, "lost": []})
        prepared = dict(known.names)
        assert len(prepared) == len(before) + 1
        again = raw_rows.rows(conn, statement, {"roots": ids, "lost": []})
        assert dict(known.names) == prepared
        names = {row[0] for row in conn.exec_driver_sql("SELECT name FROM pg_prepared_statements")}
        assert set(prepared.values()) <= names
        # A statement the session lost (DEALLOCATE by someone else) is run
        # anyway, and prepared afresh (under a new name) the next time.
        conn.exec_driver_sql("DEALLOCATE ALL")
        lost = raw_rows.rows(conn, statement, {"roots": ids, "lost": []})
        assert len(known.names) == len(prepared) - 1
        afresh = raw_rows.rows(conn, statement, {"roots": ids, "lost": []})
        assert len(known.names) == len(prepared)
        assert set(known.names.values()).isdisjoint(set(prepared.values()) - set(before.values()))
    assert first == again == lost == afresh
    assert len(first) == 3


@pytest.mark.skipif(BACKEND != "postgresql", reason="statements are prepared on PostgreSQL only")
def test_postgresql_one_set_of_prepared_statements_per_connection(app, cloud, monkeypatch):
    """The candidate reads and the statements marked ``prepared`` (the write
    path's) share one set of names per connection and one bound: neither
    evicts or reuses a name the other relies on."""
    monkeypatch.setattr(engine, "PREPARED_PER_CONNECTION", 3)
    rp = tables.resource_providers
    marked = [engine.prepared(sa.select(rp.c.id, sa.literal_column(str(k)))
                              .where(rp.c.id >= sa.bindparam("lo", type_=sa.Integer)).order_by(rp.c.id))
              for k in range(3)]
    read = [ac._TREE_PROVIDERS, ac._PROVIDER_TRAITS, ac._PROVIDER_RECORDS]
    with app.db.read() as conn:
        ids = sorted(row[0] for row in conn.execute(sa.select(rp.c.id)))
        known = conn.connection.info[engine._PREPARED]
        conn.exec_driver_sql("DEALLOCATE ALL")  # what the fixture's requests prepared
        known.names.clear()
        params = [{"roots": ids, "lost": []}, {"ids": ids}, {"ids": ids}]
        expected = [conn.execute(statement, p).all() for statement, p in zip(read, params)]
        for _ in range(3):
            for k in range(3):
                assert [row[0] for row in conn.execute(marked[k], {"lo": 0})] == ids
                assert [tuple(row) for row in raw_rows.rows(conn, read[k], params[k])] == \
                    [tuple(row) for row in expected[k]]
                on_server = conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar()
                assert on_server <= 3
        assert len(set(known.names.values())) == len(known.names) <= 3


@pytest.mark.skipif(BACKEND != "postgresql", reason="statements are prepared on PostgreSQL only")
def test_postgresql_prepared_statements_can_be_turned_off(db_url, cloud):
    """``[allotment] pg_prepared_statements = false`` (PgBouncer in transaction
    mode): the same answers, and nothing prepared on the server session."""
    from allotment.api.app import Application
    from allotment.service import database_from_config
    from tests.conftest import ApiClient, make_conf

    conf = make_conf(db_url, allotment__pg_prepared_statements=False)
    application = Application(conf, database_from_config(conf))
    try:
        client = ApiClient(application)
        query = "/allocation_candidates?resources=VCPU:1,DISK_GB:10"
        first = client.get(query)
        uuids, _ = cloud
        consumer = {"allocations": {uuids[1]: {"resources": {"VCPU": 1}}}, "project_id": new_uuid(),
                    "user_id": new_uuid(), "consumer_generation": None, "consumer_type": "INSTANCE"}
        assert client.put(f"/allocations/{new_uuid()}", json=consumer).status == 204
        second = client.get(query)
        assert first.status == second.status == 200
        assert len(first.json["allocation_requests"]) == len(second.json["allocation_requests"]) > 0
        with application.db.read() as conn:
            assert engine._PREPARED not in conn.connection.info
            assert conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar() == 0
    finally:
        application.db.dispose()


def test_insert_gives_the_new_rows_key(app):
    """``raw_rows.insert`` gives the key ``inserted_primary_key`` gives
    (``RETURNING`` on PostgreSQL, the cursor's ``lastrowid`` elsewhere), and
    a duplicate is SQLAlchemy's IntegrityError."""
    insert = sa.insert(tables.traits).values(name=sa.bindparam("name"), created_at=sa.bindparam("at"))
    names = [f"CUSTOM_RAW_KEY_{k}" for k in range(3)]
    with app.db.write() as conn:
        first = raw_rows.insert(conn, insert, {"name": names[0], "at": engine.utcnow()})
        second = conn.execute(insert, {"name": names[1], "at": engine.utcnow()}).inserted_primary_key[0]
        third = raw_rows.insert(conn, insert, {"name": names[2], "at": engine.utcnow()})
    with app.db.read() as conn:
        found = dict(conn.execute(sa.select(tables.traits.c.name, tables.traits.c.id)
                                  .where(tables.traits.c.name.in_(names))).all())
    assert found == {names[0]: first, names[1]: second, names[2]: third}
    assert first < second < third
    with pytest.raises(sa.exc.IntegrityError):
        with app.db.write() as conn:
            raw_rows.insert(conn, insert, {"name": names[0], "at": engine.utcnow()})


def test_a_claim_runs_on_the_cursor(app, api, cloud):
    """A claim (its ``GET /allocation_candidates`` and its ``PUT``) for a
    project and user seen before sends its transactions' BEGIN (SQLite),
    the changed providers' ids (SQLite), the consumer's row and the
    allocation rows (several in one INSERT elsewhere) on the DBAPI cursor,
    not through SQLAlchemy's execution, which costs more CPU than SQLite's
    own work on statements this small.  (On SQLite and PostgreSQL none of
    a claim's statements goes through it; on MySQL/MariaDB the reads whose
    values SQLAlchemy converts do.)"""
    uuids, _ = cloud
    project, user = new_uuid(), new_uuid()

    def claim() -> None:
        found = api.get("/allocation_candidates?resources=VCPU:1,DISK_GB:10&limit=5",
                        headers={"OpenStack-API-Version": "placement 1.39"})
        assert found.status == 200, found.body
        allocations = found.json["allocation_requests"][0]["allocations"]
        response = api.put(f"/allocations/{new_uuid()}", json={
            "allocations": allocations, "project_id": project, "user_id": user,
            "consumer_generation": None, "consumer_type": "INSTANCE"},
            headers={"OpenStack-API-Version": "placement 1.39"})
        assert response.status == 204, response.body

    claim()  # the project and user are new: their rows are written once
    sent = _statements_sent(app.db.engine)
    claim()
    claim()
    assert [text for text in sent if text.startswith(("BEGIN", "INSERT")) or "provider_changes" in text] == []
    if BACKEND != "mysql":
        assert sent == []


@pytest.mark.skipif(BACKEND != "postgresql", reason="the INSERT that reads usage back is PostgreSQL's")
def test_postgresql_claims_read_their_capacity_check_from_their_insert(app, api, cloud):
    """On PostgreSQL the INSERT of a claim's allocation rows also returns
    what the capacity check reads (the inventories written to, with their
    usage after the INSERT), and for a new consumer whose owner exists it
    also makes the last generation swap and the consumer's row: a PUT
    sends BEGIN with the read, a swap for each provider but the last, that
    statement and COMMIT, and no statement of its own for the check.  A
    claim over capacity is still refused, and leaves nothing behind."""
    uuids, _ = cloud
    project, user = new_uuid(), new_uuid()

    def put(resources: dict) -> tuple[int, list[str]]:
        sent.clear()
        response = api.put(f"/allocations/{new_uuid()}", json={
            "allocations": {uuids[0]: {"resources": resources}, uuids[1]: {"resources": {"DISK_GB": 10}}},
            "project_id": project, "user_id": user, "consumer_generation": None, "consumer_type": "INSTANCE"},
            headers={"OpenStack-API-Version": "placement 1.39"})
        return response, [text for text in sent if not text.startswith(("PREPARE", "DEALLOCATE"))]

    sent = pg_statements_sent(app.db.engine)
    assert put({"VCPU": 1})[0].status == 204  # the project and user are new: their rows are written once
    response, statements = put({"VCPU": 1})
    assert response.status == 204, response.body
    assert len(statements) == 4, statements  # BEGIN + read, a swap, swap + consumer + INSERT + check, COMMIT
    assert statements[0].startswith("BEGIN ISOLATION LEVEL READ COMMITTED; EXECUTE ")
    assert statements[-1] == "COMMIT"
    with app.db.read() as conn:
        before = conn.execute(sa.select(sa.func.count()).select_from(tables.allocations)).scalar_one()
    response, _ = put({"VCPU": 9})  # 8 x 1.5 = 12, of which 3 + 2 held before
    assert response.status == 409, response.body
    assert "exceed the capacity" in response.error()["detail"]
    with app.db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.allocations)).scalar_one() == before


@pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite's writers hold the database from their first read")
def test_a_consumer_made_by_another_writer_since_the_read_is_a_race_run_again(app, api, cloud, monkeypatch):
    """A claim for a consumer that had no record at the write's first read,
    whose record another transaction then commits: the claim's insert of
    the consumer (on PostgreSQL, in one statement with its last swap and
    allocation rows) fails on its uuid, the transaction is run again, and
    it then writes over the record the other made (before 1.28 nothing
    checks the consumer's generation): one record, the claim's rows."""
    from allotment.db import allocations, consumers

    uuids, _ = cloud
    project, user = new_uuid(), new_uuid()
    claim = {"allocations": {uuids[1]: {"resources": {"VCPU": 1}}}, "project_id": project, "user_id": user}
    old = {"OpenStack-API-Version": "placement 1.12"}
    assert api.put(f"/allocations/{new_uuid()}", json=claim, headers=old).status == 204  # the owner exists
    consumer = new_uuid()
    real = allocations._read_for_write
    made = []

    def then_another_writer(conn, requests, *args):
        found = real(conn, requests, *args)
        if not made:
            with app.db.engine.begin() as other:
                owner = consumers.ensure_owner(other, project, user)
                made.append(consumers.insert(other, consumer, owner, generation=0))
        return found

    monkeypatch.setattr(allocations, "_read_for_write", then_another_writer)
    response = api.put(f"/allocations/{consumer}", json={**claim, "allocations": {
        uuids[1]: {"resources": {"VCPU": 2, "DISK_GB": 10}}}}, headers=old)
    assert response.status == 204, response.body
    with app.db.read() as conn:
        records = conn.execute(sa.select(tables.consumers.c.id, tables.consumers.c.generation)
                               .where(tables.consumers.c.uuid == consumer)).all()
        rows = conn.execute(sa.select(tables.allocations.c.used)
                            .where(tables.allocations.c.consumer_id == consumer)).scalars().all()
    assert records == [(made[0], 1)] and sorted(rows) == [2, 10]
