"""Inventory storage: read, add, change and replace a provider's inventory.

Every function takes a ``Connection`` already inside the caller's
transaction and never commits, so several changes (e.g. the reshaper's
inventories and allocations across many providers) form one atomic write.

Each writer *starts* with the provider's generation compare-and-swap
(:mod:`allotment.db.generations`).  Once the swap succeeds the provider row
is ours until commit: every other writer of this provider waits at its own
swap and then fails, and nobody committed a change to the provider since
we read its generation, so what we read next is current on every backend
(MySQL's repeatable-read snapshot included) and two writers never race on
the unique (provider, class) key.  A lost swap raises ``ConcurrentUpdate``
and the caller's transaction rolls back with nothing half-written.

API for other writers
---------------------
``get_provider(conn, uuid) -> Provider | None``
    The provider's id and generation.  Read it in the writing transaction
    and compare the client's generation with it before writing: the swap
    then proves that nothing changed since this read.

``replace_inventories(conn, provider_id, expected_generation, inventories,
*, check_in_use=True, provider_uuid=None) -> int``
    Make ``inventories`` ({class name: ``Inventory`` or a dict of fields})
    the provider's complete inventory and return the new generation.
    Raises ``ConcurrentUpdate`` when the generation moved on,
    ``ResourceClassNotFound`` for an unknown class and ``InventoryInUse``
    when a removed class still has allocations (unless ``check_in_use`` is
    False).  A caller changing several providers calls it in provider-id
    order, so two transactions never wait on each other's rows in opposite
    orders.

``classes_without_inventory(conn, provider_ids) -> {provider_id: [class]}``
    Allocations left on classes the provider no longer has inventory of.
    A multi-provider writer that moves allocations in the same transaction
    (the reshaper) passes ``check_in_use=False`` above and calls this once
    at the end, when allocations have reached their final places.

``add_inventory``, ``update_inventory``, ``delete_inventory``
    The single-class writes behind POST / PUT / DELETE
    ``/resource_providers/{uuid}/inventories/{class}``.

Lowering an inventory below its current usage is allowed (Placement does
the same: existing consumers keep their allocations, new ones will not
fit); it is logged as a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows, tables
from allotment.db.engine import utcnow
from allotment.db.generations import bump_provider
from allotment.domain.inventories import (
    FIELDS,
    Inventory,
    InventoryDuplicate,
    InventoryNotFound,
    ResourceClassNotFound,
    in_use,
)

LOG = logging.getLogger(__name__)

RP = tables.resource_providers
INV = tables.inventories
RC = tables.resource_classes
ALLOC = tables.allocations


@dataclass(frozen=True)
class Provider:
    id: int
    uuid: str
    generation: int


def get_provider(conn: Connection, uuid: str) -> Provider | None:
    row = conn.execute(
        sa.select(RP.c.id, RP.c.uuid, RP.c.generation).where(RP.c.uuid == uuid)
    ).first()
    return Provider(*row) if row else None


# -- reading --------------------------------------------------------------


def _records(conn: Connection, provider_id: int) -> dict[int, Inventory]:
    """{class id: record} of one provider, in class-id order."""
    rows = conn.execute(
        sa.select(INV.c.resource_class_id, RC.c.name, *(INV.c[name] for name in FIELDS),
                  INV.c.created_at, INV.c.updated_at)
        .join(RC, RC.c.id == INV.c.resource_class_id)
        .where(INV.c.resource_provider_id == provider_id)
        .order_by(INV.c.resource_class_id)
    )
    return {row[0]: Inventory(*row[1:]) for row in rows}


def list_inventories(conn: Connection, provider_id: int) -> list[Inventory]:
    return list(_records(conn, provider_id).values())


def get_inventory(conn: Connection, provider_id: int, resource_class: str) -> Inventory | None:
    row = conn.execute(
        sa.select(RC.c.name, *(INV.c[name] for name in FIELDS), INV.c.created_at, INV.c.updated_at)
        .join(RC, RC.c.id == INV.c.resource_class_id)
        .where(INV.c.resource_provider_id == provider_id, RC.c.name == resource_class)
    ).first()
    return Inventory(*row) if row else None


def resource_class_ids(conn: Connection, names: Iterable[str]) -> dict[str, int]:
    """{name: id} for ``names``; ``ResourceClassNotFound`` names the first unknown."""
    names = list(names)
    if not names:
        return {}
    found = dict(conn.execute(sa.select(RC.c.name, RC.c.id).where(RC.c.name.in_(set(names)))).all())
    for name in names:
        if name not in found:
            raise ResourceClassNotFound(name)
    return found


def _class_id(conn: Connection, name: str) -> int:
    return resource_class_ids(conn, [name])[name]


def _usage(conn: Connection, provider_id: int, class_ids: Iterable[int]) -> dict[int, int]:
    """{class id: units allocated} for the classes that have allocations."""
    class_ids = list(class_ids)
    if not class_ids:
        return {}
    rows = conn.execute(
        sa.select(ALLOC.c.resource_class_id, sa.func.sum(ALLOC.c.used))
        .where(ALLOC.c.resource_provider_id == provider_id,
               ALLOC.c.resource_class_id.in_(class_ids))
        .group_by(ALLOC.c.resource_class_id)
    )
    return {class_id: int(used or 0) for class_id, used in rows}


#: (provider id, class id, class name) of allocations whose class the
#: provider has no inventory of, by a list of provider ids.
_WITHOUT_INVENTORY = (
    sa.select(ALLOC.c.resource_provider_id, ALLOC.c.resource_class_id, RC.c.name)
    .join(RC, RC.c.id == ALLOC.c.resource_class_id)
    .where(ALLOC.c.resource_provider_id.in_(sa.bindparam("ids", expanding=True)),
           ~sa.exists().where(INV.c.resource_provider_id == ALLOC.c.resource_provider_id,
                              INV.c.resource_class_id == ALLOC.c.resource_class_id))
    .group_by(ALLOC.c.resource_provider_id, ALLOC.c.resource_class_id, RC.c.name)
    .order_by(ALLOC.c.resource_provider_id, ALLOC.c.resource_class_id)
)


def classes_without_inventory(conn: Connection, provider_ids: Iterable[int]) -> dict[int, list[str]]:
    """Allocations on classes that have no inventory: {provider id: [class names]}.

    Class names come in class-id order, as Placement lists them.
    """
    provider_ids = sorted(set(provider_ids))
    orphans: dict[int, list[str]] = {}
    if not provider_ids:
        return orphans
    # Sorted ids: the parts' rows come in provider order, as one statement's.
    for provider_id, _class_id, name in raw_rows.rows_in_parts(conn, _WITHOUT_INVENTORY, {"ids": provider_ids}):
        orphans.setdefault(provider_id, []).append(name)
    return orphans


# -- writing --------------------------------------------------------------


def _values(inventory: Inventory) -> dict[str, Any]:
    return inventory.fields()


def _as_inventory(name: str, value: Inventory | Mapping[str, Any]) -> Inventory:
    if isinstance(value, Inventory):
        return value
    return Inventory.from_fields(name, value)


def _warn_over_capacity(provider_uuid: str, changed: Iterable[Inventory],
                        usage_by_name: Mapping[str, int]) -> None:
    for inventory in changed:
        used = usage_by_name.get(inventory.resource_class, 0)
        if used > inventory.capacity:
            LOG.warning("Resource provider %s now uses %d %s, more than the new capacity %d",
                        provider_uuid, used, inventory.resource_class, inventory.capacity)


def add_inventory(conn: Connection, provider: Provider, inventory: Inventory) -> int:
    """Add one class the provider has no inventory of; returns the new generation."""
    generation = bump_provider(conn, provider.id, provider.generation, uuid=provider.uuid)
    class_id = _class_id(conn, inventory.resource_class)
    exists = conn.execute(
        sa.select(INV.c.id).where(INV.c.resource_provider_id == provider.id,
                                  INV.c.resource_class_id == class_id)
    ).first()
    if exists:
        raise InventoryDuplicate(inventory.resource_class, provider.uuid)
    try:
        conn.execute(INV.insert().values(resource_provider_id=provider.id, resource_class_id=class_id,
                                         created_at=utcnow(), **_values(inventory)))
    except sa.exc.IntegrityError:
        # Only a writer that skipped the generation swap can get here.
        raise InventoryDuplicate(inventory.resource_class, provider.uuid) from None
    return generation


def update_inventory(conn: Connection, provider: Provider, expected_generation: int,
                     inventory: Inventory) -> int:
    """Change one existing record; returns the new generation."""
    generation = bump_provider(conn, provider.id, expected_generation, uuid=provider.uuid)
    class_id = _class_id(conn, inventory.resource_class)
    result = conn.execute(
        INV.update()
        .where(INV.c.resource_provider_id == provider.id, INV.c.resource_class_id == class_id)
        .values(updated_at=utcnow(), **_values(inventory))
    )
    if result.rowcount == 0:
        raise InventoryNotFound(inventory.resource_class)
    used = _usage(conn, provider.id, [class_id])
    _warn_over_capacity(provider.uuid, [inventory], {inventory.resource_class: used.get(class_id, 0)})
    return generation


def delete_inventory(conn: Connection, provider: Provider, resource_class: str) -> int:
    """Remove one class unless allocations use it; returns the new generation."""
    generation = bump_provider(conn, provider.id, provider.generation, uuid=provider.uuid)
    class_id = _class_id(conn, resource_class)
    if _usage(conn, provider.id, [class_id]):
        raise in_use([resource_class], provider.uuid)
    result = conn.execute(
        INV.delete().where(INV.c.resource_provider_id == provider.id,
                           INV.c.resource_class_id == class_id)
    )
    if result.rowcount == 0:
        raise InventoryNotFound(resource_class)
    return generation


def replace_inventories(conn: Connection, provider_id: int, expected_generation: int,
                        inventories: Mapping[str, Inventory | Mapping[str, Any]], *,
                        check_in_use: bool = True, provider_uuid: str | None = None) -> int:
    """Make ``inventories`` the provider's complete inventory (see module doc)."""
    label = provider_uuid or str(provider_id)
    generation = bump_provider(conn, provider_id, expected_generation, uuid=provider_uuid)
    wanted = {name: _as_inventory(name, value) for name, value in inventories.items()}
    ids = resource_class_ids(conn, wanted)
    wanted_by_id = {ids[name]: inventory for name, inventory in wanted.items()}
    existing = _records(conn, provider_id)

    to_delete = [class_id for class_id in existing if class_id not in wanted_by_id]
    to_update = [class_id for class_id in existing
                 if class_id in wanted_by_id and wanted_by_id[class_id] != existing[class_id]]
    to_add = [class_id for class_id in wanted_by_id if class_id not in existing]

    usage = _usage(conn, provider_id, to_delete + to_update) if (check_in_use or to_update) else {}
    if check_in_use:
        busy = [existing[class_id].resource_class for class_id in to_delete if class_id in usage]
        if busy:
            raise in_use(busy, label)

    now = utcnow()
    if to_delete:
        conn.execute(INV.delete().where(INV.c.resource_provider_id == provider_id,
                                        INV.c.resource_class_id.in_(to_delete)))
    for class_id in to_update:
        conn.execute(
            INV.update()
            .where(INV.c.resource_provider_id == provider_id, INV.c.resource_class_id == class_id)
            .values(updated_at=now, **_values(wanted_by_id[class_id]))
        )
    if to_add:
        conn.execute(INV.insert(), [
            {"resource_provider_id": provider_id, "resource_class_id": class_id, "created_at": now,
             **_values(wanted_by_id[class_id])}
            for class_id in to_add
        ])
    _warn_over_capacity(label, (wanted_by_id[class_id] for class_id in to_update),
                        {existing[class_id].resource_class: used for class_id, used in usage.items()})
    return generation
