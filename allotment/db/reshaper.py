"""One reshape: many providers' inventories and many consumers' allocations, atomically.

A reshape moves inventory between providers (a compute node's VGPU to one
child per physical GPU, say) together with the allocations consuming it.
Done as separate writes, some moment would have inventory without its
allocations or allocations without their inventory, and a scheduler could
claim the same capacity twice.  So the whole change is one transaction.

Clients tell the failures apart by their error codes (nova retries on
``placement.concurrent_update`` and reports ``placement.inventory.inuse``
to the operator), so the steps, and therefore which error wins when a
reshape is wrong in several ways, are Placement's:

1. every listed provider exists (unknown: ``ProviderNotFound``) and has the
   generation the client read (else ``ProviderGenerationMismatch``), in the
   order the body lists them;
2. the consumers' generations and the providers the allocations name
   (:func:`allotment.db.allocations.check_consumers_and_providers`);
3. the *interim* inventory: each provider with a non-empty new inventory
   gets the union of its old records and the new ones (a new record
   replaces the old one of its class), so nothing is removed yet
   (:func:`allotment.db.inventories.replace_inventories`); unknown classes
   are refused here;
4. the consumers' allocations are replaced, each checked against the
   interim inventory exactly as ``POST /allocations`` checks it
   (:func:`allotment.db.allocations.write_allocations`): an allocation left
   on, or moved onto, a class that is about to go away still fits here;
5. the final inventories are written, and a provider left with allocations
   on a class it no longer has is refused with ``InventoryInUse``, naming
   the first such provider in body order
   (:func:`allotment.db.inventories.classes_without_inventory`).

Any failure raises and the caller's transaction rolls back: nothing of the
reshape is left behind, not even consumer, project or user records.

Generations move exactly as Placement moves them, because clients compare
them: a non-empty inventory is written twice (interim, then final), an
emptied one once, and the allocation writer adds its own swap to every
provider it allocates from.

Writes to several providers are made in provider-id order, so two
concurrent reshapes never wait on each other's rows in opposite orders.
Concurrency needs no locks: every writer that adds usage to a provider
swaps its generation, and this transaction swaps the generation of every
provider whose inventory it changes or that it allocates from.  A claim
that committed after step 1's read makes one of our swaps fail
(``ConcurrentUpdate``); a claim that comes later waits for our swap and then
fails its own, and re-reads the reshaped state before it retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from sqlalchemy.engine import Connection

from allotment.db import allocations as allocations_db
from allotment.db import inventories as inventories_db
from allotment.domain.errors import ConcurrentUpdate, NotFound
from allotment.domain.inventories import Inventory, in_use


@dataclass(frozen=True)
class ProviderInventories:
    """The complete new inventory of one provider, and the generation the client read."""

    provider_uuid: str
    generation: int
    inventories: Mapping[str, Inventory]


class ProviderNotFound(NotFound):
    """A provider listed under ``inventories`` does not exist."""

    def __init__(self, uuid: str):
        super().__init__(f"No resource provider with uuid {uuid} found")
        self.uuid = uuid


class ProviderGenerationMismatch(ConcurrentUpdate):
    """The client's provider generation is not the current one: re-read, then retry."""

    def __init__(self, uuid: str, actual: int, given: int):
        super().__init__(f"resource provider generation conflict for provider {uuid}: "
                         f"actual: {actual}, given: {given}")


def reshape(conn: Connection, inventories: Sequence[ProviderInventories],
            allocations: Sequence[allocations_db.ConsumerAllocations], *,
            incomplete_owner: tuple[str, str]) -> None:
    """Apply one reshape inside the caller's write transaction (see the module doc)."""
    providers = _providers(conn, inventories)
    allocations_db.check_consumers_and_providers(conn, allocations, incomplete_owner=incomplete_owner)
    inventories_db.resource_class_ids(conn, [name for item in inventories for name in item.inventories])
    in_id_order = sorted(inventories, key=lambda item: providers[item.provider_uuid].id)
    for item in in_id_order:
        if item.inventories:
            provider = providers[item.provider_uuid]
            interim = {record.resource_class: record
                       for record in inventories_db.list_inventories(conn, provider.id)}
            interim.update(item.inventories)
            inventories_db.replace_inventories(conn, provider.id, provider.generation, interim,
                                               check_in_use=False, provider_uuid=provider.uuid)
    allocations_db.write_allocations(conn, allocations, incomplete_owner=incomplete_owner)
    for item in in_id_order:
        # The interim write and the allocations moved the generation on: read it again.
        provider = inventories_db.get_provider(conn, item.provider_uuid)
        inventories_db.replace_inventories(conn, provider.id, provider.generation, item.inventories,
                                           check_in_use=False, provider_uuid=provider.uuid)
    orphans = inventories_db.classes_without_inventory(conn, [providers[item.provider_uuid].id
                                                              for item in inventories])
    for item in inventories:
        provider = providers[item.provider_uuid]
        if provider.id in orphans:
            raise in_use(orphans[provider.id], provider.uuid)


def _providers(conn: Connection, inventories: Sequence[ProviderInventories]
               ) -> dict[str, inventories_db.Provider]:
    """The listed providers by uuid, each at the generation its client read."""
    found: dict[str, inventories_db.Provider] = {}
    for item in inventories:
        provider = inventories_db.get_provider(conn, item.provider_uuid)
        if provider is None:
            raise ProviderNotFound(item.provider_uuid)
        if provider.generation != item.generation:
            raise ProviderGenerationMismatch(provider.uuid, provider.generation, item.generation)
        found[provider.uuid] = provider
    return found
