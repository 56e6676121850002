"""A reshape racing with claims on the providers it reshapes.

The scene: a compute node with VCPU and VGPU inventory, instances holding
both, and two GPU child providers without inventory.  One thread (through
its own direct-interface application, as an offline upgrade tool would)
moves the VGPU inventory and every VGPU allocation to the children: it
reads the node's allocations and generations, posts the reshape, and on a
409 reads again and retries.  Meanwhile several threads (through a second
application on the same database) claim VGPU on the node and on the
children for new consumers, and give some claims back.

Whatever the interleaving, afterwards:

* no allocation points at inventory that does not exist, and no inventory
  is over capacity;
* every answer was 204 or 409: the reshape's 409s are generation conflicts
  (``placement.concurrent_update``), a claim's 409 says it did not fit or
  lost a race; no 5xx;
* each claim answered 204 and not given back is still held in full (on the
  node, or moved to a GPU by the reshape); nothing refused was written;
* the reshape eventually succeeded, and no VGPU is left on the node.

Runs on the backend of ``ALLOTMENT_TEST_BACKEND``.
"""

from __future__ import annotations

import collections
import random
import threading
import uuid as uuidlib
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa

from allotment.db import tables
from allotment.db.engine import utcnow
from allotment.direct import Direct
from tests.conftest import make_conf
from tests.ha.galera import spread

ROUNDS = 3
CLAIMERS = 6
CLAIMS_PER_THREAD = 25
RESHAPE_ATTEMPTS = 400
NODE_VGPU = 16
GPU_VGPU = NODE_VGPU // 2
NODE_VCPU = 256
PROJECT, USER = "race-project", "race-user"
VERSION = "1.30"


def _uuid() -> str:
    return str(uuidlib.uuid4())


@dataclass
class Tree:
    node: str
    gpus: list[str]


def _seed(engine) -> Tree:
    """The node with VCPU/VGPU inventory, and two bare GPU children (SQL)."""
    rp, inv, rc = tables.resource_providers, tables.inventories, tables.resource_classes
    tree = Tree(_uuid(), [_uuid(), _uuid()])
    with engine.begin() as conn:
        classes = dict(conn.execute(sa.select(rc.c.name, rc.c.id).where(rc.c.name.in_(["VCPU", "VGPU"]))).all())
        now = utcnow()
        node_id = conn.execute(sa.insert(rp).values(uuid=tree.node, name=f"node-{tree.node}", generation=0,
                                                    created_at=now)).inserted_primary_key[0]
        conn.execute(sa.update(rp).where(rp.c.id == node_id).values(root_provider_id=node_id))
        for gpu in tree.gpus:
            conn.execute(sa.insert(rp).values(uuid=gpu, name=f"gpu-{gpu}", generation=0, created_at=now,
                                              parent_provider_id=node_id, root_provider_id=node_id))
        for name, total in (("VCPU", NODE_VCPU), ("VGPU", NODE_VGPU)):
            conn.execute(sa.insert(inv).values(resource_provider_id=node_id, resource_class_id=classes[name],
                                               total=total, reserved=0, min_unit=1, max_unit=total,
                                               step_size=1, allocation_ratio=1.0, created_at=now))
    return tree


def _body(allocations: dict, generation) -> dict:
    return {"allocations": {rp: {"resources": res} for rp, res in allocations.items()},
            "project_id": PROJECT, "user_id": USER, "consumer_generation": generation}


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    held: dict[str, dict] = field(default_factory=dict)     # consumer -> {class: amount} it should hold
    refused: set[str] = field(default_factory=set)
    statuses: collections.Counter = field(default_factory=collections.Counter)
    unexpected: list[str] = field(default_factory=list)
    reshaped: bool = False

    def record(self, what: str, response, allowed: tuple[int, ...], codes: tuple[str, ...] = ()) -> int:
        with self.lock:
            self.statuses[(what, response.status_code)] += 1
            if response.status_code not in allowed:
                self.unexpected.append(f"{what}: {response.status_code} {response.text[:300]}")
            elif response.status_code == 409 and codes:
                code = response.json()["errors"][0].get("code")
                if code not in codes:
                    self.unexpected.append(f"{what}: 409 with code {code}: {response.text[:300]}")
        return response.status_code


def _claimer(client, tree: Tree, ledger: Ledger, start: threading.Barrier, seed: int) -> None:
    rng = random.Random(seed)
    start.wait()
    for _ in range(CLAIMS_PER_THREAD):
        consumer = _uuid()
        amount = rng.choice((1, 2))
        if rng.random() < 0.6:
            wanted = {tree.node: {"VCPU": 1, "VGPU": amount}}
        else:
            wanted = {tree.node: {"VCPU": 1}, rng.choice(tree.gpus): {"VGPU": amount}}
        status = ledger.record("claim", client.put(f"/allocations/{consumer}", json=_body(wanted, None),
                                                   microversion="1.28"), (204, 409))
        with ledger.lock:
            if status == 204:
                ledger.held[consumer] = {"VCPU": 1, "VGPU": amount}
            else:
                ledger.refused.add(consumer)
        if status == 204 and rng.random() < 0.5:
            # Give it back: makes room on the node, so more claims race the reshape.
            if ledger.record("give back", client.delete(f"/allocations/{consumer}"), (204,)) == 204:
                with ledger.lock:
                    del ledger.held[consumer]


