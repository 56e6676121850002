"""Resource provider rows: read, filter, create, rename, re-parent, delete.

Every provider row carries its parent and its root, so "the tree of X" is
one indexed lookup and a filtered list is one query however many filters
are combined (each filter is a semi-join on its association table).

Structural writes and how they stay correct under concurrency
--------------------------------------------------------------
Creating a child, or moving a provider to another parent, depends on the
shape of one or two whole trees (the new parent's root, the loop check on
the moved subtree, the roots to rewrite below it).  Such a write

1. *plans* in a read transaction: which trees it will touch (their roots);
2. in the write transaction, *first* takes the write lock of those root
   rows with an UPDATE that changes nothing (no SELECT ... FOR UPDATE:
   it is an ordinary write, so it works alike on every backend), and only
   then reads.  Two structural writes on one tree therefore run one after
   the other, and the second reads what the first committed (PostgreSQL
   reads per statement; MySQL/MariaDB take their snapshot at the first
   plain read, which comes after the lock; SQLite has one writer);
3. checks the trees are still the ones it locked; if a concurrent move
   changed a root, it plans again (``TreeMoved``, bounded).

Deleting a provider swaps its generation first, which orders it after (or
before) any allocation or inventory writer of that provider; the foreign
keys on parent and root turn a child created meanwhile into a refusal.

Re-parenting does not change the provider's generation: Placement keeps
it, and clients pass generations they read before a re-parent.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows, tables
from allotment.db.engine import Database, utcnow
from allotment.db.inventories import resource_class_ids
from allotment.db.traits import UnknownTraits, list_traits
from allotment.domain import resource_providers as domain
from allotment.domain.errors import (
    PROVIDER_CANNOT_DELETE_PARENT,
    PROVIDER_IN_USE,
    ConcurrentUpdate,
    Conflict,
    NotFound,
)
from allotment.domain.inventories import ResourceClassNotFound
from allotment.domain.request_groups import AggregateExpression, TraitExpression
from allotment.domain.resource_providers import ProviderFilters, ProviderRecord

T = TypeVar("T")

RP = tables.resource_providers
PARENT = RP.alias("parent")
ROOT = RP.alias("root")
INV = tables.inventories
ALLOC = tables.allocations
AGG = tables.placement_aggregates
RP_AGG = tables.resource_provider_aggregates
RP_TRAITS = tables.resource_provider_traits

# How often a structural write plans again after a concurrent move, and
# re-runs after losing an insert race on a unique name or uuid.
TREE_RETRIES = 10
INSERT_RETRIES = 3


class TreeMoved(Exception):
    """A tree this write planned on changed before its lock: plan again."""


class InsertRace(Exception):
    """A concurrent writer took the uuid or name first: re-run to say which."""


_COLUMNS = (
    RP.c.id, RP.c.uuid, RP.c.name, RP.c.generation,
    RP.c.parent_provider_id, PARENT.c.uuid,
    sa.func.coalesce(RP.c.root_provider_id, RP.c.id), sa.func.coalesce(ROOT.c.uuid, RP.c.uuid),
    RP.c.created_at, RP.c.updated_at,
)
_JOINED = RP.outerjoin(PARENT, PARENT.c.id == RP.c.parent_provider_id) \
            .outerjoin(ROOT, ROOT.c.id == RP.c.root_provider_id)


def _select() -> sa.Select:
    return sa.select(*_COLUMNS).select_from(_JOINED)


_BY_UUID = _select().where(RP.c.uuid == sa.bindparam("uuid"))


# -- reading ---------------------------------------------------------------------

def get_by_uuid(conn: Connection, uuid: str) -> ProviderRecord | None:
    row = conn.execute(_BY_UUID, {"uuid": uuid}).first()
    return ProviderRecord(*row) if row else None


def get(conn: Connection, uuid: str) -> ProviderRecord:
    """The provider; 404 ``No resource provider with uuid ... found`` when there is none."""
    provider = get_by_uuid(conn, uuid)
    if provider is None:
        raise domain.not_found(uuid)
    return provider


def list_providers(conn: Connection, filters: ProviderFilters) -> list[ProviderRecord]:
    """Providers matching every filter, in creation order (one query after name lookups).

    Raises ``UnknownTraits`` or ``ResourceClassNotFound`` for names that do
    not exist, unless Placement's search would have ended with nothing
    before it looked that name up (:func:`_ends_before`).
    """
    traits, aggregates = filters.traits, filters.aggregates
    trait_ids = _trait_ids(conn, traits)
    try:
        class_ids = resource_class_ids(conn, filters.resources)
    except ResourceClassNotFound as error:
        class_ids, unknown_class = {}, error
    else:
        unknown_class = None
    required_unknown = _unknown(TraitExpression(required=traits.required), trait_ids)
    unknown = required_unknown or _unknown(traits, trait_ids) or unknown_class
    if unknown is not None:
        if _ends_before(conn, filters, trait_ids, unknown is required_unknown,
                        unknown is unknown_class):
            return []
        raise unknown
    query = _select().order_by(RP.c.id)
    if filters.name is not None:
        query = query.where(RP.c.name == filters.name)
    if filters.uuid is not None:
        query = query.where(RP.c.uuid == filters.uuid)
    if filters.in_tree is not None:
        root = (sa.select(sa.func.coalesce(RP.c.root_provider_id, RP.c.id))
                .where(RP.c.uuid == filters.in_tree).scalar_subquery())
        # A row written without its root (by hand, or by an old writer) is its own root.
        query = query.where(sa.or_(RP.c.root_provider_id == root,
                                   sa.and_(RP.c.root_provider_id.is_(None), RP.c.id == root)))
    for name, amount in filters.resources.items():
        query = query.where(RP.c.id.in_(_providers_fitting(class_ids[name], amount)))
    query = query.where(*_trait_conditions(traits, trait_ids), *_aggregate_conditions(aggregates))
    return [ProviderRecord(*row) for row in conn.execute(query)]


def _ends_before(conn: Connection, filters: ProviderFilters, trait_ids: Mapping[str, int],
                 required_name: bool, class_name: bool) -> bool:
    """Whether Placement's search ends with nothing before it reaches an
    unknown name: of a required trait (``required_name``), a forbidden
    trait, or (``class_name``) a resource class.

    Placement takes the filters in this order and stops at the first that
    no provider at all meets, before it looks up the later names: an
    unknown ``in_tree`` provider; the required traits (their names first);
    the forbidden traits' names; ``member_of``; the resource classes.  (So
    ``required=<a trait no provider has>`` with an unknown class is an
    empty list, not a 400.)  Asked only when a name is unknown: otherwise
    the search itself finds nothing in the same cases.
    """
    enders: list[list[sa.ColumnElement[bool]]] = []
    if filters.in_tree is not None:
        enders.append([RP.c.uuid == filters.in_tree])
    if not required_name and filters.traits.required:
        enders.append(_trait_conditions(TraitExpression(required=filters.traits.required), trait_ids))
    if class_name and filters.aggregates.required:
        enders.append(_aggregate_conditions(AggregateExpression(required=filters.aggregates.required)))
    if not enders:
        return False
    met = conn.execute(sa.select(*(sa.exists(sa.select(RP.c.id).where(*conditions))
                                   for conditions in enders))).one()
    return not all(met)


def _providers_fitting(class_id: int, amount: int) -> sa.Select:
    """Providers where one more allocation of ``amount`` of the class fits now.

    The capacity rule of :mod:`allotment.domain.inventory_fit`, in SQL:
    ``used + amount <= (total - reserved) * allocation_ratio`` and the unit
    rules ``min_unit <= amount <= max_unit``, ``amount % step_size == 0``.
    The usage is a correlated sum over the (provider, class, used) index:
    one index range per inventory row, linear however stale the planner's
    statistics are (a grouped subquery joined to inventories can turn
    quadratic on PostgreSQL when it underestimates them).
    """
    used = (sa.select(sa.func.coalesce(sa.func.sum(ALLOC.c.used), 0))
            .where(ALLOC.c.resource_provider_id == INV.c.resource_provider_id,
                   ALLOC.c.resource_class_id == class_id)
            .correlate(INV).scalar_subquery())
    requested = sa.literal(amount, sa.Integer)
    return (sa.select(INV.c.resource_provider_id)
            .where(INV.c.resource_class_id == class_id,
                   INV.c.min_unit <= requested,
                   INV.c.max_unit >= requested,
                   requested % INV.c.step_size == 0,
                   used + requested <= (INV.c.total - INV.c.reserved) * INV.c.allocation_ratio))


def _trait_ids(conn: Connection, traits: TraitExpression) -> dict[str, int]:
    """The ids of the traits named that exist, in one query."""
    names = traits.names()
    if not names:
        return {}
    return {trait.name: trait.id for trait in list_traits(conn, names=sorted(names))}


def _unknown(traits: TraitExpression, ids: Mapping[str, int]) -> UnknownTraits | None:
    missing = traits.unknown(ids)
    return UnknownTraits(missing) if missing else None


def _trait_conditions(traits: TraitExpression, ids: Mapping[str, int]) -> list[sa.ColumnElement[bool]]:
    def having_any(any_of: Iterable[str]) -> sa.Select:
        return sa.select(RP_TRAITS.c.resource_provider_id).where(
            RP_TRAITS.c.trait_id.in_(sorted(ids[name] for name in any_of)))

    conditions = [RP.c.id.in_(having_any(any_of)) for any_of in traits.required]
    if traits.forbidden:
        conditions.append(RP.c.id.not_in(having_any(traits.forbidden)))
    return conditions


def _members_of_any(aggregate_uuids: Iterable[str]) -> sa.Select:
    return (sa.select(RP_AGG.c.resource_provider_id)
            .join(AGG, AGG.c.id == RP_AGG.c.aggregate_id)
            .where(AGG.c.uuid.in_(sorted(aggregate_uuids))))


def _aggregate_conditions(aggregates: AggregateExpression) -> list[sa.ColumnElement[bool]]:
    conditions = [RP.c.id.in_(_members_of_any(any_of)) for any_of in aggregates.required]
    if aggregates.forbidden:
        conditions.append(RP.c.id.not_in(_members_of_any(aggregates.forbidden)))
    return conditions


def _tree_links(conn: Connection, root_id: int) -> list[tuple[int, int | None]]:
    """(id, parent id) of every provider in one tree."""
    rows = conn.execute(sa.select(RP.c.id, RP.c.parent_provider_id).where(RP.c.root_provider_id == root_id))
    return [tuple(row) for row in rows]


# -- structural writes ---------------------------------------------------------------

def _lock_trees(conn: Connection, root_ids: Iterable[int]) -> None:
    """Take the write lock of these root rows without changing them (see module doc)."""
    conn.execute(sa.update(RP).where(RP.c.id.in_(sorted(set(root_ids))))
                 .values(root_provider_id=RP.c.root_provider_id))


def _planned_write(db: Database, plan: Callable[[Connection], set[int]] | None,
                   apply: Callable[[Connection, set[int]], T]) -> T:
    """Plan (which roots), then lock those roots and apply; plan again if they moved.

    ``plan`` None: the write touches no existing tree (a new root provider).
    """
    for _ in range(TREE_RETRIES):
        if plan is None:
            roots: set[int] = set()
        else:
            with db.read() as conn:
                roots = plan(conn)

        def work(conn: Connection) -> T:
            if roots:
                _lock_trees(conn, roots)
            return apply(conn, roots)

        try:
            return db.run_write(work, retry_on=(InsertRace,), retries=INSERT_RETRIES)
        except TreeMoved:
            continue
    raise ConcurrentUpdate("Another process kept changing the provider tree. Please retry your update")


def _check_unique(conn: Connection, uuid: str, name: str) -> None:
    taken = conn.execute(sa.select(RP.c.uuid, RP.c.name).where(sa.or_(RP.c.uuid == uuid, RP.c.name == name)))
    rows = list(taken)
    if rows:
        raise domain.create_conflict(uuid, name, uuid_taken=any(row.uuid == uuid for row in rows),
                                     name_taken=any(row.name == name for row in rows))


def _locked_parent(conn: Connection, parent_uuid: str, roots: set[int], action: str) -> ProviderRecord:
    """The parent, read after the lock; its tree must be one we locked."""
    parent = get_by_uuid(conn, parent_uuid)
    if parent is None:
        raise domain.TreeRuleViolation(action, domain.PARENT_MISSING)
    if parent.root_id not in roots:
        raise TreeMoved()
    return parent


def create(db: Database, uuid: str, name: str, parent_uuid: str | None = None) -> ProviderRecord:
    """Create a root provider, or a child of ``parent_uuid``.

    Raises ``TreeRuleViolation`` (self-parent, missing parent) and
    ``DuplicateName`` (uuid or name taken).
    """
    domain.check_new_provider_parent(uuid, parent_uuid)

    def plan(conn: Connection) -> set[int]:
        parent = get_by_uuid(conn, parent_uuid)
        if parent is None:
            raise domain.TreeRuleViolation("create", domain.PARENT_MISSING)
        return {parent.root_id}

    def apply(conn: Connection, roots: set[int]) -> ProviderRecord:
        parent = _locked_parent(conn, parent_uuid, roots, "create") if parent_uuid else None
        _check_unique(conn, uuid, name)
        try:
            new_id = conn.execute(sa.insert(RP).values(
                uuid=uuid, name=name, generation=0, created_at=utcnow(),
                parent_provider_id=parent.id if parent else None,
                root_provider_id=parent.root_id if parent else None,
            )).inserted_primary_key[0]
        except sa.exc.IntegrityError:
            raise InsertRace() from None
        if parent is None:
            # The root's second statement counts as an update, as in
            # Placement: a root has an update time from birth, a child not
            # until its first write (see ``rename``).
            conn.execute(sa.update(RP).where(RP.c.id == new_id).values(root_provider_id=new_id,
                                                                       updated_at=utcnow()))
        return get(conn, uuid)

    return _planned_write(db, plan if parent_uuid is not None else None, apply)


def rename(conn: Connection, uuid: str, name: str) -> tuple[ProviderRecord, datetime.datetime | None]:
    """Give the provider a new name (its generation stays, as in Placement).

    Returns the provider and its update time from before this update:
    Placement's answer to an update is last modified then (none for a child
    provider never written before).
    """
    provider = get(conn, uuid)
    _update_row(conn, provider, name, None)
    return get(conn, uuid), provider.updated_at


def _update_row(conn: Connection, provider: ProviderRecord, name: str,
                placement: domain.Placement | None) -> None:
    if name != provider.name:
        clash = conn.execute(sa.select(RP.c.id).where(RP.c.name == name, RP.c.id != provider.id)).first()
        if clash is not None:
            raise domain.rename_conflict(name)
    values: dict = {"name": name}
    if placement is not None:
        values.update(parent_provider_id=placement.parent_id, root_provider_id=placement.root_id)
    current = {"name": provider.name, "parent_provider_id": provider.parent_id,
               "root_provider_id": provider.root_id}
    if all(current[column] == value for column, value in values.items()):
        # Nothing changes: no write, and the update time stays (Placement's
        # ORM writes nothing either, so a child never changed keeps none).
        return
    values["updated_at"] = utcnow()
    try:
        conn.execute(sa.update(RP).where(RP.c.id == provider.id).values(**values))
    except sa.exc.IntegrityError:
        raise InsertRace() from None


def update(db: Database, uuid: str, name: str, parent_uuid: str | None, *,
           allow_reparenting: bool) -> tuple[ProviderRecord, datetime.datetime | None]:
    """Rename the provider and set its parent (``None``: make it a root).

    Before 1.37 (``allow_reparenting`` False) only a root may be given a
    parent.  Moving a provider moves its whole subtree to the new root.
    Returns what ``rename`` returns.
    """

    def plan(conn: Connection) -> set[int]:
        provider = get(conn, uuid)
        roots = {provider.root_id}
        if parent_uuid is not None:
            parent = get_by_uuid(conn, parent_uuid)
            if parent is None:
                raise domain.TreeRuleViolation("create", domain.PARENT_MISSING)
            roots.add(parent.root_id)
        return roots

    def apply(conn: Connection, roots: set[int]) -> ProviderRecord:
        provider = get(conn, uuid)
        if provider.root_id not in roots:
            raise TreeMoved()
        parent = _locked_parent(conn, parent_uuid, roots, "create") if parent_uuid else None
        subtree = domain.descendants(_tree_links(conn, provider.root_id), provider.id)
        placement = domain.new_placement(provider, parent, subtree, allow_reparenting=allow_reparenting)
        _update_row(conn, provider, name, placement)
        below = subtree - {provider.id}
        if placement is not None and placement.root_id != provider.root_id and below:
            moved = utcnow()
            for part in raw_rows.parts(sorted(below)):
                conn.execute(sa.update(RP).where(RP.c.id.in_(part))
                             .values(root_provider_id=placement.root_id, updated_at=moved))
        return get(conn, uuid), provider.updated_at

    return _planned_write(db, plan, apply)


def delete(conn: Connection, uuid: str) -> None:
    """Delete a provider with its inventories, traits and aggregate links.

    Refused (409) while it has children or allocations.
    """
    # First statement: the provider's write lock (and the end of any
    # writer that read its generation before); no row means no provider.
    locked = conn.execute(sa.update(RP).where(RP.c.uuid == uuid)
                          .values(generation=RP.c.generation + 1, root_provider_id=None))
    if locked.rowcount != 1:
        raise NotFound(f"No resource provider with uuid {uuid} found for delete")
    provider_id = conn.execute(sa.select(RP.c.id).where(RP.c.uuid == uuid)).scalar_one()
    if conn.execute(sa.select(RP.c.id).where(RP.c.parent_provider_id == provider_id).limit(1)).first():
        raise _cannot_delete_parent(uuid)
    if conn.execute(sa.select(ALLOC.c.id).where(ALLOC.c.resource_provider_id == provider_id).limit(1)).first():
        raise Conflict(f"Unable to delete resource provider {uuid}: Resource provider has allocations.",
                       code=PROVIDER_IN_USE)
    for table in (INV, RP_AGG, RP_TRAITS):
        conn.execute(sa.delete(table).where(table.c.resource_provider_id == provider_id))
    try:
        conn.execute(sa.delete(RP).where(RP.c.id == provider_id))
    except sa.exc.IntegrityError:
        # A child appeared after our check (its insert waited on no lock of ours).
        raise _cannot_delete_parent(uuid) from None


def _cannot_delete_parent(uuid: str) -> Conflict:
    return Conflict(f"Unable to delete parent resource provider {uuid}: It has child resource providers.",
                    code=PROVIDER_CANNOT_DELETE_PARENT)
