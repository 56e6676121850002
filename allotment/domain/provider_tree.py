"""An in-memory snapshot of provider trees, the solver's only input data.

The database layer answers ``GET /allocation_candidates`` with a few
set-based queries and hands the rows over as a :class:`ProviderSnapshot`;
everything after that (which provider can serve which group, sharing,
capacity sums, trees and subtrees) is decided here in plain Python, so the
rules are unit-tested without a database.

What the snapshot must contain for exact answers (over-inclusion is
harmless, only slower):

* every tree, *complete*, that holds a provider with inventory of a
  requested resource class (summaries list whole trees, and
  ``same_subtree`` needs the ancestry);
* every provider carrying ``MISC_SHARES_VIA_AGGREGATE`` that has inventory
  of a requested class or could satisfy a resourceless group, with its
  tree, and every tree that has a provider in one of that sharing
  provider's aggregates (those trees are the ones it can be "anchored" to);
* the tree of each provider named by ``in_tree``/``in_treeN``.

Providers are kept in the order given; that order (roots, and providers
within a tree) is the order the solver explores and reports them, so the
database layer should give a stable order (e.g. by internal id).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from allotment.domain import inventory_fit as cap

#: The trait that lets a provider's inventory be used by other trees that
#: share one of its aggregates.
SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"


class ProviderInventory:
    """One inventory record plus the units currently allocated from it.

    ``capacity`` and ``free`` are derived once at construction (the solver
    asks for them many times); treat instances as immutable.  A plain
    class with slots rather than a dataclass: a request builds one per
    inventory row, and this constructor costs half as much.
    """

    __slots__ = ("total", "reserved", "min_unit", "max_unit", "step_size",
                 "allocation_ratio", "used", "capacity", "free")

    def __init__(self, total: int, reserved: int = 0, min_unit: int = 1,
                 max_unit: int = cap.MAX_INT, step_size: int = 1,
                 allocation_ratio: float = 1.0, used: int = 0):
        self.total = total
        self.reserved = reserved
        self.min_unit = min_unit
        self.max_unit = max_unit
        self.step_size = step_size
        self.allocation_ratio = allocation_ratio
        self.used = used
        self.capacity = cap.capacity(total, reserved, allocation_ratio)
        self.free = self.capacity - used

    def __repr__(self) -> str:
        return (f"ProviderInventory(total={self.total}, reserved={self.reserved}, "
                f"min_unit={self.min_unit}, max_unit={self.max_unit}, "
                f"step_size={self.step_size}, "
                f"allocation_ratio={self.allocation_ratio}, used={self.used})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProviderInventory):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name)
                   for name in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def fits(self, amount: int) -> bool:
        """Could one more allocation of ``amount`` be made right now?

        Same verdict as :func:`allotment.domain.inventory_fit.amount_fits`,
        inlined because the solver calls it for every candidate provider.
        """
        return (self.min_unit <= amount <= self.max_unit
                and not amount % self.step_size and amount <= self.free)

    @property
    def combined_limit(self) -> int:
        """Largest sum one candidate may place here (capacity, max_unit)."""
        return min(self.free, self.max_unit)


@dataclasses.dataclass(slots=True)
class Provider:
    """A resource provider as the solver sees it.

    ``root_id`` equals ``id`` for a root (and defaults to it).
    ``traits`` and ``aggregates`` are collections of names/uuids; a set is
    fastest, but pass traits as a tuple in display order if the summaries
    should list them in that order (Placement lists them as stored).
    ``inventories`` maps resource class names to records with current
    usage.  Treat instances
    as immutable once in a snapshot; they are plain (not frozen) only so
    the database layer can build tens of thousands of them cheaply.
    """

    id: int
    uuid: str
    parent_id: int | None = None
    root_id: int | None = None
    generation: int = 0
    traits: Collection[str] = frozenset()
    aggregates: Collection[str] = frozenset()
    inventories: Mapping[str, ProviderInventory] = dataclasses.field(
        default_factory=dict)
    name: str | None = None

    def __post_init__(self) -> None:
        if self.root_id is None:
            if self.parent_id is not None:
                raise ValueError(
                    f"provider {self.id} has a parent but no root_id")
            self.root_id = self.id

    @property
    def is_sharing(self) -> bool:
        return SHARING_TRAIT in self.traits


#: A :class:`ShardedMap` has about this many keys a shard, and between
#: MIN_SHARDS and MAX_SHARDS shards (powers of two).
KEYS_PER_SHARD = 128
MIN_SHARDS = 64
MAX_SHARDS = 8192


def shard_count(size: int) -> int:
    """Shards for a map expected to hold about ``size`` keys."""
    return min(MAX_SHARDS, max(MIN_SHARDS, 1 << (size // KEYS_PER_SHARD).bit_length()))


#: Trees per run of :class:`TreeMemo`'s empty runs.
RUN = 64
#: Changes merged into a run's :class:`RunCapacity` before it is worked out
#: whole again: a claim's read merges one tree (a few microseconds) instead
#: of reading 64 (about 0.13 ms on a cloud of nested trees).
MERGES = 16


class ShardedMap:
    """A mapping split by key hash into dicts (shards), so that a successor
    with a few keys changed (:meth:`successor`) copies only their shards
    and shares the others.

    For the indexes of a snapshot kept across requests
    (:meth:`ProviderSnapshot.changed`): at 430,000 providers, copying one
    plain dict of them took 6-9 ms, and a snapshot has several.  The number
    of shards is chosen for the size expected when the map is made
    (:func:`shard_count`), and kept by its successors: a claim's successor
    copies a few shards of about :data:`KEYS_PER_SHARD` entries.  (512
    shards whatever the size cost a claim's read 1.28-1.38 ms of CPU at
    430,000 providers against 1.15-1.17 ms with 4,096, and 4,096 cost 5-7%
    more than 512 at 8,600 providers.)  A value set directly (``map[key] =
    v``, :meth:`setdefault`) goes into a shard the successors may share:
    only for values derived from what is the same in all of them (a cache
    of an unchanged tree); what differs goes through :meth:`successor`.
    Iteration order is not insertion order.
    """

    __slots__ = ("shards", "mask")

    def __init__(self, shards: list[dict] | None = None, *, size: int = 0):
        self.shards = shards if shards is not None else [{} for _ in range(shard_count(size))]
        self.mask = len(self.shards) - 1

    @classmethod
    def of(cls, mapping: Mapping, size: int | None = None) -> ShardedMap:
        """``mapping``'s keys and values, sharded for ``size`` keys (its own
        size by default)."""
        new = cls(size=len(mapping) if size is None else size)
        shards, mask = new.shards, new.mask
        for key, value in mapping.items():
            shards[hash(key) & mask][key] = value
        return new

    def get(self, key, default=None):
        return self.shards[hash(key) & self.mask].get(key, default)

    def __getitem__(self, key):
        return self.shards[hash(key) & self.mask][key]

    def __contains__(self, key) -> bool:
        return key in self.shards[hash(key) & self.mask]

    def __setitem__(self, key, value) -> None:
        self.shards[hash(key) & self.mask][key] = value

    def setdefault(self, key, default):
        return self.shards[hash(key) & self.mask].setdefault(key, default)

    def __len__(self) -> int:
        return sum(map(len, self.shards))

    def values(self) -> Iterator:
        return itertools.chain.from_iterable(shard.values() for shard in self.shards)

    def items(self) -> Iterator:
        return itertools.chain.from_iterable(shard.items() for shard in self.shards)

    def successor(self, removed: Iterable = (), added: Mapping | None = None) -> ShardedMap:
        """A new map: this one without the keys ``removed``, then with
        ``added``; the shards neither touches are shared."""
        shards, mask = list(self.shards), self.mask
        copied: set[int] = set()
        for key in removed:
            index = hash(key) & mask
            if index not in copied:
                shards[index] = dict(shards[index])
                copied.add(index)
            shards[index].pop(key, None)
        for key, value in (added or {}).items():
            index = hash(key) & mask
            if index not in copied:
                shards[index] = dict(shards[index])
                copied.add(index)
            shards[index][key] = value
        return ShardedMap(shards)


def _sharded(mapping: Mapping, size: int) -> ShardedMap:
    """``mapping`` as a ShardedMap (itself if it is one), sharded for ``size`` keys."""
    return mapping if isinstance(mapping, ShardedMap) else ShardedMap.of(mapping, size)


def _same_place(old: Provider | None, new: Provider) -> bool:
    """Whether ``new`` stands where ``old`` stood, with inventory of the
    same classes (what the tree indexes are made of)."""
    return (old is not None and old.parent_id == new.parent_id and old.root_id == new.root_id
            and old.uuid == new.uuid and old.inventories.keys() == new.inventories.keys())


class TreeMemo:
    """Results computed from one tree and the sharing providers lending to
    it, kept with a snapshot that is kept across requests, and dropped when
    the tree or one of those providers changes
    (:meth:`ProviderSnapshot.changed`): root id -> key -> value.

    Bounded by the sum of the sizes given to :meth:`put`: at ``limit``, it
    is emptied (its successors share the count, so what older snapshots
    still add is counted too, until then).

    Beside the entries, the runs of trees that give nothing: the roots of a
    snapshot's ``root_ids``, in runs of :data:`RUN` by their place there,
    and for each run the keys for which every one of its trees is kept as
    giving nothing (:meth:`nothing_in`).  A query over a cloud whose first
    trees are full passes a run with one lookup instead of one per tree.  A
    run is forgotten with the entries of any of its trees.
    """

    __slots__ = ("entries", "held", "limit", "trees", "empty_runs", "capacities", "order", "places")

    def __init__(self, limit: int, trees: int = 0):
        #: about how many trees there are (how the entries are sharded)
        self.trees = trees
        self.entries: ShardedMap = ShardedMap(size=trees)
        #: [sum of the sizes held], shared with this memo's successors
        self.held = [0]
        self.limit = limit
        #: run number -> the keys its trees all give nothing for (a new
        #: dict for each successor: what one marks holds of its snapshot)
        self.empty_runs: dict[int, frozenset] = {}
        #: run number -> what its trees hold (:meth:`capacity_of`), kept
        #: and forgotten as the empty runs are
        self.capacities: dict[int, RunCapacity] = {}
        #: the roots the runs are numbered in (a snapshot's ``root_ids``)
        self.order: tuple[int, ...] | None = None
        #: root id -> its place in ``order`` (the snapshot's
        #: :meth:`ProviderSnapshot.root_places`, once a run is noted)
        self.places: dict[int, int] | None = None

    def get(self, root: int, key):
        """The value kept for ``key`` from this tree, or None."""
        found = self.entries.get(root)
        if found is None:
            return None
        kept = found.get(key)
        return None if kept is None else kept[0]

    def put(self, root: int, key, value, size: int) -> None:
        """Keep ``value`` (not None), counted as ``size``."""
        if self.held[0] + size > self.limit:
            self.entries = ShardedMap(size=self.trees)
            self.empty_runs, self.capacities = {}, {}
            self.held[0] = 0
        self.entries.setdefault(root, {})[key] = (value, size)
        self.held[0] += size

    def runs_of(self, snapshot: ProviderSnapshot) -> dict[int, frozenset]:
        """The empty runs of trees numbered in ``snapshot``'s ``root_ids``
        (none if the runs known were numbered in other roots)."""
        if self.order is not snapshot.root_ids:
            self.order, self.places, self.empty_runs, self.capacities = snapshot.root_ids, None, {}, {}
        return self.empty_runs

    def capacity_of(self, run: int, snapshot: ProviderSnapshot,
                    lenders: Mapping[int, Sequence[int]]) -> RunCapacity:
        """What the trees of ``run`` (numbered as :meth:`runs_of` gave for
        ``snapshot``) hold, worked out once while none of them changes.

        The run's roots are sliced out only to work it out: a slice writes
        to each root id it holds (its reference count), and in a worker
        the ids' pages are the master's until written to.  Passing the
        runs of a full cloud sliced them all: two thirds of a worker's
        first answer (100 of 160 ms at 100,000 roots)."""
        known = self.capacities.get(run)
        if known is None or (known.changed and known.merges >= MERGES):
            known = self.capacities[run] = RunCapacity.of(self.order[run * RUN:(run + 1) * RUN], snapshot, lenders)
            self._place(snapshot)
        elif known.changed:
            known = self.capacities[run] = known.merged(
                RunCapacity.of([root for root in known.changed if root in snapshot], snapshot, lenders))
        return known

    def work_out_every_run(self, snapshot: ProviderSnapshot) -> None:
        """Every run's :meth:`capacity_of` for ``snapshot``, now rather than
        as queries meet the runs.  ``allotment serve``'s master does this
        before it forks the workers: a worker's first query on a cloud whose
        first trees are full otherwise worked out every run it passed, and
        wrote to the pages of every provider it looked at, which the workers
        share with the master until then.  At 100,000 nested roots, 80% of
        them full, in process: a forked worker's first answer took 216 ms
        and copied 30,600 pages; with the runs worked out beforehand (and
        passed without slicing their roots: :meth:`capacity_of`), 38 ms
        and 4,300 pages."""
        self.runs_of(snapshot)
        lenders = snapshot.sharing_providers_by_anchor()
        for run in range((len(snapshot.root_ids) + RUN - 1) // RUN):
            self.capacity_of(run, snapshot, lenders)

    def nothing_in(self, runs: dict[int, frozenset], run: int, key, snapshot: ProviderSnapshot) -> None:
        """Note that every tree of ``run`` gives nothing for ``key``, in
        ``runs`` (as :meth:`runs_of` gave them for ``snapshot``)."""
        runs[run] = runs.get(run, frozenset()) | {key}
        self._place(snapshot)

    def _place(self, snapshot: ProviderSnapshot) -> None:
        """Know where each root of ``snapshot`` stands in the runs (once
        something is kept of a run: :meth:`without` finds a changed tree's
        run by it)."""
        if self.places is None and self.order is snapshot.root_ids:
            self.places = snapshot.root_places()

    def without(self, roots: Iterable[int]) -> TreeMemo:
        """A successor without what was computed from these trees."""
        new = TreeMemo.__new__(TreeMemo)
        roots = set(roots)
        for root in roots:
            gone = self.entries.get(root)
            if gone:
                self.held[0] -= sum(size for _, size in gone.values())
        new.entries, new.held, new.limit, new.trees = self.entries.successor(roots), self.held, self.limit, self.trees
        new.order, new.places = self.order, self.places
        new.empty_runs, new.capacities = {}, {}
        if (self.empty_runs or self.capacities) and self.places is not None:
            # (else not known where the trees are: none is passed over)
            gone: dict[int, list[int]] = {}
            for root in roots:
                if root in self.places:
                    gone.setdefault(self.places[root] // RUN, []).append(root)
            # Copied whole, then the changed runs mended: a claim's successor
            # of a cloud with every run worked out (1,563 runs at 100,000
            # roots) took 132 us to rebuild these item by item, 15 us so.
            new.empty_runs, new.capacities = dict(self.empty_runs), dict(self.capacities)
            for run, changed in gone.items():
                new.empty_runs.pop(run, None)
                held = new.capacities.get(run)
                if held is not None:
                    new.capacities[run] = held.after(changed)
        return new


class RunCapacity:
    """What a run of trees can give one allocation at most: ``most``,
    class -> the largest amount any one of its providers could take now
    (free and within ``max_unit``), and ``lent``, the classes some sharing
    provider outside those trees can lend to one of them.  A query asking
    one provider for more of a class than ``most`` says, of a class not
    lent, finds nothing in the run without searching it (a run of full
    trees, whatever the amounts asked: 64 trees checked in one step)."""

    __slots__ = ("most", "lent", "changed", "merges")

    def __init__(self, most: dict[str, int], lent: frozenset[str], changed: frozenset[int] = frozenset(),
                 merges: int = 0):
        self.most = most
        self.lent = lent
        #: trees changed since ``most`` and ``lent`` were worked out: they
        #: stay true as bounds once what those trees hold now is merged in
        #: (:meth:`merged`), which is cheaper than working the run out again
        self.changed = changed
        #: merges since the run was last worked out whole (a bound merged
        #: into grows looser as trees fill: see :data:`MERGES`)
        self.merges = merges

    def after(self, roots: Iterable[int]) -> RunCapacity:
        """This run's, with ``roots`` changed since."""
        return RunCapacity(self.most, self.lent, self.changed.union(roots), self.merges)

    def merged(self, other: RunCapacity) -> RunCapacity:
        """Bounds true of both this run's trees as they were and ``other``'s
        as they are (those changed)."""
        most = dict(self.most)
        for rc, limit in other.most.items():
            if limit > most.get(rc, 0):
                most[rc] = limit
        return RunCapacity(most, self.lent | other.lent, frozenset(), self.merges + 1)

    @classmethod
    def of(cls, trees: Iterable[int], snapshot: ProviderSnapshot,
           lenders: Mapping[int, Sequence[int]]) -> RunCapacity:
        most: dict[str, int] = {}
        lent: set[str] = set()
        get, tree = snapshot.get, snapshot.tree
        # Providers alike share one inventories mapping (the mirror keeps
        # equal ones once): each is looked at once a run.  (By id: every
        # mapping stays alive in the snapshot meanwhile.)
        seen: set[int] = set()
        for root in trees:
            for pid in tree(root):
                inventories = get(pid).inventories
                if id(inventories) in seen:
                    continue
                seen.add(id(inventories))
                for rc, inv in inventories.items():
                    limit = inv.free if inv.free < inv.max_unit else inv.max_unit
                    if limit > most.get(rc, 0):
                        most[rc] = limit
            for pid in lenders.get(root, ()):
                lent.update(get(pid).inventories)
        return cls(most, frozenset(lent))

    def short_of(self, needs: Iterable[tuple[str, int]]) -> bool:
        """Whether no provider here, nor any lender, could take one of the
        (class, amount) ``needs``."""
        most, lent = self.most, self.lent
        return any(amount > most.get(rc, 0) and rc not in lent for rc, amount in needs)


