"""The rules for placing a provider in a tree, without a database."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from allotment.domain import resource_providers as rp
from allotment.domain.errors import DuplicateName


def record(id_, parent=None, root=None):
    return rp.ProviderRecord(id=id_, uuid=f"u{id_}", name=f"n{id_}", generation=0,
                             parent_id=parent, parent_uuid=None if parent is None else f"u{parent}",
                             root_id=root or id_, root_uuid=f"u{root or id_}")


#        1            5
#      /   \          |
#     2     3         6
#     |
#     4
LINKS = [(1, None), (2, 1), (3, 1), (4, 2), (5, None), (6, 5)]


@pytest.mark.parametrize("start, expected", [
    (1, {1, 2, 3, 4}), (2, {2, 4}), (3, {3}), (4, {4}), (5, {5, 6}),
])
def test_descendants(start, expected):
    assert rp.descendants(LINKS, start) == expected


def test_descendants_survive_a_cycle_in_bad_data():
    assert rp.descendants([(1, 2), (2, 1)], 1) == {1, 2}


def test_unparented_root_stays_put():
    assert rp.new_placement(record(1), None, {1, 2, 3, 4}, allow_reparenting=False) is None


def test_unparenting_needs_1_37():
    child = record(2, parent=1, root=1)
    with pytest.raises(rp.TreeRuleViolation) as caught:
        rp.new_placement(child, None, {2, 4}, allow_reparenting=False)
    assert caught.value.message == ("Object action update failed because: un-parenting a provider is not "
                                    "currently allowed.")
    assert rp.new_placement(child, None, {2, 4}, allow_reparenting=True) == rp.Placement(None, 2)


def test_reparenting_needs_1_37():
    child = record(2, parent=1, root=1)
    with pytest.raises(rp.TreeRuleViolation, match="re-parenting a provider is not currently allowed."):
        rp.new_placement(child, record(5), {2, 4}, allow_reparenting=False)
    assert rp.new_placement(child, record(5), {2, 4}, allow_reparenting=True) == rp.Placement(5, 5)


def test_a_root_may_get_a_parent_before_1_37():
    assert rp.new_placement(record(5), record(3, parent=1, root=1), {5, 6},
                            allow_reparenting=False) == rp.Placement(3, 1)


def test_same_parent_changes_nothing():
    assert rp.new_placement(record(2, parent=1, root=1), record(1), {2, 4}, allow_reparenting=False) is None


@pytest.mark.parametrize("new_parent", [1, 2, 4])
def test_loops_are_refused(new_parent):
    with pytest.raises(rp.TreeRuleViolation, match="creating loop in the provider tree is not allowed."):
        rp.new_placement(record(1), record(new_parent, root=1), {1, 2, 3, 4}, allow_reparenting=True)


def test_moving_inside_a_tree_keeps_the_root():
    assert rp.new_placement(record(3, parent=1, root=1), record(4, parent=2, root=1), {3},
                            allow_reparenting=True) == rp.Placement(4, 1)


def test_own_parent_on_create():
    with pytest.raises(rp.TreeRuleViolation) as caught:
        rp.check_new_provider_parent("a", "a")
    assert caught.value.message.startswith("Object action create failed because: parent provider UUID cannot "
                                           "be same as UUID.")
    rp.check_new_provider_parent("a", "b")
    rp.check_new_provider_parent("a", None)


def test_conflict_messages():
    error = rp.create_conflict("u", "n", uuid_taken=True, name_taken=False)
    assert isinstance(error, DuplicateName)
    assert error.message == "Conflicting resource provider uuid: u already exists."
    assert rp.create_conflict("u", "n", uuid_taken=False, name_taken=True).message == \
        "Conflicting resource provider name: n already exists."
    assert rp.create_conflict("u", "n", uuid_taken=True, name_taken=True).message == \
        "Conflicting resource provider uuid: u, name: n already exists."
    assert rp.rename_conflict("n").message == "Conflicting resource provider n already exists."
    assert rp.rename_conflict("n").code == "placement.duplicate_name"


def test_last_modified_prefers_the_update_time():
    created = datetime.datetime(2020, 1, 1)
    updated = datetime.datetime(2021, 1, 1)
    assert dataclasses.replace(record(1), created_at=created).last_modified == created
    assert dataclasses.replace(record(1), created_at=created, updated_at=updated).last_modified == updated
