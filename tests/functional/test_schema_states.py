"""What every entry point does with a database it cannot serve as it is.

No reference needed here: the states are made by hand on a database that
Allotment created (which has Placement 16.0.0's layout): an older Placement
revision with data that the reference would refuse to upgrade, a revision
nobody knows, and the layout of Allotment's own first revision (``0001``,
in ``alembic_version``), which is converted in place.  The real reference
databases are in test_takeover.py.
"""

from __future__ import annotations

import datetime
import json

import pytest
import sqlalchemy as sa
import webob

from allotment import service
from allotment.db import migrate, tables
from allotment.db.engine import Database
from tests.conftest import ApiClient, make_conf, new_uuid
from tests.functional.test_server import fresh_db, run_allotment, serve, write_config  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
NOW = datetime.datetime(2024, 1, 1)


def _synced(url: str) -> None:
    db = Database(url)
    service.prepare_database(db)
    db.dispose()


def _seed(url: str, *, orphan: bool) -> dict[str, str]:
    """A provider with inventory, a consumer with an allocation, and optionally one without a record."""
    ids = {"rp": new_uuid(), "consumer": new_uuid(), "orphan": new_uuid()}
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        rp_id = conn.execute(sa.insert(tables.resource_providers).values(
            uuid=ids["rp"], name="seeded", generation=1, created_at=NOW, updated_at=NOW)
        ).inserted_primary_key[0]
        conn.execute(sa.update(tables.resource_providers).values(root_provider_id=rp_id))
        conn.execute(sa.insert(tables.inventories).values(
            resource_provider_id=rp_id, resource_class_id=0, total=8, reserved=0, min_unit=1,
            max_unit=8, step_size=1, allocation_ratio=1.0, created_at=NOW, updated_at=NOW))
        project = conn.execute(sa.insert(tables.projects).values(external_id="p")).inserted_primary_key[0]
        user = conn.execute(sa.insert(tables.users).values(external_id="u")).inserted_primary_key[0]
        conn.execute(sa.insert(tables.consumers).values(uuid=ids["consumer"], project_id=project,
                                                        user_id=user, generation=1))
        allocated = [ids["consumer"]] + ([ids["orphan"]] if orphan else [])
        for consumer in allocated:
            conn.execute(sa.insert(tables.allocations).values(
                resource_provider_id=rp_id, resource_class_id=0, consumer_id=consumer, used=2,
                created_at=NOW, updated_at=NOW))
    engine.dispose()
    return ids


def _set_placement_revision(url: str, revision: str, *, keep_ours: bool = False) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :rev"), {"rev": revision})
        if not keep_ours:
            conn.execute(sa.text("DROP TABLE allotment_version"))
    engine.dispose()


@pytest.fixture
def waiting(fresh_db, tmp_path):
    """A Placement database at 611cd6dffd7b with an allocation whose consumer has no record."""
    _synced(fresh_db)
    ids = _seed(fresh_db, orphan=True)
    _set_placement_revision(fresh_db, "611cd6dffd7b")
    return fresh_db, str(write_config(tmp_path / "etc", fresh_db)), ids


def _one_line_naming_online_migrations(result) -> str:
    assert "Traceback" not in result.stdout + result.stderr
    said = result.stdout.strip().splitlines()
    assert len(said) == 1, said
    assert "allotment db online-data-migrations" in said[0]
    return said[0]


def test_sync_and_status_say_online_migrations_must_run_first(waiting):
    url, config, _ids = waiting
    sync = run_allotment("db", "sync", "--config-file", config)
    assert sync.returncode == 1
    line = _one_line_naming_online_migrations(sync)
    assert "611cd6dffd7b" in line and "1 allocations have no consumer record" in line
    assert migrate.placement_revision(sa.create_engine(url)) == "611cd6dffd7b"  # untouched

    status = run_allotment("status", "--config-file", config)
    assert status.returncode == 1
    assert "FAILURE: Placement schema at revision 611cd6dffd7b (older than 16.0.0)" in status.stdout
    assert "FAILURE: 1 consumers have allocations but no consumer record: run " \
           "'allotment db online-data-migrations'" in status.stdout
    assert status.stdout.strip().splitlines()[-1] == "verdict: action needed"


def test_serve_refuses_in_one_line(waiting):
    _url, config, _ids = waiting
    live = serve(config_path := __import__("pathlib").Path(config), "--workers", "1")
    try:
        assert live.process.wait(timeout=60) == 1
    finally:
        live.stop()
    log = live.log()
    assert "Traceback" not in log
    refused = [line for line in log.splitlines() if "not serving:" in line]
    assert len(refused) == 1 and "allotment db online-data-migrations" in refused[0], log
    assert config_path.exists()


