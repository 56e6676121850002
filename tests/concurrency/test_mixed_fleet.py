"""A mixed fleet: Allotment and the reference Placement serving one database at once.

Opt-in, not part of CI (it takes a minute or two)::

    ALLOTMENT_MIXED_FLEET=1 ALLOTMENT_TEST_BACKEND=postgresql \\
        .venv/bin/python -m pytest -q -n 0 -s tests/concurrency/test_mixed_fleet.py

(``ALLOTMENT_TEST_BACKEND=mysql`` for MariaDB/MySQL; SQLite is not a fleet
backend and skips).  It skips with a message when the variable is unset and
when the reference's venv (``shared/reference/serve``) is absent.
``ALLOTMENT_TEST_PORTS=LOW-HIGH`` keeps the servers' ports in a range.

The database is set up in the realistic order: a fresh database,
``placement-manage db sync`` (the reference's own migrations), then
``allotment db sync`` taking it over.  One reference server and one
Allotment server (two workers each) then serve it together.  The providers
are seeded through the reference's API with small capacities that exercise
``reserved`` and ``allocation_ratio``; client threads, alternating between
the two servers, race for them:

* claims for new consumers with ``PUT /allocations/{c}`` at 1.28 and at
  1.12 (no consumer generation, the way older nova writes), and for two
  consumers at once with ``POST /allocations``; a 409
  ``placement.concurrent_update`` is retried, as nova does;
* moves (``POST /allocations`` emptying the old consumer and claiming for a
  new one, as nova's migrations do) and give-backs (``DELETE`` or an empty
  ``PUT`` with the generation);
* rewrites of a few shared consumers under the generation just read.

The shared consumers are created before the race: racing to *create* one
consumer is the second test's subject.

What the reference itself does wrong under this race (Placement 16.0.0, read
from its behaviour and code; not Allotment's to fix):

* it over-allocates, on PostgreSQL and MariaDB, also with two reference
  servers and no Allotment: after a provider generation conflict it retries
  the write inside the same transaction, where its own first attempt's rows
  count as the provider's "previous usage", so an over-capacity claim passes
  as "reducing an existing overage";
* when its INSERT of a new consumer meets another request's row, it re-reads
  the consumer and goes on from that generation, whatever the client sent:
  both creators of one consumer can succeed;
* on PostgreSQL it can answer 500 (``InFailedSqlTransaction``) after such a
  failed statement; such a 500 is reported, and must have written nothing.

So the race test is marked xfail when the only writes that took a provider
over capacity were the reference's (the watcher below names them), and the
creation test when the reference let both creators succeed; either still
fails on anything Allotment did.

A watcher samples the allocations (SQL, every few milliseconds) during the
race and names the writes that took a provider over capacity, if any.
Afterwards, from SQL and through both APIs:

* no provider holds more than ``(total - reserved) * allocation_ratio`` of
  any class, at the end nor in any sample taken during the race;
* every 2xx claim is there exactly once with its amounts (also as both
  servers show it), every refused or given-back one is absent;
* the successful rewrites of each shared consumer form one unbroken chain of
  generations (no two writers won with the same generation);
* usages (``/resource_providers/{u}/usages`` and ``/usages``) equal the SQL
  sums of the allocations, and both servers answer the same.

``ALLOTMENT_MIXED_FLEET_PAIR`` picks the fleet: ``mixed`` (default: one of
each), ``reference`` (two reference servers) or ``allotment`` (two Allotment
servers): the same race, to tell whose writer is at fault when one fails.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import requests
import sqlalchemy as sa

from allotment.db import tables
from allotment.db.engine import Database
from tests import reference
from tests.conftest import BACKEND
from tests.concurrency.test_claim_race import _as_rows, _consumer_records, _rows
from tests.functional.test_server import LiveServer, allotment_command, clean_env, run_allotment, write_config

if os.environ.get("ALLOTMENT_MIXED_FLEET") != "1":
    pytest.skip("the mixed-fleet race is opt-in: set ALLOTMENT_MIXED_FLEET=1 (takes a minute or two)",
                allow_module_level=True)
if BACKEND not in ("postgresql", "mysql"):
    pytest.skip(f"the mixed-fleet race needs a server database (ALLOTMENT_TEST_BACKEND=postgresql or mysql), "
                f"not {BACKEND}", allow_module_level=True)
if reference.ensure_venv() is None or reference.serve_script() is None:
    pytest.skip("the reference Placement's venv is absent (shared/reference/serve builds it): "
                "no mixed fleet to test", allow_module_level=True)

PAIR = os.environ.get("ALLOTMENT_MIXED_FLEET_PAIR", "mixed")
KINDS = {"mixed": ("reference", "allotment"), "reference": ("reference", "reference"),
         "allotment": ("allotment", "allotment")}[PAIR]
WORKERS = 2
CLIENT_THREADS = 24
RACE_SECONDS = float(os.environ.get("ALLOTMENT_MIXED_FLEET_SECONDS", "20"))
PROVIDERS = 4
# Capacity per provider: VCPU (8 - 0) * 2.0 = 16, MEMORY_MB (2304 - 256) * 1.0 = 2048.
INVENTORY = {"VCPU": {"total": 8, "reserved": 0, "allocation_ratio": 2.0},
             "MEMORY_MB": {"total": 2304, "reserved": 256, "allocation_ratio": 1.0}}
CAPACITY = {name: int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
            for name, inv in INVENTORY.items()}
PREFILLED = {"VCPU": 8, "MEMORY_MB": 1024}
SHARED_CONSUMERS = 4
PROJECT = "fleet-project"
USER = "fleet-user"
RETRIES = 5


def _uuid() -> str:
    return str(uuidlib.uuid4())


class Client:
    """One thread's HTTP session to one server."""

    def __init__(self, base_url: str, name: str):
        self.base, self.name = base_url, name
        self.session = requests.Session()
        self.session.headers.update({"X-Auth-Token": "admin", "Accept": "application/json"})

    def call(self, method: str, path: str, json=None, version: str = "1.28") -> requests.Response:
        return self.session.request(method, self.base + path, json=json, timeout=60,
                                    headers={"OpenStack-API-Version": f"placement {version}"})


