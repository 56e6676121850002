"""``/allotment/capacity...``: read-only JSON for the capacity view.

What the web page (``/allotment/ui``, :mod:`allotment.api.ui`) needs and
the Placement API cannot give cheaply: sums over the whole cloud, a page of
provider trees with their usage, one provider with the consumers on it,
usage per project and user.  Each answer is read in one transaction
(:mod:`allotment.db.capacity_view`).  Guarded by the policy rule
``allotment:capacity`` (admin by default); the microversion does not
matter to them.

* ``GET /allotment/capacity[?member_of=AGG][&trait=NAME]``: per resource
  class ``total``, ``reserved``, ``capacity`` (``(total - reserved) *
  allocation_ratio``, per record), ``used``, ``free``; counts of
  ``providers``, ``roots``, ``consumers``; the ``aggregates`` and
  ``traits`` there are to filter by.
* ``GET /allotment/capacity/trees[?search=][&sort=name|fullness][&limit=][&offset=]``:
  ``total`` matching roots and ``trees``, each ``{root, name, fullness,
  providers: [{uuid, name, parent, depth, inventories, traits,
  aggregates}]}`` (parents before children).
* ``GET /allotment/capacity/providers?uuid=A,B``: names and roots of some
  providers (at most 500).
* ``GET /allotment/capacity/providers/{uuid}``: one provider in full.
* ``GET /allotment/capacity/projects``: per project ``usages``,
  ``consumers`` and ``users`` (the same per user).
"""

from __future__ import annotations

import uuid as uuidlib

import webob

from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_response, query_params
from allotment.db import capacity_view as db
from allotment.db import resource_totals

MAX_PAGE = 200
MAX_NAMES = 500

_UUID = {"type": "string", "format": "uuid"}
_TRAIT = {"type": "string", "pattern": "^[A-Z0-9_]+$", "maxLength": 255}
_COUNT = {"type": "string", "pattern": "^[0-9]{1,9}$"}

OVERVIEW_QUERY = {
    "type": "object",
    "properties": {"member_of": _UUID, "trait": _TRAIT},
    "additionalProperties": False,
}
TREES_QUERY = {
    "type": "object",
    "properties": {"search": {"type": "string", "maxLength": 255},
                   "sort": {"type": "string", "enum": ["name", "fullness"]},
                   "limit": _COUNT, "offset": _COUNT},
    "additionalProperties": False,
}
NAMES_QUERY = {
    "type": "object",
    "properties": {"uuid": {"type": "string", "maxLength": MAX_NAMES * 37}},
    "required": ["uuid"],
    "additionalProperties": False,
}
NO_QUERY = {"type": "object", "properties": {}, "additionalProperties": False}


def _enabled(req: Request) -> dict:
    """The query string, validated; 404 while ``[allotment] ui`` is off."""
    if not req.app.conf.allotment.ui:
        raise HTTPError(404)
    return query_params(req)


def _canonical(value: str) -> str:
    return str(uuidlib.UUID(value))


def overview(req: Request) -> webob.Response:
    """GET /allotment/capacity."""
    params = _enabled(req)
    aggregate = _canonical(params["member_of"]) if params.get("member_of") else None
    with req.app.db.read() as conn:
        body = db.overview(conn, aggregate, params.get("trait") or None)
    return json_response(req, body, cache_headers=False)


def trees(req: Request) -> webob.Response:
    """GET /allotment/capacity/trees."""
    params = _enabled(req)
    limit = int(params.get("limit", 20))
    if not 1 <= limit <= MAX_PAGE:
        raise HTTPError(400, f"Invalid query string parameters: limit must be between 1 and {MAX_PAGE}")
    offset = int(params.get("offset", 0))
    with req.app.db.read() as conn:
        body = db.tree_page(conn, params.get("search", "").strip() or None, params.get("sort", "name"),
                            limit, offset)
    return json_response(req, body, cache_headers=False)


def provider_names(req: Request) -> webob.Response:
    """GET /allotment/capacity/providers?uuid=A,B,..."""
    params = _enabled(req)
    wanted = [item.strip() for item in params["uuid"].split(",") if item.strip()]
    if len(wanted) > MAX_NAMES:
        raise HTTPError(400, f"Invalid query string parameters: at most {MAX_NAMES} uuids")
    try:
        canonical = sorted({_canonical(item) for item in wanted})
    except ValueError:
        raise HTTPError(400, "Invalid query string parameters: uuid must be a comma-separated list of "
                             "uuids") from None
    with req.app.db.read() as conn:
        found = db.provider_names(conn, canonical) if canonical else []
    return json_response(req, {"providers": found}, cache_headers=False)


def provider(req: Request) -> webob.Response:
    """GET /allotment/capacity/providers/{uuid}."""
    _enabled(req)
    try:
        uuid = _canonical(req.urlvars["uuid"])
    except ValueError:
        raise HTTPError(404, f"No resource provider with uuid {req.urlvars['uuid']} found") from None
    with req.app.db.read() as conn:
        body = db.provider_detail(conn, uuid)
    if body is None:
        raise HTTPError(404, f"No resource provider with uuid {uuid} found")
    return json_response(req, body, cache_headers=False)


def projects(req: Request) -> webob.Response:
    """GET /allotment/capacity/projects."""
    _enabled(req)
    with req.app.db.read() as conn:
        found = db.project_usages(conn)
        cloud = resource_totals.filtered_sums(conn)
    body = {"projects": found,
            "cloud": {rc: {"capacity": sums.capacity, "used": sums.used} for rc, sums in sorted(cloud.items())}}
    return json_response(req, body, cache_headers=False)
