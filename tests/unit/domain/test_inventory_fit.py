"""Capacity rules shared by the candidate solver and the allocation writer."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from allotment.domain import inventory_fit as cap
from allotment.domain.provider_tree import ProviderInventory


def inv(**kw):
    return ProviderInventory(**{"total": 10, **kw})


class TestCapacity:
    def test_ratio_and_reserved(self):
        assert cap.capacity(24, 0, 16.0) == 384
        assert cap.capacity(2000, 100, 1.0) == 1900
        assert cap.capacity(128 * 1024, 0, 1.5) == 196608

    def test_truncates_fractions(self):
        assert cap.capacity(3, 0, 1.5) == 4
        assert cap.capacity(10, 3, 0.5) == 3

    def test_reserved_above_total_gives_no_room(self):
        assert cap.capacity(4, 8, 1.0) == -4
        assert not inv(total=4, reserved=8).fits(1)


class TestViolations:
    @pytest.mark.parametrize("amount,used,expected", [
        (5, 0, None),
        (10, 0, None),
        (11, 0, cap.Violation.OVER_CAPACITY),
        (6, 5, cap.Violation.OVER_CAPACITY),
        (5, 5, None),
    ])
    def test_capacity(self, amount, used, expected):
        assert cap.violation(inv(), amount, used) is expected

    def test_min_unit_first(self):
        record = inv(total=100, min_unit=10, step_size=10, max_unit=50)
        assert cap.violation(record, 5, 0) is cap.Violation.BELOW_MIN_UNIT
        assert cap.violation(record, 60, 0) is cap.Violation.ABOVE_MAX_UNIT
        assert cap.violation(record, 15, 0) is cap.Violation.NOT_STEP_MULTIPLE
        assert cap.violation(record, 20, 90) is cap.Violation.OVER_CAPACITY
        assert cap.violation(record, 20, 80) is None

    def test_unit_rules_ignore_usage(self):
        record = inv(total=100, max_unit=5)
        assert cap.unit_violation(record, 5) is None
        assert cap.unit_violation(record, 6) is cap.Violation.ABOVE_MAX_UNIT

    def test_allocation_ratio_allows_overcommit(self):
        record = inv(total=4, allocation_ratio=2.0)
        assert record.capacity == 8
        assert cap.amount_fits(record, 8, 0)
        assert not cap.amount_fits(record, 1, 8)


class TestCombined:
    def test_sum_limited_by_max_unit(self):
        record = inv(total=8, max_unit=2)
        assert cap.combined_limit(record, 0) == 2
        assert cap.combined_amount_fits(record, 2, 0)
        assert not cap.combined_amount_fits(record, 3, 0)

    def test_sum_limited_by_remaining_capacity(self):
        record = inv(total=8, max_unit=8, used=5)
        assert record.combined_limit == 3
        assert cap.headroom(record, 5) == 3


@given(total=st.integers(0, 50), reserved=st.integers(0, 50),
       ratio=st.sampled_from([0.5, 1.0, 1.5, 2.0, 16.0]),
       used=st.integers(0, 100), amount=st.integers(1, 100))
def test_fits_matches_unrounded_comparison(total, reserved, ratio, used,
                                           amount):
    """Comparing with the truncated capacity equals comparing with the raw
    product, as SQL filters do."""
    record = ProviderInventory(total=total, reserved=reserved,
                               allocation_ratio=ratio)
    raw = used + amount <= (total - reserved) * ratio
    assert cap.amount_fits(record, amount, used) == raw


@given(total=st.integers(0, 20), reserved=st.integers(0, 5),
       min_unit=st.integers(1, 4), max_unit=st.integers(1, 25),
       step=st.integers(1, 4), ratio=st.sampled_from([0.5, 1.0, 1.5]),
       used=st.integers(0, 30), amount=st.integers(1, 30))
def test_inventory_fast_path_agrees(total, reserved, min_unit, max_unit,
                                    step, ratio, used, amount):
    """ProviderInventory inlines the rules for speed; it must not drift."""
    record = ProviderInventory(total=total, reserved=reserved,
                               min_unit=min_unit, max_unit=max_unit,
                               step_size=step, allocation_ratio=ratio,
                               used=used)
    assert record.fits(amount) == cap.amount_fits(record, amount, used)
    assert record.combined_limit == cap.combined_limit(record, used)


def test_a_capacity_beyond_a_float_is_exact_not_an_overflow():
    # (4 - 0) * -1e308 is -inf as a float; as a number it is -4e308.
    assert cap.capacity(4, 0, -1e308) == -4 * int(1e308)
    assert cap.capacity(0, 4, -1e308) == 4 * int(1e308)
    assert cap.capacity(1e308, -1e308, 2.0) == 4 * int(1e308)
    # within a float, the float product as before (truncated toward zero)
    assert cap.capacity(3, 0, 0.1) == int(3 * 0.1) == 0
    assert cap.capacity(10, 1, -0.5) == -4
