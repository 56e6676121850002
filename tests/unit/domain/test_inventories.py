"""Inventory records and the capacity rule, on plain data."""

from __future__ import annotations

import pytest

from allotment.domain import errors
from allotment.domain.inventories import (
    DEFAULTS,
    FIELDS,
    Inventory,
    InvalidInventoryCapacity,
    check_capacity,
    in_use,
)

UUID = "5b6b6b1e-5d8e-4a57-9c43-7d5f5d6c1c7e"


def test_omitted_fields_take_placements_defaults():
    inventory = Inventory.from_fields("VCPU", {"total": 8, "resource_provider_generation": 3})
    assert inventory.fields() == {"total": 8, **DEFAULTS}
    assert list(inventory.fields()) == list(FIELDS)


def test_records_compare_by_values_not_timestamps():
    import datetime

    stamp = datetime.datetime(2024, 1, 1)
    assert Inventory("VCPU", 8, created_at=stamp) == Inventory("VCPU", 8)
    assert Inventory("VCPU", 8) != Inventory("VCPU", 8, reserved=1)
    assert Inventory("VCPU", 8, created_at=stamp).last_modified == stamp


def test_capacity_applies_the_allocation_ratio():
    assert Inventory("VCPU", 10, reserved=2, allocation_ratio=1.5).capacity == 12


@pytest.mark.parametrize("total, reserved, ratio, before_1_26, from_1_26", [
    (10, 0, 1.0, True, True),
    (10, 9, 1.0, True, True),
    (10, 10, 1.0, False, True),      # everything reserved: only from 1.26
    (10, 11, 1.0, False, False),
    (10, 0, 0.0, False, True),       # a zero ratio leaves no capacity
    (10, 0, 0.05, False, True),      # int(0.5) == 0
    (10, 0, -1.0, False, False),     # negative capacity: never
])
def test_capacity_rule_by_microversion(total, reserved, ratio, before_1_26, from_1_26):
    inventory = Inventory("DISK_GB", total, reserved=reserved, allocation_ratio=ratio)
    for allowed, may_equal in ((before_1_26, False), (from_1_26, True)):
        if allowed:
            check_capacity([inventory], UUID, reserved_may_equal_total=may_equal)
        else:
            with pytest.raises(InvalidInventoryCapacity):
                check_capacity([inventory], UUID, reserved_may_equal_total=may_equal)


def test_capacity_messages_are_placements():
    bad = Inventory("DISK_GB", 256, reserved=512)
    with pytest.raises(InvalidInventoryCapacity) as old:
        check_capacity([bad], UUID, reserved_may_equal_total=False)
    assert old.value.message == (f"Invalid inventory for 'DISK_GB' on resource provider '{UUID}'. "
                                 "The reserved value is greater than or equal to total.")
    assert old.value.status == 400
    with pytest.raises(InvalidInventoryCapacity) as new:
        check_capacity([bad], UUID, reserved_may_equal_total=True)
    assert new.value.message.endswith("The reserved value is greater than total.")


def test_first_offending_record_is_reported():
    records = [Inventory("VCPU", 4), Inventory("MEMORY_MB", 4, reserved=5), Inventory("DISK_GB", 1, reserved=2)]
    with pytest.raises(InvalidInventoryCapacity, match="MEMORY_MB"):
        check_capacity(records, UUID, reserved_may_equal_total=True)


def test_in_use_message_lists_classes_in_the_order_given():
    error = in_use(["VCPU", "DISK_GB"], UUID)
    assert isinstance(error, errors.InventoryInUse)
    assert error.code == "placement.inventory.inuse"
    assert error.message == f"Inventory for 'VCPU, DISK_GB' on resource provider '{UUID}' in use."
