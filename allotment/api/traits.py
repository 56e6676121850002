"""``/traits`` and ``/resource_providers/{uuid}/traits`` (1.6+).

``GET /traits`` filters with ``name=in:A,B`` or ``name=startswith:PREFIX``
and ``associated=true|false``.  Custom traits are created with an
idempotent ``PUT /traits/{name}``.  A provider's traits are replaced as a
whole, guarded by the provider generation the client last saw.
"""

from __future__ import annotations

import re

import webob

from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_body, json_response, no_content, query_params
from allotment.db import traits as db
from allotment.domain.errors import ConcurrentUpdate, NotFound

TRAIT_NAME = {"type": "string", "minLength": 1, "maxLength": 255}
CUSTOM_TRAIT_NAME = re.compile(r"CUSTOM_[A-Z0-9_]{1,248}")  # 255 characters at most

LIST_TRAITS_QUERY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "associated": {"type": "string"}},
    "additionalProperties": False,
}

SET_PROVIDER_TRAITS = {
    "type": "object",
    "properties": {
        "traits": {"type": "array", "items": TRAIT_NAME},
        "resource_provider_generation": {"type": "integer"},
    },
    "required": ["traits", "resource_provider_generation"],
    "additionalProperties": False,
}

INVALID_CUSTOM_TRAIT = ('The trait is invalid. A valid trait must be no longer than 255 characters, '
                        'start with the prefix "CUSTOM_" and use following characters: '
                        '"A"-"Z", "0"-"9" and "_"')
BAD_NAME_FILTER = ("Badly formatted name parameter. Expected name query string parameter in form: "
                   '?name=[in|startswith]:[name1,name2|prefix]. Got: "{}"')

# Retries of a create that lost an insert race, and of a traits DELETE
# that lost the generation swap (it names no generation, so a re-run is
# what the client asked for).
RACE_RETRIES = 10


def _name_filter(value: str) -> dict:
    """``in:A,B`` → names, ``startswith:P`` → prefix; other operators filter nothing."""
    operator, colon, argument = value.partition(":")
    if not colon:
        raise HTTPError(400, BAD_NAME_FILTER.format(value))
    if operator == "in":
        return {"names": argument.split(",")}
    if operator == "startswith":
        return {"prefix": argument}
    return {}


def _associated_filter(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise HTTPError(400, 'The query parameter "associated" only accepts "true" or "false"')
    return lowered == "true"


def list_traits(req: Request) -> webob.Response:
    params = query_params(req)
    filters = _name_filter(params["name"]) if "name" in params else {}
    if "associated" in params:
        filters["associated"] = _associated_filter(params["associated"])
    with req.app.db.read() as conn:
        traits = db.list_traits(conn, **filters)
    return json_response(req, {"traits": [t.name for t in traits]},
                         last_modified=db.last_modified(traits))


def get_trait(req: Request) -> webob.Response:
    with req.app.db.read() as conn:
        trait = db.get(conn, req.urlvars["name"])
    return no_content(req, cache_headers=True, last_modified=trait.last_modified)


def put_trait(req: Request) -> webob.Response:
    name = req.urlvars["name"]
    if not CUSTOM_TRAIT_NAME.fullmatch(name):
        raise HTTPError(400, INVALID_CUSTOM_TRAIT)
    trait, created = req.app.db.run_write(lambda conn: db.ensure(conn, name),
                                          retry_on=(db.NameTaken,), retries=RACE_RETRIES)
    return no_content(req, 201 if created else 204, headers={"Location": f"{req.script_name}/traits/{name}"},
                      cache_headers=True, last_modified=trait.last_modified)


def delete_trait(req: Request) -> webob.Response:
    name = req.urlvars["name"]
    req.app.db.run_write(lambda conn: db.delete(conn, name))
    return no_content(req)


def _provider_body(result: db.ProviderTraits) -> dict:
    return {"traits": [t.name for t in result.traits],
            "resource_provider_generation": result.generation}


def list_traits_for_resource_provider(req: Request) -> webob.Response:
    uuid = req.urlvars["uuid"]
    with req.app.db.read() as conn:
        result = db.provider_traits(conn, uuid)
    if result is None:
        # Placement repeats the lookup's own message after its own here.
        raise NotFound(f"No resource provider with uuid {uuid} found: {db.provider_not_found(uuid).message}")
    return json_response(req, _provider_body(result), last_modified=db.last_modified(result.traits))


def update_traits_for_resource_provider(req: Request) -> webob.Response:
    data = json_body(req)
    uuid = req.urlvars["uuid"]
    result = req.app.db.run_write(lambda conn: db.set_provider_traits(
        conn, uuid, data["traits"], data["resource_provider_generation"]))
    return json_response(req, _provider_body(result), last_modified=db.last_modified(result.traits))


def delete_traits_for_resource_provider(req: Request) -> webob.Response:
    uuid = req.urlvars["uuid"]
    req.app.db.run_write(lambda conn: db.clear_provider_traits(conn, uuid),
                         retry_on=(ConcurrentUpdate,), retries=RACE_RETRIES)
    return no_content(req)