def test_wsgi_answers_503_until_the_database_is_servable(waiting):
    from allotment.wsgi import _LazyApplication

    url, _config, ids = waiting
    conf = make_conf(url)
    application = _LazyApplication(init=lambda: service.build_application(conf))

    def get(path):
        req = webob.Request.blank(path, headers={"X-Auth-Token": "admin", "Accept": "application/json"})
        return req.get_response(application)

    for _ in range(2):  # every request tries again, and says why
        resp = get(f"/resource_providers/{ids['rp']}")
        assert resp.status_code == 503
        error = json.loads(resp.body)["errors"][0]
        assert (error["status"], error["title"]) == (503, "Service Unavailable")
        assert "allotment db online-data-migrations" in error["detail"]
        assert error["request_id"].startswith("req-")

    code = run_allotment("db", "online-data-migrations", "--config-file", _config)
    assert code.returncode == 0, code.stdout
    assert "create_incomplete_consumers: 1 found, 1 migrated" in code.stdout
    # What the reference's later revisions then add is in place already
    # here (this database was made by Allotment): say so and serve.
    _set_placement_revision(url, "a082b8bb98d0", keep_ours=True)
    resp = get(f"/resource_providers/{ids['rp']}")
    assert resp.status_code == 200, resp.body
    application._app.db.dispose()


def test_an_unknown_revision_is_refused_by_every_command(fresh_db, tmp_path):
    _synced(fresh_db)
    _set_placement_revision(fresh_db, "0123456789ab")
    config = str(write_config(tmp_path / "etc", fresh_db))
    sync = run_allotment("db", "sync", "--config-file", config)
    assert sync.returncode == 1 and "Traceback" not in sync.stdout + sync.stderr
    assert sync.stdout.strip().splitlines() == [
        "allotment db sync: the database's schema revision '0123456789ab' is neither Placement's "
        "nor Allotment's: not a layout Allotment knows"]
    status = run_allotment("status", "--config-file", config)
    assert status.returncode == 1 and "Traceback" not in status.stdout + status.stderr
    assert "does not know (alembic_version '0123456789ab')" in status.stdout


# -- Allotment's own first layout ---------------------------------------------

OLD_NAMES = {"ix": "ix_%(table_name)s_%(column_0_N_name)s", "uq": "uq_%(table_name)s_%(column_0_N_name)s",
             "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
             "pk": "pk_%(table_name)s"}


def _legacy_layout() -> sa.MetaData:
    """The same tables under the names Allotment's revision 0001 gave their constraints and indexes."""
    legacy = sa.MetaData(naming_convention=OLD_NAMES)
    for table in tables.metadata.sorted_tables:
        columns = [sa.Column(c.name, c.type, *[sa.ForeignKey(fk.target_fullname) for fk in c.foreign_keys],
                             primary_key=c.primary_key, nullable=c.nullable,
                             autoincrement=c.autoincrement)
                   for c in table.columns]
        extras = [sa.UniqueConstraint(*uc.columns.keys()) for uc in table.constraints
                  if isinstance(uc, sa.UniqueConstraint)]
        extras += [sa.Index(f"ix_{table.name}_{'_'.join(index.columns.keys())}", *index.columns.keys())
                   for index in table.indexes]
        sa.Table(table.name, legacy, *columns, *extras)
    return legacy


def test_a_database_of_allotments_first_revision_is_converted_in_place(fresh_db, tmp_path):
    engine = sa.create_engine(fresh_db)
    _legacy_layout().create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('0001')"))
    engine.dispose()
    ids = _seed(fresh_db, orphan=False)
    config = str(write_config(tmp_path / "etc", fresh_db))
    status = run_allotment("status", "--config-file", config)
    assert status.returncode == 1 and "earlier Allotment (revision 0001)" in status.stdout

    sync = run_allotment("db", "sync", "--config-file", config)
    assert sync.returncode == 0, sync.stdout + sync.stderr
    engine = sa.create_engine(fresh_db)
    assert migrate.placement_revision(engine) == "a082b8bb98d0"
    assert migrate.current_revision(engine) == migrate.head_revision()
    inspector = sa.inspect(engine)
    assert {i["name"] for i in inspector.get_indexes("allocations")} >= {"allocations_consumer_id_idx"}
    assert not any(i["name"].startswith("ix_") for t in tables.metadata.tables
                   for i in inspector.get_indexes(t))
    engine.dispose()

    from allotment.api.app import Application
    from allotment.db.engine import database_from_config

    conf = make_conf(fresh_db)
    app = Application(conf, database_from_config(conf))
    client = ApiClient(app)
    try:
        shown = client.get(f"/allocations/{ids['consumer']}").json
        assert shown["allocations"] == {ids["rp"]: {"generation": 1, "resources": {"VCPU": 2}}}
        assert shown["project_id"] == "p"
        # New rows get fresh ids after the copied ones.
        assert client.post("/resource_providers", json={"name": "after"}).status == 200
        assert client.put(f"/allocations/{new_uuid()}", json={
            "allocations": {ids["rp"]: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u",
            "consumer_generation": None, "consumer_type": "INSTANCE"}).status == 204
        assert client.get(f"/resource_providers/{ids['rp']}/usages").json["usages"] == {"VCPU": 3}
    finally:
        app.db.dispose()
