"""The provider snapshot behind ``GET /allocation_candidates``.

The solver (:mod:`allotment.domain.allocation_candidates`) decides
everything in memory; this module's job is to hand it the smallest
complete :class:`~allotment.domain.provider_tree.ProviderSnapshot` in a
fixed, small number of set-based statements, whatever the number of
providers (never one statement per provider or per tree):

1. **names**: resource class and trait ids (unknown names are the
   client's error), aggregate ids of ``member_of``, the roots of
   ``in_tree`` providers;
2. **sharing providers** (trait ``MISC_SHARES_VIA_AGGREGATE``) holding a
   requested class, with their traits and aggregates, and the roots of
   every tree that has a provider in one of those aggregates;
3. **fitting inventories**: for each requested class, the providers where
   one more allocation of a requested amount fits *now* (capacity against
   current usage, ``min_unit``/``max_unit``/``step_size``), narrowed by
   what SQL does well: a class asked for by one group only must also meet
   that group's per-provider rules (traits, aggregates, ``in_tree``),
   ``root_required`` applies to the root, and a required trait of the
   unsuffixed group that no sharing provider can supply must be somewhere
   in the tree;
4. Python keeps the roots whose tree (plus the sharing providers reaching
   it) offers every requested class: the **anchors**;
5. **trees**: the anchors' and the sharing providers' trees, whole (a
   provider summary lists every provider of a tree, and ``same_subtree``
   needs the ancestry): providers, inventories with their usage, traits,
   and only the aggregates that matter (those of sharing providers and
   those named by ``member_of``).

Every step narrows by *necessary* conditions only: the snapshot may hold a
tree that yields nothing (the solver then skips it quickly) but never
lacks one that would yield a candidate.

Usage is a correlated sum over the ``(provider, class, used)`` index of
``allocations``: one index range per inventory row on every backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence

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


class UnknownTraits(BadRequest):
    """A trait named in the query does not exist (Placement's message)."""

    def __init__(self, names: Iterable[str]):
        super().__init__(f"No such trait(s): {', '.join(sorted(names))}.")


@dataclasses.dataclass(frozen=True)
class Names:
    """The query's names turned into ids (step 1)."""

    class_ids: dict[str, int]
    trait_ids: dict[str, int]
    #: member_of aggregate uuid -> id, for the aggregates that exist.
    aggregate_ids: dict[str, int]
    #: in_tree uuid -> root id; None when some in_tree provider is unknown
    #: (no candidate can then exist).
    in_tree_roots: dict[str, int] | None
    sharing_trait_id: int | None


# ---------------------------------------------------------------------------
# Step 1: names
# ---------------------------------------------------------------------------

def resolve_names(conn: Connection, request: AllocationCandidatesRequest) -> Names:
    """Ids for every name in the request.

    Raises ``ResourceClassNotFound`` / ``UnknownTraits`` in the order
    Placement finds them: ``root_required`` traits, then group by group its
    resource classes and its traits.
    """
    wanted_classes = request.resource_class_names()
    class_ids = dict(conn.execute(
        sa.select(RC.c.name, RC.c.id).where(RC.c.name.in_(wanted_classes))).all()) if wanted_classes else {}
    wanted_traits = request.trait_names() | {SHARING_TRAIT}
    trait_ids = dict(conn.execute(
        sa.select(TRAITS.c.name, TRAITS.c.id).where(TRAITS.c.name.in_(sorted(wanted_traits)))).all())
    _check_names(request, class_ids, trait_ids)

    aggregate_uuids = sorted(request.aggregate_uuids())
    aggregate_ids = dict(conn.execute(
        sa.select(AGG.c.uuid, AGG.c.id).where(AGG.c.uuid.in_(aggregate_uuids))).all()) if aggregate_uuids else {}

    in_tree_roots: dict[str, int] | None = {}
    wanted_trees = sorted(request.in_tree_uuids())
    if wanted_trees:
        found = dict(conn.execute(sa.select(RP.c.uuid, _ROOT).where(RP.c.uuid.in_(wanted_trees))).all())
        in_tree_roots = found if len(found) == len(wanted_trees) else None
    return Names(class_ids, trait_ids, aggregate_ids, in_tree_roots, trait_ids.get(SHARING_TRAIT))


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


def _having_trait(provider_id, trait_ids: Collection[int]) -> sa.ColumnElement[bool]:
    return sa.exists().where(RP_TRAITS.c.resource_provider_id == provider_id,
                             RP_TRAITS.c.trait_id.in_(sorted(trait_ids)))


def _in_aggregates(provider_id, aggregate_ids: Collection[int]) -> sa.ColumnElement[bool]:
    if not aggregate_ids:
        return sa.false()
    return sa.exists().where(RP_AGG.c.resource_provider_id == provider_id,
                             RP_AGG.c.aggregate_id.in_(sorted(aggregate_ids)))


# ---------------------------------------------------------------------------
# Step 2: sharing providers
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class _Sharing:
    """Sharing providers that may lend a requested class, and their reach."""

    #: provider id -> root id
    roots: dict[int, int]
    #: provider id -> trait ids
    traits: dict[int, set[int]]
    #: aggregate id -> sharing provider ids in it
    members: dict[int, list[int]]
    #: sharing provider id -> roots of trees sharing an aggregate with it
    reach: dict[int, set[int]]


def _sharing_providers(conn: Connection, request: AllocationCandidatesRequest, names: Names) -> _Sharing:
    sharing = _Sharing({}, {}, {}, {})
    if names.sharing_trait_id is None:
        return sharing
    query = (sa.select(RP.c.id, _ROOT)
             .join(RP_TRAITS, RP_TRAITS.c.resource_provider_id == RP.c.id)
             .where(RP_TRAITS.c.trait_id == names.sharing_trait_id))
    if all(group.resources for group in request.groups):
        # Without a resourceless group, only a holder of a requested class can help.
        query = query.where(sa.exists().where(
            INV.c.resource_provider_id == RP.c.id,
            INV.c.resource_class_id.in_(sorted(names.class_ids.values()))))
    sharing.roots = dict(conn.execute(query).all())
    if not sharing.roots:
        return sharing
    ids = sorted(sharing.roots)
    for pid, trait_id in conn.execute(sa.select(RP_TRAITS.c.resource_provider_id, RP_TRAITS.c.trait_id)
                                      .where(RP_TRAITS.c.resource_provider_id.in_(ids))):
        sharing.traits.setdefault(pid, set()).add(trait_id)
    for pid, agg_id in conn.execute(sa.select(RP_AGG.c.resource_provider_id, RP_AGG.c.aggregate_id)
                                    .where(RP_AGG.c.resource_provider_id.in_(ids))):
        sharing.members.setdefault(agg_id, []).append(pid)
    if sharing.members:
        rows = conn.execute(sa.select(sa.distinct(RP_AGG.c.aggregate_id), _ROOT)
                            .join(RP, RP.c.id == RP_AGG.c.resource_provider_id)
                            .where(RP_AGG.c.aggregate_id.in_(sorted(sharing.members))))
        for agg_id, root in rows:
            for pid in sharing.members[agg_id]:
                sharing.reach.setdefault(pid, set()).add(root)
    return sharing


# ---------------------------------------------------------------------------
# Step 3: inventories that can take a requested amount now
# ---------------------------------------------------------------------------

def _fits_any(amounts: Collection[int]) -> sa.ColumnElement[bool]:
    """One more allocation of one of ``amounts`` fits the inventory row.

    The capacity rule of :mod:`allotment.domain.capacity` in SQL; capacity
    is tested with the smallest amount (if that does not fit, none does),
    the unit rules with each.
    """
    smallest = sa.literal(min(amounts), sa.Integer)
    units = []
    for amount in sorted(amounts):
        value = sa.literal(amount, sa.Integer)
        units.append(sa.and_(INV.c.min_unit <= value, INV.c.max_unit >= value, value % INV.c.step_size == 0))
    used = _usage(INV.c.resource_provider_id, INV.c.resource_class_id)
    return sa.and_(sa.or_(*units),
                   used + smallest <= (INV.c.total - INV.c.reserved) * INV.c.allocation_ratio)


def _group_conditions(group: RequestGroup, names: Names, sharing: _Sharing) -> list[sa.ColumnElement[bool]]:
    """Per-provider rules of the only group asking for a class.

    Mirrors the solver's predicates (``_single_ok`` for suffixed groups,
    ``_multi_base_ok`` plus the aggregate rules for the unsuffixed one),
    loosened wherever the solver looks at the anchor rather than the
    provider.
    """
    conditions = []
    traits, aggregates = group.traits, group.aggregates
    if group.suffix:
        for any_of in traits.required:
            conditions.append(_having_trait(RP.c.id, [names.trait_ids[t] for t in any_of]))
    if traits.forbidden:
        conditions.append(sa.not_(_having_trait(RP.c.id, [names.trait_ids[t] for t in traits.forbidden])))
    for any_of in aggregates.required:
        ids = [names.aggregate_ids[u] for u in any_of if u in names.aggregate_ids]
        member = _in_aggregates(RP.c.id, ids)
        if not group.suffix:
            # An aggregate on the root spans its tree.
            member = sa.or_(member, _in_aggregates(_ROOT, ids))
        conditions.append(member)
    forbidden = [names.aggregate_ids[u] for u in aggregates.forbidden if u in names.aggregate_ids]
    if forbidden:
        conditions.append(sa.not_(_in_aggregates(RP.c.id, forbidden)))
    if group.in_tree:
        conditions.append(_ROOT == names.in_tree_roots[group.in_tree])
    return conditions


def _tree_conditions(request: AllocationCandidatesRequest, names: Names,
                     sharing: _Sharing) -> list[sa.ColumnElement[bool]]:
    """Rules on the tree of a fitting provider that is not sharing."""
    conditions = []
    root_traits = request.root_traits
    if root_traits:
        root_rule = []
        for any_of in root_traits.required:
            root_rule.append(_having_trait(_ROOT, [names.trait_ids[t] for t in any_of]))
        if root_traits.forbidden:
            root_rule.append(sa.not_(_having_trait(_ROOT, [names.trait_ids[t] for t in root_traits.forbidden])))
        conditions.append(sa.and_(*root_rule))
    unsuffixed = request.group("")
    if unsuffixed is not None and unsuffixed.resources:
        lent = set().union(*sharing.traits.values()) if sharing.traits else set()
        for any_of in unsuffixed.traits.required:
            ids = {names.trait_ids[t] for t in any_of}
            if ids & lent:
                continue  # a sharing provider may bring it
            # Some provider of the tree must carry one of them.
            conditions.append(sa.exists().where(
                RP_TRAITS.c.trait_id.in_(sorted(ids)),
                TREE_RP.c.id == RP_TRAITS.c.resource_provider_id,
                _TREE_ROOT == _ROOT))
        if unsuffixed.in_tree:
            conditions.append(_ROOT == names.in_tree_roots[unsuffixed.in_tree])
    return conditions


def _fitting_inventories(conn: Connection, request: AllocationCandidatesRequest, names: Names,
                         sharing: _Sharing) -> list[tuple[int, int, int]]:
    """(provider id, root id, class id) of every inventory that could serve."""
    askers: dict[str, list[RequestGroup]] = {}
    for group in request.groups:
        for rc in group.resources:
            askers.setdefault(rc, []).append(group)
    tree_rules = _tree_conditions(request, names, sharing)
    is_sharing = RP.c.id.in_(sorted(sharing.roots)) if sharing.roots else sa.false()
    selects = []
    for rc, groups in askers.items():
        amounts = {group.resources[rc] for group in groups}
        conditions = [INV.c.resource_class_id == names.class_ids[rc], _fits_any(amounts)]
        if len(groups) == 1:
            conditions.extend(_group_conditions(groups[0], names, sharing))
        if tree_rules:
            conditions.append(sa.or_(is_sharing, *([sa.and_(*tree_rules)])))
        selects.append(sa.select(INV.c.resource_provider_id, _ROOT, INV.c.resource_class_id)
                       .join(RP, RP.c.id == INV.c.resource_provider_id)
                       .where(*conditions))
    query = selects[0] if len(selects) == 1 else sa.union_all(*selects)
    return [tuple(row) for row in conn.execute(query)]


# ---------------------------------------------------------------------------
# Step 4: anchors
# ---------------------------------------------------------------------------

def _anchor_roots(request: AllocationCandidatesRequest, names: Names, sharing: _Sharing,
                  rows: Sequence[tuple[int, int, int]]) -> tuple[set[int], set[int]]:
    """(anchor roots, roots of the sharing providers that can lend to them)."""
    needed = {names.class_ids[rc] for rc in request.resource_class_names()}
    local: dict[int, set[int]] = {}
    lent: dict[int, set[int]] = {}  # sharing provider -> classes it can lend
    for pid, root, class_id in rows:
        local.setdefault(root, set()).add(class_id)
        if pid in sharing.roots:
            lent.setdefault(pid, set()).add(class_id)
    borrowed: dict[int, set[int]] = {}
    lenders: dict[int, set[int]] = {}
    for pid, classes in lent.items():
        for root in sharing.reach.get(pid, ()):
            borrowed.setdefault(root, set()).update(classes)
            lenders.setdefault(root, set()).add(pid)
    anchors = set()
    for root in set(local) | set(borrowed):
        if needed <= local.get(root, set()) | borrowed.get(root, set()):
            anchors.add(root)
    unsuffixed = request.group("")
    if unsuffixed is not None and unsuffixed.in_tree:
        anchors &= {names.in_tree_roots[unsuffixed.in_tree]}
    lender_roots = {sharing.roots[pid] for root in anchors for pid in lenders.get(root, ())}
    return anchors, lender_roots


# ---------------------------------------------------------------------------
# Step 5: the trees
# ---------------------------------------------------------------------------

def _in_trees(column, roots: Sequence[int]) -> sa.ColumnElement[bool]:
    return column.in_(roots)


def load_snapshot(conn: Connection, request: AllocationCandidatesRequest, names: Names) -> ProviderSnapshot:
    """The snapshot the solver needs for ``request`` (see module docstring)."""
    if names.in_tree_roots is None or any(group.resources.keys() - names.class_ids.keys()
                                          for group in request.groups):
        return ProviderSnapshot(())
    sharing = _sharing_providers(conn, request, names)
    rows = _fitting_inventories(conn, request, names, sharing)
    anchors, lender_roots = _anchor_roots(request, names, sharing, rows)
    if not anchors:
        return ProviderSnapshot(())
    roots = sorted(anchors | lender_roots)
    return _load_trees(conn, request, names, sharing, roots)


def _load_trees(conn: Connection, request: AllocationCandidatesRequest, names: Names, sharing: _Sharing,
                roots: list[int]) -> ProviderSnapshot:
    in_roots = RP.c.root_provider_id.in_(roots)
    providers = conn.execute(
        sa.select(RP.c.id, RP.c.uuid, RP.c.parent_provider_id, _ROOT, RP.c.generation)
        .where(in_roots).order_by(RP.c.id)).all()

    inventory_query = (
        sa.select(INV.c.resource_provider_id, RC.c.name, INV.c.total, INV.c.reserved, INV.c.min_unit,
                  INV.c.max_unit, INV.c.step_size, INV.c.allocation_ratio,
                  _usage(INV.c.resource_provider_id, INV.c.resource_class_id))
        .join(RP, RP.c.id == INV.c.resource_provider_id)
        .join(RC, RC.c.id == INV.c.resource_class_id)
        .where(in_roots)
        .order_by(INV.c.resource_provider_id, INV.c.resource_class_id))
    if request.version < (1, 27):
        # Only requested classes are shown, and only they matter to the solver.
        inventory_query = inventory_query.where(INV.c.resource_class_id.in_(sorted(names.class_ids.values())))
    inventories: dict[int, dict[str, ProviderInventory]] = {}
    for pid, rc, *fields, used in conn.execute(inventory_query):
        inventories.setdefault(pid, {})[rc] = ProviderInventory(*fields, used=int(used))

    trait_query = (sa.select(RP_TRAITS.c.resource_provider_id, TRAITS.c.name)
                   .join(TRAITS, TRAITS.c.id == RP_TRAITS.c.trait_id)
                   .join(RP, RP.c.id == RP_TRAITS.c.resource_provider_id)
                   .where(in_roots)
                   .order_by(RP_TRAITS.c.resource_provider_id, RP_TRAITS.c.trait_id))
    if request.version < (1, 17):
        # Summaries show no traits: the solver's are enough.
        trait_query = trait_query.where(RP_TRAITS.c.trait_id.in_(sorted(names.trait_ids.values())))
    traits: dict[int, list[str]] = {}
    for pid, name in conn.execute(trait_query):
        traits.setdefault(pid, []).append(name)

    aggregates: dict[int, set[str]] = {}
    relevant = set(sharing.members) | set(names.aggregate_ids.values())
    if relevant:
        rows = conn.execute(sa.select(RP_AGG.c.resource_provider_id, AGG.c.uuid)
                            .join(AGG, AGG.c.id == RP_AGG.c.aggregate_id)
                            .join(RP, RP.c.id == RP_AGG.c.resource_provider_id)
                            .where(in_roots, RP_AGG.c.aggregate_id.in_(sorted(relevant))))
        for pid, uuid in rows:
            aggregates.setdefault(pid, set()).add(uuid)

    empty: dict = {}
    return ProviderSnapshot(
        Provider(id=pid, uuid=uuid, parent_id=parent, root_id=root, generation=generation,
                 traits=tuple(traits.get(pid, ())), aggregates=aggregates.get(pid, frozenset()),
                 inventories=inventories.get(pid, empty))
        for pid, uuid, parent, root, generation in providers)
