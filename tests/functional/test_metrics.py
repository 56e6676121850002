"""GET /metrics: off unless configured, guarded like any route unless
opened, counting requests, conflicts, retries and candidates; capacity
gauges equal to what the inventories and usages APIs report; and, from a
multi-worker ``allotment serve``, every worker's requests counted.
"""

from __future__ import annotations

import json
import re
import threading

import pytest
import requests

from allotment.api.app import Application
from allotment.service import database_from_config
from tests.conftest import ApiClient, _empty_tables, create_database, make_conf
from tests.functional.test_allocation_candidates import AGG_A, AGG_B, Cloud
from tests.functional.test_server import serve, write_config

SAMPLE = re.compile(r'^(?P<name>[a-z_]+)(\{(?P<labels>.*)\})? (?P<value>\S+)$')


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Exposition text as {(name, {label=value...}): value}."""
    found = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
            found[(match["name"], labels)] = float(match["value"])
    return found


def value(found: dict, name: str, **labels) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def metered(db_url):
    """An application with [allotment] metrics on (one process: its own registry)."""

    def build(**options):
        conf = make_conf(db_url, allotment__metrics=True, **options)
        app = Application(conf, database_from_config(conf))
        _empty_tables(app.db.engine)
        built.append(app)
        return app, ApiClient(app)

    built: list[Application] = []
    yield build
    for app in built:
        app.db.dispose()


def scrape(api, **kw) -> dict:
    resp = api.get("/metrics", headers={"Accept": "text/plain"}, **kw)
    assert resp.status == 200, resp
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return samples(resp.text)


def test_off_unless_configured(api):
    assert api.get("/metrics").status == 404


def test_guarded_like_any_route_unless_opened(metered):
    _, api = metered()
    assert api.get("/metrics", token="").status == 401
    resp = api.get("/metrics", token="demo")
    assert resp.status == 403 and "allotment:metrics" in resp.error()["detail"]
    _, public = metered(allotment__metrics_public=True)
    assert public.get("/metrics", token="").status == 200
    assert public.get("/resource_providers", token="").status == 401  # only /metrics is opened


def test_requests_by_route_template_method_and_status(metered):
    _, api = metered()
    cloud = Cloud(api)
    cn = cloud.provider("cn1", inventories={"VCPU": 8})
    api.get(f"/resource_providers/{cn}")
    api.get("/resource_providers/not-a-provider")
    api.get("/no/such/path")
    api.request("BREW", "/resource_providers")
    found = scrape(api)
    template = "/resource_providers/{uuid}"
    # Cloud.put reads the provider once, and we asked once: 2 answers of 200.
    assert value(found, "allotment_http_requests_total", route=template, method="GET", status="200") == 2
    assert value(found, "allotment_http_requests_total", route=template, method="GET", status="404") == 1
    assert value(found, "allotment_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert value(found, "allotment_http_requests_total", route="/resource_providers", method="other",
                 status="405") == 1
    assert value(found, "allotment_http_request_duration_seconds_count", route=template, method="GET",
                 status="200") == 2
    assert value(found, "allotment_http_request_duration_seconds_bucket", route=template, method="GET",
                 status="200", le="+Inf") == 2


def test_generation_conflicts_per_route(metered):
    _, api = metered()
    cn = Cloud(api).provider("cn1")
    resp = api.put(f"/resource_providers/{cn}/inventories",
                   json={"resource_provider_generation": 99, "inventories": {"VCPU": {"total": 1}}})
    assert resp.status == 409 and resp.error()["code"] == "placement.concurrent_update"
    found = scrape(api)
    assert value(found, "allotment_generation_conflicts_total", route="/resource_providers/{uuid}/inventories",
                 method="PUT") == 1


def test_candidates_returned(metered):
    _, api = metered()
    cloud = Cloud(api)
    for name in ("cn1", "cn2", "cn3"):
        cloud.provider(name, inventories={"VCPU": 8})
    assert api.get("/allocation_candidates?resources=VCPU:1").status == 200
    assert api.get("/allocation_candidates?resources=VCPU:100").status == 200
    found = scrape(api)
    assert value(found, "allotment_allocation_candidates_returned_count") == 2
    assert value(found, "allotment_allocation_candidates_returned_sum") == 3
    assert value(found, "allotment_allocation_candidates_returned_bucket", le="0.0") == 1


def test_database_retries(metered):
    app, api = metered()

    class Lost(Exception):
        pass

    tries = []

    def work(conn):
        tries.append(1)
        if len(tries) < 3:
            raise Lost()

    app.db.run_write(work, retry_on=(Lost,), retries=5)
    assert value(scrape(api), "allotment_database_retries_total", reason="race") == 2


def test_capacity_gauges_equal_what_the_api_reports(metered):
    _, api = metered(allotment__metrics_capacity_cache_seconds=0)
    cloud = Cloud(api)
    cloud.provider("cn1", inventories={"VCPU": {"total": 16, "reserved": 2, "allocation_ratio": 1.5},
                                       "MEMORY_MB": {"total": 4096, "reserved": 512}}, aggregates=(AGG_A,))
    cloud.provider("numa0", "cn1", inventories={"VCPU": {"total": 7, "allocation_ratio": 1.3}})
    cloud.provider("cn2", inventories={"VCPU": 8, "DISK_GB": 100}, aggregates=(AGG_A, AGG_B))
    cloud.provider("ss", inventories={"DISK_GB": {"total": 1000, "reserved": 10}},
                   traits=("MISC_SHARES_VIA_AGGREGATE",), aggregates=(AGG_B,))
    cloud.allocate({"cn1": {"VCPU": 5, "MEMORY_MB": 1024}, "numa0": {"VCPU": 2}, "ss": {"DISK_GB": 50}})
    cloud.allocate({"cn2": {"VCPU": 1, "DISK_GB": 10}})
    # What the API says, provider by provider: inventories (capacity as
    # the API computes it) and usages.
    expected: dict[str | None, dict[str, dict[str, int]]] = {}
    members = {"cn1": {AGG_A}, "numa0": {AGG_A}, "cn2": {AGG_A, AGG_B}, "ss": {AGG_B}}  # numa0 by its root
    for name, uuid in cloud.names.items():
        inventories = api.get(f"/resource_providers/{uuid}/inventories").json["inventories"]
        usages = api.get(f"/resource_providers/{uuid}/usages").json["usages"]
        for where in [None, *members[name]]:
            for rc, inv in inventories.items():
                sums = expected.setdefault(where, {}).setdefault(rc, dict(total=0, reserved=0, capacity=0, used=0))
                sums["total"] += inv["total"]
                sums["reserved"] += inv["reserved"]
                sums["capacity"] += int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
                sums["used"] += usages[rc]
    found = scrape(api)
    for where, classes in expected.items():
        for rc, sums in classes.items():
            for field, amount in sums.items():
                if where is None:
                    got = value(found, f"allotment_resource_{field}", resource_class=rc)
                else:
                    got = value(found, f"allotment_aggregate_resource_{field}", aggregate=where, resource_class=rc)
                assert got == amount, (where, rc, field)
    assert value(found, "allotment_resource_capacity", resource_class="VCPU") == 21 + 9 + 8
    assert value(found, "allotment_resource_used", resource_class="VCPU") == 8


def test_capacity_is_read_once_per_cache_period(metered, monkeypatch):
    from allotment.db import resource_totals

    calls = []
    real = resource_totals.capacity_sums
    monkeypatch.setattr(resource_totals, "capacity_sums", lambda conn: calls.append(1) or real(conn))
    _, api = metered(allotment__metrics_capacity_cache_seconds=3600)
    scrape(api)
    scrape(api)
    assert len(calls) == 1


# -- several workers, one count ------------------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """allotment serve with metrics on, three workers of one thread each."""
    url, drop = create_database(tmp_path_factory, "metrics")
    config = write_config(tmp_path_factory.mktemp("metrics"), url, extra="""
        [allotment]
        metrics = true
        """)
    server = serve(config, "--workers", "3", "--threads", "1")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        drop()


def test_a_multi_worker_server_counts_every_worker(live):
    sent = 0
    lock = threading.Lock()

    def client():
        nonlocal sent
        for _ in range(15):
            # A new connection each time, so the workers share the load.
            resp = requests.get(live.url + "/resource_providers", headers={"X-Auth-Token": "admin"}, timeout=30)
            assert resp.status_code == 200
            with lock:
                sent += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pids = {line.split()[2] for line in live.log().splitlines() if '"GET /resource_providers"' in line}
    assert len(pids) >= 2, pids
    resp = requests.get(live.url + "/metrics", headers={"X-Auth-Token": "admin"}, timeout=30)
    assert resp.status_code == 200, resp.text
    found = samples(resp.text)
    assert value(found, "allotment_http_requests_total", route="/resource_providers", method="GET",
                 status="200") == sent == 60
    assert value(found, "allotment_http_request_duration_seconds_count", route="/resource_providers",
                 method="GET", status="200") == 60


def test_allotment_explain_asks_a_running_server(live, capsys):
    from allotment import cli

    assert cli.main(["explain", "--url", live.url, "--token", "admin", "--json", "resources=VCPU:1"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["verdict"] == "0/0 trees can serve this request."
    assert cli.main(["explain", "--url", live.url, "--token", "demo", "resources=VCPU:1"]) == 1
    assert capsys.readouterr().err.startswith("403 Forbidden")
