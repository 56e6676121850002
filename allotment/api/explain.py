"""``GET /allotment/explain``: why ``GET /allocation_candidates`` with the
same query string finds what it finds, or nothing.

Outside Placement's URL space (``/allotment/...`` is Allotment's own), so
it can never collide with a future Placement route.  The query string is
read exactly as ``GET /allocation_candidates`` reads it, at the request's
``OpenStack-API-Version`` (1.10 or later), with the same 400 for the same
bad input; the policy rule ``allotment:explain`` (admin by default) guards
it.  The answer is computed in one read transaction: the request's own
answer, by the very code ``GET /allocation_candidates`` runs (how many
candidates it returns), and an explanation over every tree the request
concerns (:mod:`allotment.domain.explain`).

The body (``explain_version`` 1; fields are only ever added)::

    {
      "explain_version": 1,
      "microversion": "1.39",
      "request": {                      # the query as understood
        "groups": [{"suffix": "", "resources": {"VCPU": 4},
                    "required": [["HW_CPU_X86_AVX2"], ["A", "B"]],   # AND of any-of sets
                    "forbidden": ["CUSTOM_MAINTENANCE"],
                    "member_of": [["<agg>"], ["<agg>", "<agg>"]],    # AND of any-of sets
                    "forbidden_aggregates": [], "in_tree": null}],
        "group_policy": null, "limit": null,
        "root_required": {"required": ["..."], "forbidden": ["..."]},
        "same_subtree": [["1", "2"]]},
      "verdict": "0/2000 trees can serve this request: 1500 not enough free VCPU, ...",
      "candidates": {
        "returned": 0,        # what GET /allocation_candidates returns for this query
        "available": 0,       # how many exist, counted up to the cap
        "capped": false,      # counting stopped at the cap: there may be more
        "limit": null,        # the query's limit
        "limited": false,     # the limit cut the answer
        "cap": 20000, "cap_source": "safety cap" | "max_allocation_candidates",
        "trees": 0},          # trees yielding candidates
      "cloud": {"trees": 2000, "providers": 6000},
      "steps": [              # the funnel, in the order filters apply
        {"scope": "trees" | "providers", "filter": "capacity", "label": "has VCPU:4 free",
         "group": "" | "1" | null, "resource_class": "VCPU" | null,
         "providers": {"left": 500, "eliminated": 1500} | null,
         "trees": {"left": 500, "eliminated": 1500}}],
      "reasons": [{"reason": "not enough free VCPU", "trees": 1500}],   # most common first
      "closest": [            # near misses, fewest and smallest problems first
        {"tree": {"uuid": "...", "name": "cn-0042"}, "stage": "has_provider", "lacks": 1,
         "problems": [{"kind": "capacity", "text": "VCPU: 4 requested, 2 free of 16 (...)",
                       "reason": "not enough free VCPU", "group": "", "resource_class": "VCPU",
                       "provider": {"uuid": "...", "name": "cn-0042"} | null,
                       "inventory": {"total": 16, "reserved": 2, "allocation_ratio": 1.0, "min_unit": 1,
                                     "max_unit": 16, "step_size": 1, "used": 12, "capacity": 14,
                                     "free": 2} | null,
                       "amount": 4 | null}]}],
      "notes": ["in_tree: there is no provider ..."],
      "elapsed_ms": 12.3
    }

Provider steps count, per group (per class of the unsuffixed group), the
providers passing that filter and every earlier one of the group, and the
trees having (or borrowing from a sharing provider) such a provider; tree
steps count the trees still able to serve the whole request.  ``stage``
of a near miss is the ``filter`` of the tree step that eliminated it
(``has_provider``, ``root_required``, ``isolate``, ``same_subtree``...).
"""

from __future__ import annotations

import time

import webob

from allotment.api import allocation_candidates as candidates_api
from allotment.api.collector import gc_paused
from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_response
from allotment.db import allocation_candidates as db
from allotment.domain import explain as engine
from allotment.domain.request_groups import AllocationCandidatesRequest

EXPLAIN_VERSION = 1
MIN_VERSION = (1, 10)


