"""KnownNames: the names a mirror's lineage has seen, read without a lock."""

from __future__ import annotations

from urllib.parse import parse_qsl

from allotment.db.allocation_candidates import KnownNames, Names
from allotment.domain import request_groups as rg
from allotment.domain.provider_tree import SHARING_TRAIT, Provider, ProviderSnapshot

ROOT = "11111111-2222-3333-4444-555555555555"


def _request(query: str) -> rg.AllocationCandidatesRequest:
    return rg.parse_allocation_candidates(parse_qsl(query), (1, 39))


def _names(classes: dict, traits: dict) -> Names:
    return Names(classes, {**traits, SHARING_TRAIT: 1}, {}, {}, 1, {7: "VCPU"})


def test_names_come_from_the_set_that_covered_the_request(monkeypatch):
    known = KnownNames()
    request = _request(f"resources=VCPU:1&required=CUSTOM_A&in_tree={ROOT}")
    assert known.covering(request) is None
    known.learn(_names({"VCPU": 7}, {"CUSTOM_A": 3}))
    seen = known.covering(request)
    assert seen is not None
    # Another thread learns past the limit meanwhile: everything is forgotten
    # at once, but the set this request was given still answers it.
    monkeypatch.setattr(KnownNames, "LIMIT", 0)
    known.learn(_names({"DISK_GB": 9}, {}))
    assert known.covering(request) is None
    snapshot = ProviderSnapshot([Provider(id=5, uuid=ROOT, parent_id=None, root_id=5, generation=0)])
    names = known.names(request, snapshot, seen)
    assert (names.class_ids, names.trait_ids, names.in_tree_roots) == (
        {"VCPU": 7}, {"CUSTOM_A": 3, SHARING_TRAIT: 1}, {ROOT: 5})
    other = _request("resources=VCPU:1&in_tree=99999999-2222-3333-4444-555555555555")
    assert known.names(other, snapshot, seen).in_tree_roots is None  # no such provider: no tree
