"""SQLite: a candidates request whose read transaction began before another
thread moved the provider mirror on is answered from the mirror, in a read
transaction begun again, not by reading the database as without a mirror.

Reading the database took seconds a request at 100,000 hosts whose first
trees are full while claims streamed in (and once failed with `too many SQL
variables`); here the database path is made to fail, and the mirror made to
look ahead of the request's first transaction.
"""

from __future__ import annotations

import pytest

from allotment.api import allocation_candidates as api_candidates
from allotment.api.app import Application
from allotment.db import allocation_candidates as db_candidates
from allotment.db import changes
from allotment.service import database_from_config
from tests.conftest import BACKEND, ApiClient, create_database, make_conf, new_uuid, prepare

pytestmark = pytest.mark.skipif(BACKEND != "sqlite", reason="PostgreSQL reads run without a transaction")

QUERY = "/allocation_candidates?resources=VCPU:1"
#: Asked first while the mirror looks ahead: a query no answer is kept for.
ASKED = QUERY + "&limit=2"


@pytest.fixture(params=[0, 8], ids=["computed", "answers-kept"])
def api(tmp_path_factory, request):
    """With answers computed every time, and with answers kept
    (``candidates_cache_mb``): two paths to the mirror."""
    url, drop = create_database(tmp_path_factory, "ahead")
    prepare(url)
    conf = make_conf(url, allotment__candidates_cache_mb=request.param)
    client = ApiClient(Application(conf, database_from_config(conf)), version="1.39")
    for name in ("h1", "h2"):
        rp = client.post("/resource_providers", json={"name": name, "uuid": new_uuid()}).json
        assert client.put(f"/resource_providers/{rp['uuid']}/inventories", json={
            "resource_provider_generation": rp["generation"], "inventories": {"VCPU": {"total": 4}}}).status == 200
    yield client
    drop()


def test_a_transaction_older_than_the_mirror_begins_again(api, monkeypatch):
    api.get(QUERY)  # the mirror read, at the current number
    real = changes.read_number
    numbers = []

    def older_first(conn):
        number, due = real(conn)
        numbers.append(number)
        return (number - 1 if len(numbers) == 1 else number), due

    def no_database_path(*args, **kwargs):
        raise AssertionError("read the database instead of the mirror")

    monkeypatch.setattr(api_candidates.changes, "read_number", older_first)
    monkeypatch.setattr(db_candidates, "load_candidates", no_database_path)
    answer = api.get(ASKED).json
    assert len(numbers) == 2  # one transaction begun again
    monkeypatch.undo()
    assert answer == api.get(ASKED).json and len(answer["allocation_requests"]) == 2
    assert api.application.state.mirror.full_reads == 1


def test_the_database_is_read_when_the_mirror_stays_ahead(api, monkeypatch):
    """Each transaction begun again still older (never the case for long): after
    AHEAD_RETRIES of them the request reads the database, as without a mirror."""
    api.get(QUERY)
    real = changes.read_number
    calls = []

    def always_older(conn):
        number, due = real(conn)
        calls.append(number)
        return number - 1, due

    monkeypatch.setattr(api_candidates.changes, "read_number", always_older)
    answer = api.get(ASKED).json
    assert len(calls) == api_candidates.AHEAD_RETRIES + 1
    monkeypatch.undo()
    assert answer == api.get(ASKED).json and len(answer["allocation_requests"]) == 2
