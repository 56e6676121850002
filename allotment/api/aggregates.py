"""``/resource_providers/{uuid}/aggregates`` (1.1+).

Responses are ``{"aggregates": [...]}``; from 1.19 they also carry the
provider's generation.  A PUT body is a bare list of uuids before 1.19 and
``{"aggregates": [...], "resource_provider_generation": N}`` from 1.19,
when a stale generation is refused (409) and a change bumps it; before
1.19 the generation is left as it is, as Placement does.
"""

from __future__ import annotations

import webob

from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_body, json_response
from allotment.api.microversion import Versioned
from allotment.db import aggregates as db
from allotment.db import resource_providers as providers_db
from allotment.domain.errors import ConcurrentUpdate

_AGGREGATE_LIST = {
    "type": "array",
    "items": {"type": "string", "format": "uuid"},
    "uniqueItems": True,
}
SET_SCHEMA = _AGGREGATE_LIST
SET_SCHEMA_1_19 = {
    "type": "object",
    "properties": {
        "aggregates": _AGGREGATE_LIST,
        "resource_provider_generation": {"type": "integer"},
    },
    "required": ["aggregates", "resource_provider_generation"],
    "additionalProperties": False,
}
SET_BODY = Versioned({"1.1": SET_SCHEMA, "1.19": SET_SCHEMA_1_19})


def _respond(req: Request, aggregates: list[str], generation: int) -> webob.Response:
    body: dict = {"aggregates": aggregates}
    if req.version >= (1, 19):
        body["resource_provider_generation"] = generation
    # Aggregates have no modification time of their own: "now", as Placement.
    return json_response(req, body)


def get_aggregates(req: Request) -> webob.Response:
    with req.app.db.read() as conn:
        provider = providers_db.get(conn, req.urlvars["uuid"])
        aggregates = db.provider_aggregates(conn, provider.id)
    return _respond(req, aggregates, provider.generation)


def set_aggregates(req: Request) -> webob.Response:
    """Replace the provider's aggregates (the provider must exist before the body is judged)."""
    with req.app.db.read() as conn:
        provider = providers_db.get(conn, req.urlvars["uuid"])
    expected = None
    data = json_body(req)
    if req.version >= (1, 19):
        aggregates, expected = data["aggregates"], data["resource_provider_generation"]
        if expected != provider.generation:
            raise ConcurrentUpdate("Resource provider's generation already changed. "
                                   "Please update the generation and try again.")
    else:
        aggregates = data
    try:
        generation = req.app.db.run_write(
            lambda conn: db.set_provider_aggregates(conn, provider, aggregates, expected_generation=expected),
            retry_on=(db.AggregateRace,), retries=db.RACE_RETRIES)
    except db.AggregateRace:
        raise HTTPError(409, "Another process kept creating the same aggregates. Please retry your update",
                        code=ConcurrentUpdate.default_code) from None
    return _respond(req, aggregates, generation)
