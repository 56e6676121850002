"""Inventory records and the rules a record must obey before it is stored.

An inventory says how much of one resource class a provider offers.  The
JSON schema (api layer) already bounds each number; what remains here is
the rule that spans fields — the record must leave a usable capacity —
and Placement's wording for the errors every layer raises about
inventories, so the API, the reshaper and the db layer say the same thing.

Capacity arithmetic itself lives in :mod:`allotment.domain.inventory_fit`.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from allotment.domain import inventory_fit
from allotment.domain.errors import BadRequest, ConcurrentUpdate, InventoryInUse, NotFound

#: The fields of an inventory record, in the order Placement shows them.
FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio")

#: What an omitted field means.
DEFAULTS = {
    "reserved": 0,
    "min_unit": 1,
    "max_unit": inventory_fit.MAX_INT,
    "step_size": 1,
    "allocation_ratio": 1.0,
}

#: Why a compare-and-swap on a provider's generation failed (Placement's text).
PROVIDER_CHANGED = ("Another thread concurrently updated the resource provider data. "
                    "Please retry your update")


@dataclass(frozen=True)
class Inventory:
    """One inventory record; satisfies ``inventory_fit.InventoryLimits``."""

    resource_class: str
    total: int
    reserved: int = DEFAULTS["reserved"]
    min_unit: int = DEFAULTS["min_unit"]
    max_unit: int = DEFAULTS["max_unit"]
    step_size: int = DEFAULTS["step_size"]
    allocation_ratio: float = DEFAULTS["allocation_ratio"]
    created_at: datetime.datetime | None = field(default=None, compare=False)
    updated_at: datetime.datetime | None = field(default=None, compare=False)

    @classmethod
    def from_fields(cls, resource_class: str, data: Mapping) -> "Inventory":
        """A record from validated request fields; omitted ones take the defaults."""
        return cls(resource_class, **{name: data[name] for name in FIELDS if name in data})

    @property
    def capacity(self) -> int:
        return inventory_fit.inventory_capacity(self)

    @property
    def last_modified(self) -> datetime.datetime | None:
        return self.updated_at or self.created_at

    def fields(self) -> dict:
        """The record as Placement shows it (without the resource class)."""
        return {name: getattr(self, name) for name in FIELDS}


# -- errors ---------------------------------------------------------------


class ResourceClassNotFound(NotFound):
    def __init__(self, name: str):
        super().__init__(f"No such resource class {name}.")
        self.resource_class = name


class InventoryNotFound(NotFound):
    """The provider has no inventory of this (existing) class."""

    def __init__(self, name: str):
        super().__init__(f"No inventory of class {name} found.")
        self.resource_class = name


class InvalidInventoryCapacity(BadRequest):
    """``reserved`` leaves no usable capacity (or negative from 1.26)."""

    def __init__(self, resource_class: str, provider_uuid: str, *, may_equal_total: bool):
        relation = "greater than" if may_equal_total else "greater than or equal to"
        super().__init__(f"Invalid inventory for '{resource_class}' on resource provider "
                         f"'{provider_uuid}'. The reserved value is {relation} total.")


class InventoryDuplicate(ConcurrentUpdate):
    """An inventory of this class already exists on the provider."""

    def __init__(self, resource_class: str, provider_uuid: str):
        super().__init__(f"Inventory for '{resource_class}' on resource provider "
                         f"'{provider_uuid}' already exists.")


def in_use(resource_classes: Iterable[str], provider_uuid: str) -> InventoryInUse:
    """The error for removing inventory that allocations still consume.

    Nova parses this sentence (its report client's in-use regex), so the
    wording must stay exactly Placement's.
    """
    names = ", ".join(resource_classes)
    return InventoryInUse(f"Inventory for '{names}' on resource provider '{provider_uuid}' in use.")


# -- rules ----------------------------------------------------------------


def check_capacity(inventories: Iterable[Inventory], provider_uuid: str, *,
                   reserved_may_equal_total: bool) -> None:
    """Refuse a record whose reserved units leave no capacity.

    Before microversion 1.26 the capacity must be positive; from 1.26 a
    provider may reserve everything (capacity 0) but not more.  The first
    offending record is reported, in the order given.
    """
    for inventory in inventories:
        usable = inventory.capacity
        if usable < 0 or (usable == 0 and not reserved_may_equal_total):
            raise InvalidInventoryCapacity(inventory.resource_class, provider_uuid,
                                           may_equal_total=reserved_may_equal_total)
