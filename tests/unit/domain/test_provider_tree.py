"""ProviderSnapshot.changed: a snapshot made from another by replacing some
providers looks up exactly as one made afresh from the same providers."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from allotment.domain.provider_tree import (
    KEYS_PER_SHARD, SHARING_TRAIT, KeptResults, Provider, ProviderInventory, ProviderSnapshot, ShardedMap)

AGGREGATES = ("a1", "a2", "a3")
CLASSES = ("VCPU", "DISK_GB", "VGPU")


def _provider(pid: int, parent: Provider | None, rng: random.Random) -> Provider:
    return Provider(
        id=pid, uuid=f"u{pid}-{rng.randrange(3)}", parent_id=None if parent is None else parent.id,
        root_id=pid if parent is None else parent.root_id, generation=rng.randrange(5),
        traits=tuple(sorted(rng.sample(("CUSTOM_A", SHARING_TRAIT), rng.randrange(3)))),
        aggregates=frozenset(rng.sample(AGGREGATES, rng.randrange(3))),
        inventories={rc: ProviderInventory(8, used=rng.randrange(9)) for rc in rng.sample(CLASSES, rng.randrange(3))})


def _fresh(providers: dict[int, Provider]) -> ProviderSnapshot:
    return ProviderSnapshot(sorted(providers.values(), key=lambda prov: (prov.root_id, prov.id)))


def _views(snapshot: ProviderSnapshot) -> tuple:
    """Everything the solver and the summaries look up."""
    return (snapshot.root_ids,
            {root: list(snapshot.tree(root)) for root in snapshot.root_ids},
            {prov.uuid: prov.id for prov in snapshot},
            {root: snapshot.tree_by_class(root) for root in snapshot.root_ids},
            {prov.id: snapshot.lineage(prov.id) for prov in snapshot},
            {prov.id: snapshot.ancestors(prov.id) for prov in snapshot},
            {prov.id: sorted(snapshot.sharing_anchors(prov.id)) for prov in snapshot if prov.is_sharing},
            snapshot.sharing_providers_by_anchor(), snapshot.roots_with_sharing(),
            # a few roots (sorted by place) and many (filtered in order)
            [snapshot.in_root_order(set(snapshot.root_ids[i::step])) for step in (1, 2, 40) for i in (0, 1)])


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), rounds=st.integers(1, 6))
def test_a_changed_snapshot_equals_one_made_afresh(seed, rounds):
    rng = random.Random(seed)
    providers: dict[int, Provider] = {}
    next_id = 1
    for _ in range(rng.randrange(1, 8)):
        parent = rng.choice([None, *providers.values()]) if providers else None
        providers[next_id] = _provider(next_id, parent, rng)
        next_id += 1
    snapshot = _fresh(providers)
    for _ in range(rounds):
        _views(snapshot)  # derived indexes filled, to be kept or dropped
        changed: dict[int, Provider] = {}
        gone: set[int] = set()
        for _ in range(rng.randrange(1, 4)):
            action = rng.randrange(3)
            if action == 0 or not providers:  # a new provider, root or child
                parent = rng.choice([None, *providers.values()]) if providers else None
                changed[next_id] = providers[next_id] = _provider(next_id, parent, rng)
                next_id += 1
                continue
            pid = rng.choice(sorted(providers))
            old = providers[pid]
            if action == 1:  # rewritten in place (generation, traits, aggregates, usage)
                parent = providers.get(old.parent_id) if old.parent_id is not None else None
                changed[pid] = providers[pid] = _provider(pid, parent, rng)
            elif all(prov.parent_id != pid for prov in providers.values()):  # a leaf deleted
                del providers[pid]
                changed.pop(pid, None)
                gone.add(pid)
        snapshot = snapshot.changed(changed.values(), gone | set(changed))
        assert _views(snapshot) == _views(_fresh(providers))


def test_a_tree_left_without_its_parent_is_refused():
    root = Provider(id=1, uuid="r")
    child = Provider(id=2, uuid="c", parent_id=1, root_id=1)
    snapshot = ProviderSnapshot([root, child])
    with pytest.raises(ValueError):
        snapshot.changed([], {1})


def test_kept_results_forget_changed_trees_and_stay_bounded():
    hosts = [Provider(id=i, uuid=f"h{i}", inventories={"VCPU": ProviderInventory(8)}) for i in (1, 2, 3)]
    snapshot = ProviderSnapshot(hosts)
    kept = KeptResults(limit=10)
    for host in hosts:
        kept.trees.put(host.id, "q", ("candidate",), 2)
        kept.summaries[host.id] = f"summary of {host.id}"
        kept.summaries[(host.id,)] = f"summaries of tree {host.id}"
    changed, change = snapshot.successor([Provider(id=2, uuid="h2", generation=1)], {2})
    after = kept.after(change)
    assert dict(after.summaries.items()) == {1: "summary of 1", 3: "summary of 3",
                                             (1,): "summaries of tree 1", (3,): "summaries of tree 3"}
    assert len(kept.summaries) == 6
    assert [after.trees.get(root, "q") for root in (1, 2, 3)] == [("candidate",), None, ("candidate",)]
    assert kept.trees.get(2, "q") == ("candidate",)  # the older results stay as they were
    assert after.trees.held == [4]
    # A sharing provider joining an aggregate may lend to any tree: nothing is kept.
    shared = Provider(id=4, uuid="s", traits=(SHARING_TRAIT,), aggregates=frozenset({"a1"}))
    assert len(after.after(changed.successor([shared], {4})[1]).trees.entries) == 0
    for root in range(100, 110):  # past the limit: emptied, then filled again
        after.trees.put(root, "q", ("c",), 2)
        assert after.trees.held[0] <= 10


def test_roots_come_in_root_order_however_few():
    snapshot = ProviderSnapshot([Provider(id=pid, uuid=f"h{pid}") for pid in (5, 3, 9, *range(100, 140))])
    assert snapshot.root_ids[:3] == (5, 3, 9)
    assert snapshot.in_root_order({3, 5}) == [5, 3]  # by place, not by id
    assert snapshot.in_root_order({139, 3}) == [3, 139]
    assert snapshot.in_root_order(set(snapshot.root_ids)) == list(snapshot.root_ids)
    snapshot.add([Provider(id=1, uuid="h1")])  # a new root: its place is known too
    assert snapshot.in_root_order({1, 9}) == [9, 1]


def test_a_change_copies_only_the_shards_it_touches():
    """A claim's successor of a large snapshot shares every index shard the
    change does not touch (a plain copy of each index cost milliseconds a
    claim at 430,000 providers), and reads like a snapshot made afresh."""
    roots = [Provider(id=r, uuid=f"r{r}", inventories={"VCPU": ProviderInventory(8)}) for r in range(1, 3001, 3)]
    children = [Provider(id=r + 1, uuid=f"c{r}", parent_id=r, root_id=r,
                         inventories={"VGPU": ProviderInventory(2)}) for r in range(1, 3001, 3)]
    snapshot = ProviderSnapshot(sorted(roots + children, key=lambda p: (p.root_id, p.id)))
    for pid in (1, 2, 4):
        snapshot.ancestors(pid)
        snapshot.tree_by_class(snapshot.get(pid).root_id)
    first = snapshot.changed([Provider(id=2, uuid="c1", parent_id=1, root_id=1, generation=1,
                                       inventories={"VGPU": ProviderInventory(2, used=1)})])
    second = first.changed([Provider(id=4, uuid="r4", generation=1, inventories={"VCPU": ProviderInventory(8)})])
    # New roots and providers: one added, one taken out.
    third = second.changed([Provider(id=5000, uuid="new", inventories={"VCPU": ProviderInventory(4)})], {5})
    for old, new in ((first, second), (second, third)):
        shared = sum(a is b for a, b in zip(old._by_id.shards, new._by_id.shards))
        assert shared >= len(new._by_id.shards) - 2
    # Usage or generations alone (a claim): the trees' indexes are shared as
    # they are; a provider gone: the touched tree's are made again.
    assert first._trees is snapshot._trees and second._ancestors is first._ancestors
    assert third._trees is not second._trees and third._ancestors is not second._ancestors
    fresh = ProviderSnapshot(sorted(third, key=lambda p: (p.root_id, p.id)))
    assert len(third) == len(fresh) == 2000 and list(third) == list(fresh)
    assert third.root_ids == fresh.root_ids and 5000 in third.root_ids
    assert third.get(2).inventories["VGPU"].used == 1 and third.by_uuid("c4") is None
    for pid in (1, 2, 4, 7, 5000):
        assert third.ancestors(pid) == fresh.ancestors(pid)
        root = third.get(pid).root_id
        assert third.tree(root) == fresh.tree(root) and third.tree_by_class(root) == fresh.tree_by_class(root)
    assert snapshot.get(2).generation == 0 and len(snapshot) == 2000  # the older ones unchanged


@pytest.mark.parametrize("size", [100, 9_000, 430_000])
def test_a_change_copies_shards_of_a_size_that_does_not_grow_with_the_map(size):
    """A successor copies the shards its keys fall in: about KEYS_PER_SHARD
    entries each, for a map of 9,000 keys as for one of 430,000 (with a
    fixed number of shards a claim's read copied 840-entry shards at the
    larger size), and its own successors keep the same shards."""
    mapping = ShardedMap.of({key: key for key in range(size)})
    assert len(mapping) == size
    assert max(map(len, mapping.shards)) <= 2 * KEYS_PER_SHARD
    after = mapping.successor([3], {size + 1: "new"})
    changed = [i for i, (old, new) in enumerate(zip(mapping.shards, after.shards)) if old is not new]
    assert len(changed) <= 2 and len(after.shards) == len(mapping.shards)
    assert after.get(size + 1) == "new" and 3 not in after and len(after) == size
    # Kept results and the snapshot's own indexes are sharded for the cloud.
    hosts = [Provider(id=i, uuid=f"h{i}") for i in range(1, max(size // 20, 2))]
    kept = KeptResults(10, providers=size, trees=size)
    for host in hosts:
        kept.summaries[host.id] = "summary"
    moved = ProviderSnapshot(hosts).successor([Provider(id=1, uuid="h1", generation=1)], {1})[1]
    assert len(kept.after(moved).summaries.shards) == len(ShardedMap(size=2 * size).shards)