def _reshape_payload(client, tree: Tree) -> dict:
    """Move the node's VGPU, and every VGPU allocation on it, to the GPUs.

    One read gives the node's generation and allocations together, so a
    claim committed after it makes the reshape a generation conflict.
    """
    node = client.get(f"/resource_providers/{tree.node}/allocations", microversion="1.28").json()
    gpu_generations = [client.get(f"/resource_providers/{gpu}/inventories").json()["resource_provider_generation"]
                       for gpu in tree.gpus]
    room = {gpu: GPU_VGPU for gpu in tree.gpus}  # the GPUs hold nothing before the reshape
    allocations = {}
    movers = sorted(node["allocations"].items(), key=lambda item: -item[1]["resources"].get("VGPU", 0))
    for consumer, entry in movers:
        resources = dict(entry["resources"])
        vgpu = resources.pop("VGPU", 0)
        final = {tree.node: resources} if resources else {}
        if vgpu:
            gpu = max(room, key=room.get)
            room[gpu] -= vgpu
            final[gpu] = {"VGPU": vgpu}
        allocations[consumer] = _body(final, entry["consumer_generation"])
    return {
        "inventories": {
            tree.node: {"resource_provider_generation": node["resource_provider_generation"],
                        "inventories": {"VCPU": {"total": NODE_VCPU, "max_unit": NODE_VCPU}}},
            **{gpu: {"resource_provider_generation": generation,
                     "inventories": {"VGPU": {"total": GPU_VGPU, "max_unit": GPU_VGPU}}}
               for gpu, generation in zip(tree.gpus, gpu_generations)},
        },
        "allocations": allocations,
    }


def _reshaper(client, tree: Tree, ledger: Ledger, start: threading.Barrier) -> None:
    start.wait()
    for _ in range(RESHAPE_ATTEMPTS):
        response = client.post("/reshaper", json=_reshape_payload(client, tree), microversion=VERSION)
        status = ledger.record("reshape", response, (204, 409), codes=("placement.concurrent_update",))
        if status == 204:
            with ledger.lock:
                ledger.reshaped = True
            return
        if status != 409:
            return


def _database_state(engine, tree: Tree):
    a, inv, rp, rc = tables.allocations, tables.inventories, tables.resource_providers, tables.resource_classes
    with engine.connect() as conn:
        rows = conn.execute(sa.select(rp.c.uuid, a.c.consumer_id, rc.c.name, a.c.used)
                            .join(rp, rp.c.id == a.c.resource_provider_id)
                            .join(rc, rc.c.id == a.c.resource_class_id)).all()
        inventory = {(row.uuid, row.name): row for row in conn.execute(
            sa.select(rp.c.uuid, rc.c.name, inv.c.total, inv.c.reserved, inv.c.allocation_ratio)
            .join(rp, rp.c.id == inv.c.resource_provider_id)
            .join(rc, rc.c.id == inv.c.resource_class_id))}
    return rows, inventory


def _check(engine, tree: Tree, ledger: Ledger, instances: dict[str, dict]) -> None:
    assert not ledger.unexpected, ledger.unexpected
    assert ledger.reshaped, ledger.statuses
    rows, inventory = _database_state(engine, tree)
    used = collections.Counter()
    holdings: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for provider, consumer, name, amount in rows:
        assert (provider, name) in inventory, f"{consumer} holds {amount} {name} on {provider} without inventory"
        used[(provider, name)] += amount
        holdings[consumer][name] += amount
    for key, amount in used.items():
        record = inventory[key]
        assert amount <= int((record.total - record.reserved) * record.allocation_ratio), (key, amount)
    assert (tree.node, "VGPU") not in inventory and (tree.node, "VGPU") not in used
    expected = {**instances, **ledger.held}
    assert dict(holdings) == {c: collections.Counter(res) for c, res in expected.items()}
    assert not (ledger.refused & set(holdings))


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_reshape_racing_claims_keeps_every_allocation_on_real_capacity(app, db_url, round_):
    tree = _seed(app.db.engine)
    with Direct(make_conf(db_url), migrate=False) as claims, \
            Direct(make_conf(spread(db_url, 2)[1]), migrate=False) as upgrader:  # Galera: another node
        # Instances already there: VGPU 6 of 16 in use on the node.
        instances = {}
        for amount in (2, 2, 1, 1):
            consumer = _uuid()
            r = claims.put(f"/allocations/{consumer}", microversion="1.28",
                           json=_body({tree.node: {"VCPU": 2, "VGPU": amount}}, None))
            assert r.status_code == 204, r.text
            instances[consumer] = {"VCPU": 2, "VGPU": amount}
        ledger = Ledger()
        start = threading.Barrier(CLAIMERS + 1)
        threads = [threading.Thread(target=_claimer, args=(claims, tree, ledger, start, round_ * 100 + i))
                   for i in range(CLAIMERS)]
        threads.append(threading.Thread(target=_reshaper, args=(upgrader, tree, ledger, start)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not any(thread.is_alive() for thread in threads)
    _check(app.db.engine, tree, ledger, instances)
    # The race was real: the reshape or the claims lost at least once, or
    # claims succeeded both before and after the move.
    print(dict(ledger.statuses))
