"""Consumer records: created on demand, race-free; and the online data
migration (with its ``allotment status`` check) for allocations that predate them."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from allotment import cli
from allotment.db import consumers, tables
from tests.conftest import new_uuid
from tests.functional.test_allocations import INCOMPLETE, body, claim, seed_legacy_allocation, seed_provider


@pytest.fixture
def conf_file(tmp_path, db_url):
    path = tmp_path / "placement.conf"
    path.write_text(f"[placement_database]\nconnection = {db_url}\n[api]\nauth_strategy = noauth2\n"
                    "[placement]\nincomplete_consumer_project_id = legacy-project\n"
                    "incomplete_consumer_user_id = legacy-user\n")
    return str(path)


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def consumer_count(app) -> int:
    with app.db.read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(tables.consumers)).scalar_one()


def test_online_migration_creates_missing_consumers_in_resumable_batches(app, api, conf_file, capsys):
    rp = seed_provider(app, {"VCPU": 1000, "DISK_GB": 1000})
    legacy = [new_uuid() for _ in range(70)]
    for consumer in legacy:
        seed_legacy_allocation(app, rp, consumer, {"VCPU": 1, "DISK_GB": 2})
    api.put(f"/allocations/{new_uuid()}", version="1.28", json=body(claim(rp, VCPU=1)))

    code, out = run_cli(capsys, "status", "--config-file", conf_file)
    assert code == 1
    assert "FAILURE: 70 consumers have allocations but no consumer record" in out

    code, out = run_cli(capsys, "db", "online-data-migrations", "--config-file", conf_file, "--max-count", "30")
    assert code == 1
    assert "create_incomplete_consumers: 70 found, 30 migrated" in out
    assert consumer_count(app) == 31

    code, out = run_cli(capsys, "db", "online-data-migrations", "--config-file", conf_file)
    assert (code, "create_incomplete_consumers: 40 found, 40 migrated" in out) == (0, True)
    code, out = run_cli(capsys, "db", "online-data-migrations", "--config-file", conf_file)
    assert (code, "create_incomplete_consumers: 0 found, 0 migrated" in out) == (0, True)
    code, out = run_cli(capsys, "status", "--config-file", conf_file)
    assert code == 0 and "OK: every consumer with allocations has a consumer record" in out

    shown = api.get(f"/allocations/{legacy[0]}", version="1.28").json
    assert (shown["project_id"], shown["user_id"], shown["consumer_generation"]) == (
        "legacy-project", "legacy-user", 0)
    # Migrated consumers now count in their (incomplete) project's usage.
    assert api.get("/usages?project_id=legacy-project", version="1.9").json["usages"] == {
        "VCPU": 70, "DISK_GB": 140}
    assert api.put(f"/allocations/{legacy[0]}", version="1.28", json=body(claim(rp, VCPU=5), 0)).status == 204


def test_online_migration_refuses_a_nonsense_max_count(conf_file, capsys):
    code, out = run_cli(capsys, "db", "online-data-migrations", "--config-file", conf_file, "--max-count", "0")
    assert code == 2 and "--max-count" in out


def test_projects_and_users_are_created_once_under_a_race(app):
    ids: list[tuple[int, int]] = []
    barrier = threading.Barrier(8)

    def create():
        barrier.wait()
        ids.append(app.db.run_write(lambda conn: consumers.ensure_owner(conn, "racing-project", "racing-user"),
                                    retry_on=(consumers.RecordRace,), retries=10))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    with app.db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.projects).where(
            tables.projects.c.external_id == "racing-project")).scalar_one() == 1


def test_racing_creators_of_one_consumer_have_exactly_one_winner(app, api):
    rp = seed_provider(app, {"VCPU": 100})
    consumer = new_uuid()
    statuses: list[int] = []
    barrier = threading.Barrier(8)

    def create(amount):
        barrier.wait()
        statuses.append(api.put(f"/allocations/{consumer}", version="1.28",
                                json=body(claim(rp, VCPU=amount))).status)

    threads = [threading.Thread(target=create, args=(i + 1,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [204] + [409] * 7
    shown = api.get(f"/allocations/{consumer}", version="1.28").json
    assert shown["consumer_generation"] == 1
    used = shown["allocations"][rp]["resources"]["VCPU"]
    assert api.get(f"/resource_providers/{rp}/usages").json["usages"] == {"VCPU": used}


def test_emptying_an_unknown_consumer_creates_it_at_generation_0(app, api):
    # A quirk of Placement, matched: emptying a consumer that has no record
    # creates one at generation 0, so its next write must name 0, not null.
    rp = seed_provider(app, {"VCPU": 4})
    consumer = new_uuid()
    assert api.put(f"/allocations/{consumer}", version="1.28", json=body({})).status == 204
    assert consumer_count(app) == 1
    assert api.get(f"/allocations/{consumer}", version="1.28").json == {"allocations": {}}
    # Emptying it again (generation 0) keeps it; null is now stale.
    assert api.put(f"/allocations/{consumer}", version="1.28", json=body({}, 0)).status == 204
    r = api.put(f"/allocations/{consumer}", version="1.28", json=body(claim(rp, VCPU=1)))
    assert r.status == 409
    assert "consumer generation conflict - expected 0 but got None" in r.error()["detail"]
    assert api.put(f"/allocations/{consumer}", version="1.28", json=body(claim(rp, VCPU=1), 0)).status == 204
    assert api.get(f"/allocations/{consumer}", version="1.28").json["consumer_generation"] == 1
    # A consumer that held allocations goes with them.
    api.delete(f"/allocations/{consumer}")
    assert consumer_count(app) == 0
    # POST /allocations (any version) does the same.
    other = new_uuid()
    assert api.post("/allocations", version="1.13",
                    json={other: {"allocations": {}, "project_id": "p", "user_id": "u"}}).status == 204
    assert consumer_count(app) == 1
    # DELETE finds no allocations to remove.
    assert api.delete(f"/allocations/{other}").status == 404


def test_incomplete_owner_comes_from_configuration(app, api):
    app.conf.set_override("incomplete_consumer_project_id", "old-project", group="placement")
    rp = seed_provider(app, {"VCPU": 4})
    consumer = new_uuid()
    api.put(f"/allocations/{consumer}", version="1.7",
            json={"allocations": [{"resource_provider": {"uuid": rp}, "resources": {"VCPU": 1}}]})
    shown = api.get(f"/allocations/{consumer}", version="1.12").json
    assert (shown["project_id"], shown["user_id"]) == ("old-project", INCOMPLETE)
