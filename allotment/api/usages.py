"""Usages over HTTP: per provider, and per project/user (1.9) or type (1.38).

``GET /usages`` is the one route whose policy depends on the query: a
reader may see their own project's totals.  The dispatcher checks
``placement:usages`` against the caller's own project (a necessary
condition: whoever may read some project's usage passes it); the handler
then checks it against the project asked for, before validating anything,
as Placement does.
"""

from __future__ import annotations

import copy

import webob

from allotment.api import policy
from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_response, query_params
from allotment.api.microversion import Versioned
from allotment.db import usages as db

OWNER_ID = {"type": "string", "minLength": 1, "maxLength": 255}

USAGES_QUERY_V1_9: dict = {
    "type": "object",
    "properties": {"project_id": OWNER_ID, "user_id": OWNER_ID},
    "required": ["project_id"],
    "additionalProperties": False,
}
USAGES_QUERY_V1_38 = copy.deepcopy(USAGES_QUERY_V1_9)
USAGES_QUERY_V1_38["properties"]["consumer_type"] = {
    "type": "string", "pattern": "^[A-Z0-9_]+$|^all|^unknown$", "minLength": 1, "maxLength": 255,
}
TOTAL_USAGES_QUERY = Versioned({"1.9": USAGES_QUERY_V1_9, "1.38": USAGES_QUERY_V1_38})


def list_usages(req: Request) -> webob.Response:
    """GET /resource_providers/{uuid}/usages: usage per class of its inventory."""
    uuid = req.urlvars["uuid"]
    with req.app.db.read() as conn:
        found = db.provider_usages(conn, uuid)
    if found is None:
        # Placement repeats the lookup's own message after its own here.
        missing = f"No resource provider with uuid {uuid} found"
        raise HTTPError(404, f"{missing}: {missing}")
    # Usage is a question about now: Last-Modified is the current time.
    return json_response(req, {"resource_provider_generation": found.generation, "usages": found.usages})


def get_total_usages(req: Request) -> webob.Response:
    """GET /usages?project_id=&user_id=[&consumer_type=] (1.9; types 1.38)."""
    # The policy and the schema come before the query's NUL check, as in Placement.
    req.authorize(policy.TOTAL_USAGES, {"project_id": dict(req.unchecked_query() or ()).get("project_id")})
    by_type = req.version >= (1, 38)
    params = query_params(req)
    project, user = params["project_id"], params.get("user_id")
    with req.app.db.read() as conn:
        if by_type:
            usages: dict = db.usages_by_consumer_type(conn, project, user, params.get("consumer_type"))
        else:
            usages = db.total_usages(conn, project, user)
    return json_response(req, {"usages": usages})