def explain(req: Request) -> webob.Response:
    """GET /allotment/explain."""
    if req.version < MIN_VERSION:
        raise HTTPError(400, "GET /allotment/explain reads the query of GET /allocation_candidates, which "
                             "needs microversion 1.10 or later: send OpenStack-API-Version: placement 1.39 "
                             "(or latest)")
    started = time.monotonic()
    request = candidates_api.parse_query(req)
    cap, cap_source = candidates_api.generation_cap(req.app.conf)
    with gc_paused():
        with req.app.db.read() as conn:
            names, found = candidates_api.find(req, conn, request)
            trees = db.load_all_trees(conn, request, names, req.app.state.providers)
            providers_total, trees_total = db.cloud_size(conn)
            result = engine.explain(request, trees.snapshot, trees.roots, trees_total=trees_total,
                                    providers_total=providers_total, max_candidates=cap)
            labels = db.provider_labels(conn, result.provider_ids())
        unknown = sorted(request.aggregate_uuids() - names.aggregate_ids.keys())
        result.notes.extend(f"aggregate {uuid} has no providers" for uuid in unknown)
        body = shape(request, result, len(found.allocation_requests), cap, cap_source, labels)
    body["microversion"] = f"{req.version[0]}.{req.version[1]}"
    body["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    return json_response(req, body)


def shape(request: AllocationCandidatesRequest, result: engine.Explanation, returned: int, cap: int,
          cap_source: str, labels: dict[int, tuple[str, str]]) -> dict:
    """The JSON body (see the module doc)."""

    def provider(pid: int | None) -> dict | None:
        if pid is None:
            return None
        uuid, name = labels.get(pid, (None, None))
        return {"uuid": uuid, "name": name}

    limit = request.limit
    return {
        "explain_version": EXPLAIN_VERSION,
        "request": _request(request),
        "verdict": result.verdict(returned, limit, cap, cap_source),
        "candidates": {
            "returned": returned,
            "available": result.available,
            "capped": result.capped,
            "limit": limit,
            "limited": limit is not None and result.available > returned,
            "cap": cap,
            "cap_source": cap_source,
            "trees": result.serving,
        },
        "cloud": {"trees": result.trees_total, "providers": result.providers_total},
        "steps": [_step(step) for step in result.steps],
        "reasons": [{"reason": phrase, "trees": count} for phrase, count in result.reasons],
        "closest": [{
            "tree": provider(tree.root_id),
            "stage": _stage_filter(tree.stage),
            "lacks": len(tree.problems),
            "problems": [_problem(problem, provider) for problem in tree.problems],
        } for tree in result.closest],
        "notes": result.notes,
    }


def _stage_filter(stage: str | None) -> str | None:
    return "has_provider" if stage and stage.startswith("slot") else stage


def _step(step: engine.Step) -> dict:
    providers = None
    if step.scope == engine.PROVIDERS:
        providers = {"left": step.providers_left, "eliminated": step.providers_eliminated}
    return {
        "scope": step.scope,
        "filter": step.filter,
        "label": step.label,
        "group": step.group,
        "resource_class": step.resource_class,
        "providers": providers,
        "trees": {"left": step.trees_left, "eliminated": step.trees_eliminated},
    }


def _problem(problem: engine.Problem, provider) -> dict:
    inv = problem.inventory
    return {
        "kind": problem.kind,
        "text": problem.text,
        "reason": problem.reason,
        "group": problem.group,
        "resource_class": problem.resource_class,
        "provider": provider(problem.provider_id),
        "amount": problem.amount,
        "inventory": None if inv is None else {
            "total": inv.total, "reserved": inv.reserved, "allocation_ratio": inv.allocation_ratio,
            "min_unit": inv.min_unit, "max_unit": inv.max_unit, "step_size": inv.step_size,
            "used": inv.used, "capacity": inv.capacity, "free": inv.free},
    }


def _request(request: AllocationCandidatesRequest) -> dict:
    def sets(expression) -> list[list[str]]:
        return [sorted(any_of) for any_of in expression]

    return {
        "groups": [{
            "suffix": group.suffix,
            "resources": dict(group.resources),
            "required": sets(group.traits.required),
            "forbidden": sorted(group.traits.forbidden),
            "member_of": sets(group.aggregates.required),
            "forbidden_aggregates": sorted(group.aggregates.forbidden),
            "in_tree": group.in_tree,
        } for group in request.groups],
        "group_policy": request.group_policy,
        "limit": request.limit,
        "root_required": {"required": sorted(set().union(*request.root_traits.required)),
                          "forbidden": sorted(request.root_traits.forbidden)},
        "same_subtree": [sorted(suffixes) for suffixes in request.same_subtrees],
    }