def _code(response: requests.Response) -> str | None:
    try:
        return response.json()["errors"][0].get("code")
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _body(allocations: dict, generation: int | None) -> dict:
    return {"allocations": allocations, "project_id": PROJECT, "user_id": USER,
            "consumer_generation": generation}


@dataclass
class Ledger:
    """What the clients were told, to compare with what the database holds."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    held: dict[str, dict] = field(default_factory=dict)
    writer: dict[str, str] = field(default_factory=dict)      # consumer -> server and kind of write
    released: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)
    chains: dict[str, list[tuple[int | None, dict, str]]] = field(
        default_factory=lambda: collections.defaultdict(list))
    statuses: collections.Counter = field(default_factory=collections.Counter)
    unexpected: list[str] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)

    def answer(self, what: str, client: Client, response: requests.Response,
               allowed: tuple[int, ...]) -> int:
        with self.lock:
            self.statuses[(client.name, what, response.status_code)] += 1
            if response.status_code == 500 and _reference_defect(client, response):
                self.defects.append(f"{client.name} {what}: {response.text[:200]}")
                return 409  # it wrote nothing: checked like a refusal
            if response.status_code not in allowed:
                self.unexpected.append(f"{client.name} {what}: {response.status_code} {response.text[:300]}")
        return response.status_code


def _reference_defect(client: Client, response: requests.Response) -> bool:
    """The reference's own 500 on PostgreSQL when two requests create one consumer at once.

    Placement 16.0.0 catches the duplicate-key error of the losing INSERT
    and carries on in the transaction PostgreSQL has already aborted.  Not
    ours to fix; the checks still require that such a request wrote nothing.
    """
    return client.name.startswith("reference") and "InFailedSqlTransaction" in response.text


def _retrying(client: Client, ledger: Ledger, what: str, method: str, path: str, body: dict,
              version: str = "1.28", allowed: tuple[int, ...] = (204, 409)) -> int:
    """Send a write; on 409 concurrent_update send it again (a few times), as nova does.

    Any other answer outside ``allowed`` is unexpected.
    """
    for _ in range(RETRIES):
        response = client.call(method, path, body, version)
        concurrent = response.status_code == 409 and _code(response) == "placement.concurrent_update"
        status = ledger.answer(what, client, response, allowed + ((409,) if concurrent else ()))
        if not concurrent:
            return status
        with ledger.lock:
            ledger.statuses[(client.name, what, "retried")] += 1
    return status


def _claim(providers: list[str], rng: random.Random) -> dict:
    chosen = rng.sample(providers, rng.choice((1, 1, 2)))
    return {rp: {"resources": {"VCPU": rng.randint(1, 2), "MEMORY_MB": 64 * rng.randint(1, 4)}}
            for rp in chosen}


def _new_consumer(client: Client, providers, ledger: Ledger, rng: random.Random, mine: list) -> None:
    consumer, allocations = _uuid(), _claim(providers, rng)
    version_new = rng.random() >= 0.3
    if not version_new:
        # Before 1.28: no consumer generation in the body.
        status = _retrying(client, ledger, "claim@1.12", "PUT", f"/allocations/{consumer}",
                           {"allocations": allocations, "project_id": PROJECT, "user_id": USER}, "1.12")
    else:
        status = _retrying(client, ledger, "claim", "PUT", f"/allocations/{consumer}",
                           _body(allocations, None))
    if status != 204:
        with ledger.lock:
            ledger.refused.add(consumer)
        return
    with ledger.lock:
        ledger.held[consumer] = allocations
        ledger.writer[consumer] = f"{client.name} {'claim' if version_new else 'claim@1.12'}"
    roll = rng.random()
    if roll < 0.4:
        _give_back(client, consumer, ledger, rng)
    elif roll < 0.7:
        mine.append(_move(client, providers, consumer, allocations, ledger, rng))
    else:
        mine.append(consumer)


def _two_consumers(client: Client, providers, ledger: Ledger, rng: random.Random, mine: list) -> None:
    pair = {_uuid(): _claim(providers, rng) for _ in range(2)}
    status = _retrying(client, ledger, "post", "POST", "/allocations",
                       {c: _body(allocs, None) for c, allocs in pair.items()})
    with ledger.lock:
        if status == 204:
            ledger.held.update(pair)
            ledger.writer.update({c: f"{client.name} post" for c in pair})
        else:
            ledger.refused.update(pair)
    if status == 204:
        mine.extend(pair)


def _move(client: Client, providers, consumer: str, allocations: dict, ledger: Ledger,
          rng: random.Random) -> str:
    """Hand a consumer's claim over to a new one on one provider (a migration); the holder after."""
    target = _uuid()
    resources = {}
    for entry in allocations.values():
        for name, amount in entry["resources"].items():
            resources[name] = resources.get(name, 0) + amount
    moved = {rng.choice(providers): {"resources": resources}}
    status = _retrying(client, ledger, "move", "POST", "/allocations",
                       {consumer: _body({}, 1), target: _body(moved, None)})
    with ledger.lock:
        if status == 204:
            del ledger.held[consumer]
            ledger.released.add(consumer)
            ledger.held[target] = moved
            ledger.writer[target] = f"{client.name} move"
            return target
        ledger.refused.add(target)
        return consumer


