"""A database that goes back in time under a running server: fresh answers.

A backup restored under a running server (an older SQLite file, a
PostgreSQL dump), a point-in-time recovery or a promoted replica that had
not received the last writes: the database's change number goes back, and
on PostgreSQL a restored dump is a new table of the number altogether.  The
mirror of every provider and the kept answers must notice and read again,
not serve what they read from the history that was lost.

Each test runs one application keeping everything it can (mirror, kept
answers) and one keeping nothing, on the same database, and compares their
answers after the restore.  On PostgreSQL the restored database is also
written to until its change number is exactly the one the first
application last saw: equal numbers, another database (the counter table
restored is a new table), still a fresh answer.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess

import pytest
import sqlalchemy as sa

from allotment.api.app import Application
from allotment.db import changes
from allotment.service import database_from_config
from tests.conftest import BACKEND, ApiClient, create_database, make_conf, new_uuid, prepare

pytestmark = pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS,
                                reason=f"no change number on {BACKEND}: nothing is kept")

QUERY = "/allocation_candidates?resources=VCPU:4"


@pytest.fixture
def database(tmp_path_factory):
    url, drop = create_database(tmp_path_factory, "bit")
    prepare(url)
    yield url
    drop()


def _client(url: str, **overrides) -> ApiClient:
    conf = make_conf(url, **overrides)
    return ApiClient(Application(conf, database_from_config(conf)), version="1.28")


def _providers(answer) -> list[str]:
    return sorted(answer.json["provider_summaries"])


def _save(url: str, directory) -> str:
    """A backup of the database as it is now."""
    parsed = sa.engine.make_url(url)
    if BACKEND == "sqlite":
        saved = str(directory / "saved.sqlite")
        with sqlite3.connect(parsed.database) as source, sqlite3.connect(saved) as target:
            source.backup(target)
        return saved
    saved = str(directory / "saved.dump")
    subprocess.run(["pg_dump", "-h", parsed.host, "-p", str(parsed.port or 5432), "-U", parsed.username,
                    "-Fc", "-f", saved, parsed.database], check=True, capture_output=True)
    return saved


def _restore(url: str, saved: str) -> None:
    """The backup put back under the running applications, as an operator would."""
    parsed = sa.engine.make_url(url)
    if BACKEND == "sqlite":
        # SQLite's online backup, into the live file: its connections see the
        # restored pages at their next transaction.
        with sqlite3.connect(saved) as source, sqlite3.connect(parsed.database) as target:
            source.backup(target)
        return
    subprocess.run(["pg_restore", "-h", parsed.host, "-p", str(parsed.port or 5432), "-U", parsed.username,
                    "--clean", "--if-exists", "--single-transaction", "-d", parsed.database, saved],
                   check=True, capture_output=True)


def _count(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        number, _ = changes.current_number(engine)
        return number & ((1 << changes.TOKEN_SHIFT) - 1)
    finally:
        engine.dispose()


@pytest.fixture
def restorable(database, tmp_path):
    """(url, keeping, fresh, providers, saved): three providers of 8 VCPU saved
    in a backup; then two of them filled, and the keeping application has
    answered from its mirror and kept its answer."""
    if BACKEND == "postgresql" and not (shutil.which("pg_dump") and shutil.which("pg_restore")):
        reason = "pg_dump / pg_restore are not installed (apt-get install postgresql-client)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    keeping = _client(database)
    fresh = _client(database, allotment__candidates_cache_mb=0, allotment__provider_mirror=False)
    assert keeping.application.state.mirror is not None
    providers = []
    for index in range(3):
        uuid = new_uuid()
        assert keeping.post("/resource_providers", json={"name": f"bit-{index}", "uuid": uuid}).status in (200, 201)
        assert keeping.put(f"/resource_providers/{uuid}/inventories", json={
            "resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}}}).status == 200
        providers.append(uuid)
    assert _providers(keeping.get(QUERY)) == sorted(providers)
    saved = _save(database, tmp_path)
    for uuid in providers[:2]:
        claim = {"allocations": {uuid: {"resources": {"VCPU": 6}}}, "project_id": new_uuid(),
                 "user_id": new_uuid(), "consumer_generation": None}
        assert keeping.put(f"/allocations/{new_uuid()}", json=claim).status == 204
    for _ in range(2):  # the second from what was kept
        assert _providers(keeping.get(QUERY)) == [providers[2]]
    yield database, keeping, fresh, providers, saved
    for client in (keeping, fresh):
        client.application.db.dispose()


def _write_until(url: str, done, provider: str) -> None:
    """Write transactions touching only ``provider`` until ``done(count)``."""
    engine = sa.create_engine(url)
    try:
        while not done(_count(url)):
            with engine.begin() as conn:
                conn.exec_driver_sql("UPDATE inventories SET reserved = 0 WHERE resource_provider_id = "
                                     "(SELECT id FROM resource_providers WHERE uuid = :uuid)"
                                     if BACKEND == "sqlite" else
                                     "UPDATE inventories SET reserved = 0 WHERE resource_provider_id = "
                                     "(SELECT id FROM resource_providers WHERE uuid = %(uuid)s)", {"uuid": provider})
    finally:
        engine.dispose()


def test_a_restored_backup_is_noticed_at_the_next_read(restorable):
    url, keeping, fresh, providers, saved = restorable
    seen = _count(url)
    _restore(url, saved)
    expected = fresh.get(QUERY)
    assert _providers(expected) == sorted(providers)
    assert keeping.get(QUERY).text == expected.text
    # Writes to the third provider only, past the number the mirror had
    # seen: a mirror still of the lost history would take the first two as
    # still full.
    _write_until(url, lambda count: count > seen, providers[2])
    assert keeping.get(QUERY).text == fresh.get(QUERY).text == expected.text
    assert keeping.application.state.mirror.rebuilds >= 1
    # And it goes on from there: a claim on the restored database is seen.
    claim = {"allocations": {providers[0]: {"resources": {"VCPU": 5}}}, "project_id": new_uuid(),
             "user_id": new_uuid(), "consumer_generation": None}
    assert fresh.put(f"/allocations/{new_uuid()}", json=claim).status == 204
    assert keeping.get(QUERY).text == fresh.get(QUERY).text
    assert _providers(keeping.get(QUERY)) == sorted(providers[1:])


def test_a_restored_backup_written_to_until_the_same_number_is_another_database(restorable):
    if BACKEND != "postgresql":
        pytest.skip("a restored SQLite file keeps its identity: it is seen going back only by a read "
                    "made before as many writes as were lost (see allotment/db/changes.py)")
    url, keeping, fresh, providers, saved = restorable
    seen = _count(url)
    _restore(url, saved)
    assert _count(url) < seen
    _write_until(url, lambda count: count >= seen, providers[2])
    assert _count(url) == seen
    expected = fresh.get(QUERY)
    assert _providers(expected) == sorted(providers)
    assert keeping.get(QUERY).text == expected.text
