"""tools/difftest sets apart one known difference from the reference: a
resourceless group's ``in_tree<N>``, which Placement 16.0.0 does not apply
(its provider may come from any tree) and Allotment does.

Found by the differential test (seed 126): ``resources=VCPU:1&required_R=
CUSTOM_T1&in_tree_R=<another tree>&same_subtree=_R`` made the reference map
``_R`` to a provider outside that tree; Allotment answered no candidate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "difftest"))

import runner  # noqa: E402

ROOT_A, CHILD_A, ROOT_B, CHILD_B = (f"00000000-0000-4000-8000-00000000000{i}" for i in range(1, 5))
ROOTS = {ROOT_A: ROOT_A, CHILD_A: ROOT_A, ROOT_B: ROOT_B, CHILD_B: ROOT_B}


def _path(in_tree: str, extra: str = "") -> str:
    return ("/allocation_candidates?resources=VCPU:1&required_R=CUSTOM_T1"
            f"&in_tree_R={in_tree}&same_subtree=_R{extra}")


def _get(path: str) -> dict:
    return {"method": "GET", "path": path,
            "headers": {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}, "body": None}


def _candidate(root: str, child: str) -> dict:
    return {"allocations": {root: {"resources": {"VCPU": 1}}}, "mappings": {"": [root], "_R": [child]}}


def _answer(candidates: list[dict], providers: list[str], status: int = 200) -> dict:
    summaries = {uuid: {"resources": {}, "traits": [], "parent_provider_uuid": None if uuid == ROOTS[uuid]
                        else ROOTS[uuid], "root_provider_uuid": ROOTS[uuid]} for uuid in providers}
    body = {"allocation_requests": candidates, "provider_summaries": summaries}
    return {"status": status, "headers": {"content-type": "application/json"},
            "body": json.dumps(body).encode()}


class _Reference:
    """Answers the roots the classifier asks the reference for."""

    def __init__(self):
        self.asked = []

    def send(self, side: str, request: dict) -> dict:
        assert side == "ref" and request["method"] == "GET"
        self.asked.append(request)
        uuid = request["path"].rsplit("/", 1)[-1]
        if uuid not in ROOTS:
            return {"status": 404, "headers": {}, "body": b"{}"}
        body = {"uuid": uuid, "root_provider_uuid": ROOTS[uuid]}
        return {"status": 200, "headers": {}, "body": json.dumps(body).encode()}


def test_a_resourceless_group_outside_its_in_tree_is_set_apart():
    # in_tree_R names tree B, and the reference offers _R from tree A.
    ref = _answer([_candidate(ROOT_A, CHILD_A)], [ROOT_A, CHILD_A])
    ours = _answer([], [])
    pair = _Reference()
    request = _get(_path(CHILD_B))
    assert runner.diverges(request, ref, ours)
    assert runner.reference_ignored_resourceless_in_tree(request, ref, ours, pair)
    # the root was asked at a microversion that has it
    assert pair.asked[0]["path"] == f"/resource_providers/{CHILD_B}"
    assert pair.asked[0]["headers"]["OpenStack-API-Version"] == "placement 1.14"


def test_the_candidates_inside_the_tree_must_be_the_same():
    inside, outside = _candidate(ROOT_B, CHILD_B), _candidate(ROOT_A, CHILD_A)
    ref = _answer([inside, outside], [ROOT_A, CHILD_A, ROOT_B, CHILD_B])
    assert runner.reference_ignored_resourceless_in_tree(
        _get(_path(ROOT_B)), ref, _answer([inside], [ROOT_B, CHILD_B]), _Reference())
    # only the reference's candidate in the named tree missing from ours: a divergence
    assert not runner.reference_ignored_resourceless_in_tree(
        _get(_path(ROOT_B)), ref, _answer([outside], [ROOT_A, CHILD_A]), _Reference())
    # a summary of ours that differs from the reference's: a divergence
    ours = _answer([inside], [ROOT_B, CHILD_B])
    body = json.loads(ours["body"])
    body["provider_summaries"][CHILD_B]["traits"] = ["CUSTOM_OTHER"]
    assert not runner.reference_ignored_resourceless_in_tree(
        _get(_path(ROOT_B)), ref, dict(ours, body=json.dumps(body).encode()), _Reference())


def test_anything_else_still_diverges():
    ref = _answer([_candidate(ROOT_A, CHILD_A)], [ROOT_A, CHILD_A])
    ours = _answer([], [])
    # the group's provider is inside the named tree: nothing to explain by it
    assert not runner.reference_ignored_resourceless_in_tree(_get(_path(ROOT_A)), ref, ours, _Reference())
    # a group with resources keeps to in_tree in the reference too
    path = _path(CHILD_B).replace("required_R=", "resources_R=VGPU:1&required_R=")
    assert not runner.reference_ignored_resourceless_in_tree(_get(path), ref, ours, _Reference())
    # a provider the reference does not know
    unknown = "00000000-0000-4000-8000-000000000009"
    assert not runner.reference_ignored_resourceless_in_tree(_get(_path(unknown)), ref, ours, _Reference())
    # ours offers what the reference does not
    assert not runner.reference_ignored_resourceless_in_tree(_get(_path(CHILD_B)), ours, ref, _Reference())
    # other statuses, and no live reference to ask for roots
    assert not runner.reference_ignored_resourceless_in_tree(
        _get(_path(CHILD_B)), dict(ref, status=400), ours, _Reference())
    assert not runner.reference_ignored_resourceless_in_tree(_get(_path(CHILD_B)), ref, ours, None)