def _give_back(client: Client, consumer: str, ledger: Ledger, rng: random.Random) -> None:
    if rng.random() < 0.5:
        status = ledger.answer("give back", client, client.call("DELETE", f"/allocations/{consumer}"), (204,))
    else:
        status = _retrying(client, ledger, "give back", "PUT", f"/allocations/{consumer}", _body({}, 1),
                           allowed=(204,))
    # Only this thread knows the consumer: giving it back succeeds, or
    # (still 409 concurrent_update after the retries: starved by the other
    # writers) leaves the claim in place, as checked afterwards.
    if status == 204:
        with ledger.lock:
            del ledger.held[consumer]
            ledger.released.add(consumer)


def _rewrite_shared(client: Client, providers, consumer: str, ledger: Ledger, rng: random.Random) -> None:
    current = client.call("GET", f"/allocations/{consumer}")
    if ledger.answer("read shared", client, current, (200,)) != 200:
        return
    generation = current.json().get("consumer_generation")  # absent: no allocations yet
    allocations = {rng.choice(providers): {"resources": {"VCPU": 1, "MEMORY_MB": 64 * rng.randint(1, 2)}}}
    response = client.call("PUT", f"/allocations/{consumer}", _body(allocations, generation))
    if ledger.answer("rewrite shared", client, response, (204, 409)) == 204:
        with ledger.lock:
            ledger.chains[consumer].append((generation, allocations, client.name))
            ledger.writer[consumer] = f"{client.name} rewrite"


