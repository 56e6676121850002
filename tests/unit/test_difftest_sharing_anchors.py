"""tools/difftest sets apart one known instability of the reference: an
unsuffixed group served by sharing providers alone, where Placement keeps at
most one of the trees the sharing provider reaches (picked by set order)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "difftest"))

import runner  # noqa: E402

SHARED, TREE_A, TREE_B, PLAIN = (f"00000000-0000-4000-8000-00000000000{i}" for i in range(1, 5))
PATH = "/allocation_candidates?resources=IPV4_ADDRESS:1&resources_NET=SRIOV_NET_VF:1&group_policy=none"


def _summary(traits):
    return {"resources": {}, "traits": traits, "parent_provider_uuid": None, "root_provider_uuid": None}


def _candidate(unsuffixed, tree):
    return {"allocations": {unsuffixed: {"resources": {"IPV4_ADDRESS": 1}},
                            tree: {"resources": {"SRIOV_NET_VF": 1}}},
            "mappings": {"": [unsuffixed], "_NET": [tree]}}


def _answer(candidates, providers, status=200):
    summaries = {uuid: _summary(["MISC_SHARES_VIA_AGGREGATE"] if uuid == SHARED else []) for uuid in providers}
    body = {"allocation_requests": candidates, "provider_summaries": summaries}
    return {"status": status, "headers": {"content-type": "application/json"},
            "body": json.dumps(body).encode()}


def _get(path=PATH):
    return {"method": "GET", "path": path, "headers": {}, "body": None}


def test_fewer_trees_for_a_sharing_only_unsuffixed_group_is_set_apart():
    ours = _answer([_candidate(SHARED, TREE_A), _candidate(SHARED, TREE_B)], [SHARED, TREE_A, TREE_B])
    for ref in (_answer([], []), _answer([_candidate(SHARED, TREE_B)], [SHARED, TREE_B])):
        assert runner.diverges(_get(), ref, ours)
        assert runner.reference_dropped_sharing_anchors(_get(), ref, ours)


def test_an_unsuffixed_group_on_a_provider_that_does_not_share_still_diverges():
    ours = _answer([_candidate(PLAIN, TREE_A), _candidate(SHARED, TREE_B)], [SHARED, PLAIN, TREE_A, TREE_B])
    ref = _answer([_candidate(SHARED, TREE_B)], [SHARED, TREE_B])
    assert not runner.reference_dropped_sharing_anchors(_get(), ref, ours)


def test_a_candidate_only_the_reference_offers_still_diverges():
    ours = _answer([_candidate(SHARED, TREE_A)], [SHARED, TREE_A])
    ref = _answer([_candidate(SHARED, TREE_B)], [SHARED, TREE_B])
    assert not runner.reference_dropped_sharing_anchors(_get(), ref, ours)
    # the same answers on both sides are no subset either (nothing to set apart)
    assert not runner.reference_dropped_sharing_anchors(_get(), ours, ours)


def test_a_differing_summary_or_status_still_diverges():
    ours = _answer([_candidate(SHARED, TREE_A), _candidate(SHARED, TREE_B)], [SHARED, TREE_A, TREE_B])
    ref = _answer([_candidate(SHARED, TREE_B)], [SHARED, TREE_B])
    body = json.loads(ref["body"])
    body["provider_summaries"][TREE_B]["traits"] = ["CUSTOM_OTHER"]
    assert not runner.reference_dropped_sharing_anchors(_get(), dict(ref, body=json.dumps(body).encode()), ours)
    assert not runner.reference_dropped_sharing_anchors(_get(), dict(ref, status=400), ours)


def test_only_requests_with_an_unsuffixed_group_qualify():
    path = "/allocation_candidates?resources1=IPV4_ADDRESS:1&resources_NET=SRIOV_NET_VF:1&group_policy=none"
    ours = _answer([_candidate(SHARED, TREE_A), _candidate(SHARED, TREE_B)], [SHARED, TREE_A, TREE_B])
    assert not runner.reference_dropped_sharing_anchors(_get(path), _answer([], []), ours)


# Before 1.34 a candidate has no mappings: which providers serve the
# unsuffixed group is worked out from the amounts (seen with seed 700: the
# unsuffixed VCPU:8 on a sharing provider, the suffixed VCPU:1 in a tree).
BARE_PATH = "/allocation_candidates?resources=VCPU:8&resources1=VCPU:1"


def _bare(allocations):
    return {"allocations": {uuid: {"resources": held} for uuid, held in allocations.items()}}


def test_without_mappings_a_sharing_only_unsuffixed_group_is_found_from_the_amounts():
    both_on_shared = _bare({SHARED: {"VCPU": 9}})
    split = _bare({SHARED: {"VCPU": 8}, TREE_A: {"VCPU": 1}})
    ours = _answer([split, both_on_shared], [SHARED, TREE_A])
    ref = _answer([both_on_shared], [SHARED])
    assert runner.diverges(_get(BARE_PATH), ref, ours)
    assert runner.reference_dropped_sharing_anchors(_get(BARE_PATH), ref, ours)


def test_without_mappings_an_unsuffixed_group_off_the_sharing_provider_still_diverges():
    both_on_shared = _bare({SHARED: {"VCPU": 9}})
    # VCPU:8 can only be the unsuffixed group, and it is on a plain provider
    plain = _bare({PLAIN: {"VCPU": 8}, SHARED: {"VCPU": 1}})
    ours = _answer([plain, both_on_shared], [SHARED, PLAIN])
    ref = _answer([both_on_shared], [SHARED])
    assert not runner.reference_dropped_sharing_anchors(_get(BARE_PATH), ref, ours)
    # amounts that no placement of the groups explains are not set apart either
    odd = _bare({SHARED: {"VCPU": 7}, TREE_A: {"VCPU": 2}})
    ours = _answer([odd, both_on_shared], [SHARED, TREE_A])
    assert not runner.reference_dropped_sharing_anchors(_get(BARE_PATH), ref, ours)
