"""Faults between the server and its database end in a clear answer.

The database is reached through a TCP proxy (tests/ha/proxy.py) that can
refuse every connection or cut one at its ``COMMIT``; the driver, the
database and the whole application are real.

* While the database cannot be reached: ``503`` in Placement's error format
  with ``Retry-After``, a body that says the database is unavailable and
  nothing of its address or user; ``GET /healthcheck`` answers 503 too, and
  ``GET /`` stays as Placement defines it.  Once it can be reached again the
  same application answers without being restarted.
* A connection lost during ``COMMIT``: the change may have been made or
  not, and the answer says exactly that (503, Retry-After).  Repeating the
  request is safe either way: when it was made, the consumer generation the
  repeat carries no longer matches (409) and nothing is allocated twice;
  when it was not, the repeat makes it.

Server databases only: SQLite has no connection to lose.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from allotment.api.app import Application
from allotment.db import tables
from allotment.service import database_from_config
from tests.conftest import BACKEND, ApiClient, _empty_tables, make_conf, new_uuid
from tests.ha.proxy import FaultProxy

pytestmark = pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite has no server connection to lose")


@pytest.fixture
def proxy(db_url):
    url = sa.engine.make_url(db_url)
    running = FaultProxy(url.host, url.port or (5432 if BACKEND == "postgresql" else 3306))
    yield running
    running.close()


@pytest.fixture
def faulty(db_url, proxy):
    """A client of an application whose database connections go through the proxy."""
    conf = make_conf(proxy.url(db_url))
    application = Application(conf, database_from_config(conf))
    _empty_tables(application.db.engine)
    yield ApiClient(application)
    application.db.dispose()


def _provider(client: ApiClient, vcpus: int = 8) -> str:
    uuid = new_uuid()
    assert client.post("/resource_providers", json={"name": f"rp-{uuid[:8]}", "uuid": uuid}).status in (200, 201)
    resp = client.put(f"/resource_providers/{uuid}/inventories",
                      json={"resource_provider_generation": 0, "inventories": {"VCPU": {"total": vcpus}}})
    assert resp.status == 200, resp
    return uuid


def _claim(rp: str, vcpus: int, generation) -> dict:
    return {"allocations": {rp: {"resources": {"VCPU": vcpus}}}, "project_id": new_uuid(),
            "user_id": new_uuid(), "consumer_generation": generation}


def _allocated(db_url: str, consumer: str) -> list[tuple]:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            alloc = tables.allocations
            return conn.execute(sa.select(alloc.c.resource_provider_id, alloc.c.used)
                                .where(alloc.c.consumer_id == consumer)).all()
    finally:
        engine.dispose()


def _assert_says_unavailable(resp, db_url: str) -> None:
    assert resp.status == 503, resp
    assert resp.headers["Retry-After"].isdigit()
    error = resp.error()
    assert error["title"] == "Service Unavailable"
    assert "database is unavailable" in error["detail"]
    url = sa.engine.make_url(db_url)
    # The request id is random hex, which may hold the port's digits ("3306"
    # was seen in one): the rest of the answer must not.
    text = resp.text.replace(error["request_id"], "")
    for secret in (url.host, str(url.port), url.username, url.database):
        assert secret and secret not in text, secret


def test_an_unreachable_database_is_a_503_with_retry_after_and_recovery_needs_no_restart(faulty, proxy,
                                                                                          db_url):
    rp = _provider(faulty)
    proxy.down()
    _assert_says_unavailable(faulty.get("/resource_providers", version="1.23"), db_url)
    # A write is refused the same way, and nothing was written.
    _assert_says_unavailable(faulty.put(f"/allocations/{new_uuid()}", json=_claim(rp, 1, None), version="1.28"),
                             db_url)
    _assert_says_unavailable(faulty.get("/allocation_candidates?resources=VCPU:1"), db_url)
    # The load balancer's check says so; Placement's root document does not change.
    health = faulty.request("GET", "/healthcheck", version=None, token="", headers={"Accept": "text/plain"})
    assert (health.status, health.text) == (503, "The database is unavailable")
    root = faulty.get("/", token="")
    assert root.status == 200 and root.json["versions"][0]["id"] == "v1.0"

    proxy.up()
    assert faulty.get("/resource_providers").status == 200
    health = faulty.request("GET", "/healthcheck", version=None, token="", headers={"Accept": "text/plain"})
    assert (health.status, health.text) in ((200, "OK"), (503, "The database is unavailable"))
    assert faulty.put(f"/allocations/{new_uuid()}", json=_claim(rp, 1, None), version="1.28").status == 204


@pytest.mark.parametrize("how", ["deliver", "withhold"])
def test_a_commit_whose_connection_is_lost_is_said_to_be_unknown_and_the_repeat_is_safe(faulty, proxy,
                                                                                         db_url, how):
    rp = _provider(faulty, vcpus=4)
    consumer = new_uuid()
    body = _claim(rp, 3, None)
    proxy.cut_at_commit(how)
    first = faulty.put(f"/allocations/{consumer}", json=body, version="1.28")
    assert proxy.cut_commits == [how]
    assert first.status == 503, first
    assert first.headers["Retry-After"].isdigit()
    assert "may or may not have been made" in first.error()["detail"]
    made = bool(_allocated(db_url, consumer))
    assert made == (how == "deliver")

    # The client repeats the very same request.
    again = faulty.put(f"/allocations/{consumer}", json=body, version="1.28")
    if made:
        assert again.status == 409, again
        assert again.error()["code"] == "placement.concurrent_update"
    else:
        assert again.status == 204, again
    # Exactly one claim of 3, whichever way it went: nothing twice, nothing over capacity.
    assert [used for _, used in _allocated(db_url, consumer)] == [3]
    usages = faulty.get(f"/resource_providers/{rp}/usages").json["usages"]
    assert usages == {"VCPU": 3}
    held = faulty.get(f"/allocations/{consumer}", version="1.28").json
    assert held["consumer_generation"] == 1


def test_post_allocations_repeated_after_an_unknown_outcome_is_not_applied_twice(faulty, proxy, db_url):
    rp = _provider(faulty, vcpus=4)
    consumers = [new_uuid(), new_uuid()]
    body = {consumer: _claim(rp, 2, None) for consumer in consumers}
    proxy.cut_at_commit("deliver")
    assert faulty.post("/allocations", json=body, version="1.28").status == 503
    again = faulty.post("/allocations", json=body, version="1.28")
    assert again.status == 409, again
    assert faulty.get(f"/resource_providers/{rp}/usages").json["usages"] == {"VCPU": 4}


def test_the_wsgi_entry_point_answers_503_without_the_address_while_the_database_is_down(db_url, proxy):
    """``allotment.wsgi:application`` builds the application at its first request:
    with the database down that is a 503 in the same form, and the next
    request after it is back is served."""
    import webob

    from allotment import service
    from allotment.wsgi import _LazyApplication

    conf = make_conf(proxy.url(db_url))
    application = _LazyApplication(init=lambda: service.build_application(conf))
    proxy.down()
    req = webob.Request.blank("/resource_providers", headers={"X-Auth-Token": "admin",
                                                              "Accept": "application/json"})
    from tests.conftest import Response

    _assert_says_unavailable(Response(req.get_response(application)), db_url)
    proxy.up()
    assert req.get_response(application).status_code == 200
    application._app.db.dispose()


def test_a_lost_connection_empties_what_is_kept_by_provider_generation(faulty, proxy):
    """Generations say which state of a provider a kept value is only within
    one history: after a restart or failover (possibly to an older copy)
    nothing read before is trusted."""
    _provider(faulty)
    state = faulty.application.state
    state.mirror = None  # the database path, as on MySQL/MariaDB
    state.answers = None
    kept = state.providers
    assert faulty.get("/allocation_candidates?resources=VCPU:1").status == 200
    assert kept.providers._entries and kept.traits._entries
    proxy.down()
    assert faulty.get("/allocation_candidates?resources=VCPU:1").status == 503
    assert not kept.providers._entries and not kept.traits._entries
    proxy.up()
    assert faulty.get("/allocation_candidates?resources=VCPU:1").status == 200