def _watch(db: Database, stop: threading.Event, crossings: list) -> None:
    """Sample the allocations while the race runs; when a provider goes over
    capacity, note the rows that appeared since the sample before: the writes
    that pushed it over (their writers are looked up afterwards)."""
    before: set[tuple] = set()
    while not stop.is_set():
        rows = set(_rows(db))
        sums = collections.defaultdict(int)
        for _consumer, rp, name, used in rows:
            sums[(rp, name)] += used
        for (rp, name), used in sums.items():
            if used > CAPACITY[name] and not any(c[0] == (rp, name) for c in crossings):
                crossings.append(((rp, name), used, sorted(row for row in rows - before
                                                           if (row[1], row[2]) == (rp, name))))
        before = rows
        time.sleep(0.02)


def _worker(client: Client, providers, shared, ledger: Ledger, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    mine: list[str] = []  # the claims this thread keeps until its next step
    while time.monotonic() < deadline:
        try:
            while mine:
                _give_back(client, mine.pop(0), ledger, rng)
            action = rng.random()
            if action < 0.5:
                _new_consumer(client, providers, ledger, rng, mine)
            elif action < 0.65:
                _two_consumers(client, providers, ledger, rng, mine)
            else:
                _rewrite_shared(client, providers, rng.choice(shared), ledger, rng)
        except requests.RequestException as error:
            with ledger.lock:
                ledger.unexpected.append(f"{client.name} connection: {error!r}")


# -- the fleet ---------------------------------------------------------------


def _start(kind: str, url: str, directory: Path, index: int) -> tuple[LiveServer, str]:
    directory.mkdir(parents=True, exist_ok=True)
    port = reference.free_port()
    if kind == "reference":
        command = [reference.serve_script(), "--config-file", reference.write_conf(str(directory), url)]
    else:
        command = allotment_command() + ["serve", "--config-file", str(write_config(directory, url))]
    live = LiveServer(command + ["--port", str(port), "--workers", str(WORKERS), "--threads", "4"],
                      port, directory / f"{kind}.log", env=clean_env())
    try:
        live.wait_ready(timeout=90)
    except BaseException:
        live.stop()
        raise
    return live, f"{kind}{index}"


@pytest.fixture
def fleet_database(tmp_path):
    """A database set up by the reference first, then taken over by Allotment."""
    url, drop = reference.scratch_database(BACKEND, "fleet")
    try:
        conf = reference.write_conf(str(tmp_path / "manage"), url)
        done = reference.manage(conf, "db", "sync")
        assert done.returncode == 0, done.stderr[-2000:]
        config = write_config(tmp_path / "takeover", url)
        taken = run_allotment("db", "sync", "--config-file", str(config))
        assert taken.returncode == 0, taken.stdout + taken.stderr
        yield url
    finally:
        drop()


def _seed(client: Client, ledger: Ledger) -> list[str]:
    providers = []
    for index in range(PROVIDERS):
        uuid = _uuid()
        made = client.call("POST", "/resource_providers", {"name": f"fleet-{index}", "uuid": uuid})
        assert made.status_code == 200, made.text
        put = client.call("PUT", f"/resource_providers/{uuid}/inventories", {
            "resource_provider_generation": made.json()["generation"],
            "inventories": {name: {**inv, "max_unit": inv["total"]} for name, inv in INVENTORY.items()}})
        assert put.status_code == 200, put.text
        # Two fillers (VCPU's max_unit is 8) take most of the capacity.
        for _ in range(2):
            filler = _uuid()
            allocations = {uuid: {"resources": {name: n // 2 for name, n in PREFILLED.items()}}}
            claimed = client.call("PUT", f"/allocations/{filler}", _body(allocations, None))
            assert claimed.status_code == 204, claimed.text
            ledger.held[filler] = allocations
        providers.append(uuid)
    return providers


@contextlib.contextmanager
def _fleet(fleet_database: str, tmp_path: Path) -> Iterator[list[Client]]:
    """The pair's servers (``KINDS``) on the one database, a client for each;
    stopped on the way out, also when one of them failed to start."""
    servers = []
    try:
        for index, kind in enumerate(KINDS):
            servers.append(_start(kind, fleet_database, tmp_path / f"server{index}", index))
        yield [Client(live.url, name) for live, name in servers]
    finally:
        for live, _name in servers:
            live.stop()


def test_mixed_fleet_never_over_allocates_nor_loses_writes(fleet_database, tmp_path):
    started = time.monotonic()
    db = Database(fleet_database)
    try:
        with _fleet(fleet_database, tmp_path) as clients:
            ledger = Ledger()
            providers = _seed(clients[0], ledger)
            # Shared consumers exist before the race (see the module doc: two
            # writers creating one consumer at once is the reference's weak spot).
            shared = []
            for index in range(SHARED_CONSUMERS):
                consumer = _uuid()
                first = {providers[index % PROVIDERS]: {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}
                made = clients[0].call("PUT", f"/allocations/{consumer}", _body(first, None))
                assert made.status_code == 204, made.text
                ledger.chains[consumer].append((None, first, "setup"))
                shared.append(consumer)

            deadline = time.monotonic() + RACE_SECONDS
            threads = [threading.Thread(target=_worker, args=(
                Client(clients[i % len(clients)].base, clients[i % len(clients)].name),
                providers, shared, ledger, deadline, i)) for i in range(CLIENT_THREADS)]
            stop, crossings = threading.Event(), []
            watcher = threading.Thread(target=_watch, args=(db, stop, crossings))
            watcher.start()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=RACE_SECONDS + 180)
            stop.set()
            watcher.join()
            assert not any(thread.is_alive() for thread in threads), "a client thread hung"
            seen_over = [f"{rp} {name} went over capacity ({used} > {CAPACITY[name]}) with: "
                         + ", ".join(f"{consumer} {amount} by {ledger.writer.get(consumer, '?')}"
                                     for consumer, _rp, _name, amount in new_rows)
                         for (rp, name), used, new_rows in crossings]
            for line in seen_over:
                print(f"\n[{BACKEND} {PAIR}] {line}")
            over_at_end = _verify(db, clients, providers, shared, ledger)
            problems = seen_over + list(over_at_end.values())
            culprits = {ledger.writer.get(consumer, "?").split()[0]
                        for _key, _used, new_rows in crossings for consumer, *_ in new_rows}
            if (problems and culprits and all(name.startswith("reference") for name in culprits)
                    and set(over_at_end) <= {key for key, _used, _rows in crossings}):
                pytest.xfail("Placement 16.0.0 itself over-allocated (see the module doc):\n" + "\n".join(problems))
            assert problems == [], "over capacity:\n" + "\n".join(problems)
            print(f"[{BACKEND} {PAIR}] {time.monotonic() - started:.0f}s in all")
    finally:
        db.dispose()


# -- the checks --------------------------------------------------------------
# Rows, consumer records and the row form of an answer: the claim-race test's own helpers.


def _verify(db: Database, clients: list[Client], providers, shared, ledger: Ledger) -> dict:
    """Check everything but capacity; returns the providers and classes over capacity at the end."""
    if ledger.defects:
        print(f"\n[{BACKEND} {PAIR}] the reference's own 500s (nothing written):\n" + "\n".join(ledger.defects))
    print(f"\n[{BACKEND} {PAIR}] answers: "
          f"{dict(sorted(ledger.statuses.items(), key=lambda item: str(item[0])))}")
    rows = _rows(db)
    records = _consumer_records(db)
    sums = collections.defaultdict(int)
    for _consumer, rp, name, used in rows:
        sums[(rp, name)] += used
    # Capacity is judged by the caller (with what the watcher saw); the
    # other checks hold whatever it finds.
    over = {(rp, name): f"{rp} {name}: {sums[(rp, name)]} > {CAPACITY[name]} at the end"
            for rp in providers for name in INVENTORY if sums[(rp, name)] > CAPACITY[name]}
    assert not ledger.unexpected, "unexpected answers:\n" + "\n".join(ledger.unexpected[:20])
    claims = {what: sum(n for (_, w, s), n in ledger.statuses.items() if w == what and s == 204)
              for what in ("claim", "claim@1.12", "post", "move")}
    refused = sum(n for (_, w, s), n in ledger.statuses.items() if w.startswith("claim") and s == 409)
    assert all(claims.values()) and refused > 0, f"the race never reached capacity or a kind of write: {claims}"

    keys = collections.Counter((consumer, rp, name) for consumer, rp, name, _used in rows)
    assert [key for key, n in keys.items() if n > 1] == [], "a claim is there more than once"

    expected = dict(ledger.held)
    for consumer in shared:
        chain = sorted(ledger.chains.get(consumer, []), key=lambda link: -1 if link[0] is None else link[0])
        if not chain:
            continue
        generations = [generation for generation, _, _ in chain]
        assert generations == [None] + list(range(1, len(chain))), \
            f"lost update on {consumer}: {[(g, who) for g, _, who in chain]}"
        assert records[consumer] == len(chain)
        expected[consumer] = chain[-1][1]
    assert sum(len(ledger.chains.get(c, [])) for c in shared) > 0

    actual = collections.defaultdict(set)
    for consumer, rp, name, used in rows:
        actual[consumer].add((consumer, rp, name, used))
    for consumer, allocations in expected.items():
        assert actual.get(consumer, set()) == _as_rows(consumer, allocations), consumer
        assert consumer in records, f"{consumer} has allocations but no consumer record"
    for consumer in ledger.refused | ledger.released:
        assert consumer not in actual and consumer not in records, f"{consumer} was refused or given back"
    assert set(actual) == set(expected)

    implied = collections.defaultdict(int)
    for allocations in expected.values():
        for rp, entry in allocations.items():
            for name, amount in entry["resources"].items():
                implied[(rp, name)] += amount
    assert dict(sums) == dict(implied)

    # Both APIs: the same usages, equal to the SQL sums, and the same allocations.
    rng = random.Random(0)
    gone = rng.sample(sorted(ledger.refused | ledger.released), min(40, len(ledger.refused | ledger.released)))
    for client in clients:
        for rp in providers:
            usages = client.call("GET", f"/resource_providers/{rp}/usages").json()["usages"]
            assert usages == {name: sums[(rp, name)] for name in INVENTORY}, (client.name, rp)
        totals = client.call("GET", f"/usages?project_id={PROJECT}").json()["usages"]
        assert totals == {name: sum(sums[(rp, name)] for rp in providers) for name in INVENTORY}, client.name
        for consumer, allocations in expected.items():
            shown = client.call("GET", f"/allocations/{consumer}").json()
            assert {rp: entry["resources"] for rp, entry in shown["allocations"].items()} == \
                {rp: entry["resources"] for rp, entry in allocations.items()}, (client.name, consumer)
            assert shown["consumer_generation"] == records[consumer], (client.name, consumer)
        for consumer in gone:
            assert client.call("GET", f"/allocations/{consumer}").json()["allocations"] == {}, \
                (client.name, consumer)
    return over


def _stop_after(deadline: float) -> None:
    """A barrier action: past the deadline, break the barrier (its waiters stop)."""
    if time.monotonic() > deadline:
        raise TimeoutError("the race is over")


def test_racing_creations_of_one_consumer(fleet_database, tmp_path):
    """Two clients, one per server, create the same consumer at the same moment
    (consumer_generation null at 1.28): at most one may succeed.

    Allotment can never be the second to succeed (its INSERT of the consumer
    meets the other's row and the request ends in 409), so with two Allotment
    servers a double success fails the test.  The reference can (see the
    module doc); when it takes part, double successes are reported and the
    test is marked xfail, after checking that the database still holds
    exactly one consumer record and one set of allocations for each.
    """
    db = Database(fleet_database)
    with _fleet(fleet_database, tmp_path) as clients:
        providers = _seed(clients[0], Ledger())
        results: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        lock = threading.Lock()
        deadline = time.monotonic() + RACE_SECONDS / 2

        def racer(client: Client, barrier: threading.Barrier, names: list[str], seed: int) -> None:
            rng = random.Random(seed)
            for consumer in names:
                allocations = {rng.choice(providers): {"resources": {"MEMORY_MB": 1}}}  # never full
                try:
                    barrier.wait(timeout=60)
                except (threading.BrokenBarrierError, TimeoutError):
                    return
                status = client.call("PUT", f"/allocations/{consumer}", _body(allocations, None)).status_code
                with lock:
                    results[consumer].append((client.name, status))

        pairs = []
        for pair in range(4):
            names = [_uuid() for _ in range(400)]
            barrier = threading.Barrier(2, action=lambda: _stop_after(deadline))
            pairs += [threading.Thread(target=racer, args=(Client(c.base, c.name), barrier, names, pair * 2 + i))
                      for i, c in enumerate(clients)]
        for thread in pairs:
            thread.start()
        for thread in pairs:
            thread.join(timeout=RACE_SECONDS + 120)
        assert not any(thread.is_alive() for thread in pairs), "a client thread hung"
    rows, records = _rows(db), _consumer_records(db)
    db.dispose()
    statuses = collections.Counter(status for answers in results.values() for _, status in answers)
    print(f"\n[{BACKEND} {PAIR}] creations: {len(results)} consumers, answers {dict(statuses)}")
    unexpected = [(c, a) for c, a in results.items() for _, s in a if s not in (204, 409, 500)]
    assert unexpected == []
    keys = collections.Counter((consumer, rp, name) for consumer, rp, name, _used in rows)
    assert [key for key, n in keys.items() if n > 1] == []
    won = {c for c, answers in results.items() if any(s == 204 for _, s in answers)}
    assert won <= set(records) and won <= {consumer for consumer, *_ in rows}
    assert not ({c for c in results if c not in won} & set(records)), "a refused creation left a record"
    doubles = {c: a for c, a in results.items() if sum(s == 204 for _, s in a) > 1}
    if doubles and "reference" in KINDS:
        pytest.xfail(f"the reference let both creators of {len(doubles)} of {len(results)} consumers succeed, "
                     f"e.g. {next(iter(doubles.items()))}")
    assert doubles == {}, f"both creators succeeded: {list(doubles.items())[:5]}"