@dataclasses.dataclass(frozen=True)
class SnapshotChange:
    """What :meth:`ProviderSnapshot.successor` changed."""

    #: Roots of the trees that gained, lost or changed a provider.
    trees: frozenset[int]
    #: Providers whose tree, place or record changed (what a provider's
    #: summary is made of).
    providers: frozenset[int]
    #: Trees a changed sharing provider lent to.
    lent_to: frozenset[int]
    #: Whether which trees borrow from which may have changed.
    sharing_moved: bool


class KeptResults:
    """What the solver computed from a snapshot kept across requests (the
    provider mirror's), kept beside it, not in it: ``trees``, the
    candidates each query found per tree (:class:`TreeMemo`), and
    ``summaries``, provider id -> the solver's summary of that provider and
    (root id,) -> the summaries of that tree.

    :meth:`after` gives the results still true of a snapshot's successor:
    what was computed from a changed tree, or from a tree a changed sharing
    provider lent to, is dropped (every tree's candidates when which trees
    borrow from which may have changed).  The older results stay as they
    were, for the requests still using the older snapshot.
    """

    __slots__ = ("trees", "summaries", "size")

    def __init__(self, limit: int, *, providers: int = 0, trees: int = 0):
        self.trees = TreeMemo(limit, trees)
        self.summaries: dict | ShardedMap = {}
        #: about how many summaries there may be (how they are sharded)
        self.size = providers + trees

    def after(self, change: SnapshotChange) -> KeptResults:
        new = KeptResults.__new__(KeptResults)
        new.size = self.size
        new.summaries = _sharded(self.summaries, self.size).successor(
            itertools.chain(change.providers, ((root,) for root in change.trees)))
        if change.sharing_moved:
            new.trees = TreeMemo(self.trees.limit, self.trees.trees)
        else:
            new.trees = self.trees.without(change.trees | change.lent_to)
        return new


