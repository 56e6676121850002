"""Racing claims against several live server processes on one database.

Two ``allotment serve`` processes with four workers each share one database
(the backend of ``ALLOTMENT_TEST_BACKEND``).  32 client threads, spread over
both servers, race for a few providers that are nearly full:

* claiming for new consumers (``PUT /allocations/{c}`` and two consumers at
  a time with ``POST /allocations``), then often giving the claim back
  (``DELETE``, or ``PUT`` of empty allocations with the generation), so the
  providers stay at the edge of their capacity;
* rewriting a few shared consumers: read the generation, write new
  allocations under it.

Every answer is recorded, and afterwards the database must agree with the
answers exactly:

* no provider is over capacity, for any class;
* every 2xx write is there exactly once (one row per provider and class,
  the amounts written), and nothing that was given back remains;
* every 409 left nothing behind (no allocations, no consumer record);
* the successful rewrites of each shared consumer form one unbroken chain of
  generations (no two writers won with the same generation: no lost update),
  and the consumer holds what the last one wrote;
* usages (per provider and per project) equal the sum of the allocations,
  and equal the sum the clients' answers imply;
* no 5xx, no dropped connection.
"""

from __future__ import annotations

import collections
import random
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field

import pytest
import requests
import sqlalchemy as sa

from allotment import service
from allotment.db import tables
from allotment.db.engine import Database, utcnow
from tests.conftest import BACKEND, create_database
from tests.functional.test_server import serve, write_config
from tests.ha.galera import spread

SERVERS = 2
WORKERS = 4
CLIENT_THREADS = 32
RACE_SECONDS = 12
PROVIDERS = 4
# Each provider: 16 VCPU / 2048 MB, 12 / 1536 of them taken before the race.
INVENTORY = {"VCPU": 16, "MEMORY_MB": 2048}
PREFILLED = {"VCPU": 12, "MEMORY_MB": 1536}
SHARED_CONSUMERS = 4
PROJECT = "race-project"

def _uuid() -> str:
    return str(uuidlib.uuid4())


def _seed_providers(url: str) -> list[str]:
    db = Database(url)
    service.prepare_database(db)
    uuids = [_uuid() for _ in range(PROVIDERS)]
    rp = tables.resource_providers
    with db.write() as conn:
        ids = dict(conn.execute(sa.select(tables.resource_classes.c.name, tables.resource_classes.c.id)
                                .where(tables.resource_classes.c.name.in_(INVENTORY))).all())
        for index, uuid in enumerate(uuids):
            now = utcnow()
            pid = conn.execute(sa.insert(rp).values(uuid=uuid, name=f"race-{index}", generation=0,
                                                    created_at=now)).inserted_primary_key[0]
            conn.execute(sa.update(rp).where(rp.c.id == pid).values(root_provider_id=pid))
            for name, total in INVENTORY.items():
                conn.execute(sa.insert(tables.inventories).values(
                    resource_provider_id=pid, resource_class_id=ids[name], total=total, reserved=0,
                    min_unit=1, max_unit=total, step_size=1, allocation_ratio=1.0, created_at=now))
    db.dispose()
    return uuids


class Client:
    """One thread's HTTP session to one server, at microversion 1.28."""

    def __init__(self, base_url: str):
        self.base = base_url
        self.session = requests.Session()
        self.session.headers.update({"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.28",
                                     "Accept": "application/json"})

    def call(self, method: str, path: str, json=None) -> requests.Response:
        return self.session.request(method, self.base + path, json=json, timeout=60)


def _body(allocations: dict, generation: int | None) -> dict:
    return {"allocations": allocations, "project_id": PROJECT, "user_id": "race-user",
            "consumer_generation": generation}


