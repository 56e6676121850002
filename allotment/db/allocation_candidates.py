"""The provider snapshot behind ``GET /allocation_candidates``.

The solver (:mod:`allotment.domain.allocation_candidates`) decides
everything in memory; this module hands it the smallest complete
:class:`~allotment.domain.provider_tree.ProviderSnapshot` in a fixed,
small number of set-based statements whatever the number of providers
(never one statement per provider or per tree):

1. **names** (one statement): resource class and trait ids (unknown names
   are the client's error), aggregate ids of ``member_of``, the roots of
   ``in_tree`` providers;
2. **sharing providers** (trait ``MISC_SHARES_VIA_AGGREGATE``) holding a
   requested class, with their traits and aggregates and the roots of
   every tree that has a provider in one of those aggregates (one
   statement when there are none);
3. **fitting inventories** (one statement): every inventory of a requested
   class that could take a requested amount, with its current usage,
   narrowed by what SQL does well: the unit rules and static capacity; a
   class asked for by one group only must also meet that group's
   per-provider rules (traits, aggregates, ``in_tree``); ``root_required``
   applies to the root; a required trait of the unsuffixed group that no
   sharing provider can bring must be somewhere in the tree.  Usage is
   compared in Python (the correlated sum is computed once per row, as a
   selected column);
4. Python keeps the roots whose tree, plus the sharing providers reaching
   it, offers every requested class: the **anchors**, in id order;
5. **trees** (three statements per round): the anchors' trees and their
   lenders', whole (a summary lists every provider of a tree and
   ``same_subtree`` needs the ancestry), with only the traits and
   aggregates the request is about.  When the caller takes only the first
   ``limit`` candidates, trees are loaded in rounds as the search reaches
   them, so a small ``limit`` reads little;
6. **summaries** (two statements, after solving): all traits, and the
   complete inventories of the providers whose snapshot inventories are
   partial, for the providers listed in ``provider_summaries`` only.

Every step narrows by *necessary* conditions only: the snapshot may hold a
tree that yields nothing (the solver skips it quickly) but never lacks one
that would yield a candidate.

Statements are built once per process (the fitting one once per query
*shape*) with bound parameters, so SQLAlchemy neither rebuilds nor
recompiles them per request.  Lookups follow indexes on every backend:
inventories by class, usage by ``(provider, class, used)``, trees by
``root_provider_id``, traits and aggregates by their primary keys.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Iterable, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import tables
from allotment.domain.errors import BadRequest
from allotment.domain.inventories import ResourceClassNotFound
from allotment.domain.provider_tree import SHARING_TRAIT, Provider, ProviderInventory, ProviderSnapshot
from allotment.domain.request_groups import AllocationCandidatesRequest, RequestGroup

RP = tables.resource_providers
TREE_RP = RP.alias("tree_rp")
INV = tables.inventories
RC = tables.resource_classes
ALLOC = tables.allocations
TRAITS = tables.traits
RP_TRAITS = tables.resource_provider_traits
AGG = tables.placement_aggregates
RP_AGG = tables.resource_provider_aggregates

_ROOT = sa.func.coalesce(RP.c.root_provider_id, RP.c.id)
_TREE_ROOT = sa.func.coalesce(TREE_RP.c.root_provider_id, TREE_RP.c.id)


def _many(name: str) -> sa.BindParameter:
    """A parameter holding a list (``IN``), however long."""
    return sa.bindparam(name, expanding=True)


def _one(name: str) -> sa.BindParameter:
    return sa.bindparam(name, type_=sa.Integer)


def _rows(conn: Connection, statement: sa.Executable, params: dict) -> Sequence[sa.Row]:
    """All rows at once: one ``fetchall`` instead of a driver call per row."""
    return conn.execute(statement, params).all()


class UnknownTraits(BadRequest):
    """A trait named in the query does not exist (Placement's message)."""

    def __init__(self, names: Iterable[str]):
        super().__init__(f"No such trait(s): {', '.join(sorted(names))}.")


# ---------------------------------------------------------------------------
# Step 1: names
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Names:
    """The query's names turned into ids."""

    class_ids: dict[str, int]
    trait_ids: dict[str, int]
    #: member_of aggregate uuid -> id, for the aggregates that exist.
    aggregate_ids: dict[str, int]
    #: in_tree uuid -> root id; None when some in_tree provider is unknown
    #: (no candidate can then exist).
    in_tree_roots: dict[str, int] | None
    sharing_trait_id: int | None


_NAMES = sa.union_all(
    sa.select(sa.literal("c"), RC.c.name, RC.c.id).where(RC.c.name.in_(_many("classes"))),
    sa.select(sa.literal("t"), TRAITS.c.name, TRAITS.c.id).where(TRAITS.c.name.in_(_many("traits"))),
    sa.select(sa.literal("a"), AGG.c.uuid, AGG.c.id).where(AGG.c.uuid.in_(_many("aggregates"))),
    sa.select(sa.literal("r"), RP.c.uuid, _ROOT).where(RP.c.uuid.in_(_many("trees"))),
)


def resolve_names(conn: Connection, request: AllocationCandidatesRequest) -> Names:
    """Ids for every name in the request, in one statement.

    Raises ``ResourceClassNotFound`` / ``UnknownTraits`` in the order
    Placement finds them: ``root_required`` traits, then group by group its
    resource classes and its traits.
    """
    found: dict[str, dict[str, int]] = {"c": {}, "t": {}, "a": {}, "r": {}}
    wanted_trees = request.in_tree_uuids()
    rows = _rows(conn, _NAMES, {
        "classes": request.resource_class_names(),
        "traits": sorted(request.trait_names() | {SHARING_TRAIT}),
        "aggregates": sorted(request.aggregate_uuids()),
        "trees": sorted(wanted_trees),
    })
    for kind, name, ident in rows:
        found[kind][name] = ident
    class_ids, trait_ids = found["c"], found["t"]
    _check_names(request, class_ids, trait_ids)
    in_tree_roots = found["r"] if len(found["r"]) == len(wanted_trees) else None
    return Names(class_ids, trait_ids, found["a"], in_tree_roots, trait_ids.get(SHARING_TRAIT))


def _check_names(request: AllocationCandidatesRequest, class_ids: Collection[str],
                 trait_ids: Collection[str]) -> None:
    def check_traits(names: set[str]) -> None:
        missing = names - set(trait_ids)
        if missing:
            raise UnknownTraits(missing)

    check_traits(request.root_traits.names())
    for group in request.groups:
        for name in group.resources:
            if name not in class_ids:
                raise ResourceClassNotFound(name)
        check_traits(group.traits.names())


# ---------------------------------------------------------------------------
# Reusable SQL fragments
# ---------------------------------------------------------------------------

def _usage(provider_id, class_id) -> sa.ScalarSelect:
    """Units currently allocated of one inventory (correlated, index-only)."""
    return (sa.select(sa.func.coalesce(sa.func.sum(ALLOC.c.used), 0))
            .where(ALLOC.c.resource_provider_id == provider_id,
                   ALLOC.c.resource_class_id == class_id)
            .scalar_subquery())


#: An inventory record's fields in ProviderInventory's order, then usage.
_INVENTORY_FIELDS = (INV.c.total, INV.c.reserved, INV.c.min_unit, INV.c.max_unit, INV.c.step_size,
                     INV.c.allocation_ratio, _usage(INV.c.resource_provider_id, INV.c.resource_class_id))


def _having_trait(provider_id, param: str) -> sa.ColumnElement[bool]:
    return sa.exists().where(RP_TRAITS.c.resource_provider_id == provider_id,
                             RP_TRAITS.c.trait_id.in_(_many(param)))


def _in_aggregates(provider_id, param: str) -> sa.ColumnElement[bool]:
    return sa.exists().where(RP_AGG.c.resource_provider_id == provider_id,
                             RP_AGG.c.aggregate_id.in_(_many(param)))


# ---------------------------------------------------------------------------
# Step 2: sharing providers
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class _Sharing:
    """Sharing providers that may lend, and their reach."""

    #: provider id -> root id
    roots: dict[int, int]
    #: provider id -> trait ids
    traits: dict[int, set[int]]
    #: aggregate id -> sharing provider ids in it
    members: dict[int, list[int]]
    #: sharing provider id -> roots of trees sharing an aggregate with it
    reach: dict[int, set[int]]


_SHARING = (sa.select(RP.c.id, _ROOT)
            .join(RP_TRAITS, RP_TRAITS.c.resource_provider_id == RP.c.id)
            .where(RP_TRAITS.c.trait_id == _one("sharing_trait")))
# Without a resourceless group only a holder of a requested class can lend.
_SHARING_HOLDERS = _SHARING.where(sa.exists().where(INV.c.resource_provider_id == RP.c.id,
                                                    INV.c.resource_class_id.in_(_many("classes"))))
_SHARING_TRAITS = (sa.select(RP_TRAITS.c.resource_provider_id, RP_TRAITS.c.trait_id)
                   .where(RP_TRAITS.c.resource_provider_id.in_(_many("ids"))))
_SHARING_AGGREGATES = (sa.select(RP_AGG.c.resource_provider_id, RP_AGG.c.aggregate_id)
                       .where(RP_AGG.c.resource_provider_id.in_(_many("ids"))))
_AGGREGATE_ROOTS = (sa.select(RP_AGG.c.aggregate_id, _ROOT).distinct()
                    .join(RP, RP.c.id == RP_AGG.c.resource_provider_id)
                    .where(RP_AGG.c.aggregate_id.in_(_many("aggregates"))))


def _sharing_providers(conn: Connection, request: AllocationCandidatesRequest, names: Names) -> _Sharing:
    sharing = _Sharing({}, {}, {}, {})
    if names.sharing_trait_id is None:
        return sharing
    if all(group.resources for group in request.groups):
        rows = _rows(conn, _SHARING_HOLDERS, {"sharing_trait": names.sharing_trait_id,
                                              "classes": sorted(names.class_ids.values())})
    else:
        rows = _rows(conn, _SHARING, {"sharing_trait": names.sharing_trait_id})
    sharing.roots = dict(rows)
    if not sharing.roots:
        return sharing
    ids = {"ids": sorted(sharing.roots)}
    for pid, trait_id in _rows(conn, _SHARING_TRAITS, ids):
        sharing.traits.setdefault(pid, set()).add(trait_id)
    for pid, agg_id in _rows(conn, _SHARING_AGGREGATES, ids):
        sharing.members.setdefault(agg_id, []).append(pid)
    if sharing.members:
        for agg_id, root in _rows(conn, _AGGREGATE_ROOTS, {"aggregates": sorted(sharing.members)}):
            for pid in sharing.members[agg_id]:
                sharing.reach.setdefault(pid, set()).add(root)
    return sharing


# ---------------------------------------------------------------------------
# Step 3: inventories that could take a requested amount
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _GroupShape:
    """The per-provider rules of the only group asking for a class."""

    suffixed: bool
    required: int        # any-of trait sets (suffixed groups only)
    forbidden: bool
    member_of: int       # any-of aggregate sets
    forbidden_aggregates: bool
    in_tree: bool


@dataclasses.dataclass(frozen=True)
class _FitShape:
    """Everything that decides the fitting statement's text (not values)."""

    #: per requested class: (number of distinct amounts, its only group)
    classes: tuple[tuple[int, _GroupShape | None], ...]
    root_required: int
    root_forbidden: bool
    tree_traits: int
    tree_in_tree: bool


def _fitting_shape(request: AllocationCandidatesRequest, names: Names,
                   sharing: _Sharing) -> tuple[_FitShape, dict, dict[int, list[int]]]:
    """(shape, parameters, class id -> amounts) of the fitting statement.

    Parameter names follow :func:`_fitting_statement`: ``c{i}`` the class,
    ``c{i}a{j}`` its amounts, ``c{i}rt{k}``/``c{i}ft``/``c{i}ma{k}``/
    ``c{i}fa``/``c{i}tree`` its group's rules; ``rr{k}``/``rf`` the root's
    traits, ``tt{k}``/``tree`` the unsuffixed group's tree rules,
    ``sharing`` the sharing providers (exempt from tree rules).
    """
    askers: dict[str, list[RequestGroup]] = {}
    for group in request.groups:
        for rc in group.resources:
            askers.setdefault(rc, []).append(group)
    params: dict = {"sharing": sorted(sharing.roots)}
    amounts_of: dict[int, list[int]] = {}
    classes = []
    for i, (rc, groups) in enumerate(askers.items()):
        amounts = sorted({group.resources[rc] for group in groups})
        class_id = names.class_ids[rc]
        amounts_of[class_id] = amounts
        params[f"c{i}"] = class_id
        for j, amount in enumerate(amounts):
            params[f"c{i}a{j}"] = amount
        group_shape = _group_rules(groups[0], names, params, f"c{i}") if len(groups) == 1 else None
        classes.append((len(amounts), group_shape))
    root_required = request.root_traits.required
    for k, any_of in enumerate(root_required):
        params[f"rr{k}"] = sorted(names.trait_ids[t] for t in any_of)
    if request.root_traits.forbidden:
        params["rf"] = sorted(names.trait_ids[t] for t in request.root_traits.forbidden)
    tree_traits = 0
    tree_in_tree = False
    unsuffixed = request.group("")
    if unsuffixed is not None and unsuffixed.resources:
        lent = set().union(*sharing.traits.values())
        for any_of in unsuffixed.traits.required:
            ids = {names.trait_ids[t] for t in any_of}
            if not ids & lent:  # else a sharing provider may bring it
                params[f"tt{tree_traits}"] = sorted(ids)
                tree_traits += 1
        if unsuffixed.in_tree:
            params["tree"] = names.in_tree_roots[unsuffixed.in_tree]
            tree_in_tree = True
    shape = _FitShape(tuple(classes), len(root_required), bool(request.root_traits.forbidden),
                      tree_traits, tree_in_tree)
    return shape, params, amounts_of


def _group_rules(group: RequestGroup, names: Names, params: dict, prefix: str) -> _GroupShape:
    """Parameters of one group's per-provider rules (see _group_conditions)."""
    traits, aggregates = group.traits, group.aggregates
    required = traits.required if group.suffix else ()
    for k, any_of in enumerate(required):
        params[f"{prefix}rt{k}"] = sorted(names.trait_ids[t] for t in any_of)
    if traits.forbidden:
        params[f"{prefix}ft"] = sorted(names.trait_ids[t] for t in traits.forbidden)
    for k, any_of in enumerate(aggregates.required):
        # An aggregate that does not exist has no members.
        params[f"{prefix}ma{k}"] = sorted(names.aggregate_ids[u] for u in any_of if u in names.aggregate_ids)
    forbidden_aggregates = sorted(names.aggregate_ids[u] for u in aggregates.forbidden
                                  if u in names.aggregate_ids)
    if forbidden_aggregates:
        params[f"{prefix}fa"] = forbidden_aggregates
    if group.in_tree:
        params[f"{prefix}tree"] = names.in_tree_roots[group.in_tree]
    return _GroupShape(bool(group.suffix), len(required), bool(traits.forbidden), len(aggregates.required),
                       bool(forbidden_aggregates), bool(group.in_tree))


def _group_conditions(shape: _GroupShape, prefix: str) -> list[sa.ColumnElement[bool]]:
    """Per-provider rules of the only group asking for a class.

    Mirrors the solver's predicates (``_single_ok`` for suffixed groups,
    ``_multi_base_ok`` plus the aggregate rules for the unsuffixed one),
    loosened wherever the solver looks at the anchor rather than the
    provider.
    """
    conditions = [_having_trait(RP.c.id, f"{prefix}rt{k}") for k in range(shape.required)]
    if shape.forbidden:
        conditions.append(sa.not_(_having_trait(RP.c.id, f"{prefix}ft")))
    for k in range(shape.member_of):
        member = _in_aggregates(RP.c.id, f"{prefix}ma{k}")
        if not shape.suffixed:
            # An aggregate on the root spans its tree.
            member = sa.or_(member, _in_aggregates(_ROOT, f"{prefix}ma{k}"))
        conditions.append(member)
    if shape.forbidden_aggregates:
        conditions.append(sa.not_(_in_aggregates(RP.c.id, f"{prefix}fa")))
    if shape.in_tree:
        conditions.append(_ROOT == _one(f"{prefix}tree"))
    return conditions


def _tree_conditions(shape: _FitShape) -> list[sa.ColumnElement[bool]]:
    """Rules on the tree of a provider that is not sharing."""
    conditions = [_having_trait(_ROOT, f"rr{k}") for k in range(shape.root_required)]
    if shape.root_forbidden:
        conditions.append(sa.not_(_having_trait(_ROOT, "rf")))
    for k in range(shape.tree_traits):
        # Some provider of the tree carries one of them.  Not correlated:
        # the set of such roots is built once (correlated, planners
        # without statistics walk every carrier of the trait per row).
        conditions.append(_ROOT.in_(
            sa.select(_TREE_ROOT)
            .join(RP_TRAITS, RP_TRAITS.c.resource_provider_id == TREE_RP.c.id)
            .where(RP_TRAITS.c.trait_id.in_(_many(f"tt{k}")))))
    if shape.tree_in_tree:
        conditions.append(_ROOT == _one("tree"))
    return conditions


@functools.lru_cache(maxsize=512)
def _fitting_statement(shape: _FitShape) -> sa.Executable:
    """One SELECT per requested class (each driven by the class index),
    UNION ALL: (provider, root, class, inventory fields, usage)."""
    tree_rules = _tree_conditions(shape)
    selects = []
    for i, (amounts, group_shape) in enumerate(shape.classes):
        unit_rules = []
        for j in range(amounts):
            value = _one(f"c{i}a{j}")
            unit_rules.append(sa.and_(INV.c.min_unit <= value, INV.c.max_unit >= value,
                                      value % INV.c.step_size == 0,
                                      value <= (INV.c.total - INV.c.reserved) * INV.c.allocation_ratio))
        conditions = [INV.c.resource_class_id == _one(f"c{i}"), sa.or_(*unit_rules)]
        if group_shape is not None:
            conditions.extend(_group_conditions(group_shape, f"c{i}"))
        if tree_rules:
            conditions.append(sa.or_(RP.c.id.in_(_many("sharing")), sa.and_(*tree_rules)))
        selects.append(sa.select(INV.c.resource_provider_id, _ROOT, INV.c.resource_class_id, *_INVENTORY_FIELDS)
                       .join(RP, RP.c.id == INV.c.resource_provider_id)
                       .where(*conditions))
    return selects[0] if len(selects) == 1 else sa.union_all(*selects)


#: (provider id, root id, class id, inventory with usage)
_Fitting = tuple[int, int, int, ProviderInventory]


def _fitting_inventories(conn: Connection, request: AllocationCandidatesRequest, names: Names,
                         sharing: _Sharing) -> list[_Fitting]:
    """Every inventory of a requested class that can take a requested amount now."""
    shape, params, amounts_of = _fitting_shape(request, names, sharing)
    found = []
    for row in _rows(conn, _fitting_statement(shape), params):
        inventory = _inventory(row, 3)
        for amount in amounts_of[row[2]]:
            if inventory.fits(amount):
                found.append((row[0], row[1], row[2], inventory))
                break
    return found


def _inventory(row: sa.Row, at: int) -> ProviderInventory:
    """The inventory whose _INVENTORY_FIELDS start at column ``at``."""
    return ProviderInventory(row[at], row[at + 1], row[at + 2], row[at + 3], row[at + 4], row[at + 5],
                             int(row[at + 6]))


# ---------------------------------------------------------------------------
# Step 4: anchors
# ---------------------------------------------------------------------------

def _anchor_roots(request: AllocationCandidatesRequest, names: Names, sharing: _Sharing,
                  rows: Sequence[_Fitting]) -> tuple[list[int], dict[int, list[int]]]:
    """(anchor roots in id order, root -> sharing providers that may lend to it).

    An anchor's tree, plus what sharing providers reaching it lend, offers
    every requested class.  A sharing provider lends when it holds a
    fitting inventory (or, with a resourceless group, whatever it holds:
    it may be the provider that group names).
    """
    needed = {names.class_ids[rc] for rc in request.resource_class_names()}
    local: dict[int, set[int]] = {}
    lent: dict[int, set[int]] = {}  # sharing provider -> classes it can lend
    for pid, root, class_id, _ in rows:
        local.setdefault(root, set()).add(class_id)
        if pid in sharing.roots:
            lent.setdefault(pid, set()).add(class_id)
    if not all(group.resources for group in request.groups):
        for pid in sharing.roots:
            lent.setdefault(pid, set())
    borrowed: dict[int, set[int]] = {}
    lenders: dict[int, list[int]] = {}
    for pid in sorted(lent):
        for root in sharing.reach.get(pid, ()):
            if root != sharing.roots[pid]:
                borrowed.setdefault(root, set()).update(lent[pid])
                lenders.setdefault(root, []).append(pid)
    nothing: set[int] = set()
    anchors = [root for root in sorted(local.keys() | borrowed.keys())
               if needed <= local.get(root, nothing) | borrowed.get(root, nothing)]
    unsuffixed = request.group("")
    if unsuffixed is not None and unsuffixed.in_tree:
        only = names.in_tree_roots[unsuffixed.in_tree]
        anchors = [root for root in anchors if root == only]
    return anchors, lenders


# ---------------------------------------------------------------------------
# Traits, cached per provider generation
# ---------------------------------------------------------------------------

# Every listed provider, with or without traits, with the generation read
# in the same statement (the pair is what the cache keeps).
_PROVIDER_TRAITS = (sa.select(RP.c.id, RP.c.uuid, RP.c.generation, TRAITS.c.name)
                   .select_from(RP.outerjoin(RP_TRAITS, RP_TRAITS.c.resource_provider_id == RP.c.id)
                                .outerjoin(TRAITS, TRAITS.c.id == RP_TRAITS.c.trait_id))
                   .where(RP.c.id.in_(_many("ids")))
                   .order_by(RP.c.id, RP_TRAITS.c.trait_id))


class _TraitCache:
    """A provider's traits, by (id, uuid, generation), for this process.

    Sound with any number of processes writing: every change to a
    provider's traits bumps its generation in the same transaction
    (:mod:`allotment.db.traits`), and the generation a request compares
    with is the one its own snapshot read.  Bounded: cleared when full.
    """

    MAX_ENTRIES = 200_000

    def __init__(self) -> None:
        self._entries: dict[int, tuple[str, int, tuple[str, ...]]] = {}

    def get(self, provider_id: int, uuid: str, generation: int) -> tuple[str, ...] | None:
        entry = self._entries.get(provider_id)
        if entry is not None and entry[1] == generation and entry[0] == uuid:
            return entry[2]
        return None

    def put(self, provider_id: int, uuid: str, generation: int, traits: tuple[str, ...]) -> None:
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries = {}
        self._entries[provider_id] = (uuid, generation, traits)


_TRAITS = _TraitCache()


def _traits_of(conn: Connection, providers: Iterable[tuple[int, str, int]]) -> dict[int, tuple[str, ...]]:
    """All traits of these (id, uuid, generation) providers: from the cache
    where it holds that generation, else read (one statement) and kept."""
    found: dict[int, tuple[str, ...]] = {}
    missing = []
    for pid, uuid, generation in providers:
        known = _TRAITS.get(pid, uuid, generation)
        if known is None:
            missing.append(pid)
        else:
            found[pid] = known
    if missing:
        read: dict[int, list[str]] = {}
        seen: dict[int, tuple[str, int]] = {}
        for pid, uuid, generation, name in _rows(conn, _PROVIDER_TRAITS, {"ids": missing}):
            names = read.get(pid)
            if names is None:
                names = read[pid] = []
                seen[pid] = (uuid, generation)
            if name is not None:
                names.append(name)
        for pid, names in read.items():
            found[pid] = traits = tuple(names)
            _TRAITS.put(pid, *seen[pid], traits)
    return found


# ---------------------------------------------------------------------------
# Step 5: the trees
# ---------------------------------------------------------------------------

#: Trees loaded in the first round when the caller takes only the first
#: candidates; each further round loads at most twice as many.
FIRST_ROUND = 4


@dataclasses.dataclass
class Candidates:
    """What the solver needs, and what the summaries need beyond it.

    ``snapshot`` providers carry only the inventories that can take a
    requested amount (all the solver looks at) and only the traits and
    aggregates the request is about.  ``anchors`` are the roots to search,
    in order; when only the first candidates are wanted it is lazy and
    adds trees to the snapshot as it goes, so it must be consumed inside
    the read transaction.  ``inventory_counts`` (provider id -> number of
    inventories it really has) tells :func:`load_summaries` which
    providers need their full inventory read.
    """

    snapshot: ProviderSnapshot
    anchors: Iterable[int]
    inventory_counts: dict[int, int]


def load_candidates(conn: Connection, request: AllocationCandidatesRequest, names: Names, *,
                    wanted: int | None = None) -> Candidates:
    """The snapshot and anchors the solver needs for ``request``.

    ``wanted``: the caller takes only the first ``wanted`` candidates in
    anchor order (a ``limit`` without randomisation, depth-first); trees
    are then loaded in rounds as the search reaches them.  None: every
    tree is loaded at once.
    """
    if names.in_tree_roots is None or any(group.resources.keys() - names.class_ids.keys()
                                          for group in request.groups):
        return Candidates(ProviderSnapshot(), (), {})
    sharing = _sharing_providers(conn, request, names)
    rows = _fitting_inventories(conn, request, names, sharing)
    anchors, lenders = _anchor_roots(request, names, sharing, rows)
    if not anchors:
        return Candidates(ProviderSnapshot(), (), {})
    trees = _Trees(conn, names, sharing, rows, lenders)
    trees.load(names.in_tree_roots.values())
    if wanted is None:
        trees.load(anchors)
        return Candidates(trees.snapshot, anchors, trees.inventory_counts)
    return Candidates(trees.snapshot, trees.in_rounds(anchors, wanted), trees.inventory_counts)


def _in_trees(column_root, column_id) -> sa.ColumnElement[bool]:
    """Providers of the trees in ``roots``; a root written without its own
    id as root (as other modules allow) is found by its id."""
    return sa.or_(column_root.in_(_many("roots")), column_id.in_(_many("roots")))


_INVENTORY_COUNT = (sa.select(sa.func.count()).select_from(INV)
                    .where(INV.c.resource_provider_id == RP.c.id).scalar_subquery())
_TREE_PROVIDERS = (sa.select(RP.c.id, RP.c.uuid, RP.c.parent_provider_id, _ROOT, RP.c.generation,
                             _INVENTORY_COUNT)
                   .where(_in_trees(RP.c.root_provider_id, RP.c.id))
                   .order_by(RP.c.id))
_TREE_AGGREGATES = (sa.select(RP_AGG.c.resource_provider_id, AGG.c.uuid)
                    .join(AGG, AGG.c.id == RP_AGG.c.aggregate_id)
                    .join(RP, RP.c.id == RP_AGG.c.resource_provider_id)
                    .where(_in_trees(RP.c.root_provider_id, RP.c.id),
                           RP_AGG.c.aggregate_id.in_(_many("aggregates"))))


class _Trees:
    """Loads whole trees into one snapshot, each tree once."""

    def __init__(self, conn: Connection, names: Names, sharing: _Sharing, rows: Sequence[_Fitting],
                 lenders: dict[int, list[int]]):
        self.conn = conn
        self.sharing = sharing
        self.lenders = lenders
        self.snapshot = ProviderSnapshot(sharing_lenders=lenders)
        self.inventory_counts: dict[int, int] = {}
        self._loaded: set[int] = set()
        self._inventories: dict[int, dict[str, ProviderInventory]] = {}
        class_names = {class_id: name for name, class_id in names.class_ids.items()}
        for pid, _, class_id, inventory in rows:
            self._inventories.setdefault(pid, {})[class_names[class_id]] = inventory
        # All traits (cached by generation; the summaries show them), but
        # only the aggregates of sharing providers and of member_of.
        self._aggregates = sorted(sharing.members.keys() | set(names.aggregate_ids.values()))

    def in_rounds(self, anchors: Sequence[int], wanted: int) -> Iterator[int]:
        """The anchors, loading their trees a round ahead of the search."""
        size = FIRST_ROUND
        start = 0
        while start < len(anchors):
            # Each anchor searched so far gave at least one candidate, as
            # a rule: no more are needed than candidates still missing.
            count = min(size, wanted - start) if start < wanted else size
            chunk = anchors[start:start + count]
            self.load(chunk)
            yield from chunk
            start += count
            size *= 2

    def load(self, anchors: Iterable[int]) -> None:
        """Add the anchors' trees and their lenders' trees."""
        roots = set(anchors)
        for root in list(roots):
            roots.update(self.sharing.roots[pid] for pid in self.lenders.get(root, ()))
        roots -= self._loaded
        if not roots:
            return
        self._loaded |= roots
        params = {"roots": sorted(roots)}
        providers = _rows(self.conn, _TREE_PROVIDERS, params)
        traits = _traits_of(self.conn, ((row[0], row[1], row[4]) for row in providers))
        aggregates: dict[int, set[str]] = {}
        if self._aggregates:
            for pid, uuid in _rows(self.conn, _TREE_AGGREGATES, {**params, "aggregates": self._aggregates}):
                aggregates.setdefault(pid, set()).add(uuid)
        empty: dict = {}
        self.snapshot.add(
            Provider(id=pid, uuid=uuid, parent_id=parent, root_id=root, generation=generation,
                     traits=traits[pid], aggregates=aggregates.get(pid, frozenset()),
                     inventories=self._inventories.get(pid, empty))
            for pid, uuid, parent, root, generation, _ in providers)
        for row in providers:
            self.inventory_counts[row[0]] = row[5]


# ---------------------------------------------------------------------------
# Step 6: what the provider summaries show
# ---------------------------------------------------------------------------

_SUMMARY_INVENTORIES = (sa.select(INV.c.resource_provider_id, RC.c.name, *_INVENTORY_FIELDS)
                        .join(RC, RC.c.id == INV.c.resource_class_id)
                        .where(INV.c.resource_provider_id.in_(_many("ids")))
                        .order_by(INV.c.resource_provider_id, INV.c.resource_class_id))
_SUMMARY_REQUESTED_INVENTORIES = _SUMMARY_INVENTORIES.where(INV.c.resource_class_id.in_(_many("classes")))
def load_summaries(conn: Connection, candidates: Candidates, provider_ids: Collection[int], *,
                   all_classes: bool, class_ids: Collection[int] = ()
                   ) -> dict[int, dict[str, ProviderInventory]]:
    """Complete inventories (with usage) of the providers listed in the
    summaries (their traits are in the snapshot already).

    With ``all_classes`` the snapshot's inventories are reused when they
    are all the provider has; otherwise (before 1.27: only ``class_ids``
    are shown) they are always read, as a provider may hold a requested
    class that fits no requested amount.
    """
    snapshot = candidates.snapshot
    inventories: dict[int, dict[str, ProviderInventory]] = {}
    missing = []
    for pid in provider_ids:
        known = snapshot.get(pid).inventories
        if all_classes and len(known) == candidates.inventory_counts.get(pid, 0):
            inventories[pid] = known
        else:
            missing.append(pid)
            inventories[pid] = {}
    if missing:
        if all_classes:
            rows = _rows(conn, _SUMMARY_INVENTORIES, {"ids": missing})
        else:
            rows = _rows(conn, _SUMMARY_REQUESTED_INVENTORIES, {"ids": missing, "classes": sorted(class_ids)})
        for row in rows:
            inventories[row[0]][row[1]] = _inventory(row, 2)
    return inventories