class ProviderSnapshot:
    """Providers grouped into trees, with the lookups the solver needs.

    Derived indexes (ancestry, which trees a sharing provider reaches) are
    built lazily and cached: a snapshot serves one request and most
    requests touch only a few trees when a ``limit`` is given.
    """

    def __init__(self, providers: Iterable[Provider] = (), *,
                 sharing_lenders: Mapping[int, Sequence[int]] | None = None):
        """``sharing_lenders`` (root id -> sharing providers outside that
        tree that can lend to it, in snapshot order) replaces the
        derivation from aggregates when the caller already knows it, e.g.
        a database layer that adds trees with :meth:`add` as the search
        goes (aggregates of trees not yet added would be missing)."""
        self._by_id: dict[int, Provider] = {}
        #: uuid -> provider id (the id of a uuid never changes)
        self._by_uuid: dict[str, int] = {}
        self._trees: dict[int, list[int]] = {}
        #: Roots in the order their first provider was given.
        self.root_ids: tuple[int, ...] = ()
        self._ancestors: dict[int, frozenset[int]] = {}
        self._lineage: dict[int, tuple[int, ...]] = {}
        self._agg_roots: dict[str, tuple[int, ...]] | None = None
        self._anchor_cache: dict[int, tuple[int, ...]] = {}
        self._sharing_by_root: dict[int, tuple[int, ...]] | None = None
        self._sharing_roots: frozenset[int] | None = None
        self._lenders_given = sharing_lenders is not None
        if sharing_lenders is not None:
            self._sharing_by_root = {root: tuple(lenders) for root, lenders in sharing_lenders.items()}
        self._classes: dict[int, dict[str, list[int]]] = {}
        #: root id -> its place in root_ids (built when first needed)
        self._root_index: dict[int, int] | None = None
        self.add(providers)

    def add(self, providers: Iterable[Provider]) -> None:
        """Add whole trees (each tree complete in one call, none of them
        already present).

        Indexes derived from every tree's aggregates are dropped, unless
        the lenders were given at construction.
        """
        added: list[Provider] = []
        for prov in providers:
            if prov.id in self._by_id:
                raise ValueError(f"duplicate provider id {prov.id}")
            self._by_id[prov.id] = prov
            self._by_uuid[prov.uuid] = prov.id
            self._trees.setdefault(prov.root_id, []).append(prov.id)
            added.append(prov)
        for prov in added:
            if prov.root_id not in self._by_id:
                raise ValueError(
                    f"provider {prov.id}: root {prov.root_id} missing from "
                    "snapshot (trees must be complete)")
            if prov.parent_id is not None and prov.parent_id not in self._by_id:
                raise ValueError(
                    f"provider {prov.id}: parent {prov.parent_id} missing "
                    "from snapshot (trees must be complete)")
        self._count = len(self._by_id)
        if len(self._trees) != len(self.root_ids):
            self.root_ids = tuple(self._trees)
            self._root_index = None
        if added:
            self._sharing_roots = None
        if added and not self._lenders_given:
            self._agg_roots = None
            self._anchor_cache = {}
            self._sharing_by_root = None

    def changed(self, providers: Iterable[Provider], gone: Iterable[int] = ()) -> ProviderSnapshot:
        """:meth:`successor`'s new snapshot."""
        return self.successor(providers, gone)[0]

    def successor(self, providers: Iterable[Provider],
                  gone: Iterable[int] = ()) -> tuple[ProviderSnapshot, SnapshotChange]:
        """A new snapshot: this one with ``providers`` added or put in place
        of those with their ids, and the providers ``gone`` taken out; and
        what changed, for results kept from this one (:class:`KeptResults`).

        For a snapshot of every provider kept current across requests
        (:mod:`allotment.db.provider_mirror`), which must give its roots in
        id order: the trees touched are sorted again, and the result's
        ``root_ids`` are in id order.  The derived indexes of the trees
        not touched are kept.  ``ValueError`` when a touched tree would
        lack its root or a parent.

        The result's indexes are :class:`ShardedMap` objects sharing every
        shard the change does not touch with this snapshot's (converted
        once, at the first change): a claim's successor costs a few
        shards' copies, whatever the size of the cloud.
        """
        providers = list(providers)
        size = self._count  # every index is sharded for the providers' number
        by_id = _sharded(self._by_id, size)
        new_ids = {prov.id for prov in providers}
        before: dict[int, Provider | None] = {}
        touched: set[int] = set()
        for pid in itertools.chain(gone, new_ids):
            if pid in before:
                continue
            old = by_id.get(pid)
            before[pid] = old
            if old is not None:
                touched.add(old.root_id)
        for prov in providers:
            touched.add(prov.root_id)
        new = ProviderSnapshot()
        new._by_id = by_id.successor(before, {prov.id: prov for prov in providers})
        new._count = self._count + sum(1 for pid in new_ids if before.get(pid) is None) - sum(
            1 for pid, old in before.items() if old is not None and pid not in new_ids)
        if all(before[pid] is None or pid in new_ids for pid in before) and all(
                _same_place(before[prov.id], prov) for prov in providers):
            # Only generations, usage, traits or aggregates changed (a claim):
            # every tree keeps its providers, ancestry and classes.
            new._by_uuid, new._trees = self._by_uuid, self._trees
            new.root_ids, new._root_index = self.root_ids, self._root_index
            new._ancestors, new._lineage, new._classes = self._ancestors, self._lineage, self._classes
            members: set[int] = new_ids
        else:
            self._moved(new, providers, before, touched)
            members = set()
            for root in touched:
                members.update(self._trees.get(root, ()))
                members.update(new._trees.get(root, ()))

        def reach(prov: Provider | None) -> tuple | None:
            """What the sharing indexes know of a provider."""
            if prov is None or not (prov.aggregates or prov.is_sharing):
                return None
            return prov.root_id, prov.is_sharing, frozenset(prov.aggregates)

        lent_to: set[int] = set()
        sharing_moved = not all(reach(old) == reach(new._by_id.get(pid)) for pid, old in before.items())
        if not sharing_moved:
            # Nothing the sharing indexes are made of changed.
            for pid, old in before.items():
                if old is not None and old.is_sharing:
                    lent_to.update(self.sharing_anchors(pid))
            new._agg_roots, new._anchor_cache = self._agg_roots, dict(self._anchor_cache)
            new._sharing_by_root, new._sharing_roots = self._sharing_by_root, self._sharing_roots
        return new, SnapshotChange(frozenset(touched), frozenset(members), frozenset(lent_to), sharing_moved)

    def _moved(self, new: ProviderSnapshot, providers: list[Provider], before: dict[int, Provider | None],
               touched: set[int]) -> None:
        """:meth:`changed` where trees gained, lost or rearranged providers:
        ``new``'s tree indexes, the touched trees sorted again."""
        size = self._count
        by_id, trees = new._by_id, _sharded(self._trees, size)
        stale = [old.uuid for old in before.values() if old is not None]
        new._by_uuid = _sharded(self._by_uuid, size).successor(stale, {prov.uuid: prov.id for prov in providers})
        new_trees: dict[int, list[int]] = {}
        for root in touched:
            kept = [pid for pid in trees.get(root, ()) if pid not in before]
            new_trees[root] = sorted(kept + [prov.id for prov in providers if prov.root_id == root])
        new._trees = trees.successor(new_trees, {root: tree for root, tree in new_trees.items() if tree})
        for root in touched:
            for pid in new._trees.get(root, ()):
                prov = by_id[pid]
                if prov.root_id not in by_id or (prov.parent_id is not None and prov.parent_id not in by_id):
                    raise ValueError(f"provider {pid}: its tree is not complete")
        if all(bool(tree) == (root in trees) for root, tree in new_trees.items()):
            new.root_ids, new._root_index = self.root_ids, self._root_index
        else:
            roots = set(self.root_ids)
            for root, tree in new_trees.items():
                (roots.add if tree else roots.discard)(root)
            new.root_ids = tuple(sorted(roots))
        members: set[int] = set()
        for root in touched:
            members.update(trees.get(root, ()))
            members.update(new_trees[root])
        new._ancestors = _sharded(self._ancestors, size).successor(members)
        new._lineage = _sharded(self._lineage, size).successor(members)
        new._classes = _sharded(self._classes, size).successor(touched)

    # -- plain lookups -------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Provider]:
        """The providers in the order given (a successor made by
        :meth:`changed`: tree by tree, in root id order)."""
        if isinstance(self._by_id, dict):
            return iter(self._by_id.values())
        by_id, trees = self._by_id, self._trees
        return (by_id[pid] for root in self.root_ids for pid in trees[root])

    def __contains__(self, provider_id: object) -> bool:
        return provider_id in self._by_id

    def get(self, provider_id: int) -> Provider:
        return self._by_id[provider_id]

    def by_uuid(self, uuid: str) -> Provider | None:
        pid = self._by_uuid.get(uuid)
        return None if pid is None else self._by_id.get(pid)

    def tree(self, root_id: int) -> list[int]:
        """Ids of the providers in the tree rooted at ``root_id``."""
        return self._trees.get(root_id, [])

    def tree_by_class(self, root_id: int) -> dict[str, list[int]]:
        """Providers of a tree that have inventory, by resource class."""
        found = self._classes.get(root_id)
        if found is None:
            found = {}
            for pid in self._trees.get(root_id, ()):
                for rc in self._by_id[pid].inventories:
                    found.setdefault(rc, []).append(pid)
            self._classes[root_id] = found
        return found

    def in_root_order(self, roots: Collection[int]) -> list[int]:
        """These roots (of this snapshot) in the order of ``root_ids``;
        a few among many are sorted by their place rather than found by
        walking every root."""
        if len(roots) * 16 >= len(self.root_ids):
            return [root for root in self.root_ids if root in roots]
        return sorted(roots, key=self.root_places().__getitem__)

    def root_places(self) -> dict[int, int]:
        """Root id -> its place in ``root_ids`` (made when first asked for,
        and shared by the successors that keep the same roots)."""
        index = self._root_index
        if index is None:
            index = self._root_index = {root: place for place, root in enumerate(self.root_ids)}
        return index

    def uuid_of(self, provider_id: int | None) -> str | None:
        if provider_id is None:
            return None
        return self._by_id[provider_id].uuid

    # -- ancestry --------------------------------------------------------

    def ancestors(self, provider_id: int) -> frozenset[int]:
        """The provider itself and every provider above it."""
        found = self._ancestors.get(provider_id)
        if found is None:
            found = frozenset(self.lineage(provider_id))
            self._ancestors[provider_id] = found
        return found

    def lineage(self, provider_id: int) -> tuple[int, ...]:
        """The provider, its parent, ... up to its root, in that order."""
        found = self._lineage.get(provider_id)
        if found is None:
            chain = []
            pid: int | None = provider_id
            while pid is not None:
                chain.append(pid)
                pid = self._by_id[pid].parent_id
            found = tuple(chain)
            self._lineage[provider_id] = found
        return found

    def lowest_common_ancestor(self, provider_ids: Iterable[int]
                               ) -> int | None:
        """The deepest provider that is an ancestor-or-self of all the
        given ones; None when they are in different trees."""
        ids = iter(provider_ids)
        first = next(ids, None)
        if first is None:
            return None
        chain = self.lineage(first)
        for pid in ids:
            above = self.ancestors(pid)
            chain = tuple(a for a in chain if a in above)
            if not chain:
                return None
        return chain[0]

    def in_same_subtree(self, provider_ids: Iterable[int]) -> bool:
        """True when one of the providers is an ancestor (or is itself) of
        every other one: they all hang below a member of the set."""
        members = set(provider_ids)
        if len(members) <= 1:
            return True
        common = None
        for pid in members:
            anc = self.ancestors(pid)
            common = anc if common is None else common & anc
            if not common:
                return False
        return bool(common & members)

    # -- sharing ---------------------------------------------------------

    def aggregate_roots(self) -> dict[str, tuple[int, ...]]:
        """Aggregate uuid -> the roots of the trees holding a provider in it."""
        if self._agg_roots is None:
            index: dict[str, dict[int, None]] = {}
            for prov in self._by_id.values():
                for agg in prov.aggregates:
                    index.setdefault(agg, {})[prov.root_id] = None
            self._agg_roots = {agg: tuple(roots)
                               for agg, roots in index.items()}
        return self._agg_roots

    def sharing_anchors(self, provider_id: int) -> tuple[int, ...]:
        """Roots of the trees whose providers share an aggregate with this
        provider (its own tree included when it is in an aggregate).

        Only meaningful for sharing providers; the solver adds the
        provider's own root separately.
        """
        found = self._anchor_cache.get(provider_id)
        if found is None:
            agg_roots = self.aggregate_roots()
            roots: dict[int, None] = {}
            for agg in sorted(self._by_id[provider_id].aggregates):
                for root in agg_roots.get(agg, ()):
                    roots[root] = None
            found = tuple(roots)
            self._anchor_cache[provider_id] = found
        return found

    def roots_with_sharing(self) -> frozenset[int]:
        """Roots of the trees that hold a sharing provider."""
        if self._sharing_roots is None:
            self._sharing_roots = frozenset(prov.root_id for prov in self._by_id.values() if prov.is_sharing)
        return self._sharing_roots

    def sharing_providers_by_anchor(self) -> dict[int, tuple[int, ...]]:
        """For each root, the sharing providers *outside* its tree that can
        lend it inventory, in id order (the order the search tries them,
        whatever order the providers were given in)."""
        if self._sharing_by_root is None:
            index: dict[int, list[int]] = {}
            for prov in self._by_id.values():
                if not prov.is_sharing:
                    continue
                for root in self.sharing_anchors(prov.id):
                    if root != prov.root_id:
                        index.setdefault(root, []).append(prov.id)
            self._sharing_by_root = {r: tuple(sorted(p)) for r, p in index.items()}
        return self._sharing_by_root
