"""``/resource_providers`` and ``/resource_providers/{uuid}``.

What changes with the microversion:

* 1.1 / 1.6 / 1.11: ``aggregates`` / ``traits`` / ``allocations`` links;
* 1.3 ``member_of``, 1.4 ``resources``, 1.14 ``in_tree``, 1.18 ``required``
  filters (1.22 forbidden traits, 1.24 repeated ``member_of``, 1.32
  forbidden aggregates, 1.39 ``in:`` and repeated ``required``);
* 1.14: ``parent_provider_uuid`` in bodies, parent and root in responses;
* 1.20: POST answers 200 with the provider instead of an empty 201;
* 1.37: a provider that has a parent may be moved or made a root.
"""

from __future__ import annotations

import copy
import uuid as uuidlib
from collections.abc import Callable

import webob

from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_body, json_response, latest, no_content, query_params
from allotment.api.microversion import Versioned
from allotment.db import resource_providers as db
from allotment.domain import request_groups as groups
from allotment.domain.inventories import ResourceClassNotFound
from allotment.domain.resource_providers import NAME_MAX_LENGTH, ProviderFilters, ProviderRecord, \
    TreeRuleViolation

_NAME = {"type": "string", "maxLength": NAME_MAX_LENGTH}
_PARENT = {"anyOf": [{"type": "string", "format": "uuid"}, {"type": "null"}]}

UPDATE_SCHEMA = {
    "type": "object",
    "properties": {"name": _NAME},
    "required": ["name"],
    "additionalProperties": False,
}
CREATE_SCHEMA = copy.deepcopy(UPDATE_SCHEMA)
CREATE_SCHEMA["properties"]["uuid"] = {"type": "string", "format": "uuid"}
UPDATE_SCHEMA_1_14 = copy.deepcopy(UPDATE_SCHEMA)
UPDATE_SCHEMA_1_14["properties"]["parent_provider_uuid"] = _PARENT
CREATE_SCHEMA_1_14 = copy.deepcopy(CREATE_SCHEMA)
CREATE_SCHEMA_1_14["properties"]["parent_provider_uuid"] = _PARENT
CREATE_BODY = Versioned({"1.0": CREATE_SCHEMA, "1.14": CREATE_SCHEMA_1_14})
UPDATE_BODY = Versioned({"1.0": UPDATE_SCHEMA, "1.14": UPDATE_SCHEMA_1_14})

# The query parameters of GET /resource_providers and the version each
# became valid; the schema of a version admits those up to it.
_LIST_PARAMETERS = (
    ((1, 0), "name", {"type": "string"}),
    ((1, 0), "uuid", {"type": "string", "format": "uuid"}),
    ((1, 3), "member_of", {"type": "string"}),
    ((1, 4), "resources", {"type": "string"}),
    ((1, 14), "in_tree", {"type": "string", "format": "uuid"}),
    ((1, 18), "required", {"type": "string"}),
)
_LIST_SCHEMAS = {
    since: {
        "type": "object",
        "properties": {name: schema for version, name, schema in _LIST_PARAMETERS if version <= since},
        "additionalProperties": False,
    }
    for since, _, _ in _LIST_PARAMETERS
}


def LIST_QUERY(version: tuple[int, int]) -> dict:  # noqa: N802 - named like the other schemas
    """The query schema of GET /resource_providers at ``version``."""
    return _LIST_SCHEMAS[max(since for since in _LIST_SCHEMAS if since <= version)]


# -- representation -------------------------------------------------------------

def provider_url(req: Request, uuid: str) -> str:
    return f"{req.script_name}/resource_providers/{uuid}"


def _related(version: tuple[int, int]) -> list[str]:
    """The sub-resources a provider links to at this version (besides itself)."""
    related = ["inventories", "usages"]
    if version >= (1, 1):
        related.append("aggregates")
    if version >= (1, 6):
        related.append("traits")
    if version >= (1, 11):
        related.append("allocations")
    return related


def _representer(req: Request) -> Callable[[ProviderRecord], dict]:
    """A function giving a provider's body at this request's version.

    Everything that depends only on the request is worked out once: a
    list of 10,000 providers is mostly this function's work.
    """
    base = f"{req.script_name}/resource_providers/"
    related = [(rel, "/" + rel) for rel in _related(req.version)]
    nested = req.version >= (1, 14)

    def represent(provider: ProviderRecord) -> dict:
        url = base + provider.uuid
        links = [{"rel": "self", "href": url}] + [{"rel": rel, "href": url + suffix} for rel, suffix in related]
        body = {"uuid": provider.uuid, "name": provider.name, "generation": provider.generation,
                "links": links}
        if nested:
            body["parent_provider_uuid"] = provider.parent_uuid
            body["root_provider_uuid"] = provider.root_uuid
        return body

    return represent


