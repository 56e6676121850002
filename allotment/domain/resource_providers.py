"""Resource providers as plain data, and the rules for shaping their trees.

A provider tree is kept as two columns on every provider: its parent and
its root.  The rules for changing a parent (which microversion may do what,
and that no provider may end up below itself) are decided here, from rows
the database layer has already read, so they are unit-tested without one.

Placement words these refusals as "object action" failures and the API
prefixes them with what it was doing ("Unable to save resource provider
..."); :class:`TreeRuleViolation` carries the action and reason so the API
can do the same.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import defaultdict
from collections.abc import Iterable, Mapping

from allotment.domain import errors
from allotment.domain.request_groups import AggregateExpression, TraitExpression

#: Longest provider name the schema (and the column) accepts.
NAME_MAX_LENGTH = 200

PARENT_MISSING = "parent provider UUID does not exist."
SELF_PARENT = ("parent provider UUID cannot be same as UUID. Please set parent provider UUID to None "
               "if there is no parent.")
REPARENT_NOT_ALLOWED = "re-parenting a provider is not currently allowed."
UNPARENT_NOT_ALLOWED = "un-parenting a provider is not currently allowed."
LOOP = "creating loop in the provider tree is not allowed."


@dataclasses.dataclass(frozen=True, slots=True)
class ProviderRecord:
    """One provider row with its parent's and root's uuids resolved."""

    id: int
    uuid: str
    name: str
    generation: int
    parent_id: int | None
    parent_uuid: str | None
    root_id: int
    root_uuid: str
    created_at: datetime.datetime | None = None
    updated_at: datetime.datetime | None = None

    @property
    def last_modified(self) -> datetime.datetime | None:
        return self.updated_at or self.created_at


@dataclasses.dataclass(frozen=True)
class ProviderFilters:
    """What ``GET /resource_providers`` asked for; every filter given must hold.

    ``resources`` maps class names to amounts a provider must still be
    able to take (one allocation of that size must fit right now).
    """

    name: str | None = None
    uuid: str | None = None
    in_tree: str | None = None
    resources: Mapping[str, int] = dataclasses.field(default_factory=dict)
    traits: TraitExpression = TraitExpression()
    aggregates: AggregateExpression = AggregateExpression()


class TreeRuleViolation(errors.BadRequest):
    """A parent change Placement refuses (400); ``action`` is "create" or "update"."""

    def __init__(self, action: str, reason: str):
        super().__init__(f"Object action {action} failed because: {reason}")
        self.action = action
        self.reason = reason


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Where a provider sits in its forest: its parent (None: a root) and root."""

    parent_id: int | None
    root_id: int


def descendants(links: Iterable[tuple[int, int | None]], start: int) -> set[int]:
    """``start`` and every provider below it, from (id, parent id) pairs of its tree."""
    children: dict[int, list[int]] = defaultdict(list)
    for provider_id, parent_id in links:
        if parent_id is not None:
            children[parent_id].append(provider_id)
    found = {start}
    stack = [start]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def check_new_provider_parent(uuid: str, parent_uuid: str | None) -> None:
    """A provider cannot be created as its own parent."""
    if parent_uuid is not None and parent_uuid == uuid:
        raise TreeRuleViolation("create", SELF_PARENT)


def new_placement(provider: ProviderRecord, new_parent: ProviderRecord | None,
                  subtree: set[int], *, allow_reparenting: bool) -> Placement | None:
    """Where ``provider`` goes when a client sets its parent to ``new_parent``.

    ``new_parent`` None means "no parent".  ``subtree`` is the provider and
    everything below it.  Returns None when nothing changes.  Before 1.37
    (``allow_reparenting`` False) a provider that has a parent keeps it; a
    root may still be given one.
    """
    if new_parent is None:
        if provider.parent_id is None:
            return None
        if not allow_reparenting:
            raise TreeRuleViolation("update", UNPARENT_NOT_ALLOWED)
        return Placement(None, provider.id)
    if provider.parent_id is not None and provider.parent_id != new_parent.id and not allow_reparenting:
        raise TreeRuleViolation("update", REPARENT_NOT_ALLOWED)
    if new_parent.id in subtree:
        raise TreeRuleViolation("update", LOOP)
    if provider.parent_id == new_parent.id and provider.root_id == new_parent.root_id:
        return None
    return Placement(new_parent.id, new_parent.root_id)


def create_conflict(uuid: str, name: str, *, uuid_taken: bool, name_taken: bool) -> errors.DuplicateName:
    """409 for a new provider whose uuid and/or name another provider has."""
    taken = []
    if uuid_taken:
        taken.append(f"uuid: {uuid}")
    if name_taken:
        taken.append(f"name: {name}")
    return errors.DuplicateName(f"Conflicting resource provider {', '.join(taken)} already exists.")


def rename_conflict(name: str) -> errors.DuplicateName:
    """409 for renaming a provider to a name another provider has."""
    return errors.DuplicateName(f"Conflicting resource provider {name} already exists.")


def not_found(uuid: str) -> errors.NotFound:
    return errors.NotFound(f"No resource provider with uuid {uuid} found")