@dataclass
class Ledger:
    """What the clients were told, to compare with what the database holds."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    held: dict[str, dict] = field(default_factory=dict)        # consumer -> allocations it holds
    released: set[str] = field(default_factory=set)            # claimed, then given back
    refused: set[str] = field(default_factory=set)             # 409 on creation
    chains: dict[str, list[tuple[int, dict]]] = field(default_factory=lambda: collections.defaultdict(list))
    statuses: collections.Counter = field(default_factory=collections.Counter)
    unexpected: list[str] = field(default_factory=list)

    def answer(self, what: str, response: requests.Response, allowed: tuple[int, ...]) -> int:
        with self.lock:
            self.statuses[(what, response.status_code)] += 1
            if response.status_code not in allowed:
                self.unexpected.append(f"{what}: {response.status_code} {response.text[:300]}")
        return response.status_code


def _claim(providers: list[str], rng: random.Random) -> dict:
    chosen = rng.sample(providers, rng.choice((1, 1, 2)))
    return {rp: {"resources": {"VCPU": rng.randint(1, 2), "MEMORY_MB": 64 * rng.randint(1, 4)}} for rp in chosen}


def _worker(client: Client, providers: list[str], shared: list[str], ledger: Ledger, deadline: float,
            seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        try:
            action = rng.random()
            if action < 0.45:
                _new_consumer(client, providers, ledger, rng)
            elif action < 0.6:
                _two_consumers(client, providers, ledger, rng)
            else:
                _rewrite_shared(client, providers, rng.choice(shared), ledger, rng)
        except requests.RequestException as error:
            with ledger.lock:
                ledger.unexpected.append(f"connection: {error!r}")


def _new_consumer(client: Client, providers: list[str], ledger: Ledger, rng: random.Random) -> None:
    consumer, allocations = _uuid(), _claim(providers, rng)
    status = ledger.answer("claim", client.call("PUT", f"/allocations/{consumer}", _body(allocations, None)),
                           (204, 409))
    if status != 204:
        with ledger.lock:
            ledger.refused.add(consumer)
        return
    with ledger.lock:
        ledger.held[consumer] = allocations
    if rng.random() < 0.6:
        _give_back(client, consumer, ledger, rng)


def _two_consumers(client: Client, providers: list[str], ledger: Ledger, rng: random.Random) -> None:
    pair = {_uuid(): _claim(providers, rng) for _ in range(2)}
    data = {c: {**_body(allocs, None)} for c, allocs in pair.items()}
    status = ledger.answer("post", client.call("POST", "/allocations", data), (204, 409))
    with ledger.lock:
        if status == 204:
            ledger.held.update(pair)
        else:
            ledger.refused.update(pair)
    if status == 204 and rng.random() < 0.6:
        for consumer in pair:
            _give_back(client, consumer, ledger, rng)


def _give_back(client: Client, consumer: str, ledger: Ledger, rng: random.Random) -> None:
    if rng.random() < 0.5:
        response = client.call("DELETE", f"/allocations/{consumer}")
    else:
        response = client.call("PUT", f"/allocations/{consumer}", _body({}, 1))
    # Only this thread knows the consumer: giving it back must succeed.
    if ledger.answer("give back", response, (204,)) == 204:
        with ledger.lock:
            del ledger.held[consumer]
            ledger.released.add(consumer)


def _rewrite_shared(client: Client, providers: list[str], consumer: str, ledger: Ledger,
                    rng: random.Random) -> None:
    current = client.call("GET", f"/allocations/{consumer}")
    if ledger.answer("read shared", current, (200,)) != 200:
        return
    generation = current.json().get("consumer_generation")  # absent: no allocations yet
    allocations = {rng.choice(providers): {"resources": {"VCPU": 1, "MEMORY_MB": 64 * rng.randint(1, 2)}}}
    status = ledger.answer("rewrite shared", client.call("PUT", f"/allocations/{consumer}",
                                                         _body(allocations, generation)), (204, 409))
    if status == 204:
        with ledger.lock:
            ledger.chains[consumer].append((generation, allocations))


def _rows(db: Database) -> list[tuple]:
    a, rp, rc = tables.allocations, tables.resource_providers, tables.resource_classes
    with db.read() as conn:
        return conn.execute(sa.select(a.c.consumer_id, rp.c.uuid, rc.c.name, a.c.used)
                            .join(rp, rp.c.id == a.c.resource_provider_id)
                            .join(rc, rc.c.id == a.c.resource_class_id)).all()


def _consumer_records(db: Database) -> dict[str, int]:
    with db.read() as conn:
        return dict(conn.execute(sa.select(tables.consumers.c.uuid, tables.consumers.c.generation)).all())


def _as_rows(consumer: str, allocations: dict) -> set[tuple]:
    return {(consumer, rp, name, amount) for rp, entry in allocations.items()
            for name, amount in entry["resources"].items()}


@pytest.fixture
def race_database(tmp_path_factory):
    url, drop = create_database(tmp_path_factory, "race")
    yield url
    drop()


#: ``[allotment] claims_together`` (PostgreSQL): the claims waiting in a
#: worker at once are committed in groups; the race must end the same.
TOGETHER = "[allotment]\nclaims_together = true\nmetrics = true\n"


@pytest.mark.parametrize("together", [False, pytest.param(True, marks=pytest.mark.skipif(
    BACKEND != "postgresql", reason="claims are grouped on PostgreSQL"))], ids=["alone", "together"])
def test_racing_claims_never_over_allocate_nor_lose_writes(race_database, tmp_path, together):
    providers = _seed_providers(race_database)
    # On the Galera pass each server goes through its own node.
    servers = [serve(write_config(tmp_path / f"host{i}", url, extra=TOGETHER if together else ""),
                     "--workers", str(WORKERS), "--threads", "4", log_name=f"server{i}.log")
               for i, url in enumerate(spread(race_database, SERVERS))]
    db = Database(race_database)
    try:
        for server in servers:
            server.wait_ready()
        setup = Client(servers[0].url)
        ledger = Ledger()
        for rp in providers:
            filler = _uuid()
            allocations = {rp: {"resources": dict(PREFILLED)}}
            assert setup.call("PUT", f"/allocations/{filler}", _body(allocations, None)).status_code == 204
            ledger.held[filler] = allocations
        # Shared consumers start without allocations: their first writer
        # passes a null generation.
        shared = [_uuid() for _ in range(SHARED_CONSUMERS)]

        deadline = time.monotonic() + RACE_SECONDS
        threads = [threading.Thread(target=_worker, args=(Client(servers[i % SERVERS].url), providers, shared,
                                                          ledger, deadline, i))
                   for i in range(CLIENT_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=RACE_SECONDS + 120)
        assert not any(thread.is_alive() for thread in threads), "a client thread hung"
        _verify(db, setup, providers, shared, ledger)
        if together:
            # The claims did meet in groups (every worker's count, whichever
            # answers).  At the edge of capacity most groups are refused and
            # written again claim by claim: both outcomes count.
            grouped = [line for server in servers
                       for line in Client(server.url).call("GET", "/metrics").text.splitlines()
                       if line.startswith("allotment_grouped_claims_total{")]
            assert sum(float(line.split()[-1]) for line in grouped) > 0, grouped
            print(f"[{BACKEND}] grouped claims: {grouped}")
    finally:
        for server in servers:
            server.stop()
        db.dispose()


def _verify(db: Database, client: Client, providers: list[str], shared: list[str], ledger: Ledger) -> None:
    print(f"\n[{BACKEND}] answers: {dict(sorted(ledger.statuses.items()))}")
    assert not ledger.unexpected, "unexpected answers:\n" + "\n".join(ledger.unexpected[:20])
    assert ledger.statuses[("claim", 204)] > 0 and ledger.statuses[("claim", 409)] > 0, \
        "the race never reached the providers' capacity"
    assert ledger.statuses[("rewrite shared", 204)] > 0

    rows = _rows(db)
    records = _consumer_records(db)
    # Exactly once: never two rows for one consumer, provider and class.
    keys = collections.Counter((consumer, rp, name) for consumer, rp, name, _used in rows)
    assert [key for key, n in keys.items() if n > 1] == []

    # Shared consumers: one unbroken chain of generations, ending in the last write.
    expected = {consumer: allocations for consumer, allocations in ledger.held.items()}
    for consumer in shared:
        chain = sorted(ledger.chains.get(consumer, []), key=lambda link: -1 if link[0] is None else link[0])
        if not chain:
            continue
        generations = [generation for generation, _ in chain]
        assert generations == [None] + list(range(1, len(chain))), (consumer, generations)
        assert records[consumer] == len(chain)
        expected[consumer] = chain[-1][1]

    actual = collections.defaultdict(set)
    for consumer, rp, name, used in rows:
        actual[consumer].add((consumer, rp, name, used))
    for consumer, allocations in expected.items():
        assert actual.get(consumer, set()) == _as_rows(consumer, allocations), consumer
        assert consumer in records
    # Refused and given back: nothing left behind, not even a consumer record.
    for consumer in ledger.refused | ledger.released:
        assert consumer not in actual and consumer not in records, consumer
    assert set(actual) == set(expected)

    # Capacity, and usages equal to the sums (the database's and the clients').
    sums = collections.defaultdict(int)
    for consumer, rp, name, used in rows:
        sums[(rp, name)] += used
    implied = collections.defaultdict(int)
    for consumer, allocations in expected.items():
        for rp, entry in allocations.items():
            for name, amount in entry["resources"].items():
                implied[(rp, name)] += amount
    assert dict(sums) == dict(implied)
    for rp in providers:
        usages = client.call("GET", f"/resource_providers/{rp}/usages").json()["usages"]
        for name, total in INVENTORY.items():
            assert sums[(rp, name)] <= total, f"{rp} over capacity for {name}: {sums[(rp, name)]} > {total}"
            assert usages[name] == sums[(rp, name)]
    totals = client.call("GET", f"/usages?project_id={PROJECT}").json()["usages"]
    for name in INVENTORY:
        assert totals[name] == sum(sums[(rp, name)] for rp in providers)
