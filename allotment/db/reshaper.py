"""One reshape: many providers' inventories and many consumers' allocations, atomically.

A reshape moves inventory between providers (a compute node's VGPU to one
child per physical GPU, say) together with the allocations consuming it.
Done as separate writes, some moment would have inventory without its
allocations or allocations without their inventory, and a scheduler could
claim the same capacity twice.  So the whole change is one transaction, and
the rules that only make sense for the final picture are checked once, at
the end, when everything is in place:

1. every listed provider exists (unknown: ``ProviderNotFound``) and has the
   generation the client read (else ``ProviderGenerationMismatch``);
2. each provider's inventory is replaced, in provider id order, *without*
   the in-use check (:func:`allotment.db.inventories.replace_inventories`):
   allocations may still sit on a class that is moving away;
3. the consumers' allocations are replaced *without* the capacity check
   (:func:`allotment.db.allocations.write_allocations`), which checks the
   consumer generations and swaps the generation of every provider it
   allocates from;
4. every new allocation must fit the inventory it now draws on
   (:func:`allotment.db.allocations.check_capacity`), and no listed
   provider may be left with allocations of a class it no longer has
   (:func:`allotment.db.inventories.check_no_allocations_without_inventory`).

Any failure raises and the caller's transaction rolls back: nothing of the
reshape is left behind, not even consumer, project or user records.

Generations move exactly as Placement moves them, because clients compare
them: Placement writes a non-empty inventory twice (an interim union of old
and new, then the final one), so such a provider's generation advances by
one more than a provider whose inventory is emptied.  Step 2 swaps once per
write Placement makes; step 3 adds the allocation writer's own swap.

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
from allotment.db.generations import bump_provider
from allotment.domain.errors import ConcurrentUpdate, NotFound
from allotment.domain.inventories import Inventory


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
    for item in sorted(inventories, key=lambda item: providers[item.provider_uuid].id):
        _replace(conn, providers[item.provider_uuid], item.inventories)
    written = allocations_db.write_allocations(conn, allocations, incomplete_owner=incomplete_owner,
                                               check_capacity=False)
    allocations_db.check_capacity(conn, written.claims, written.growth)
    inventories_db.check_no_allocations_without_inventory(
        conn, {provider.id: provider.uuid for provider in providers.values()})


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


def _replace(conn: Connection, provider: inventories_db.Provider,
             inventories: Mapping[str, Inventory]) -> None:
    """Replace one provider's inventory, leaving the in-use check for the end."""
    generation = inventories_db.replace_inventories(
        conn, provider.id, provider.generation, inventories,
        check_in_use=False, provider_uuid=provider.uuid)
    if inventories:
        # Placement's second (interim + final) write of a non-empty inventory.
        bump_provider(conn, provider.id, generation, uuid=provider.uuid)