# -- handlers --------------------------------------------------------------------

def list_resource_providers(req: Request) -> webob.Response:
    """GET /resource_providers: every provider matching all filters given."""
    filters = _filters(req, query_params(req))
    with req.app.db.read() as conn:
        try:
            providers = db.list_providers(conn, filters)
        except ResourceClassNotFound as error:
            raise HTTPError(400, f"Invalid resource class in resources parameter: {error.message}") from None
        except db.UnknownTraits as error:
            raise HTTPError(400, f'Invalid trait(s) in "required" parameter: {error.message}') from None
    represent = _representer(req)
    body = {"resource_providers": [represent(provider) for provider in providers]}
    return json_response(req, body, last_modified=latest(*(p.last_modified for p in providers)))


def _filters(req: Request, params: dict[str, str]) -> ProviderFilters:
    """The filters of the query, checked in the order Placement reports errors."""
    aggregates = groups.AggregateExpression()
    if "member_of" in params:
        aggregates = groups.parse_member_of(req.GET.getall("member_of"), req.version)
    resources = groups.parse_resources(params["resources"]) if "resources" in params else {}
    traits = groups.TraitExpression()
    if "required" in params:
        traits = groups.parse_required(req.GET.getall("required"), req.version)
    # An empty name filters nothing, as in Placement.
    return ProviderFilters(name=params.get("name") or None, uuid=params.get("uuid"), in_tree=params.get("in_tree"),
                           resources=resources, traits=traits, aggregates=aggregates)


def get_resource_provider(req: Request) -> webob.Response:
    with req.app.db.read() as conn:
        provider = db.get(conn, req.urlvars["uuid"])
    return json_response(req, _representer(req)(provider), last_modified=provider.last_modified)


def create_resource_provider(req: Request) -> webob.Response:
    """POST /resource_providers: 201 and a Location (200 with the provider from 1.20)."""
    data = json_body(req)
    # A hyphenless uuid is stored in its canonical form.
    uuid = str(uuidlib.UUID(data["uuid"])) if data.get("uuid") else str(uuidlib.uuid4())
    if not data["name"]:
        # Placement's schema admits "", its create refuses it before any
        # other check (a rename to "" is accepted, as there).
        raise HTTPError(400, f'Unable to create resource provider "", {uuid}: '
                             f'Object action create failed because: name is required')
    try:
        provider = db.create(req.app.db, uuid, data["name"], data.get("parent_provider_uuid"))
    except TreeRuleViolation as error:
        raise HTTPError(400, f'Unable to create resource provider "{data["name"]}", {uuid}: '
                             f'{error.message}') from None
    headers = {"Location": provider_url(req, uuid)}
    if req.version >= (1, 20):
        return json_response(req, _representer(req)(provider), last_modified=provider.last_modified,
                             headers=headers)
    return no_content(req, 201, headers=headers)


def update_resource_provider(req: Request) -> webob.Response:
    """PUT /resource_providers/{uuid}: rename, and from 1.14 set the parent."""
    uuid = req.urlvars["uuid"]
    data = _body(req)
    try:
        if "parent_provider_uuid" in data:
            provider, previous_update = db.update(req.app.db, uuid, data["name"], data["parent_provider_uuid"],
                                                  allow_reparenting=req.version >= (1, 37))
        else:
            provider, previous_update = req.app.db.run_write(lambda conn: db.rename(conn, uuid, data["name"]),
                                            retry_on=(db.InsertRace,), retries=db.INSERT_RETRIES)
    except TreeRuleViolation as error:
        raise HTTPError(400, f"Unable to save resource provider {uuid}: {error.message}") from None
    # Placement's answer is last modified at the update before this one,
    # not now; a child provider never written before has none, so no header.
    response = json_response(req, _representer(req)(provider), last_modified=previous_update)
    if previous_update is None:
        response.headers.pop("Last-Modified", None)
    return response


def delete_resource_provider(req: Request) -> webob.Response:
    """DELETE /resource_providers/{uuid}: refused while it has children or allocations."""
    uuid = req.urlvars["uuid"]
    req.app.db.run_write(lambda conn: db.delete(conn, uuid))
    return no_content(req)


def _body(req: Request):
    """The validated body; a missing provider is reported before a bad body."""
    try:
        return json_body(req)
    except HTTPError:
        with req.app.db.read() as conn:
            db.get(conn, req.urlvars["uuid"])
        raise
