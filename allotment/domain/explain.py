"""Why an allocation-candidates request finds what it finds (or nothing).

"No valid host was found" is the question operators most often have to
answer; this module answers it for one ``GET /allocation_candidates``
query, over a snapshot holding every tree the request concerns (loaded by
:func:`allotment.db.allocation_candidates.load_all_trees`, without the
narrowing the answer's own loading does).

Same engine, no second set of rules
-----------------------------------
Every verdict here comes from the solver of
:mod:`allotment.domain.allocation_candidates`, never from a re-statement of
its rules:

* which trees may anchor a candidate (``in_tree``, ``root_required``):
  the plan's :meth:`~allotment.domain.allocation_candidates.Plan.anchor_roots`;
* which providers can serve each group (or each class of the unsuffixed
  group) under each anchor: the plan's domains;
* whether a tree yields candidates: the plan's search.  The rules the
  search checks once every group has providers (the unsuffixed group's
  traits together, ``isolate``, amounts summed on one provider,
  ``same_subtree``, one provider per tree before 1.29) are switched on one
  after the other (:data:`~allotment.domain.allocation_candidates
  .SEARCH_RULES`), so the first rule under which a tree stops yielding is
  the one that eliminates it;
* how many candidates there are: the plan's own enumeration, cut where
  ``max_allocation_candidates`` (or the safety cap) cuts it.

What this module adds is the *why*: which part of a failed predicate
failed (:func:`provider_problems` names the missing trait, the class
without room, the aggregate...), for the funnel (how many providers and
trees each filter leaves, in the order they apply) and for the near misses
(the trees that came closest, and exactly what they lack).  A property
test checks that a provider has no problem exactly when the solver's
predicate accepts it, so the words cannot drift from the rules.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterable, Sequence

from allotment.domain import allocation_candidates as solver
from allotment.domain.provider_tree import Provider, ProviderInventory, ProviderSnapshot
from allotment.domain.request_groups import AggregateExpression, AllocationCandidatesRequest, TraitExpression

#: Near misses listed in an explanation.
CLOSEST = 5
#: Placements one probe of one tree may try before it is given up as too
#: large to explain (the answer itself is never cut short by this).
SEARCH_BUDGET = 20_000
#: Reasons named in the one-line verdict.
VERDICT_REASONS = 4

# Filters of a provider, in the order they are applied to each group.
INVENTORY, UNITS, CAPACITY = "inventory", "units", "capacity"
REQUIRED, FORBIDDEN = "required", "forbidden"
MEMBER_OF, FORBIDDEN_MEMBER_OF, IN_TREE = "member_of", "forbidden_member_of", "in_tree"
#: A resourceless group naming no required trait or aggregate: no provider
#: passes (see ``solver.names_something``).
NAMES_SOMETHING = "names_something"
PROVIDER_FILTERS = (NAMES_SOMETHING, INVENTORY, UNITS, CAPACITY, REQUIRED, FORBIDDEN, MEMBER_OF, FORBIDDEN_MEMBER_OF,
                    IN_TREE)

# Filters of a tree, in order: the request's trees, the anchor rules, one
# "has a provider" step per slot (``slot0``, ``slot1``...), then the search
# rules; a tree the search could not decide within the budget is UNDECIDED.
REQUESTED, ROOT_REQUIRED, UNDECIDED = "requested", "root_required", "undecided"

# Problem kinds.
NO_INVENTORY = "no_inventory"        # a tree without the class (nor a lender of it)
MIN_UNIT, MAX_UNIT, STEP_SIZE = "min_unit", "max_unit", "step_size"
TRAIT, FORBIDDEN_TRAIT = "trait", "forbidden_trait"
AGGREGATE, FORBIDDEN_AGGREGATE = "aggregate", "forbidden_aggregate"
ROOT_TRAIT, ROOT_FORBIDDEN_TRAIT = "root_trait", "root_forbidden_trait"
NO_PROVIDER = "no_provider"
NAMES_NOTHING = "names_nothing"      # a resourceless group with nothing to look a provider up by

_FILTER_OF_KIND = {
    INVENTORY: INVENTORY, MIN_UNIT: UNITS, MAX_UNIT: UNITS, STEP_SIZE: UNITS, CAPACITY: CAPACITY,
    TRAIT: REQUIRED, FORBIDDEN_TRAIT: FORBIDDEN, AGGREGATE: MEMBER_OF,
    FORBIDDEN_AGGREGATE: FORBIDDEN_MEMBER_OF, IN_TREE: IN_TREE, NAMES_NOTHING: NAMES_SOMETHING,
}


# ---------------------------------------------------------------------------
# What an explanation is made of
# ---------------------------------------------------------------------------

def group_name(suffix: str | None) -> str:
    return "the unsuffixed group" if suffix == "" else f"group {suffix}"


def _groups(suffixes: Sequence[str]) -> str:
    """``groups 1 and 2``, ``the unsuffixed group and group 1``."""
    if all(suffixes):
        return "groups " + _and(list(suffixes))
    return _and([group_name(s) for s in suffixes])


def _and(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _any_of(names: Iterable[str]) -> str:
    names = sorted(names)
    return names[0] if len(names) == 1 else "any of " + ", ".join(names)


@dataclasses.dataclass(slots=True)
class Problem:
    """One thing that keeps a provider (or a tree) from serving.

    ``text`` is the line a person reads ("VCPU: 4 requested, 2 free of 16
    (12 used, reserved 2, ratio 1.0)"); ``reason`` the short phrase the
    verdict counts trees by ("not enough free VCPU").
    """

    kind: str
    #: The request group it concerns ('' the unsuffixed one); None: the request.
    group: str | None = None
    resource_class: str | None = None
    provider_id: int | None = None
    amount: int | None = None
    inventory: ProviderInventory | None = None
    #: What is missing: trait or aggregate names (an any-of set), group suffixes...
    subject: tuple[str, ...] = ()
    #: A sentence for the kinds that need one (search rules).
    sentence: str = ""
    #: In another tree than ``in_tree`` asks for: no use as a near miss.
    hard: bool = False
    #: For the root of the tree, not the provider itself.
    on_root: bool = False

    @property
    def filter(self) -> str:
        return _FILTER_OF_KIND.get(self.kind, self.kind)

    @property
    def shortfall(self) -> float:
        """How far from fitting, 0 < x <= 1 (a missing trait counts 1)."""
        inv, amount = self.inventory, self.amount
        if inv is None or not amount:
            return 1.0
        if self.kind == CAPACITY:
            return min(1.0, max(amount - inv.free, 1) / amount)
        if self.kind == MAX_UNIT:
            return min(1.0, (amount - inv.max_unit) / amount)
        if self.kind == MIN_UNIT:
            return min(1.0, (inv.min_unit - amount) / inv.min_unit)
        return 0.5

    @property
    def text(self) -> str:
        kind, rc, inv, amount = self.kind, self.resource_class, self.inventory, self.amount
        subject = self.subject
        if kind == CAPACITY:
            return (f"{rc}: {amount} requested, {inv.free} free of {inv.total} "
                    f"({inv.used} used, reserved {inv.reserved}, ratio {float(inv.allocation_ratio)})")
        if kind == MAX_UNIT:
            return f"{rc}: max_unit {inv.max_unit} < {amount} requested"
        if kind == MIN_UNIT:
            return f"{rc}: min_unit {inv.min_unit} > {amount} requested"
        if kind == STEP_SIZE:
            return f"{rc}: step_size {inv.step_size} does not divide {amount}"
        if kind == INVENTORY:
            return f"no {rc} inventory"
        if kind == NO_INVENTORY:
            return f"no provider in the tree has {rc} inventory, nor does a sharing provider lend it"
        if kind == TRAIT:
            return f"lacks trait {_any_of(subject)}" + (self.sentence and f" ({self.sentence})")
        if kind == FORBIDDEN_TRAIT:
            return f"has forbidden trait {subject[0]}"
        if kind == AGGREGATE:
            tail = " (nor is its root)" if self.on_root else ""
            return f"not in aggregate {_any_of(subject)}{tail}"
        if kind == FORBIDDEN_AGGREGATE:
            return (f"its root is in forbidden aggregate {subject[0]}" if self.on_root
                    else f"in forbidden aggregate {subject[0]}")
        if kind == IN_TREE:
            return f"not in the tree of in_tree{self.group or ''} provider {subject[0]}"
        if kind == NAMES_NOTHING:
            return (f"{group_name(self.group)} has no resources and names no required trait or aggregate: "
                    "Placement looks its provider up by those, so it finds none")
        if kind == ROOT_TRAIT:
            return f"root lacks trait {subject[0]}"
        if kind == ROOT_FORBIDDEN_TRAIT:
            return f"root has forbidden trait {subject[0]}"
        return self.sentence

    @property
    def reason(self) -> str:
        """The phrase trees are counted by in the verdict."""
        kind, rc, subject = self.kind, self.resource_class, self.subject
        if kind == CAPACITY:
            return f"not enough free {rc}"
        if kind == MAX_UNIT:
            return f"{rc} max_unit too small"
        if kind == MIN_UNIT:
            return f"{rc} min_unit too large"
        if kind == STEP_SIZE:
            return f"{rc} step_size does not divide the amount"
        if kind in (INVENTORY, NO_INVENTORY):
            return f"no {rc} inventory"
        if kind == TRAIT:
            return f"lack trait {_any_of(subject)}"
        if kind == FORBIDDEN_TRAIT:
            return f"have forbidden trait {subject[0]}"
        if kind == AGGREGATE:
            return f"not in aggregate {_any_of(subject)}"
        if kind == FORBIDDEN_AGGREGATE:
            return f"in forbidden aggregate {subject[0]}"
        if kind == IN_TREE:
            return f"outside the tree of in_tree{self.group or ''} provider {subject[0]}"
        if kind == NAMES_NOTHING:
            return f"{group_name(self.group)} names no required trait or aggregate"
        if kind == ROOT_TRAIT:
            return f"root lacks trait {subject[0]}"
        if kind == ROOT_FORBIDDEN_TRAIT:
            return f"root has forbidden trait {subject[0]}"
        if kind == solver.ISOLATE:
            return "isolate: groups would need the same provider"
        if kind == solver.COMBINED_CAPACITY:
            return "groups together exceed a provider" + (f"'s {rc}" if rc else "")
        if kind == solver.SAME_SUBTREE:
            return f"same_subtree {','.join(subject)}: no common ancestor"
        if kind == solver.TRAITS_TOGETHER:
            return "unsuffixed group's traits not on one combination"
        if kind == solver.ONE_PROVIDER_PER_TREE:
            return "need several providers of one tree (before 1.29)"
        if kind == UNDECIDED:
            return "too large to explain"
        return self.sentence


PROVIDERS, TREES = "providers", "trees"


@dataclasses.dataclass(slots=True)
class Step:
    """One filter of the funnel and what was left after it.

    ``scope`` PROVIDERS: the providers that pass this filter and every
    earlier one of the same group (or class of the unsuffixed group), and
    the trees having, or borrowing, such a provider.  ``scope`` TREES: the
    trees still able to serve the whole request.  ``group`` and
    ``resource_class`` say which group (class) a step concerns, if one.
    """

    scope: str
    filter: str
    label: str
    group: str | None = None
    resource_class: str | None = None
    providers_left: int | None = None
    providers_eliminated: int | None = None
    trees_left: int = 0
    trees_eliminated: int = 0


@dataclasses.dataclass(slots=True)
class TreeVerdict:
    """What became of one tree: ``stage`` is the filter that eliminated it
    (None: it can serve the request); ``problems`` everything it lacks, as
    far as that stage shows."""

    root_id: int
    stage: str | None = None
    problems: list[Problem] = dataclasses.field(default_factory=list)
    #: Candidates counted under this anchor (depth-first, up to the cap).
    candidates: int = 0

    @property
    def distance(self) -> tuple[int, float]:
        return len(self.problems), sum(p.shortfall for p in self.problems)

    @property
    def hard(self) -> bool:
        return any(p.hard for p in self.problems)


@dataclasses.dataclass
class Explanation:
    steps: list[Step]
    #: Every tree the request concerns, in search order.
    trees: list[TreeVerdict]
    #: Trees in the whole cloud (those not in ``trees`` hold no requested class).
    trees_total: int
    providers_total: int
    #: Candidates the request yields, counted up to the cap.
    available: int = 0
    #: Whether counting stopped at the cap (there may be more).
    capped: bool = False
    #: (phrase, trees) for the trees that cannot serve, most common first.
    reasons: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    closest: list[TreeVerdict] = dataclasses.field(default_factory=list)
    #: Request-wide facts that explain everything at once.
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def serving(self) -> int:
        """Trees that can serve the request."""
        return sum(1 for tree in self.trees if tree.stage is None)

    def provider_ids(self) -> set[int]:
        """Providers an explanation names (to be labelled with their names)."""
        found = {tree.root_id for tree in self.closest}
        for tree in self.closest:
            found.update(p.provider_id for p in tree.problems if p.provider_id is not None)
        return found

    def verdict(self, returned: int, limit: int | None, cap: int, cap_name: str) -> str:
        """One line a person can act on, in the manner of "0/5 nodes are
        available: 3 Insufficient cpu, 2 had untolerated taint"."""
        serving, total = self.serving, self.trees_total
        head = f"{serving}/{total} trees can serve this request"
        if serving:
            counted = f"{self.available}{'+' if self.capped else ''}"
            head += f" ({returned} candidate{'s' if returned != 1 else ''}"
            if limit is not None and self.available > returned:
                head += f": limit={limit} of {counted}"
            elif self.capped:
                head += f", cut at the {cap_name} of {cap}"
            head += ")"
        if not self.reasons:
            return head + "."
        shown = [f"{count} {phrase}" for phrase, count in self.reasons[:VERDICT_REASONS]]
        if len(self.reasons) > VERDICT_REASONS:
            more = len(self.reasons) - VERDICT_REASONS
            shown.append(f"{more} more reason{'s' if more > 1 else ''}")
        if serving:
            return f"{head}; the other {total - serving}: {', '.join(shown)}."
        return f"{head}: {', '.join(shown)}."


# ---------------------------------------------------------------------------
# Why a provider cannot serve a slot
# ---------------------------------------------------------------------------

def amount_problems(suffix: str, rc: str, amount: int, inv: ProviderInventory,
                    provider_id: int) -> list[Problem]:
    """Every rule ``amount`` of ``rc`` breaks on ``inv`` (empty exactly when
    ``inv.fits(amount)``)."""
    if inv.fits(amount):
        return []
    found = []
    for kind, broken in ((MIN_UNIT, amount < inv.min_unit), (MAX_UNIT, amount > inv.max_unit),
                         (STEP_SIZE, amount % inv.step_size != 0), (CAPACITY, amount > inv.free)):
        if broken:
            found.append(Problem(kind, suffix, rc, provider_id, amount, inv))
    return found


def _trait_problems(suffix: str, traits: TraitExpression, prov: Provider, required: bool) -> list[Problem]:
    required = required and bool(traits.required)
    if not required and not traits.forbidden:
        return []
    found = []
    have = prov.traits
    if required:
        for any_of in traits.required:
            if any_of.isdisjoint(have):
                found.append(Problem(TRAIT, suffix, provider_id=prov.id, subject=tuple(sorted(any_of))))
    for name in sorted(traits.forbidden.intersection(have)):
        found.append(Problem(FORBIDDEN_TRAIT, suffix, provider_id=prov.id, subject=(name,)))
    return found


def _aggregate_problems(suffix: str, aggs: AggregateExpression, prov: Provider,
                        anchor: Provider | None, spans: bool) -> list[Problem]:
    """``anchor``: the root of the candidate, whose forbidden aggregates
    exclude the unsuffixed group's providers, lenders included (None for
    suffixed groups); ``spans``: the anchor's aggregates count as the
    provider's (the unsuffixed group's providers of the anchor's own tree)."""
    found = []
    if anchor is not None and anchor.id != prov.id:
        for name in sorted(aggs.forbidden.intersection(anchor.aggregates)):
            found.append(Problem(FORBIDDEN_AGGREGATE, suffix, provider_id=anchor.id, subject=(name,),
                                 on_root=True))
    for name in sorted(aggs.forbidden.intersection(prov.aggregates)):
        found.append(Problem(FORBIDDEN_AGGREGATE, suffix, provider_id=prov.id, subject=(name,)))
    if aggs.required and not aggs.satisfied_by(prov.aggregates) and not (
            spans and aggs.satisfied_by(anchor.aggregates)):
        for any_of in aggs.required:
            if any_of.isdisjoint(prov.aggregates):
                found.append(Problem(AGGREGATE, suffix, provider_id=prov.id, subject=tuple(sorted(any_of)),
                                     on_root=spans and anchor.id != prov.id
                                     and any_of.isdisjoint(anchor.aggregates)))
    return found


def _names_nothing(slot: solver.Slot) -> bool:
    """A resourceless group with no required trait or aggregate: the solver
    finds no provider for it (``solver.names_something``)."""
    return slot.single and not slot.amounts and not solver.names_something(slot.group)


def provider_problems(plan: solver.Plan, slot: solver.Slot, prov: Provider, anchor: int) -> list[Problem]:
    """Everything that keeps ``prov`` from serving ``slot`` for a candidate
    anchored at ``anchor`` (its own root, or a tree a sharing provider
    lends to).  Empty exactly when the solver would put ``prov`` in the
    slot's domain for that anchor (``single_ok``, ``multi_domain``)."""
    grp = slot.group
    suffix = grp.suffix
    found: list[Problem] = []
    if _names_nothing(slot):
        found.append(Problem(NAMES_NOTHING, suffix, provider_id=prov.id, hard=True))
    for rc, amount in slot.amounts:
        inv = prov.inventories.get(rc)
        if inv is None:
            found.append(Problem(INVENTORY, suffix, rc, prov.id))
        else:
            found.extend(amount_problems(suffix, rc, amount, inv, prov.id))
    found.extend(_trait_problems(suffix, grp.traits, prov, required=slot.single))
    lent = prov.root_id != anchor
    if grp.aggregates:
        root = None if slot.single else plan.snapshot.get(anchor)
        found.extend(_aggregate_problems(suffix, grp.aggregates, prov, root, spans=root is not None and not lent))
    if grp.in_tree:
        tree_root = plan.in_tree_roots[grp.in_tree]
        outside = prov.root_id != tree_root if slot.single else (lent or anchor != tree_root)
        if outside:
            found.append(Problem(IN_TREE, suffix, provider_id=prov.id, subject=(grp.in_tree,), hard=True))
    return found


def _serves(plan: solver.Plan, slot: solver.Slot, prov: Provider, anchor: int) -> bool:
    """The solver's own verdict for one provider (what provider_problems explains)."""
    if slot.single:
        return plan.single_ok(slot.group, prov)
    lenders = (prov.id,) if prov.root_id != anchor else ()
    by_class = plan.snapshot.tree_by_class(anchor) if not lenders else {}
    return prov.id in plan.multi_domain(slot, anchor, by_class, lenders)


# ---------------------------------------------------------------------------
# The explanation
# ---------------------------------------------------------------------------

class _TooLarge(Exception):
    """A probe tried more placements than its budget."""


class _CountedSearch(solver.Search):
    """The solver's search, counting placements against the plan's budget."""

    __slots__ = ()

    def consistent(self, depth: int) -> bool:
        plan = self.plan
        plan.steps_left -= 1
        if plan.steps_left < 0:
            raise _TooLarge()
        return solver.Search.consistent(self, depth)


def _slot_key(index: int) -> str:
    return f"slot{index}"


def explain(request: AllocationCandidatesRequest, snapshot: ProviderSnapshot, roots: Sequence[int], *,
            trees_total: int, providers_total: int, max_candidates: int = -1,
            closest: int = CLOSEST, budget: int = SEARCH_BUDGET) -> Explanation:
    """Explain ``request`` over ``snapshot``.

    :param roots: the trees to consider, in the order candidates are
        searched (the snapshot must hold each of them, complete, and the
        trees of the sharing providers lending to them).
    :param trees_total: trees in the whole cloud (the others hold no
        requested class and borrow none).
    :param max_candidates: the cap on candidates (-1: none), as the answer
        applies it.
    """
    return _Explainer(request, snapshot, list(roots), trees_total, providers_total,
                      max_candidates, closest, budget).run()


@dataclasses.dataclass
class _Explainer:
    request: AllocationCandidatesRequest
    snapshot: ProviderSnapshot
    roots: list[int]
    trees_total: int
    providers_total: int
    max_candidates: int
    closest: int
    budget: int

    def run(self) -> Explanation:
        request, snapshot = self.request, self.snapshot
        result = Explanation(steps=[], trees=[], trees_total=self.trees_total,
                             providers_total=self.providers_total)
        result.steps.append(Step(TREES, "cloud", "trees in the cloud", providers_left=self.providers_total,
                                 trees_left=self.trees_total))
        result.steps.append(Step(TREES, REQUESTED, "have (or borrow) a requested class", trees_left=len(self.roots),
                                 trees_eliminated=self.trees_total - len(self.roots)))
        plan = solver.Plan.build(request, snapshot)
        if plan is None:
            return self._unknown_in_tree(result)
        self.plan = plan
        self.rules = self._applicable_rules()
        self._provider_funnel(result)
        self._judge_trees(result)
        self._tree_funnel(result)
        self._sum_up(result)
        return result

    # -- the provider funnel, group by group -------------------------------------

    def _filters(self, slot: solver.Slot) -> list[tuple[str, str]]:
        grp = slot.group
        amounts = ", ".join(f"{rc}:{amount}" for rc, amount in slot.amounts)
        filters = []
        if _names_nothing(slot):
            filters.append((NAMES_SOMETHING, "is named by a required trait or aggregate (the group has none)"))
        if slot.amounts:
            filters.append((INVENTORY, "has " + ", ".join(rc for rc, _ in slot.amounts) + " inventory"))
            filters.append((UNITS, f"min_unit, max_unit and step_size allow {amounts}"))
            filters.append((CAPACITY, f"has {amounts} free"))
        if slot.single and grp.traits.required:
            filters.append((REQUIRED, "has traits " + _and([_any_of(s) for s in grp.traits.required])))
        if grp.traits.forbidden:
            filters.append((FORBIDDEN, "has none of traits " + ", ".join(sorted(grp.traits.forbidden))))
        if grp.aggregates.required:
            filters.append((MEMBER_OF, ("is" if slot.single else "is (or its root is)") + " in aggregates "
                            + _and([_any_of(s) for s in grp.aggregates.required])))
        if grp.aggregates.forbidden:
            filters.append((FORBIDDEN_MEMBER_OF, ("is" if slot.single else "neither it nor its root is")
                            + " in any of aggregates " + ", ".join(sorted(grp.aggregates.forbidden))))
        if grp.in_tree:
            filters.append((IN_TREE, f"is in the tree of {grp.in_tree}"))
        return filters

    def _provider_funnel(self, result: Explanation) -> None:
        snapshot, plan = self.snapshot, self.plan
        reach: dict[int, list[int]] = {}  # sharing provider -> trees it lends to
        for root, lenders in plan.lenders.items():
            for pid in lenders:
                reach.setdefault(pid, []).append(root)
        considered = set(self.roots)
        for slot in plan.slots:
            filters = self._filters(slot)
            order = {name: i for i, (name, _) in enumerate(filters)}
            # Per provider: the index of the first filter it fails (len: none).
            first_fail: list[int] = []
            trees_at: list[set[int]] = [set() for _ in range(len(filters) + 1)]
            for prov in snapshot:
                problems = provider_problems(plan, slot, prov, prov.root_id)
                failed = min((order[p.filter] for p in problems), default=len(filters))
                first_fail.append(failed)
                trees_at[failed].add(prov.root_id)
                for root in reach.get(prov.id, ()):
                    # Lending to another tree: the rules for lenders.
                    lent = provider_problems(plan, slot, prov, root)
                    trees_at[min((order[p.filter] for p in lent), default=len(filters))].add(root)
            counts = collections.Counter(first_fail)
            left = len(first_fail)
            trees_left_set: set[int] = set().union(*trees_at) & considered
            before_trees = len(trees_left_set)
            suffix = slot.suffix
            rc = slot.amounts[0][0] if not slot.single else None
            for i, (name, label) in enumerate(filters):
                left_after = left - counts.get(i, 0)
                trees_left_set = set().union(*trees_at[i + 1:]) & considered
                result.steps.append(Step(PROVIDERS, name, label, suffix, rc, providers_left=left_after,
                                         providers_eliminated=left - left_after,
                                         trees_left=len(trees_left_set),
                                         trees_eliminated=before_trees - len(trees_left_set)))
                left, before_trees = left_after, len(trees_left_set)

    # -- trees ----------------------------------------------------------------

    def _applicable_rules(self) -> list[str]:
        plan, request = self.plan, self.request
        rules = []
        if plan.unsuffixed is not None and plan.unsuffixed.traits.required:
            rules.append(solver.TRAITS_TOGETHER)
        if request.isolate and sum(1 for s in plan.slots if s.single) > 1:
            rules.append(solver.ISOLATE)
        asked = collections.Counter(rc for s in plan.slots for rc, _ in s.amounts)
        if any(count > 1 for count in asked.values()):
            rules.append(solver.COMBINED_CAPACITY)
        if plan.subtree_sets:
            rules.append(solver.SAME_SUBTREE)
        if not request.nested_aware and sum(1 for s in plan.slots if s.amounts) > 1:
            rules.append(solver.ONE_PROVIDER_PER_TREE)
        return rules

    def _probe_plans(self) -> list[solver.Plan]:
        """Plan k enforces the first k applicable rules (never DISTINCT)."""
        plans = []
        every = frozenset(solver.SEARCH_RULES)
        for k in range(len(self.rules) + 1):
            relaxed = (every - frozenset(self.rules[:k])) | {solver.DISTINCT}
            probe = solver.Plan.build(self.request, self.snapshot, relaxed)
            probe.search_class = _CountedSearch
            plans.append(probe)
        return plans

    def _yields(self, plan: solver.Plan, root: int) -> bool | None:
        """Does the tree yield a candidate under this plan (None: too large to tell)?"""
        plan.steps_left = self.budget
        try:
            return next(iter(plan.candidates_at(root)), None) is not None
        except _TooLarge:
            return None

    def _count(self) -> tuple[dict[int, int], int, bool, set[int]]:
        """Candidates per anchor, as the answer generates them (depth-first),
        until the cap; and the anchors not reached before it."""
        plan = self.plan
        cap = max(self.max_candidates, 1) if self.max_candidates >= 0 else None
        counts: dict[int, int] = {}
        total = 0
        capped = False
        unreached = set()
        for root in plan.anchor_roots(self.roots):
            if capped:
                unreached.add(root)
                continue
            for _ in plan.candidates_at(root):
                counts[root] = counts.get(root, 0) + 1
                total += 1
                if cap is not None and total >= cap:
                    capped = True
                    break
        return counts, total, capped, unreached

    def _judge_trees(self, result: Explanation) -> None:
        plan, request = self.plan, self.request
        counts, total, capped, unreached = self._count()
        result.available, result.capped = total, capped
        anchors = set(plan.anchor_roots(self.roots))
        probes = self._probe_plans() if self.rules or plan.lending else []
        unsuffixed = request.group("")
        only = plan.in_tree_roots[unsuffixed.in_tree] if unsuffixed is not None and unsuffixed.in_tree else None
        for root in self.roots:
            tree = TreeVerdict(root, candidates=counts.get(root, 0))
            result.trees.append(tree)
            if tree.candidates:
                continue  # anchored candidates: it serves
            if only is not None and root != only:
                tree.stage = IN_TREE
                tree.problems.append(Problem(IN_TREE, "", provider_id=root, subject=(unsuffixed.in_tree,),
                                             hard=True))
                continue
            if root not in anchors:
                tree.stage = ROOT_REQUIRED
                tree.problems.extend(self._root_problems(root))
            # Domains do not depend on the search rules.
            domains = plan.all_domains(root)
            for index, domain in enumerate(domains):
                if not domain:
                    tree.stage = tree.stage or _slot_key(index)
                    tree.problems.extend(self._slot_problems(index, root))
            if tree.stage is not None:
                # Would it have the unsuffixed group's traits, had it room?
                tree.problems.extend(self._missing_traits(root))
                continue
            if root in unreached or plan.lending:
                # Not counted (past the cap), or only repeats of candidates
                # counted under another anchor: does it yield at all?
                verdict = self._yields(probes[-1], root) if probes else True
                if verdict:
                    continue
                if verdict is None:
                    tree.stage = UNDECIDED
                    tree.problems.append(self._undecided())
                    continue
            self._first_rule(tree, probes, domains)

    def _first_rule(self, tree: TreeVerdict, probes: list[solver.Plan], domains: list[list[int]]) -> None:
        """The first search rule under which the tree stops yielding."""
        rules = self.rules
        failing = len(rules)  # the full plan yields nothing here
        for k in range(1, len(rules)):
            verdict = self._yields(probes[k], tree.root_id)
            if verdict is None:
                tree.stage = UNDECIDED
                tree.problems.append(self._undecided())
                return
            if not verdict:
                failing = k
                break
        if failing == 0:  # pragma: no cover - every domain is non-empty
            tree.stage = UNDECIDED
            tree.problems.append(self._undecided())
            return
        rule = rules[failing - 1]
        tree.stage = rule
        tree.problems.extend(self._rule_problems(rule, tree.root_id, domains))

    def _undecided(self) -> Problem:
        return Problem(UNDECIDED, sentence=f"not decided: searching this tree took more than {self.budget} "
                                           "placements")

    def _root_problems(self, root: int) -> list[Problem]:
        traits = self.request.root_traits
        prov = self.snapshot.get(root)
        found = [Problem(ROOT_TRAIT, provider_id=root, subject=tuple(sorted(any_of)))
                 for any_of in traits.required if any_of.isdisjoint(prov.traits)]
        found += [Problem(ROOT_FORBIDDEN_TRAIT, provider_id=root, subject=(name,))
                  for name in sorted(traits.forbidden.intersection(prov.traits))]
        return found

    def _slot_problems(self, index: int, root: int) -> list[Problem]:
        """What the closest provider of the tree (or lender to it) lacks for
        the slot, or that no provider has the class at all."""
        plan, snapshot = self.plan, self.snapshot
        slot = plan.slots[index]
        classes = {rc for rc, _ in slot.amounts}
        options = list(snapshot.tree(root)) + list(plan.lenders.get(root, ()))
        if classes:
            options = [pid for pid in options if classes.intersection(snapshot.get(pid).inventories)]
        if not options:
            return [Problem(NO_INVENTORY, slot.suffix, rc) for rc, _ in slot.amounts]
        best = None
        for pid in options:
            problems = provider_problems(plan, slot, snapshot.get(pid), root)
            key = (len(problems), sum(p.shortfall for p in problems))
            if best is None or key < best[0]:
                best = (key, problems)
        problems = best[1]
        if not problems:  # pragma: no cover - provider_problems agrees with the solver (tested)
            return [Problem(NO_PROVIDER, slot.suffix, sentence=f"no provider can serve {group_name(slot.suffix)}")]
        return problems

    def _missing_traits(self, root: int) -> list[Problem]:
        """The unsuffixed group's required traits that no provider of the
        tree (or lender to it) holding one of the group's classes has."""
        unsuffixed = self.plan.unsuffixed
        if unsuffixed is None or not unsuffixed.traits.required:
            return []
        snapshot = self.snapshot
        have: set[str] = set()
        for pid in itertools.chain(snapshot.tree(root), self.plan.lenders.get(root, ())):
            prov = snapshot.get(pid)
            if not unsuffixed.resources.keys().isdisjoint(prov.inventories):
                have.update(prov.traits)
        return [Problem(TRAIT, "", subject=tuple(sorted(any_of)),
                        sentence="no provider the unsuffixed group could use here has it")
                for any_of in unsuffixed.traits.required if any_of.isdisjoint(have)]

    # -- what a search rule lacks ---------------------------------------------------

    def _rule_problems(self, rule: str, root: int, domains: list[list[int]]) -> list[Problem]:
        plan, snapshot = self.plan, self.snapshot
        slots = plan.slots
        if rule == solver.TRAITS_TOGETHER:
            have: set[str] = set()
            for slot, domain in zip(slots, domains):
                if not slot.single:
                    for pid in domain:
                        have.update(snapshot.get(pid).traits)
            missing = [any_of for any_of in plan.unsuffixed.traits.required if any_of.isdisjoint(have)]
            if missing:
                return [Problem(TRAIT, "", subject=tuple(sorted(any_of)),
                                sentence="none of the providers the unsuffixed group can use here has it")
                        for any_of in missing]
            return [Problem(rule, "", sentence="the unsuffixed group's required traits are never all on "
                                               "providers that can serve it together")]
        if rule == solver.ISOLATE:
            return [self._isolate_problem(domains)]
        if rule == solver.COMBINED_CAPACITY:
            return [self._combined_problem(domains)]
        if rule == solver.SAME_SUBTREE:
            return [self._subtree_problem(domains)]
        return [Problem(rule, sentence="before microversion 1.29 a candidate may take resources from only "
                                       "one provider of a tree, and no provider here serves every group")]

    def _isolate_problem(self, domains: list[list[int]]) -> Problem:
        singles = [(slot.suffix, set(domain)) for slot, domain in zip(self.plan.slots, domains) if slot.single]
        if len(singles) <= 10:
            for size in range(2, len(singles) + 1):
                for combo in itertools.combinations(singles, size):
                    union = set().union(*(domain for _, domain in combo))
                    if len(union) < size:
                        suffixes = tuple(s for s, _ in combo)
                        if len(union) == 1:
                            text = f"isolate: {_groups(suffixes)} could only be satisfied by the same provider"
                        else:
                            text = (f"isolate: {_groups(suffixes)} could only be satisfied by "
                                    f"{len(union)} providers")
                        return Problem(solver.ISOLATE, subject=suffixes, sentence=text,
                                       provider_id=next(iter(union)) if len(union) == 1 else None)
        return Problem(solver.ISOLATE, sentence="isolate: no way to give each group a provider of its own "
                                                "that also meets the other rules")

    def _combined_problem(self, domains: list[list[int]]) -> Problem:
        forced: dict[tuple[int, str], list[tuple[str, int]]] = {}
        for slot, domain in zip(self.plan.slots, domains):
            if len(domain) == 1:
                for rc, amount in slot.amounts:
                    forced.setdefault((domain[0], rc), []).append((slot.suffix, amount))
        for (pid, rc), parts in forced.items():
            need = sum(amount for _, amount in parts)
            inv = self.snapshot.get(pid).inventories[rc]
            if len(parts) > 1 and need > inv.combined_limit:
                names = _groups([suffix for suffix, _ in parts])
                return Problem(solver.COMBINED_CAPACITY, resource_class=rc, provider_id=pid, amount=need,
                               inventory=inv,
                               sentence=f"{rc}: {names} together need {need} from one provider, which has "
                                        f"{inv.free} free (max_unit {inv.max_unit})")
        asked = collections.Counter(rc for slot in self.plan.slots for rc, _ in slot.amounts)
        shared = [rc for rc, count in asked.items() if count > 1]
        return Problem(solver.COMBINED_CAPACITY, resource_class=shared[0] if len(shared) == 1 else None,
                       sentence=f"{', '.join(shared)}: the groups' amounts together do not fit the "
                                "providers that could serve them")

    def _subtree_problem(self, domains: list[list[int]]) -> Problem:
        plan = self.plan
        for idx in plan.subtree_sets:
            if not self._subtree_possible(idx, domains):
                suffixes = tuple(plan.slots[i].suffix for i in idx)
                return Problem(solver.SAME_SUBTREE, subject=suffixes,
                               sentence=f"same_subtree {','.join(suffixes)}: no common ancestor among the "
                                        "providers that could serve these groups")
        return Problem(solver.SAME_SUBTREE, subject=("*",),
                       sentence="same_subtree: cannot be met together with the other rules")

    def _subtree_possible(self, idx: tuple[int, ...], domains: list[list[int]]) -> bool:
        """Could some member's provider be an ancestor-or-self of providers
        for all the others, by the domains alone?"""
        ancestors = self.snapshot.ancestors
        for top_slot in idx:
            for top in domains[top_slot]:
                if all(any(top in ancestors(pid) for pid in domains[other])
                       for other in idx if other != top_slot):
                    return True
        return False

    # -- the tree funnel and the summary ------------------------------------------

    def _tree_funnel(self, result: Explanation) -> None:
        plan, request = self.plan, self.request
        stages = []
        unsuffixed = request.group("")
        if unsuffixed is not None and unsuffixed.in_tree:
            stages.append((IN_TREE, f"the tree of in_tree provider {unsuffixed.in_tree}"))
        if request.root_traits:
            parts = [_any_of(s) for s in request.root_traits.required]
            parts += [f"not {name}" for name in sorted(request.root_traits.forbidden)]
            stages.append((ROOT_REQUIRED, "root has traits " + _and(parts)))
        for index, slot in enumerate(plan.slots):
            what = (f"unsuffixed {slot.amounts[0][0]}:{slot.amounts[0][1]}" if not slot.single
                    else group_name(slot.suffix))
            stages.append((_slot_key(index), f"{what} has a provider"))
        labels = {
            solver.TRAITS_TOGETHER: "unsuffixed group's required traits met together",
            solver.ISOLATE: "isolate: a provider per suffixed group",
            solver.COMBINED_CAPACITY: "several groups' amounts fit on one provider",
            solver.SAME_SUBTREE: "same_subtree met",
            solver.ONE_PROVIDER_PER_TREE: "one provider per tree (before 1.29)",
        }
        stages += [(rule, labels[rule]) for rule in self.rules]
        stage_of = collections.Counter(tree.stage for tree in result.trees)
        if stage_of.get(UNDECIDED):
            stages.append((UNDECIDED, "decided within the search budget"))
        left = len(result.trees)
        slot_of = {_slot_key(index): slot for index, slot in enumerate(plan.slots)}
        for key, label in stages:
            eliminated = stage_of.get(key, 0)
            step = Step(TREES, key, label, trees_left=left - eliminated, trees_eliminated=eliminated)
            slot = slot_of.get(key)
            if slot is not None:
                step.filter = "has_provider"
                step.group = slot.suffix
                step.resource_class = None if slot.single else slot.amounts[0][0]
            result.steps.append(step)
            left -= eliminated

    def _sum_up(self, result: Explanation) -> None:
        reasons: collections.Counter[str] = collections.Counter()
        phrases: dict[tuple, str] = {}  # many trees share each reason: word it once
        for tree in result.trees:
            if tree.stage is not None:
                found = set()
                for p in tree.problems:
                    key = (p.kind, p.group, p.resource_class, p.subject, p.sentence)
                    phrase = phrases.get(key)
                    if phrase is None:
                        phrase = phrases[key] = p.reason
                    found.add(phrase)
                reasons.update(found)
        outside = self.trees_total - len(self.roots)
        if outside > 0:
            reasons[f"no {' or '.join(self.request.resource_class_names())} inventory"] += outside
        result.reasons = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
        failing = [tree for tree in result.trees if tree.stage is not None and tree.problems and not tree.hard]
        order = {root: i for i, root in enumerate(self.roots)}
        failing.sort(key=lambda tree: (*tree.distance, order[tree.root_id]))
        result.closest = failing[:self.closest]

    def _unknown_in_tree(self, result: Explanation) -> Explanation:
        """Some in_tree provider does not exist: nothing can be a candidate."""
        for grp in self.request.groups:
            if grp.in_tree and self.snapshot.by_uuid(grp.in_tree) is None:
                result.notes.append(f"in_tree{grp.suffix}: there is no provider {grp.in_tree}")
        result.trees = [TreeVerdict(root, IN_TREE) for root in self.roots]
        result.steps.append(Step(TREES, IN_TREE, "the in_tree providers exist", trees_left=0,
                                 trees_eliminated=len(self.roots)))
        result.reasons = [("in_tree names no provider", len(self.roots))] if self.roots else []
        return result

