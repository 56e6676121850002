"""Find allocation candidates for a parsed request over a provider snapshot.

The search, in Placement's terms
--------------------------------
A candidate is *anchored* at one root provider T.  Every request group is
served by providers "reachable" from T:

* the **unsuffixed group** may spread its resource classes over several
  providers: each class comes, whole, from one provider of tree T or from a
  sharing provider (``MISC_SHARES_VIA_AGGREGATE``) that shares an aggregate
  with some provider of T.  Its ``required`` traits must be met by the union
  of the traits of the providers it uses, none of which may carry a
  forbidden trait.  ``member_of`` is met by the provider *or by T* (an
  aggregate on a root spans its tree); a sharing provider must itself be a
  member.  A forbidden aggregate on the provider or on T excludes it.
  ``in_tree`` confines it to that tree, without sharing providers.
* a **suffixed group** is served by exactly one provider holding all its
  resources, traits and aggregates itself, either in T or sharing with T
  (``in_treeN`` constrains the provider, not the anchor).  A *resourceless*
  suffixed group (1.36) just names such a provider, by a required trait or
  aggregate: as in Placement, one with neither finds none.

Then: ``group_policy=isolate`` makes suffixed groups use distinct
providers; every ``same_subtree`` set of groups must have one of its
providers above (or equal to) all the others; amounts that several groups
put on one provider and class are summed and must still fit (capacity and
``max_unit``); ``root_required`` filters anchors by the root's traits;
before 1.29 a candidate may not use two providers of one tree.

Two candidates are the same when their allocations *and* mappings match,
so groups with identical requirements on swapped providers are distinct
candidates (``mappings`` tell them apart, as Placement reports them).

How it stays fast
-----------------
Nothing is enumerated that cannot be returned: per anchor, each group's
viable providers are computed once (predicates cached per provider and
shared between groups with identical requirements), an anchor missing a
group is skipped without search, and a depth-first search over groups
checks isolation, summed capacity, the unsuffixed traits and each
``same_subtree`` as soon as the groups involved are placed.  Candidates are
produced lazily, so with a ``limit`` (and no randomisation) the work stops
after ``limit`` candidates; ``max_allocation_candidates`` caps generation in
the order the strategy gives (``depth-first``: one anchor after another;
``breadth-first``: round-robin over anchors).

Extending the search
--------------------
:class:`Plan` (built by :meth:`Plan.build`) and :class:`Search` are
public for tools that look inside the search, such as
:mod:`allotment.domain.explain`: a plan may be built with rules relaxed
(``relaxed``, see :data:`SEARCH_RULES`), asked for the providers a slot
may take (:meth:`Plan.single_ok`, :meth:`Plan.multi_domain`), and given a
subclass of :class:`Search` as its ``search_class``.  The one method meant
to be overridden is :meth:`Search.consistent`, called once per placement
tried: an override may count, limit (by raising) or veto placements, and
calls the base method for the solver's own verdict.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence

from allotment.domain import inventory_fit as cap
from allotment.domain.provider_tree import RUN, KeptResults, Provider, ProviderSnapshot, RunCapacity, TreeMemo
from allotment.domain.request_groups import (
    AllocationCandidatesRequest, RequestGroup)

#: Candidates of one tree kept for later requests at most (more are
#: computed again).
MEMO_PER_TREE = 16
#: What the tree memo of one snapshot's kept results keeps at most, in units of about 250 bytes: a
#: kept candidate (with its encoded JSON, about 1 KB) counts
#: MEMO_CANDIDATE_UNITS, each tree's entry for a request (about 60-300
#: bytes, kept for a tree that gives nothing too) one: 20,000 candidates,
#: or the entries of eight queries that 10,000 trees meet none of.
MEMO_CANDIDATE_UNITS = 4
MEMO_LIMIT = 80_000
#: A mirror of more than MEMO_LIMIT / MEMO_UNITS_PER_TREE trees keeps this
#: many units per tree instead (100,000 trees: 400,000 units, up to about
#: 100 MB): a query without a limit over such a cloud fills 80,000 units
#: on its own (20,000 candidates), and a memo emptied at every request
#: keeps nothing.
MEMO_UNITS_PER_TREE = 4

DEPTH_FIRST = "depth-first"
BREADTH_FIRST = "breadth-first"
STRATEGIES = (DEPTH_FIRST, BREADTH_FIRST)

# The rules the search checks once every group has providers, in the order
# an explanation reports them.  A plan may be built with some of them
# switched off (``relaxed``): that is how :mod:`allotment.domain.explain`
# finds which rule eliminates a tree, with this very search rather than a
# second implementation of the rules.  Answers always enforce them all.
TRAITS_TOGETHER = "traits_together"    # the unsuffixed group's required traits
ISOLATE = "isolate"                    # group_policy=isolate
COMBINED_CAPACITY = "combined_capacity"  # amounts of several groups on one provider
SAME_SUBTREE = "same_subtree"
ONE_PROVIDER_PER_TREE = "one_provider_per_tree"  # before 1.29
SEARCH_RULES = (TRAITS_TOGETHER, ISOLATE, COMBINED_CAPACITY, SAME_SUBTREE, ONE_PROVIDER_PER_TREE)
#: Not a rule of the request: a candidate made of sharing providers only is
#: produced once, under the first anchor that reaches it.
DISTINCT = "distinct"


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------

@dataclasses.dataclass(slots=True, weakref_slot=True)
class AllocationRequest:
    """One candidate, ready to be shaped into JSON.

    ``allocations``: provider uuid -> {resource class: amount}, amounts of
    several groups summed.  ``mappings``: group suffix (``''`` for the
    unsuffixed group) -> uuids of the providers serving it (1.34+).
    """

    anchor_root_id: int
    allocations: dict[str, dict[str, int]]
    mappings: dict[str, list[str]]
    #: Internal ids of the providers holding allocated resources.
    provider_ids: tuple[int, ...]


@dataclasses.dataclass(slots=True)
class ProviderSummary:
    """A provider to list under ``provider_summaries``.

    Resources come from ``provider.inventories`` (``capacity``, ``used``);
    before 1.27 the API shows only requested classes.
    """

    provider: Provider
    parent_provider_uuid: str | None
    root_provider_uuid: str

    @property
    def uuid(self) -> str:
        return self.provider.uuid


@dataclasses.dataclass(slots=True, weakref_slot=True)
class TreeSummaries:
    """The summaries of every provider of one tree, in tree order, kept
    with a snapshot's :class:`~allotment.domain.provider_tree.KeptResults`
    while the tree does not change."""

    summaries: tuple[ProviderSummary, ...]


@dataclasses.dataclass(slots=True)
class AllocationCandidates:
    allocation_requests: list[AllocationRequest]
    provider_summaries: list[ProviderSummary]
    #: Candidates generated before ``limit`` or sampling picked the answer
    #: (equal to ``max_candidates`` when that cap cut generation short).
    generated: int = 0
    #: The same summaries tree by tree, when results are kept (from 1.29,
    #: where whole trees are listed); None otherwise.
    summary_trees: list[TreeSummaries] | None = None
    #: The runs of candidates (one tree's for one query) that the kept
    #: results hold, met while generating: the same objects are given again
    #: while they hold them.
    kept_runs: list[tuple[AllocationRequest, ...]] = dataclasses.field(default_factory=list)

    def kept_ids(self) -> set[int]:
        """The ids of the candidates (generated, not only chosen) that the
        kept results hold."""
        return {id(areq) for run in self.kept_runs for areq in run}


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------

def names_something(grp: RequestGroup) -> bool:
    """Whether a resourceless group asks for a required trait or aggregate.

    Placement looks for a resourceless group's provider among those having
    its required traits or aggregates; one naming neither (only forbidden
    traits or aggregates, or only ``in_tree``) finds no provider, so no
    candidate holds it."""
    return bool(grp.traits.required or grp.aggregates.required)


def find_allocation_candidates(
        request: AllocationCandidatesRequest,
        snapshot: ProviderSnapshot,
        *,
        max_candidates: int = -1,
        strategy: str = DEPTH_FIRST,
        randomize: bool = False,
        rng: random.Random | None = None,
        anchors: Iterable[int] | None = None,
        kept: KeptResults | None = None) -> AllocationCandidates:
    """Answer ``GET /allocation_candidates``.

    :param max_candidates: ``[placement] max_allocation_candidates``; -1 for
        no cap.  Generation stops once this many distinct candidates exist
        (as in Placement, 0 still lets the first one through).
    :param strategy: ``[placement] allocation_candidates_generation_strategy``.
    :param randomize: ``[placement] randomize_allocation_candidates``: pick
        ``limit`` candidates at random (and shuffle) instead of the first.
    :param anchors: see :func:`iter_allocation_requests`.
    :param kept: results kept from this snapshot for the next requests
        (the provider mirror's), read and added to.
    """
    kept_runs: list[tuple[AllocationRequest, ...]] = []
    stream: Iterator[AllocationRequest] = iter_allocation_requests(
        request, snapshot, strategy=strategy, anchors=anchors, kept=kept, kept_runs=kept_runs)
    if max_candidates >= 0:
        stream = itertools.islice(stream, max(max_candidates, 1))
    # zip pulls from the stream first: the counter only advances for
    # candidates actually generated.
    counter = itertools.count()
    stream = (areq for areq, _ in zip(stream, counter))
    limit = request.limit
    if randomize:
        rng = rng or random.Random()
        chosen = (_reservoir_sample(stream, limit, rng) if limit
                  else list(stream))
        rng.shuffle(chosen)
    else:
        chosen = list(itertools.islice(stream, limit) if limit
                      else stream)
    trees = None
    if request.nested_aware and kept is not None:
        trees = summarize_trees(chosen, snapshot, kept)
        summaries = list(itertools.chain.from_iterable(tree.summaries for tree in trees))
    else:
        summaries = summarize(chosen, snapshot, request.nested_aware, kept)
    return AllocationCandidates(
        allocation_requests=chosen,
        provider_summaries=summaries,
        generated=next(counter),
        summary_trees=trees,
        kept_runs=kept_runs)


def iter_allocation_requests(
        request: AllocationCandidatesRequest,
        snapshot: ProviderSnapshot,
        *,
        strategy: str = DEPTH_FIRST,
        anchors: Iterable[int] | None = None,
        kept: KeptResults | None = None,
        kept_runs: list | None = None) -> Iterator[AllocationRequest]:
    """Lazily yield distinct candidates in the strategy's order.

    :param anchors: the roots to try, in order, instead of every root of
        the snapshot.  It is consumed lazily, one root before its search,
        so a caller may add each tree (and the trees of the sharing
        providers that lend to it) to the snapshot just before yielding
        its root; ``in_tree`` trees must be there from the start.
    :param kept: results kept from this snapshot: each tree's candidates
        are taken from it, or kept in it (see :meth:`Plan.remembered`).
    :param kept_runs: the runs of candidates given from ``kept``, or kept
        there once given, are appended to it.
    """
    if strategy not in STRATEGIES:
        raise ValueError("Strategy '%s' not recognized" % strategy)
    plan = Plan.build(request, snapshot)
    if plan is None:
        return iter(())
    if kept is None:
        per_anchor = (plan.candidates_at(root)
                      for root in plan.anchor_roots(anchors))
    else:
        key = repr(dataclasses.replace(request, limit=None))
        roots = plan.every_root(anchors)
        per_anchor = plan.remembered(kept.trees, key, plan.anchor_roots(anchors) if roots is None else roots,
                                     [] if kept_runs is None else kept_runs)
    if strategy == DEPTH_FIRST:
        stream = itertools.chain.from_iterable(per_anchor)
    else:
        stream = _round_robin(per_anchor)
    return stream


def summarize(allocation_requests: Sequence[AllocationRequest],
              snapshot: ProviderSnapshot,
              nested_aware: bool = True,
              kept: KeptResults | None = None) -> list[ProviderSummary]:
    """Providers whose summaries accompany these candidates (each kept in
    ``kept``, by provider id, when given).

    From 1.29 every provider of every tree holding an allocated resource
    (resourceless mappings alone do not pull a tree in); before, only the
    providers holding allocated resources.
    """
    if nested_aware:
        pids = [pid for root in _used_roots(allocation_requests, snapshot)
                for pid in snapshot.tree(root)]
    else:
        used = {pid for areq in allocation_requests for pid in areq.provider_ids}
        pids = [prov.id for prov in snapshot if prov.id in used]
    if kept is None:
        return [_summary(snapshot.get(pid), snapshot) for pid in pids]
    by_provider = kept.summaries
    result = []
    for pid in pids:
        summary = by_provider.get(pid)
        if summary is None:
            summary = by_provider[pid] = _summary(snapshot.get(pid), snapshot)
        result.append(summary)
    return result


def summarize_trees(allocation_requests: Sequence[AllocationRequest],
                    snapshot: ProviderSnapshot, kept: KeptResults) -> list[TreeSummaries]:
    """:func:`summarize` from 1.29, tree by tree, each tree's summaries kept
    in ``kept`` (by root id)."""
    by_tree = kept.summaries
    result = []
    for root in _used_roots(allocation_requests, snapshot):
        tree = by_tree.get((root,))
        if tree is None:
            tree = by_tree[(root,)] = TreeSummaries(tuple(
                _summary(snapshot.get(pid), snapshot) for pid in snapshot.tree(root)))
        result.append(tree)
    return result


def _used_roots(allocation_requests: Sequence[AllocationRequest],
                snapshot: ProviderSnapshot) -> list[int]:
    """Roots of the trees holding an allocated resource, in snapshot
    order.  When no sharing provider lends outside its tree, a candidate's
    providers are all in its anchor's tree."""
    if snapshot.sharing_providers_by_anchor():
        roots = {snapshot.get(pid).root_id for areq in allocation_requests for pid in areq.provider_ids}
    else:
        roots = {areq.anchor_root_id for areq in allocation_requests if areq.provider_ids}
    return snapshot.in_root_order(roots)


def _summary(prov: Provider, snapshot: ProviderSnapshot) -> ProviderSummary:
    return ProviderSummary(
        provider=prov,
        parent_provider_uuid=snapshot.uuid_of(prov.parent_id),
        root_provider_uuid=snapshot.uuid_of(prov.root_id))


def _reservoir_sample(stream: Iterable, size: int,
                      rng: random.Random) -> list:
    """Uniform sample of ``size`` items in one pass and O(size) memory."""
    sample = []
    for seen, item in enumerate(stream):
        if seen < size:
            sample.append(item)
        else:
            pick = rng.randint(0, seen)
            if pick < size:
                sample[pick] = item
    return sample


def _round_robin(iterables: Iterable[Iterable]) -> Iterator:
    """One item from each iterable in turn until all are exhausted."""
    active = collections.deque(iter(it) for it in iterables)
    while active:
        try:
            item = next(active[0])
        except StopIteration:
            active.popleft()
            continue
        yield item
        active.rotate(-1)


# ---------------------------------------------------------------------------
# The plan: request-wide preparation and per-anchor search
# ---------------------------------------------------------------------------

@dataclasses.dataclass(slots=True)
class Slot:
    """One decision of the search: the provider for a suffixed group, or
    for one resource class of the unsuffixed group."""

    suffix: str
    amounts: tuple[tuple[str, int], ...]
    group: RequestGroup
    #: Suffixed groups are single-provider and take part in isolation.
    single: bool
    #: Key shared by slots whose provider predicate is identical.
    signature: tuple
    #: Whether the group has member_of rules (asked once, not per provider).
    has_aggregates: bool = False

    def __post_init__(self) -> None:
        self.has_aggregates = bool(self.group.aggregates)


class Plan:
    """Everything about a request that does not depend on the anchor."""

    def __init__(self, request: AllocationCandidatesRequest,
                 snapshot: ProviderSnapshot,
                 in_tree_roots: dict[str, int],
                 relaxed: frozenset[str] = frozenset()):
        self.request = request
        self.snapshot = snapshot
        self.in_tree_roots = in_tree_roots
        #: Rules switched off (see SEARCH_RULES); empty for an answer.
        self.relaxed = relaxed
        self.isolate = request.isolate and ISOLATE not in relaxed
        self.nested_aware = request.nested_aware or ONE_PROVIDER_PER_TREE in relaxed
        self.combined = COMBINED_CAPACITY not in relaxed
        self.distinct = DISTINCT not in relaxed
        #: The search used per anchor: :class:`Search` or a subclass of it
        #: (explain's counts its steps).
        self.search_class = Search
        self.slots: list[Slot] = []
        unsuffixed = request.group("")
        if unsuffixed is not None:
            for rc, amount in unsuffixed.resources.items():
                self.slots.append(Slot(
                    "", ((rc, amount),), unsuffixed, False,
                    ("multi", rc, amount)))
        for grp in request.groups:
            if grp.suffix:
                self.slots.append(Slot(
                    grp.suffix, tuple(grp.resources.items()), grp, True,
                    ("single", tuple(sorted(grp.resources.items())),
                     grp.traits, grp.aggregates, grp.in_tree)))
        # The unsuffixed traits are checked once its last class is placed.
        self.unsuffixed = unsuffixed if unsuffixed is not None and \
            unsuffixed.resources else None
        self.last_unsuffixed = sum(1 for s in self.slots if not s.single) - 1
        # same_subtree sets as slot indexes; each is re-checked whenever one
        # of its slots is placed (see Search._subtree_possible).
        slot_of = {s.suffix: i for i, s in enumerate(self.slots) if s.single}
        self.subtree_sets: list[tuple[int, ...]] = []
        self.subtree_checks: dict[int, list[tuple[int, ...]]] = {}
        for suffixes in (() if SAME_SUBTREE in relaxed else request.same_subtrees):
            idx = tuple(sorted(slot_of[s] for s in suffixes if s in slot_of))
            if len(idx) > 1:
                self.subtree_sets.append(idx)
                for i in idx:
                    self.subtree_checks.setdefault(i, []).append(idx)
        self._single_ok_cache: dict[tuple, dict[int, bool]] = {}
        self._seen: set = set()
        #: Candidates made of sharing providers only met so far: what one
        #: anchor gives then depends on the anchors before it.
        self.shared_only = 0
        #: Whether any sharing provider lends outside its tree: otherwise
        #: no candidate can be reached from two anchors.
        self.lenders = snapshot.sharing_providers_by_anchor()
        self.lending = bool(self.lenders)
        self.check_traits = (self.unsuffixed is not None
                             and bool(self.unsuffixed.traits.required)
                             and TRAITS_TOGETHER not in relaxed)
        self.slot_count = len(self.slots)
        # For trees of one provider (see _lone): what every slot together
        # puts on it, and the classes asked for by more than one slot.  And
        # what one provider (of the anchor's tree or lent to it) must take
        # at least, per class: a tree or run of trees that cannot is passed
        # over (see RunCapacity).  Not with rules relaxed (explain's).
        self._lone_amounts: dict[str, int] = {}
        asked: dict[str, int] = {}
        needs: dict[str, int] = {}
        for slot in self.slots:
            for rc, amount in slot.amounts:
                self._lone_amounts[rc] = self._lone_amounts.get(rc, 0) + amount
                asked[rc] = asked.get(rc, 0) + 1
                needs[rc] = max(needs.get(rc, 0), amount)
        self._needs = () if relaxed else tuple(needs.items())
        self._lone_shared = [rc for rc, count in asked.items()
                             if count > 1 and self.combined]
        self._lone_suffixes = list(dict.fromkeys(
            slot.suffix for slot in self.slots))
        self._lone_isolation_fails = self.isolate and sum(
            1 for slot in self.slots if slot.single) > 1

    @classmethod
    def build(cls, request: AllocationCandidatesRequest,
              snapshot: ProviderSnapshot,
              relaxed: frozenset[str] = frozenset()) -> Plan | None:
        """A plan, or None when some ``in_tree`` provider is unknown (no
        candidate can then exist).  ``relaxed``: rules switched off."""
        roots = {}
        for grp in request.groups:
            if grp.in_tree:
                prov = snapshot.by_uuid(grp.in_tree)
                if prov is None:
                    return None
                roots[grp.in_tree] = prov.root_id
        plan = cls(request, snapshot, roots, relaxed)
        if not plan.slots:
            return None
        return plan

    # -- anchors -----------------------------------------------------------

    def anchor_roots(self, anchors: Iterable[int] | None = None
                     ) -> Iterator[int]:
        """Roots that may anchor a candidate, in snapshot order (or in the
        order of ``anchors``)."""
        root_traits = self.request.root_traits
        unsuffixed_tree = (self.unsuffixed.in_tree
                           if self.unsuffixed is not None else None)
        roots: Iterable[int]
        if anchors is not None:
            roots = anchors
            if unsuffixed_tree:
                only = self.in_tree_roots[unsuffixed_tree]
                roots = (root for root in anchors if root == only)
        elif unsuffixed_tree:
            roots = (self.in_tree_roots[unsuffixed_tree],)
        else:
            roots = self.snapshot.root_ids
        if not root_traits:
            return iter(roots)
        get = self.snapshot.get
        return (root for root in roots if root_traits.matches(get(root).traits))

    def every_root(self, anchors: Iterable[int] | None = None) -> tuple[int, ...] | None:
        """The snapshot's ``root_ids`` when they are the roots
        :meth:`anchor_roots` gives (before its root traits are checked),
        else None."""
        if anchors is not None and anchors is not self.snapshot.root_ids:
            return None
        if self.unsuffixed is not None and self.unsuffixed.in_tree:
            return None
        return self.snapshot.root_ids

    # -- per-provider predicates ----------------------------------------------

    def single_ok(self, grp: RequestGroup, prov: Provider) -> bool:
        """Can this provider alone serve the suffixed group?"""
        inventories = prov.inventories
        for rc, amount in grp.resources.items():
            inv = inventories.get(rc)
            if inv is None or not inv.fits(amount):
                return False
        if not grp.resources and not names_something(grp):
            return False
        if not grp.traits.matches(prov.traits):
            return False
        if grp.aggregates and not grp.aggregates.matches(prov.aggregates):
            return False
        if grp.in_tree and prov.root_id != self.in_tree_roots[grp.in_tree]:
            return False
        return True

    def _single_ok_cached(self, slot: Slot, pid: int) -> bool:
        """:meth:`single_ok` for providers seen under many anchors
        (sharing providers)."""
        cache = self._single_ok_cache.setdefault(slot.signature, {})
        found = cache.get(pid)
        if found is None:
            found = self.single_ok(slot.group, self.snapshot.get(pid))
            cache[pid] = found
        return found

    def _multi_base_ok(self, slot: Slot, prov: Provider) -> bool:
        """Capacity and forbidden traits for one unsuffixed class; the
        aggregate rules depend on the anchor and are applied by the caller."""
        (rc, amount), = slot.amounts
        inv = prov.inventories.get(rc)
        return (inv is not None and inv.fits(amount)
                and not slot.group.traits.forbids_any(prov.traits))

    # -- domains -------------------------------------------------------------

    def _slot_domains(self, root: int) -> Iterator[list[int]]:
        """The viable providers of each slot for this anchor, slot by slot
        (lazily: a caller may stop at the first empty one).  Slots with
        identical requirements share one list."""
        sharing = self.lenders.get(root, ())
        by_class = self.snapshot.tree_by_class(root)
        memo: dict[tuple, list[int]] = {}
        for slot in self.slots:
            domain = memo.get(slot.signature)
            if domain is None:
                if slot.single:
                    domain = self._single_domain(slot, root, by_class,
                                                 sharing)
                else:
                    domain = self.multi_domain(slot, root, by_class,
                                                sharing)
                memo[slot.signature] = domain
            yield domain

    def all_domains(self, root: int) -> list[list[int]]:
        """Every slot's viable providers for this anchor, empty ones
        included (explain says which slots have none)."""
        return list(self._slot_domains(root))

    def _domains(self, root: int) -> list[list[int]] | None:
        """Viable providers of every slot for this anchor, or None when
        some slot has none."""
        snapshot = self.snapshot
        domains = []
        for domain in self._slot_domains(root):
            if not domain:
                return None
            domains.append(domain)
        if self.check_traits:
            # Cheap test before searching: even all the providers the
            # unsuffixed classes could use together lack a required trait.
            available: set[str] = set()
            for slot, domain in zip(self.slots, domains):
                if not slot.single:
                    for pid in domain:
                        available.update(snapshot.get(pid).traits)
            if not self.unsuffixed.traits.satisfied_by(available):
                return None
        return domains

    def _single_domain(self, slot: Slot, root: int,
                       by_class: dict[str, list[int]],
                       sharing: Sequence[int]) -> list[int]:
        snapshot = self.snapshot
        grp = slot.group
        if slot.amounts:
            # Only providers with inventory of the first class can qualify.
            in_tree = by_class.get(slot.amounts[0][0], ())
        else:
            in_tree = snapshot.tree(root)
        domain = [pid for pid in in_tree
                  if self.single_ok(grp, snapshot.get(pid))]
        domain += [pid for pid in sharing
                   if self._single_ok_cached(slot, pid)]
        return domain

    def multi_domain(self, slot: Slot, root: int,
                     by_class: dict[str, list[int]],
                     sharing: Sequence[int]) -> list[int]:
        """Providers for one unsuffixed class: capacity, no forbidden
        trait, and the aggregate rules (an aggregate on the root spans its
        tree; a sharing provider must be a member itself)."""
        grp = slot.group
        in_tree = grp.in_tree
        if in_tree and self.in_tree_roots[in_tree] != root:
            return []
        get = self.snapshot.get
        aggs = grp.aggregates if slot.has_aggregates else None
        forbidden = grp.traits.forbidden
        (rc, amount), = slot.amounts
        root_member = True
        if aggs is not None:
            root_aggs = get(root).aggregates
            if aggs.forbids_any(root_aggs):
                return []
            root_member = not aggs.required or aggs.satisfied_by(root_aggs)
        domain = []
        for pid in by_class.get(rc, ()):
            prov = get(pid)
            if not prov.inventories[rc].fits(amount):
                continue
            if forbidden and not forbidden.isdisjoint(prov.traits):
                continue
            if aggs is not None and (
                    aggs.forbids_any(prov.aggregates) or not (
                        root_member or aggs.satisfied_by(prov.aggregates))):
                continue
            domain.append(pid)
        if in_tree or not sharing:
            return domain
        for pid in sharing:
            prov = get(pid)
            inv = prov.inventories.get(rc)
            if inv is None or not inv.fits(amount):
                continue
            if forbidden and not forbidden.isdisjoint(prov.traits):
                continue
            if aggs is not None and not aggs.matches(prov.aggregates):
                continue
            domain.append(pid)
        return domain

    # -- search ----------------------------------------------------------------

    def candidates_at(self, root: int) -> Iterable[AllocationRequest]:
        """All candidates anchored at ``root``, lazily."""
        snapshot = self.snapshot
        if len(snapshot.tree(root)) == 1 and not (
                self.lending and (root in self.lenders
                                  or snapshot.get(root).is_sharing)):
            return self._lone(root)
        domains = self._domains(root)
        if domains is None:
            return ()
        search = self.search_class(self, root, domains)
        for domain in domains:
            if len(domain) != 1:
                return search.run()
        # One provider per slot (flat trees, mostly): one assignment to
        # check, without the search's generators.
        found = search.only()
        return (found,) if found is not None else ()

    def remembered(self, memo: TreeMemo, key: str, roots: Iterable[int],
                   kept_runs: list) -> Iterator[Iterable[AllocationRequest]]:
        """:meth:`candidates_at` for each of ``roots`` in turn, each kept in
        ``memo`` under ``key`` (the request but its limit) for the next
        requests while neither the tree nor a sharing provider lending to
        it changes (:meth:`KeptResults.after` forgets it then).  The trees the
        memo knows give nothing are passed over: a query that few trees
        meet (``member_of``, rare traits) costs a dictionary lookup per
        other tree, and one whose trees are every root of the snapshot in
        order (see :meth:`anchor_roots`) a lookup per run of
        :data:`~allotment.domain.provider_tree.RUN` trees that all give
        nothing (a cloud whose first trees are full).  A run or tree whose
        providers cannot take an amount asked of one provider
        (:class:`~allotment.domain.provider_tree.RunCapacity`) is known to
        give nothing without a search, from the first asking.

        Not kept: a tree holding a sharing provider, more than
        :data:`MEMO_PER_TREE` candidates, and candidates searched while a
        candidate made of sharing providers only was met (given under the
        first anchor that reaches it, so what this anchor gives depends on
        the others).  The ids of the candidates given from the memo, or
        kept in it, are appended to ``kept_runs`` (as the memo keeps them)."""
        order = self.snapshot.root_ids
        if roots is not order:
            yield from self._remembered_trees(memo, key, roots, kept_runs, None)
            return
        root_traits = self.request.root_traits
        get = self.snapshot.get
        needs = self._needs
        for start in range(0, len(order), RUN):
            runs = memo.runs_of(self.snapshot)
            found = runs.get(start // RUN)
            if found is not None and key in found:
                continue
            if needs and memo.capacity_of(start // RUN, self.snapshot, self.lenders).short_of(needs):
                memo.nothing_in(runs, start // RUN, key, self.snapshot)
                continue
            trees = order[start:start + RUN]
            if root_traits:
                trees = [root for root in trees if root_traits.matches(get(root).traits)]
            nothing = [True]
            yield from self._remembered_trees(memo, key, trees, kept_runs, nothing)
            if nothing[0]:
                memo.nothing_in(runs, start // RUN, key, self.snapshot)

    def _remembered_trees(self, memo: TreeMemo, key: str, roots: Iterable[int],
                          kept_runs: list, nothing: list | None) -> Iterator[Iterable[AllocationRequest]]:
        """:meth:`remembered` tree by tree; ``nothing[0]`` stays true while
        every tree is kept as giving nothing (once each has been asked
        for all it gives)."""
        remembering = self._remembering
        sharing = self.snapshot.roots_with_sharing() if self.lending else ()
        needs, snapshot, lenders = self._needs, self.snapshot, self.lenders
        for root in roots:
            if sharing and root in sharing:
                if nothing:
                    nothing[0] = False
                yield self.candidates_at(root)
                continue
            per_key = memo.entries.get(root)
            if per_key is not None:
                kept = per_key.get(key)
                if kept is not None:
                    if kept[0]:
                        if nothing:
                            nothing[0] = False
                        kept_runs.append(kept[0])
                        yield kept[0]
                    continue
            if needs and RunCapacity.of((root,), snapshot, lenders).short_of(needs):
                memo.put(root, key, (), 1)  # as a search that found nothing keeps it
                continue
            yield remembering(memo, key, root, kept_runs)
            if nothing and nothing[0]:
                per_key = memo.entries.get(root)
                kept = per_key.get(key) if per_key is not None else None
                nothing[0] = kept is not None and not kept[0]

    def _remembering(self, memo: TreeMemo, key: str, root: int,
                     kept_runs: list) -> Iterator[AllocationRequest]:
        kept: list[AllocationRequest] | None = []
        shared_only = self.shared_only
        for areq in self.candidates_at(root):
            if kept is not None:
                kept.append(areq)
                if len(kept) > MEMO_PER_TREE:
                    kept = None
            yield areq
        # All of them were asked for (a limit may stop before).
        if kept is not None and self.shared_only == shared_only:
            run = tuple(kept)
            kept_runs.append(run)
            memo.put(root, key, run, MEMO_CANDIDATE_UNITS * len(kept) + 1)

    def _lone(self, root: int) -> tuple[AllocationRequest, ...]:
        """The candidates of a tree of one provider that borrows nothing
        (flat compute nodes): every slot on that provider, or none.

        The checks of :meth:`_domains` and :class:`Search` reduced to one
        provider: each slot's own predicate, then isolation (two suffixed
        groups cannot share it), the summed amounts, and the unsuffixed
        group's required traits; ``same_subtree`` and the one-provider-
        per-tree rule hold trivially.  It cannot repeat under another
        anchor (nothing lends to it, and it lends to nobody).
        """
        if self._lone_isolation_fails:
            return ()
        prov = self.snapshot.get(root)
        inventories = prov.inventories
        for slot in self.slots:
            grp = slot.group
            if slot.single:
                if not self.single_ok(grp, prov):
                    return ()
                continue
            if grp.in_tree and self.in_tree_roots[grp.in_tree] != root:
                return ()
            (rc, amount), = slot.amounts
            inv = inventories.get(rc)
            if inv is None or not inv.fits(amount):
                return ()
            forbidden = grp.traits.forbidden
            if forbidden and not forbidden.isdisjoint(prov.traits):
                return ()
            if slot.has_aggregates and not grp.aggregates.matches(
                    prov.aggregates):
                return ()
        for rc in self._lone_shared:
            if self._lone_amounts[rc] > inventories[rc].combined_limit:
                return ()
        if self.check_traits and not self.unsuffixed.traits.satisfied_by(
                prov.traits):
            return ()
        uuid = prov.uuid
        allocations = ({uuid: dict(self._lone_amounts)}
                       if self._lone_amounts else {})
        return (AllocationRequest(
            anchor_root_id=root,
            allocations=allocations,
            mappings={suffix: [uuid] for suffix in self._lone_suffixes},
            provider_ids=(root,) if allocations else ()),)

    def is_repeat(self, picked: Sequence[int],
                  allocations: dict, mappings: dict) -> bool:
        """True for a candidate already produced under another anchor.

        Only a candidate made purely of sharing providers can be reached
        from more than one anchor, so only those are remembered.
        """
        if not self.lending or not self.distinct:
            return False
        snapshot = self.snapshot
        if not all(snapshot.get(pid).is_sharing for pid in picked):
            return False
        key = (frozenset((uuid, rc, amount)
                         for uuid, res in allocations.items()
                         for rc, amount in res.items()),
               frozenset((suffix, frozenset(uuids))
                         for suffix, uuids in mappings.items()))
        self.shared_only += 1
        if key in self._seen:
            return True
        self._seen.add(key)
        return False


class Search:
    """Depth-first assignment of providers to slots for one anchor.

    The extension point of the search (see the module doc): a subclass
    set as a plan's ``search_class`` may override :meth:`consistent`.
    """

    __slots__ = ("plan", "root", "domains", "slots", "picked", "load",
                 "isolated", "limits", "offered", "reach", "last")

    def __init__(self, plan: Plan, root: int, domains: list[list[int]]):
        self.plan = plan
        self.root = root
        self.domains = domains
        self.slots = plan.slots
        self.last = plan.slot_count - 1
        self.picked: list[int] = [0] * len(domains)
        self.load: dict[tuple[int, str], int] = {}
        self.isolated: set[int] = set()
        self.limits: dict[tuple[int, str], int] = {}
        # For slots in a same_subtree set: their providers, and every
        # ancestor-or-self of those providers.
        self.offered: dict[int, set[int]] = {}
        self.reach: dict[int, set[int]] = {}
        snapshot = plan.snapshot
        for idx in plan.subtree_sets:
            for i in idx:
                if i not in self.offered:
                    self.offered[i] = set(domains[i])
                    reach: set[int] = set()
                    for pid in domains[i]:
                        reach.update(snapshot.ancestors(pid))
                    self.reach[i] = reach

    def _limit(self, pid: int, rc: str) -> int:
        key = (pid, rc)
        found = self.limits.get(key)
        if found is None:
            if self.plan.combined:
                found = self.plan.snapshot.get(pid).inventories[rc].combined_limit
            else:
                found = cap.MAX_INT * len(self.slots)  # rule switched off
            self.limits[key] = found
        return found

    def run(self) -> Iterator[AllocationRequest]:
        return self._place(0)

    def only(self) -> AllocationRequest | None:
        """The candidate when every domain holds one provider, if valid:
        the checks of :meth:`_place`, in the same order, on that one
        assignment."""
        plan = self.plan
        picked = self.picked
        load = self.load
        for depth, (slot, domain) in enumerate(zip(self.slots, self.domains)):
            pid = domain[0]
            if plan.isolate and slot.single:
                if pid in self.isolated:
                    return None
                self.isolated.add(pid)
            for rc, amount in slot.amounts:
                key = (pid, rc)
                before = load.get(key)
                if before is None:
                    # A domain's providers fit their slot's amounts alone.
                    load[key] = amount
                    continue
                total = before + amount
                if total > self._limit(pid, rc):
                    return None
                load[key] = total
            picked[depth] = pid
            if not self.consistent(depth):
                return None
        if not plan.nested_aware and not self._one_provider_per_tree():
            return None
        return self._emit()

    def _place(self, depth: int) -> Iterator[AllocationRequest]:
        plan = self.plan
        slot = self.slots[depth]
        isolate = plan.isolate and slot.single
        last = depth == self.last
        load = self.load
        picked = self.picked
        isolated = self.isolated
        for pid in self.domains[depth]:
            if isolate and pid in isolated:
                continue
            added = []
            fits = True
            for rc, amount in slot.amounts:
                key = (pid, rc)
                before = load.get(key)
                if before is None:
                    # A domain's providers fit their slot's amounts alone.
                    total = amount
                else:
                    total = before + amount
                    if total > self._limit(pid, rc):
                        fits = False
                        break
                load[key] = total
                added.append((key, amount))
            if fits:
                picked[depth] = pid
                if self.consistent(depth):
                    if last:
                        # The leaf inline: no generator per candidate.
                        if plan.nested_aware or \
                                self._one_provider_per_tree():
                            areq = self._emit()
                            if areq is not None:
                                yield areq
                    else:
                        if isolate:
                            isolated.add(pid)
                        yield from self._place(depth + 1)
                        if isolate:
                            isolated.discard(pid)
            for key, amount in added:
                remaining = load[key] - amount
                if remaining:
                    load[key] = remaining
                else:
                    del load[key]

    def consistent(self, depth: int) -> bool:
        """Checks that become decidable once slot ``depth`` is placed (the
        overridable hook: called once per placement tried; ``self.picked[:depth
        + 1]`` holds the providers placed so far)."""
        plan = self.plan
        if not plan.check_traits and not plan.subtree_checks:
            return True
        snapshot = plan.snapshot
        if depth == plan.last_unsuffixed and plan.check_traits:
            traits: set[str] = set()
            for i in range(depth + 1):
                traits.update(snapshot.get(self.picked[i]).traits)
            if not plan.unsuffixed.traits.satisfied_by(traits):
                return False
        for idx in plan.subtree_checks.get(depth, ()):
            if not self._subtree_possible(idx, depth):
                return False
        return True

    def _subtree_possible(self, idx: tuple[int, ...], depth: int) -> bool:
        """Can the same_subtree set ``idx`` still be met, given its slots
        placed up to ``depth``?

        The set is met when one member is an ancestor-or-self of all the
        others, i.e. when the lowest common ancestor L of all members is a
        member.  With only some placed (L being theirs):

        * if L is not placed, a remaining slot must still be able to pick
          an ancestor-or-self of L;
        * if L is placed, either a remaining slot can pick a strict ancestor
          of L (a new top), or L stays the top and every remaining slot
          must be able to pick something at or below L.

        Pruning here, not only once the set is complete, keeps doomed
        branches from being enumerated.
        """
        snapshot = self.plan.snapshot
        placed = [self.picked[i] for i in idx if i <= depth]
        remaining = [i for i in idx if i > depth]
        top = snapshot.lowest_common_ancestor(placed)
        if top is None:
            return False
        lineage = snapshot.lineage(top)
        if top not in placed:
            return any(a in self.offered[i] for i in remaining
                       for a in lineage)
        if any(a in self.offered[i] for i in remaining for a in lineage[1:]):
            return True
        return all(top in self.reach[i] for i in remaining)

    def _one_provider_per_tree(self) -> bool:
        """Before 1.29: no two providers of one tree may hold resources."""
        snapshot = self.plan.snapshot
        owner: dict[int, int] = {}
        for slot, pid in zip(self.slots, self.picked):
            if not slot.amounts:
                continue
            root = snapshot.get(pid).root_id
            if owner.setdefault(root, pid) != pid:
                return False
        return True

    def _emit(self) -> AllocationRequest | None:
        get = self.plan.snapshot.get
        allocations: dict[str, dict[str, int]] = {}
        mappings: dict[str, list[str]] = {}
        holders: dict[int, None] = {}
        for slot, pid in zip(self.slots, self.picked):
            uuid = get(pid).uuid
            if slot.amounts:
                holders[pid] = None
                resources = allocations.get(uuid)
                if resources is None:
                    resources = allocations[uuid] = {}
                for rc, amount in slot.amounts:
                    resources[rc] = resources.get(rc, 0) + amount
            serving = mappings.get(slot.suffix)
            if serving is None:
                mappings[slot.suffix] = [uuid]
            elif uuid not in serving:
                serving.append(uuid)
        if self.plan.lending and self.plan.is_repeat(
                self.picked, allocations, mappings):
            return None
        return AllocationRequest(
            anchor_root_id=self.root,
            allocations=allocations,
            mappings=mappings,
            provider_ids=tuple(holders))
