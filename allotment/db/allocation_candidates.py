"""The provider snapshot behind ``GET /allocation_candidates``.

The solver (:mod:`allotment.domain.allocation_candidates`) decides
everything in memory; this module hands it the smallest complete
:class:`~allotment.domain.provider_tree.ProviderSnapshot` in a fixed,
small number of set-based statements whatever the number of providers
(never one statement per provider or per tree):

1. **names** (one statement): resource class and trait ids (unknown names
   are the client's error), aggregate ids of ``member_of``, the roots of
   ``in_tree`` providers, and every class's name;
2. **sharing providers** (trait ``MISC_SHARES_VIA_AGGREGATE``) holding a
   requested class, with their traits and aggregates and the roots of
   every tree that has a provider in one of those aggregates (one
   statement when there are none);
3. **candidate providers** (one statement): (provider, root, class) of
   every inventory of a requested class that could take a requested
   amount by the rules that do not depend on usage (units, capacity),
   narrowed by what SQL does well: a class asked for by one group only
   must also meet that group's per-provider rules (traits, aggregates,
   ``in_tree``); ``root_required`` applies to the root; a required trait
   of the unsuffixed group that no sharing provider can bring must be
   somewhere in the tree;
4. Python keeps the roots whose tree, plus the sharing providers reaching
   it, has every requested class: the **anchors**, in id order;
5. **trees** (three or four statements per round): the anchors' trees and
   their lenders', whole (a summary lists every provider of a tree and
   ``same_subtree`` needs the ancestry): providers with their generation,
   the current usage of each (provider, class), and only the aggregates
   that matter (sharing providers' and ``member_of``'s).  When the caller
   takes only the first ``limit`` candidates, trees are loaded in rounds
   as the search reaches them, so a small ``limit`` reads little.

Under such a ``limit`` step 3 is also done piecemeal: the sharing
providers' rows (and any row without a root id) first, then one window of
root ids at a time, growing, each window's anchors searched before the
next is read; the rest of the ids in one statement once a window would
cover a good share of them (:func:`_in_windows`).

What only changes with a provider's generation -- its traits and the
fields of its inventory records, which every writer changes together with
a generation compare-and-swap -- is kept per process (the caller's
:class:`~allotment.db.provider_cache.ProviderCaches`), by provider id, uuid
and generation, and read (one statement each) only for providers whose
generation moved: correct however many processes write.  Usage, tree
structure and aggregates (their writers do not always bump generations)
are read on every request.  The snapshot's providers then carry complete
inventories with usage and all their traits, which is all the summaries
show: nothing is read after solving.

Every step narrows by *necessary* conditions only: the snapshot may hold a
tree that yields nothing (the solver skips it quickly) but never lacks one
that would yield a candidate.  Statements are built once per process (the
candidate one once per query *shape*) with bound parameters.  Lookups
follow indexes on every backend: inventories by class, usage by
``(provider, class, used)``, trees by ``root_provider_id``, traits,
inventories and aggregates by provider.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows, tables
from allotment.db.provider_cache import ProviderCaches
from allotment.db.traits import UnknownTraits
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


def _rows(conn: Connection, statement: sa.Executable, params: dict) -> Sequence[tuple]:
    """All rows at once (one ``fetchall``), without SQLAlchemy's per-statement
    work (:mod:`allotment.db.raw_rows`)."""
    return raw_rows.rows(conn, statement, params)


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
    #: every resource class: id -> name (summaries show them all from 1.27)
    class_names: dict[int, str]
    #: the lowest and highest provider ids (None: no providers)
    min_provider_id: int | None = None
    max_provider_id: int | None = None


_NAMES = sa.union_all(
    sa.select(sa.literal("c"), RC.c.name, RC.c.id).where(RC.c.name.in_(_many("classes"))),
    sa.select(sa.literal("t"), TRAITS.c.name, TRAITS.c.id).where(TRAITS.c.name.in_(_many("traits"))),
    sa.select(sa.literal("a"), AGG.c.uuid, AGG.c.id).where(AGG.c.uuid.in_(_many("aggregates"))),
    sa.select(sa.literal("r"), RP.c.uuid, _ROOT).where(RP.c.uuid.in_(_many("trees"))),
    sa.select(sa.literal("k"), RC.c.name, RC.c.id),
    sa.select(sa.literal("m"), sa.literal("min"), sa.func.min(RP.c.id)),
    sa.select(sa.literal("m"), sa.literal("max"), sa.func.max(RP.c.id)),
)


def resolve_names(conn: Connection, request: AllocationCandidatesRequest, *, check: bool = True) -> Names:
    """Ids for every name in the request, in one statement.

    With ``check``, raises ``ResourceClassNotFound`` / ``UnknownTraits`` in
    the order Placement finds them (:func:`first_unknown`).  Without, the
    unknown names are simply absent from the result.
    """
    found: dict[str, dict[str, int]] = {"c": {}, "t": {}, "a": {}, "r": {}, "k": {}, "m": {}}
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
    if check:
        problem = first_unknown(request, class_ids, trait_ids)
        if problem is not None:
            raise problem[1]
    in_tree_roots = found["r"] if len(found["r"]) == len(wanted_trees) else None
    return Names(class_ids, trait_ids, found["a"], in_tree_roots, trait_ids.get(SHARING_TRAIT),
                 {class_id: name for name, class_id in found["k"].items()},
                 found["m"].get("min"), found["m"].get("max"))


class KnownNames:
    """The names seen to exist while one mirror of every provider lasts
    (:mod:`allotment.db.provider_mirror`), so that a request whose names
    are all among them needs no statement to resolve them.

    A name, once there, stays with the same id until a row of its table
    is updated or deleted; the database notes such a write as a change of
    everything (:data:`allotment.db.changes.EVERYTHING`), which makes the
    mirror read every provider again and start with new, empty
    ``KnownNames``.  A name added later is not known here until a request
    asks for it (names found missing are not kept), so inserts, which the
    database does not note per provider, never leave these out of date.
    The caller learns only names read before its snapshot was brought up
    to date in the same lineage (see ``allotment.api.allocation_candidates``):
    they then exist at every later snapshot of it.

    ``in_tree`` providers are looked up in the snapshot itself; the lowest
    and highest provider ids, which only the database's windowed reads use,
    are left out (None)."""

    #: Names kept at most (all forgotten at once past it).
    LIMIT = 10_000

    def __init__(self) -> None:
        #: What is known, replaced whole (never changed once made), so that
        #: a reader takes one consistent set without the lock.
        self._seen = _Seen({}, {}, {}, {})
        self._lock = threading.Lock()

    def learn(self, names: Names) -> None:
        """Keep the names ``names`` found (read before the snapshot of this
        lineage that the caller was given)."""
        with self._lock:
            seen = self._seen
            if len(seen.classes) + len(seen.traits) + len(seen.aggregates) > self.LIMIT:
                seen = _Seen({}, {}, {}, {})
            self._seen = _Seen({**seen.classes, **names.class_ids}, {**seen.traits, **names.trait_ids},
                               {**seen.aggregates, **names.aggregate_ids}, names.class_names)

    def covering(self, request: AllocationCandidatesRequest) -> _Seen | None:
        """What is known, if it holds every class, trait and aggregate
        ``request`` names (and the sharing trait); else None."""
        seen = self._seen
        classes, traits, aggregates = seen.classes, seen.traits, seen.aggregates
        if (SHARING_TRAIT in traits
                and all(name in classes for name in request.resource_class_names())
                and all(name in traits for name in request.trait_names())
                and all(uuid in aggregates for uuid in request.aggregate_uuids())):
            return seen
        return None

    @staticmethod
    def names(request: AllocationCandidatesRequest, snapshot: ProviderSnapshot, seen: _Seen) -> Names:
        """``request``'s names from ``seen`` (what :meth:`covering` gave for
        it), with its ``in_tree`` roots as ``snapshot`` holds them."""
        classes, traits, aggregates = seen.classes, seen.traits, seen.aggregates
        in_tree_roots: dict[str, int] | None = {}
        for uuid in request.in_tree_uuids():
            provider = snapshot.by_uuid(uuid)
            if provider is None:
                in_tree_roots = None
                break
            in_tree_roots[uuid] = provider.root_id
        return Names({name: classes[name] for name in request.resource_class_names()},
                     {name: traits[name] for name in request.trait_names() | {SHARING_TRAIT}},
                     {uuid: aggregates[uuid] for uuid in request.aggregate_uuids()},
                     in_tree_roots, traits[SHARING_TRAIT], seen.class_names)


class _Seen(NamedTuple):
    """The names :class:`KnownNames` holds at one moment."""

    classes: dict[str, int]
    traits: dict[str, int]
    aggregates: dict[str, int]
    #: Every class's name by id, as last read.
    class_names: dict[int, str]


def first_unknown(request: AllocationCandidatesRequest, class_ids: Collection[str],
                  trait_ids: Collection[str]) -> tuple[int | None, BadRequest] | None:
    """The first unknown name, in the order Placement finds them, as
    (index of its group in ``request.groups``, or None for ``root_required``;
    the error to report); None when every name exists.

    Placement checks ``root_required``'s names first, then searches group by
    group in query order, checking each group's resource classes and then
    its traits just before searching it.  Some searches end (empty answer)
    before a name is looked at: no root meeting ``root_required`` (before
    any group), a group that finds nothing (before the later groups), a
    group whose ``member_of`` has no member (before its traits).  The
    caller decides about those (see ``allotment.api.allocation_candidates``).
    """
    missing = request.root_traits.unknown(trait_ids)
    if missing:
        return None, UnknownTraits(missing)
    for index, group in enumerate(request.groups):
        for name in group.resources:
            if name not in class_ids:
                return index, ResourceClassNotFound(name)
        missing = group.traits.unknown(trait_ids)
        if missing:
            return index, UnknownTraits(missing)
    return None


def no_root_qualifies(conn: Connection, request: AllocationCandidatesRequest, names: Names) -> bool:
    """``root_required`` is given (its names all exist) and no root provider
    meets it: Placement then answers nothing before it looks at the groups."""
    traits = request.root_traits
    if not traits:
        return False
    roots = sa.select(RP.c.id).where(RP.c.parent_provider_id.is_(None)).limit(1)
    params: dict = {}
    for k, any_of in enumerate(traits.required):
        params[f"rr{k}"] = sorted(names.trait_ids[t] for t in any_of)
        roots = roots.where(_having_trait(RP.c.id, f"rr{k}"))
    if traits.forbidden:
        params["rf"] = sorted(names.trait_ids[t] for t in traits.forbidden)
        roots = roots.where(sa.not_(_having_trait(RP.c.id, "rf")))
    # Built per call (rare: only when a name is unknown): SQLAlchemy's own
    # cache, which matches statements by structure, serves it better.
    return not conn.execute(roots, params).all()


def no_member(conn: Connection, group: RequestGroup, names: Names) -> bool:
    """The group's ``member_of`` names aggregates and no provider is in every
    set of them: Placement then answers nothing before it looks the group's
    traits up."""
    aggregates = group.aggregates.required
    if not aggregates:
        return False
    members = sa.select(RP.c.id).limit(1)
    params: dict = {}
    for k, any_of in enumerate(aggregates):
        params[f"ma{k}"] = sorted(names.aggregate_ids[u] for u in any_of if u in names.aggregate_ids)
        members = members.where(_in_aggregates(RP.c.id, f"ma{k}"))
    return not conn.execute(members, params).all()  # built per call, as above


# ---------------------------------------------------------------------------
# Reusable SQL fragments
# ---------------------------------------------------------------------------

#: Units currently allocated of an inventory record: a correlated sum over
#: one range of the (provider, class, used) index, cheaper on every backend
#: than grouping the allocations and joining them back.
_USAGE = (sa.select(sa.func.coalesce(sa.func.sum(ALLOC.c.used), 0))
          .where(ALLOC.c.resource_provider_id == INV.c.resource_provider_id,
                 ALLOC.c.resource_class_id == INV.c.resource_class_id)
          .scalar_subquery())


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
# Step 3: providers that could take a requested amount
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
                   sharing: _Sharing) -> tuple[_FitShape, dict]:
    """(shape, parameters) of the candidate statement.

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
    classes = []
    for i, (rc, groups) in enumerate(askers.items()):
        amounts = sorted({group.resources[rc] for group in groups})
        params[f"c{i}"] = names.class_ids[rc]
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
    return shape, params


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

    Mirrors the solver's predicates (``Plan.single_ok`` for suffixed groups,
    ``_multi_base_ok`` plus the aggregate rules for the unsuffixed one),
    loosened wherever the solver looks at the anchor rather than the
    provider.
    """
    conditions = [_having_trait(RP.c.id, f"{prefix}rt{k}") for k in range(shape.required)]
    if shape.forbidden:
        conditions.append(sa.not_(_having_trait(RP.c.id, f"{prefix}ft")))
    for k in range(shape.member_of):
        # Not correlated (as the tree traits below): the members are
        # listed once, where a correlated test probes every aggregate of
        # the list for every inventory of the class.
        members = (sa.select(RP_AGG.c.resource_provider_id)
                   .where(RP_AGG.c.aggregate_id.in_(_many(f"{prefix}ma{k}"))))
        member = RP.c.id.in_(members)
        if not shape.suffixed:
            # An aggregate on the root spans its tree.
            member = sa.or_(member, _ROOT.in_(members))
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


#: What the candidate statement reads: every inventory of the requested
#: classes (driven by the class index); those of the trees whose root id
#: is in ``lo``..``hi`` (driven by the root index); those of the trees whose
#: root id is at least ``lo`` (driven by the class index); or those of the
#: sharing providers and of the rows that have no root of their own.
ALL, WINDOW, REST, EXTRA = "all", "window", "rest", "extra"


@functools.lru_cache(maxsize=512)
def _fitting_statement(shape: _FitShape, scope: str = ALL) -> sa.Executable:
    """One SELECT per requested class, UNION ALL: (provider, root, class,
    usage).

    Usage is selected, not compared: a provider whose usage leaves no room
    is dropped by the solver; comparing here too would compute the sum
    twice per row for the few it removes.

    ``WINDOW`` and ``EXTRA`` read a few trees: there the class is compared
    as ``resource_class_id + 0``, which no index serves, so that every
    planner drives the statement from the providers they name (the root
    index, or their ids) rather than from every inventory of the class
    (SQLite has no statistics to tell the two apart).
    """
    tree_rules = _tree_conditions(shape)
    if scope == WINDOW:
        scope_rule = RP.c.root_provider_id.between(_one("lo"), _one("hi"))
    elif scope == EXTRA:
        scope_rule = sa.or_(RP.c.id.in_(_many("sharing")), RP.c.root_provider_id.is_(None))
    elif scope == REST:
        scope_rule = _ROOT >= _one("lo")
    selects = []
    for i, (amounts, group_shape) in enumerate(shape.classes):
        unit_rules = []
        for j in range(amounts):
            value = _one(f"c{i}a{j}")
            unit_rules.append(sa.and_(INV.c.min_unit <= value, INV.c.max_unit >= value,
                                      value % INV.c.step_size == 0,
                                      value <= (INV.c.total - INV.c.reserved) * INV.c.allocation_ratio))
        class_id = INV.c.resource_class_id + 0 if scope in (WINDOW, EXTRA) else INV.c.resource_class_id
        conditions = [class_id == _one(f"c{i}"), sa.or_(*unit_rules)]
        if scope != ALL:
            conditions.append(scope_rule)
        if group_shape is not None:
            conditions.extend(_group_conditions(group_shape, f"c{i}"))
        if tree_rules:
            conditions.append(sa.or_(RP.c.id.in_(_many("sharing")), sa.and_(*tree_rules)))
        selects.append(sa.select(INV.c.resource_provider_id, _ROOT, INV.c.resource_class_id, _USAGE)
                       .join(RP, RP.c.id == INV.c.resource_provider_id)
                       .where(*conditions))
    return selects[0] if len(selects) == 1 else sa.union_all(*selects)


#: (provider id, root id, class id, usage)
_Fitting = tuple[int, int, int, int]


def _fitting_inventories(conn: Connection, request: AllocationCandidatesRequest, names: Names,
                         sharing: _Sharing) -> Sequence[_Fitting]:
    """Every inventory of a requested class that could take a requested amount."""
    shape, params = _fitting_shape(request, names, sharing)
    return _rows(conn, _fitting_statement(shape), params)


# ---------------------------------------------------------------------------
# Step 4: anchors
# ---------------------------------------------------------------------------

def _anchor_roots(request: AllocationCandidatesRequest, names: Names, sharing: _Sharing,
                  rows: Sequence[_Fitting]) -> tuple[list[int], dict[int, list[int]]]:
    """(anchor roots in id order, root -> sharing providers that may lend to it).

    An anchor's tree, plus what sharing providers reaching it lend, has
    every requested class.  A sharing provider lends when it holds a
    candidate inventory (or, with a resourceless group, whatever it holds:
    it may be the provider that group names).
    """
    needed = {names.class_ids[rc] for rc in request.resource_class_names()}
    local, borrowed, lenders = _reach(request, sharing, rows)
    nothing: set[int] = set()
    anchors = [root for root in sorted(local.keys() | borrowed.keys())
               if needed <= local.get(root, nothing) | borrowed.get(root, nothing)]
    unsuffixed = request.group("")
    if unsuffixed is not None and unsuffixed.in_tree:
        only = names.in_tree_roots[unsuffixed.in_tree]
        anchors = [root for root in anchors if root == only]
    return anchors, lenders


def _reach(request: AllocationCandidatesRequest, sharing: _Sharing, rows: Sequence[_Fitting]
           ) -> tuple[dict[int, set[int]], dict[int, set[int]], dict[int, list[int]]]:
    """(root -> classes its own providers hold in ``rows``, root -> classes
    sharing providers of other trees lend it, root -> those lenders)."""
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
    return local, borrowed, lenders


def built_inventories(records: Sequence[tuple], used: Sequence[int],
                      class_names: dict[int, str]) -> dict[str, ProviderInventory]:
    """A provider's inventories with their usage, by class name, from its
    records (class id, total, reserved, min_unit, max_unit, step_size,
    ratio) in class id order and the units used of each; a record of a
    class not in ``class_names`` is left out."""
    return {class_names[record[0]]: ProviderInventory(*record[1:], used=amount)
            for record, amount in zip(records, used) if record[0] in class_names}


def _with_generation(*item) -> sa.Select:
    """Every listed provider with its generation and ``item`` (outer-joined)."""
    return sa.select(RP.c.id, RP.c.uuid, RP.c.generation, *item)


#: A provider's trait names, in trait id order.
_PROVIDER_TRAITS = (_with_generation(TRAITS.c.name)
                    .select_from(RP.outerjoin(RP_TRAITS, RP_TRAITS.c.resource_provider_id == RP.c.id)
                                 .outerjoin(TRAITS, TRAITS.c.id == RP_TRAITS.c.trait_id))
                    .where(RP.c.id.in_(_many("ids")))
                    .order_by(RP.c.id, RP_TRAITS.c.trait_id))
#: A provider's inventory records without usage, in class id order, as
#: (class id, total, reserved, min_unit, max_unit, step_size, ratio).
_PROVIDER_RECORDS = (_with_generation(INV.c.resource_class_id, INV.c.total, INV.c.reserved, INV.c.min_unit,
                                       INV.c.max_unit, INV.c.step_size, INV.c.allocation_ratio)
                     .select_from(RP.outerjoin(INV, INV.c.resource_provider_id == RP.c.id))
                     .where(RP.c.id.in_(_many("ids")))
                     .order_by(RP.c.id, INV.c.resource_class_id))

# ---------------------------------------------------------------------------
# Step 5: the trees
# ---------------------------------------------------------------------------

#: When the caller takes only the first candidates, the first round loads
#: trees with up to this many candidate inventories (a few hundred flat
#: hosts, or a few hosts of a hundred devices each); each further round
#: twice as many.
FIRST_ROUND = 512
#: Trees read by one statement at most, however large a round grows: a
#: request that passes many trees giving nothing (a cloud whose first trees
#: are full) doubles its rounds, and SQLite takes 32,766 parameters at most.
LOAD_TREES = 4096


@dataclasses.dataclass
class Candidates:
    """What the solver needs.

    ``snapshot`` providers carry their complete inventories with usage and
    all their traits (what the summaries show), but only the aggregates
    the request is about.  ``anchors`` are the roots to search, in order;
    when only the first candidates are wanted it is lazy and adds trees to
    the snapshot as it goes, so it must be consumed inside the read
    transaction.
    """

    snapshot: ProviderSnapshot
    anchors: Iterable[int]


def nothing_to_find(request: AllocationCandidatesRequest, names: Names) -> bool:
    """Whether no candidate can exist for a request whose names were checked
    leniently: an ``in_tree`` provider or a requested class is unknown."""
    return names.in_tree_roots is None or any(group.resources.keys() - names.class_ids.keys()
                                              for group in request.groups)


def mirrored_candidates(request: AllocationCandidatesRequest, names: Names,
                        snapshot: ProviderSnapshot) -> Candidates:
    """What the solver needs, from a snapshot of every provider
    (:mod:`allotment.db.provider_mirror`): all of it, every root an anchor
    to try, in id order."""
    if nothing_to_find(request, names):
        return Candidates(ProviderSnapshot(), ())
    members = _member_roots(request, snapshot)
    return Candidates(snapshot, snapshot.root_ids if members is None else members)


def _member_roots(request: AllocationCandidatesRequest, snapshot: ProviderSnapshot) -> list[int] | None:
    """The roots, in snapshot order, of the trees that hold a provider in
    one aggregate of each ``member_of`` any-of set of the request: the only
    anchors that can give a candidate when no sharing provider lends
    outside its own tree (every provider of a candidate is then in the
    anchor's tree, and a group's aggregates are met by its provider or by
    the tree's root).  None when no group names aggregates, or where
    sharing providers lend.  So a query that a few trees meet costs about
    its answer, not a look at every tree of the cloud (a member_of query
    164 candidates meet over 100,000 nested hosts: 886 ms of server CPU)."""
    wanted = [any_of for grp in request.groups for any_of in grp.aggregates.required]
    if not wanted or snapshot.sharing_providers_by_anchor():
        return None
    by_aggregate = snapshot.aggregate_roots()
    roots: set[int] | None = None
    for any_of in wanted:
        found: set[int] = set()
        for aggregate in any_of:
            found.update(by_aggregate.get(aggregate, ()))
        roots = found if roots is None else roots & found
        if not roots:
            return []
    return snapshot.in_root_order(roots)


def load_candidates(conn: Connection, request: AllocationCandidatesRequest, names: Names, caches: ProviderCaches, *,
                    wanted: int | None = None) -> Candidates:
    """The snapshot and anchors the solver needs for ``request``.

    ``wanted``: the caller takes only the first ``wanted`` candidates in
    anchor order (a ``limit`` without randomisation, depth-first); trees
    are then loaded in rounds as the search reaches them.  None: every
    tree is loaded at once.
    """
    if nothing_to_find(request, names):
        return Candidates(ProviderSnapshot(), ())
    sharing = _sharing_providers(conn, request, names)
    if _windowed(request, names, wanted):
        return _in_windows(conn, request, names, sharing, wanted, caches)
    rows = _fitting_inventories(conn, request, names, sharing)
    anchors, lenders = _anchor_roots(request, names, sharing, rows)
    if not anchors:
        return Candidates(ProviderSnapshot(), ())
    trees = _Trees(conn, names, sharing, rows, lenders, caches)
    trees.load(names.in_tree_roots.values())
    if wanted is None:
        trees.load(anchors)
        return Candidates(trees.snapshot, anchors)
    return Candidates(trees.snapshot, trees.in_rounds(anchors, wanted))


#: Under a limit, the candidate inventories are read a window of root ids
#: at a time (the first one spanning this many ids, or twice the limit;
#: each further one as many as the anchors still wanted need at the density
#: of anchors seen so far, plus a quarter, at most twice the last), so that
#: a small limit reads few trees.  A
#: window costs more per tree than reading every inventory of a class, so
#: once the next window would span more than 1/REST_SHARE of the ids left,
#: the rest is read in one go.
FIRST_WINDOW = 32
REST_SHARE = 4


def _more(wanted: int) -> int:
    """Anchors per round once ``wanted`` anchors gave fewer candidates."""
    return max(1, wanted // 4)


def _first_span(wanted: int) -> int:
    return max(FIRST_WINDOW, 2 * wanted)


def _next_span(span: int, covered: int, found: int, still: int) -> int:
    """Ids of the next window: enough for ``still`` more anchors, with a
    quarter to spare, at the density seen so far (``found`` anchors in the
    ``covered`` ids read), but at most twice the last ``span`` (an anchor
    may give many candidates: ``still`` counts one each)."""
    if not found:
        return span * 2
    return max(FIRST_WINDOW, min(span * 2, -(-still * covered * 5 // (found * 4))))


def _rest_now(span: int, low: int, last: int) -> bool:
    """Would a window of ``span`` ids from ``low`` cover too much of what is left?"""
    return span * REST_SHARE > last - low + 1


def _windowed(request: AllocationCandidatesRequest, names: Names, wanted: int | None) -> bool:
    """Read in windows: only the first ``wanted`` anchors are needed, they
    may come from any tree, and the first window would not already cover
    most ids (then one statement over everything costs less)."""
    if wanted is None or names.max_provider_id is None:
        return False
    unsuffixed = request.group("")
    if unsuffixed is not None and unsuffixed.in_tree:
        return False
    return not _rest_now(_first_span(wanted), names.min_provider_id, names.max_provider_id)


def _in_windows(conn: Connection, request: AllocationCandidatesRequest, names: Names,
                sharing: _Sharing, wanted: int, caches: ProviderCaches) -> Candidates:
    """Candidates whose anchors are found window by window, in root id order.

    Every anchor is found in the window of its root: its own trees' rows
    are all there (they carry that root), and what it may borrow comes from
    the sharing providers, read up front with the rows that have no root of
    their own.  So the anchors, and their order, are those of reading
    everything at once.  (A sharing provider's rows may come twice, up
    front and in its root's window: harmless, the same rows.)
    """
    shape, params = _fitting_shape(request, names, sharing)
    extra = _rows(conn, _fitting_statement(shape, EXTRA), params)
    lending = [row for row in extra if row[0] in sharing.roots]
    rootless = [row for row in extra if row[0] not in sharing.roots]
    _, lenders = _anchor_roots(request, names, sharing, lending)
    trees = _Trees(conn, names, sharing, lending, lenders, caches)
    trees.load(names.in_tree_roots.values())
    last = names.max_provider_id

    def windows() -> Iterator[list[int]]:
        low, span = names.min_provider_id, _first_span(wanted)
        found, more = 0, _more(wanted)
        while low <= last:
            if _rest_now(span, low, last):
                rows = _rows(conn, _fitting_statement(shape, REST), {**params, "lo": low})
                high = None  # the rest, trees created meanwhile included
            else:
                high = low + span - 1
                rows = list(_rows(conn, _fitting_statement(shape, WINDOW), {**params, "lo": low, "hi": high}))
                rows.extend(row for row in rootless if low <= row[1] <= high)
            trees.add_rows(rows)
            anchors, _ = _anchor_roots(request, names, sharing, lending + rows)
            anchors = [root for root in anchors if low <= root and (high is None or root <= high)]
            yield anchors
            if high is None:
                return
            # The search wants more: every anchor so far has been searched.
            found += len(anchors)
            still = wanted - found
            if still <= 0:  # some gave nothing
                still, more = more, more * 2
            low, span = high + 1, _next_span(span, high - names.min_provider_id + 1, found, still)

    return Candidates(trees.snapshot, trees.in_windows(windows(), wanted))


def _in_trees() -> sa.ColumnElement[bool]:
    """Providers of the trees in ``roots`` (by the root_provider_id index),
    and the ``lost`` roots: rows written without their own id as root (as
    other modules allow: such a row is its own root), usually none."""
    return sa.or_(RP.c.root_provider_id.in_(_many("roots")), RP.c.id.in_(_many("lost")))


_TREE_PROVIDERS = (sa.select(RP.c.id, RP.c.uuid, RP.c.parent_provider_id, _ROOT, RP.c.generation)
                   .where(_in_trees())
                   .order_by(RP.c.id))
#: Usage of every inventory record of some providers.
_PROVIDER_USAGE = (sa.select(INV.c.resource_provider_id, INV.c.resource_class_id, _USAGE)
                   .where(INV.c.resource_provider_id.in_(_many("ids"))))
_TREE_AGGREGATES = (sa.select(RP_AGG.c.resource_provider_id, AGG.c.uuid)
                    .join(AGG, AGG.c.id == RP_AGG.c.aggregate_id)
                    .join(RP, RP.c.id == RP_AGG.c.resource_provider_id)
                    .where(_in_trees(), RP_AGG.c.aggregate_id.in_(_many("aggregates"))))


class _Trees:
    """Loads whole trees into one snapshot, each tree once."""

    def __init__(self, conn: Connection, names: Names, sharing: _Sharing, rows: Sequence[_Fitting],
                 lenders: dict[int, list[int]], caches: ProviderCaches):
        self.conn = conn
        self.caches = caches
        self.sharing = sharing
        self.lenders = lenders
        # The usage the candidate statement read: most of what trees need.
        self._usage: dict[tuple[int, int], int] = {}
        # Candidate inventories per root: how big a tree is, roughly.
        self._weight: dict[int, int] = {}
        self.add_rows(rows)
        self.class_names = names.class_names
        caches.note_class_names(names.class_names)
        self.snapshot = ProviderSnapshot(sharing_lenders=lenders)
        self._loaded: set[int] = set()
        # Only the aggregates of sharing providers and of member_of.
        self._aggregates = sorted(sharing.members.keys() | set(names.aggregate_ids.values()))

    def add_rows(self, rows: Iterable[_Fitting]) -> None:
        """Take the usage and tree sizes of more candidate rows."""
        usage, weight = self._usage, self._weight
        for row in rows:
            usage[(row[0], row[2])] = int(row[3])
            weight[row[1]] = weight.get(row[1], 0) + 1

    def in_windows(self, windows: Iterable[Sequence[int]], wanted: int) -> Iterator[int]:
        """The anchors of each window in turn, trees loaded in rounds."""
        given = 0
        for anchors in windows:
            for root in self.in_rounds(anchors, wanted - given, more=_more(wanted)):
                given += 1
                yield root

    def in_rounds(self, anchors: Sequence[int], wanted: int, more: int | None = None) -> Iterator[int]:
        """The anchors, loading their trees a round ahead of the search.

        A round ends at its budget of candidate inventories (big trees
        yield many candidates each) or, as an anchor gives at least one
        candidate as a rule, once it holds as many anchors as candidates
        are still missing; rounds grow, so that an answer takes a few.
        Once as many anchors as candidates wanted are out and the search
        still asks (some gave nothing), rounds of ``more`` anchors follow,
        doubling: the few that are still missing should not load every
        tree the budget allows.
        """
        budget = FIRST_ROUND
        more = _more(wanted) if more is None else more
        start = 0
        while start < len(anchors):
            end = start
            weight = 0
            missing = wanted - start
            if missing <= 0:
                missing = more
                more *= 2
            while end < len(anchors) and weight < budget and end - start < missing:
                weight += self._weight.get(anchors[end], 1)
                end += 1
            chunk = anchors[start:end]
            self.load(chunk)
            yield from chunk
            start = end
            budget *= 2

    def load(self, anchors: Iterable[int]) -> None:
        """Add the anchors' trees and their lenders' trees."""
        roots = set(anchors)
        for root in list(roots):
            roots.update(self.sharing.roots[pid] for pid in self.lenders.get(root, ()))
        roots -= self._loaded
        if not roots:
            return
        self._loaded |= roots
        ordered = sorted(roots)
        for start in range(0, len(ordered), LOAD_TREES):
            self._load_trees(ordered[start:start + LOAD_TREES])

    def _load_trees(self, ordered: list[int]) -> None:
        """:meth:`load` of at most :data:`LOAD_TREES` trees (roots in id order)."""
        roots = set(ordered)
        params = {"roots": ordered, "lost": []}
        providers = _rows(self.conn, _TREE_PROVIDERS, params)
        lost = roots.difference(row[0] for row in providers)
        if lost:
            params["lost"] = sorted(lost)
            providers = _rows(self.conn, _TREE_PROVIDERS, params)
        aggregates: dict[int, set[str]] = {}
        if self._aggregates:
            for pid, uuid in _rows(self.conn, _TREE_AGGREGATES, {**params, "aggregates": self._aggregates}):
                aggregates.setdefault(pid, set()).add(uuid)
        # The provider built last time where nothing it shows changed (its
        # generation, place in the tree, usage and aggregates): most of
        # them when one claim was written since.
        added: list = list(providers)
        kept: dict[int, tuple] = {}
        rest = []
        for i, (pid, uuid, parent, root, generation) in enumerate(providers):
            built = self.caches.providers.get(pid, uuid, generation)
            if built is not None and built[0] == parent and built[1] == root:
                kept[i] = built
            else:
                rest.append(i)
        # Usage of the classes no candidate row brought (one statement).
        usage = self._usage
        class_ids = {added[i][0]: built[2] for i, built in kept.items()}
        class_ids.update((pid, tuple([record[0] for record in records])) for pid, records in self.caches.records.fetch(
            self.conn, _PROVIDER_RECORDS, [(added[i][0], added[i][1], added[i][4]) for i in rest]).items())
        lacking = [pid for pid, ids in class_ids.items() if any((pid, class_id) not in usage for class_id in ids)]
        for pid, class_id, used in raw_rows.rows_in_parts(self.conn, _PROVIDER_USAGE, {"ids": lacking}):
            usage[(pid, class_id)] = int(used)
        no_aggregates: frozenset = frozenset()
        for i, built in kept.items():
            pid = added[i][0]
            if (tuple([usage.get((pid, class_id), 0) for class_id in built[2]]) == built[3]
                    and aggregates.get(pid, no_aggregates) == built[4].aggregates):
                added[i] = built[4]
            else:
                rest.append(i)
        if rest:
            self._build(added, rest, aggregates)
        self.snapshot.add(added)

    def _build(self, added: list, rest: list[int], aggregates: dict[int, set[str]]) -> None:
        """Build the providers whose rows are at positions ``rest`` of ``added``,
        in place (their records and usage have been read)."""
        keys = [(added[i][0], added[i][1], added[i][4]) for i in rest]
        traits = self.caches.traits.fetch(self.conn, _PROVIDER_TRAITS, keys)
        records = self.caches.records.fetch(self.conn, _PROVIDER_RECORDS, keys)  # cached by load as a rule
        usage = self._usage
        no_aggregates: frozenset = frozenset()
        for i in rest:
            pid, uuid, parent, root, generation = added[i]
            # A record written after the usage was read has none yet.
            used = tuple([usage.get((pid, record[0]), 0) for record in records[pid]])
            provider = added[i] = Provider(
                id=pid, uuid=uuid, parent_id=parent, root_id=root, generation=generation,
                traits=traits[pid], aggregates=aggregates.get(pid, no_aggregates),
                inventories=self._inventories(pid, uuid, generation, records[pid], used))
            self.caches.providers.put(pid, uuid, generation,
                           (parent, root, tuple([record[0] for record in records[pid]]), used, provider))

    def _inventories(self, pid: int, uuid: str, generation: int, records: tuple,
                     used: tuple[int, ...]) -> dict[str, ProviderInventory]:
        """The provider's inventories with usage; the same objects as last
        time when nothing changed (they are never modified)."""
        cache = self.caches.inventories
        cached = cache.get(pid, uuid, generation)
        if cached is not None and cached[0] == used:
            return cached[1]
        class_names = self.class_names
        # (A class created after this request read the class names cannot
        # be one it asked for: such a record is left out.)
        # Providers with the same records (kept once) and usage share one
        # (never modified) mapping.
        inventories = cache.kept((records, used))
        if inventories is None:
            inventories = cache.keep((records, used), built_inventories(records, used, class_names))
        cache.put(pid, uuid, generation, (used, inventories))
        return inventories


# ---------------------------------------------------------------------------
# Every tree the request concerns, for explanations
# ---------------------------------------------------------------------------

#: Every inventory of the requested classes, whatever the amounts and rules.
_EVERY_INVENTORY = (sa.select(INV.c.resource_provider_id, _ROOT, INV.c.resource_class_id, _USAGE)
                    .join(RP, RP.c.id == INV.c.resource_provider_id)
                    .where(INV.c.resource_class_id.in_(_many("classes"))))
_CLOUD_SIZE = sa.select(sa.func.count(), sa.func.sum(sa.case((RP.c.parent_provider_id.is_(None), 1), else_=0)))
_LABELS = sa.select(RP.c.id, RP.c.uuid, RP.c.name).where(RP.c.id.in_(_many("ids")))


@dataclasses.dataclass
class AllTrees:
    """What an explanation looks at: the complete trees of every provider
    holding a requested class (however little, whatever its traits), of
    the sharing providers holding one and of every tree they reach, and of
    the ``in_tree`` providers; ``roots`` are those trees in id order (the
    order candidates are searched in).  Loaded by the same code as
    :func:`load_candidates`'s trees, without its narrowing."""

    snapshot: ProviderSnapshot
    roots: list[int]


def load_all_trees(conn: Connection, request: AllocationCandidatesRequest, names: Names,
                   caches: ProviderCaches) -> AllTrees:
    """The trees an explanation of ``request`` needs (see :class:`AllTrees`)."""
    classes = sorted(names.class_ids[rc] for rc in request.resource_class_names() if rc in names.class_ids)
    sharing = _sharing_providers(conn, request, names)
    rows = _rows(conn, _EVERY_INVENTORY, {"classes": classes}) if classes else []
    local, borrowed, lenders = _reach(request, sharing, rows)
    trees = _Trees(conn, names, sharing, rows, lenders, caches)
    in_tree = list((names.in_tree_roots or {}).values())
    roots = sorted(local.keys() | borrowed.keys() | set(in_tree))
    trees.load(roots)
    return AllTrees(trees.snapshot, roots)


def cloud_size(conn: Connection) -> tuple[int, int]:
    """(providers, root providers) in the whole cloud."""
    providers, roots = _rows(conn, _CLOUD_SIZE, {})[0]
    return int(providers), int(roots or 0)


def provider_labels(conn: Connection, ids: Collection[int]) -> dict[int, tuple[str, str]]:
    """id -> (uuid, name) of some providers (those an explanation names)."""
    if not ids:
        return {}
    return {pid: (uuid, name) for pid, uuid, name in _rows(conn, _LABELS, {"ids": sorted(ids)})}
