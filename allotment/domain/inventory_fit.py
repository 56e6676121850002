"""Capacity rules for one inventory record.

Both the allocation-candidate solver and the allocation writer must agree,
to the unit, on whether an amount fits an inventory; a disagreement means
candidates the writer then refuses (or claims the solver never offers).
So the rules live here once, as plain functions over numbers:

* capacity = int((total - reserved) * allocation_ratio)
  (the figure shown as ``capacity`` in provider summaries and usages);
* an amount fits when ``min_unit <= amount <= max_unit``,
  ``amount % step_size == 0`` and ``used + amount <= capacity``.

Comparing the integer ``used + amount`` against the truncated capacity is
the same as comparing it against the unrounded product, so callers that
check in SQL with ``(total - reserved) * allocation_ratio`` reach the same
verdict.

When several request groups put amounts of one class on one provider, the
*sum* is checked again with :func:`combined_amount_fits` (capacity and
``max_unit`` only: each part already passed the unit checks, and a sum of
multiples of ``step_size`` that are each ``>= min_unit`` passes them too).
"""

from __future__ import annotations

import enum
from fractions import Fraction
from typing import Protocol

#: Largest value an inventory's ``max_unit`` can take; also its default.
MAX_INT = 2147483647


class InventoryLimits(Protocol):
    """What the rules need to know about an inventory record."""

    total: int
    reserved: int
    min_unit: int
    max_unit: int
    step_size: int
    allocation_ratio: float


class Violation(enum.Enum):
    """The first rule an amount breaks, so a writer can say which."""

    BELOW_MIN_UNIT = "min_unit"
    ABOVE_MAX_UNIT = "max_unit"
    NOT_STEP_MULTIPLE = "step_size"
    OVER_CAPACITY = "capacity"


def capacity(total: int, reserved: int, allocation_ratio: float) -> int:
    """Usable units of an inventory: ``int((total - reserved) * ratio)``.

    A product beyond what a float holds (a record Placement itself fails on
    with a 500, e.g. ``allocation_ratio: -1e308`` under a class name it does
    not know) is computed exactly instead, so it is judged like any other.
    """
    try:
        return int((total - reserved) * allocation_ratio)
    except (OverflowError, ValueError):  # an infinite (or, of infinities, undefined) float
        return int((Fraction(total) - Fraction(reserved)) * Fraction(allocation_ratio))


def inventory_capacity(inv: InventoryLimits) -> int:
    """:func:`capacity` of an inventory record."""
    return capacity(inv.total, inv.reserved, inv.allocation_ratio)


def unit_violation(inv: InventoryLimits, amount: int) -> Violation | None:
    """Check an amount against ``min_unit``, ``max_unit`` and ``step_size``.

    These rules concern one allocation of one class on one provider and do
    not depend on what is already used.
    """
    if amount < inv.min_unit:
        return Violation.BELOW_MIN_UNIT
    if amount > inv.max_unit:
        return Violation.ABOVE_MAX_UNIT
    if amount % inv.step_size:
        return Violation.NOT_STEP_MULTIPLE
    return None


def violation(inv: InventoryLimits, amount: int, used: int) -> Violation | None:
    """The first rule that ``amount`` on top of ``used`` breaks, or None."""
    problem = unit_violation(inv, amount)
    if problem is not None:
        return problem
    if used + amount > inventory_capacity(inv):
        return Violation.OVER_CAPACITY
    return None


def amount_fits(inv: InventoryLimits, amount: int, used: int) -> bool:
    """True when ``amount`` more units can be allocated from ``inv``."""
    return violation(inv, amount, used) is None


def headroom(inv: InventoryLimits, used: int) -> int:
    """How many more units the capacity allows (may be negative when an
    inventory was shrunk below its usage)."""
    return inventory_capacity(inv) - used


def combined_limit(inv: InventoryLimits, used: int) -> int:
    """Largest total one candidate may put on this inventory: the smaller
    of the remaining capacity and ``max_unit``."""
    return min(headroom(inv, used), inv.max_unit)


def combined_amount_fits(inv: InventoryLimits, total_amount: int,
                         used: int) -> bool:
    """Check a sum of amounts from several request groups.

    Each part has passed :func:`amount_fits` on its own; the sum must still
    fit the remaining capacity and ``max_unit``.
    """
    return total_amount <= combined_limit(inv, used)
