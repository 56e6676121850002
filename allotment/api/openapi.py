"""The OpenAPI 3.1 description of the API, generated from the route table.

One document per microversion: ``document(routes.TABLE, Version(1, 39))``
describes exactly what a client sending ``OpenStack-API-Version: placement
1.39`` may call, with the very JSON schemas the handlers validate with
(declared in the route table, ``allotment.api.routes``, which the caller
passes in: the table imports this module's handler), so the description
cannot drift from the server.  A single document cannot say "this body
from 1.14, that one from 1.28" in a way client generators understand; one
per version can, and each carries the ranges as
``x-openstack-microversions`` extensions for a reader comparing versions:

* the document: ``x-openstack-microversion`` (the version it describes,
  and the oldest and newest served);
* each operation: ``x-openstack-microversions`` ``{"min": "1.6"}`` (when
  it appeared) and ``x-openstack-policy`` (the policy rule checked);
* each request body and query schema: ``x-openstack-microversions``
  ``{"min", "max"}``, the range over which exactly that schema applies.

Served at ``GET /allotment/openapi.json[?microversion=1.X]`` (no token
needed) and written by ``allotment openapi [--microversion 1.X]``.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import orjson
import webob

from allotment.api import microversion
from allotment.api.errors import HTTPError
from allotment.api.microversion import MAX_VERSION, MIN_VERSION, Version
from allotment.api.endpoint import OWN_PREFIX, Endpoint, RouteTable, Schema, schema_at
from allotment.api.http import query_params

#: Path parameters: what a valid value looks like (anything else is a 404
#: or, where the path names something to create, a 400).
PATH_PARAMETERS = {
    "uuid": {"type": "string", "format": "uuid"},
    "consumer_uuid": {"type": "string", "format": "uuid"},
    "resource_class": {"type": "string", "pattern": "^[A-Z0-9_]+$", "maxLength": 255},
    "name": {"type": "string", "pattern": "^[A-Z0-9_]+$", "maxLength": 255},
}

#: Where an answer tells a client the identity of something it may use next,
#: for the OpenAPI links (and so for a stateful fuzzer): (method, template)
#: -> {path parameter: runtime expression}.  Every route below the source
#: template that uses the parameter is a target.
CREATES: dict[tuple[str, str], dict[str, str]] = {
    ("POST", "/resource_providers"): {"uuid": "$response.body#/uuid"},
    ("GET", "/resource_providers/{uuid}"): {"uuid": "$response.body#/uuid"},
    ("POST", "/resource_providers/{uuid}/inventories"): {
        "uuid": "$request.path.uuid", "resource_class": "$request.body#/resource_class"},
    ("POST", "/resource_classes"): {"name": "$request.body#/name"},
    ("PUT", "/resource_classes/{name}"): {"name": "$request.path.name"},
    ("PUT", "/traits/{name}"): {"name": "$request.path.name"},
    ("PUT", "/allocations/{consumer_uuid}"): {"consumer_uuid": "$request.path.consumer_uuid"},
}

DOCUMENT_QUERY = {
    "type": "object",
    "properties": {"microversion": {"type": "string", "pattern": r"^(latest|[0-9]+\.[0-9]+)$"}},
    "additionalProperties": False,
}

#: What each error status means here (the body is always the Error schema).
ERROR_STATUSES = {
    400: "The request is malformed: a body, query string or header that does not validate, "
         "or values that contradict each other.",
    401: "No token, or a token the identity service does not accept.",
    403: "The policy rule of the operation does not allow the caller.",
    404: "Nothing at this URL: an unknown resource, or an operation newer than the microversion.",
    405: "The URL exists but not with this method (the Allow header lists those it has).",
    406: "The Accept header excludes application/json, or the microversion is not served.",
    409: "A conflict: a stale generation, something in use, or an allocation that does not fit.",
    413: "The body is larger than [allotment] max_request_body_size.",
    415: "The body is not declared as application/json.",
}

ERROR_SCHEMA = {
    "type": "object",
    "required": ["errors"],
    "properties": {
        "errors": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["status", "title", "detail", "request_id"],
                "properties": {
                    "status": {"type": "integer", "description": "The HTTP status, again."},
                    "title": {"type": "string", "description": "The status's reason phrase."},
                    "detail": {"type": "string", "description": "What went wrong, in Placement's words."},
                    "request_id": {"type": "string", "pattern": "^req-[0-9a-f-]{36}$",
                                   "description": "Also in the x-openstack-request-id header."},
                    "code": {"type": "string",
                             "description": "From microversion 1.23: e.g. placement.concurrent_update."},
                },
            },
        },
    },
}

DESCRIPTION = """\
Allotment serves the OpenStack Placement API, microversions {min} to {max}.
This document describes microversion **{version}**: send
`OpenStack-API-Version: placement {version}` with every request (without the
header a request is served at 1.0). Other microversions have documents of
their own: `GET /allotment/openapi.json?microversion=1.X`, or
`allotment openapi --microversion 1.X`. Operations, bodies and query schemas
carry `x-openstack-microversions` with the range of versions they apply to.

**Authentication**: the token goes in `X-Auth-Token` (keystone, or with
`[api] auth_strategy = noauth2` any `user[:project]` text). `GET /` and this
description need none.

**Errors** are `{{"errors": [{{"status", "title", "detail", "request_id", "code"}}]}}`
(`code` from 1.23; HTML instead when the client accepts text/html but not
JSON), and every response carries `x-openstack-request-id`.

**Limits** (checked before any database is asked): a body larger than
`[allotment] max_request_body_size` (16 MiB by default) is refused with 413
before it is read; under `allotment serve` the request line (method, path and
query string) may be 8190 bytes (414 beyond); integers in bodies are bounded
by their schemas, and amounts in `resources` query parameters by 2147483647
(the largest `max_unit`). No text in a request (path, query string, JSON
string) may contain U+0000: 404 in a path, 400 elsewhere. Other control
characters are stored as given. A path that is not UTF-8 is read as Latin-1,
as Placement does; a query string that is not UTF-8 is a 400.
"""


def versions() -> list[Version]:
    """Every microversion served, oldest first."""
    return [Version(MIN_VERSION.major, minor) for minor in range(MIN_VERSION.minor, MAX_VERSION.minor + 1)]


def parse_version(text: str | None) -> Version:
    """A version asked for by name (``latest`` or ``1.X``); ValueError if not served."""
    if text is None or text == "latest":
        return MAX_VERSION
    match = re.fullmatch(r"([0-9]+)\.([0-9]+)", text)
    if not match:
        raise ValueError(f"invalid microversion {text!r}: expected 'latest' or 1.X")
    version = Version(int(match.group(1)), int(match.group(2)))
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"microversion {text} is not served ({MIN_VERSION} to {MAX_VERSION})")
    return version


def _range(declared: Schema, version: Version) -> dict[str, str]:
    """The versions around ``version`` over which ``declared`` gives the same schema."""
    schema = schema_at(declared, version)
    served = versions()
    index = served.index(version)
    low = high = index
    while low > 0 and schema_at(declared, served[low - 1]) == schema:
        low -= 1
    while high < len(served) - 1 and schema_at(declared, served[high + 1]) == schema:
        high += 1
    return {"min": str(served[low]), "max": str(served[high])}


def _operation_id(endpoint: Endpoint) -> str:
    return endpoint.handler.__name__


def _summary(method: str, template: str, endpoint: Endpoint) -> tuple[str, str]:
    """The handler's first docstring line (else method and path), and the rest."""
    doc = (endpoint.handler.__doc__ or "").strip()
    first, _, rest = doc.partition("\n")
    return (first.rstrip(".") or f"{method} {template}"), rest.strip()


def _query_parameters(schema: dict) -> list[dict]:
    required = set(schema.get("required", ()))
    parameters = [{"name": name, "in": "query", "required": name in required,
                   "schema": copy.deepcopy(sub)}
                  for name, sub in schema.get("properties", {}).items()]
    if schema.get("patternProperties"):
        # Keys chosen by the client (request groups: resources1, required_NET...).
        parameters.append({
            "name": "request_groups", "in": "query", "style": "form", "explode": True,
            "description": "Parameters whose names match these patterns (request groups).",
            "schema": {"type": "object", "patternProperties": copy.deepcopy(schema["patternProperties"])},
        })
    return parameters


def _error_statuses(method: str, template: str, endpoint: Endpoint, own: bool) -> list[int]:
    statuses = set()
    if endpoint.versioned:
        statuses |= {400, 406}  # a malformed or unserved microversion header
    if endpoint.query or endpoint.body:
        statuses.add(400)
    if endpoint.policy:
        statuses |= {401, 403}
    if "{" in template:
        statuses.add(404)
    if method in ("PUT", "POST", "DELETE") and not own:
        statuses.add(409)
    if endpoint.body:
        statuses.add(413)
    if endpoint.accepts_json:
        statuses.add(415)
    return sorted(statuses)


def _operation(method: str, template: str, endpoint: Endpoint, version: Version, own: bool) -> dict:
    summary, description = _summary(method, template, endpoint)
    operation: dict[str, Any] = {
        "operationId": _operation_id(endpoint),
        "summary": summary,
        "tags": [endpoint.handler.__module__.rpartition(".")[2] if not own else "allotment"],
        "security": [{"token": []}] if endpoint.policy else [],
    }
    if description:
        operation["description"] = description
    if endpoint.policy:
        operation["x-openstack-policy"] = endpoint.policy
    if endpoint.versioned:
        operation["x-openstack-microversions"] = {"min": str(endpoint.min_version)}
    parameters: list[dict] = [{"name": name, "in": "path", "required": True,
                               "schema": copy.deepcopy(PATH_PARAMETERS[name])}
                              for name in re.findall(r"\{(\w+)\}", template)]
    if endpoint.versioned:
        parameters.append({"$ref": "#/components/parameters/microversion"})
    query = schema_at(endpoint.query, version)
    if query is not None:
        parameters += _query_parameters(query)
        operation["x-query-schema"] = dict(copy.deepcopy(query),
                                           **{"x-openstack-microversions": _range(endpoint.query, version)})
    if parameters:
        operation["parameters"] = parameters
    body = schema_at(endpoint.body, version)
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": copy.deepcopy(body)}},
            "x-openstack-microversions": _range(endpoint.body, version),
        }
    responses: dict[str, Any] = {}
    for status, has_json in endpoint.answers_at(version):
        response: dict[str, Any] = {"description": "Success."}
        if has_json:
            response["content"] = {"application/json": {"schema": {"type": "object"}}}
        elif not endpoint.produces_json and status == 200:
            response["content"] = {"text/plain": {"schema": {"type": "string"}}}
        responses[str(status)] = response
    for status in _error_statuses(method, template, endpoint, own):
        responses[str(status)] = {"$ref": f"#/components/responses/{status}"}
    operation["responses"] = responses
    return operation


def _links(paths: dict, operations: dict[tuple[str, str], dict]) -> None:
    """OpenAPI links from answers that identify something to what uses it."""
    for (method, template), expressions in CREATES.items():
        source = operations.get((method, template))
        if source is None:
            continue
        links = {}
        for (target_method, target_template), target in operations.items():
            if (target_method, target_template) == (method, template):
                continue
            if not (target_template == template or target_template.startswith(template + "/")):
                continue
            needed = re.findall(r"\{(\w+)\}", target_template)
            if not needed or not set(needed) <= set(expressions):
                continue
            links[target["operationId"]] = {
                "operationId": target["operationId"],
                "parameters": {name: expressions[name] for name in needed},
            }
        if not links:
            continue
        uses_body = any(expression.startswith("$response.body") for expression in expressions.values())
        for status, response in source["responses"].items():
            if status.startswith("2") and "$ref" not in response and (
                    "content" in response or not uses_body):
                response["links"] = links


@functools.lru_cache(maxsize=None)  # one per version served, at most
def _document(table: RouteTable, version: Version) -> dict:
    paths: dict[str, dict] = {}
    operations: dict[tuple[str, str], dict] = {}
    for routes, own in ((table.placement, False), (table.own, True)):
        for template, methods in routes.items():
            for method, endpoint in methods.items():
                if not own and version < endpoint.min_version:
                    continue
                operation = _operation(method, template, endpoint, version, own)
                paths.setdefault(template, {})[method.lower()] = operation
                operations[(method, template)] = operation
    _links(paths, operations)
    error_schema = copy.deepcopy(ERROR_SCHEMA)
    if version >= (1, 23):
        error_schema["properties"]["errors"]["items"]["required"].append("code")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "OpenStack Placement API (Allotment)",
            "version": str(version),
            "description": DESCRIPTION.format(version=version, min=MIN_VERSION, max=MAX_VERSION),
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "x-openstack-microversion": {"version": str(version), "min": str(MIN_VERSION),
                                     "max": str(MAX_VERSION)},
        "servers": [{"url": "/"}],
        "tags": [{"name": "allotment", "description": f"Allotment's own routes (under {OWN_PREFIX}, and /metrics), "
                                                      "outside Placement's URL space."}],
        "paths": paths,
        "components": {
            "securitySchemes": {"token": {"type": "apiKey", "in": "header", "name": "X-Auth-Token"}},
            "parameters": {"microversion": {
                "name": microversion.HEADER, "in": "header", "required": version != MIN_VERSION,
                "description": "The microversion this document describes; without it, 1.0.",
                "schema": {"type": "string", "enum": [f"{microversion.SERVICE_TYPE} {version}"]},
            }},
            "schemas": {"Error": error_schema},
            "responses": {
                str(status): {
                    "description": text,
                    "headers": {"x-openstack-request-id": {"schema": {"type": "string"}}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
                for status, text in ERROR_STATUSES.items()
            },
        },
    }


def document(table: RouteTable, version: Version = MAX_VERSION, *, server_url: str = "/") -> dict:
    """The OpenAPI document of ``table`` at ``version`` (a fresh copy: callers may change it)."""
    found = copy.deepcopy(_document(table, version))
    found["servers"] = [{"url": server_url}]
    return found


#: Rendered documents kept, per (version, the server's URL path): the path
#: is the request's SCRIPT_NAME, which a proxy may set (bounded, whatever
#: it sends).
RENDERED_KEPT = 32


@functools.lru_cache(maxsize=RENDERED_KEPT)
def _rendered(table: RouteTable, version: Version, server_url: str) -> bytes:
    return orjson.dumps({**_document(table, version), "servers": [{"url": server_url}]})


def serve_document(req) -> webob.Response:
    """The OpenAPI document of one microversion (the latest unless ``?microversion=1.X``)."""
    params = query_params(req)
    try:
        version = parse_version(params.get("microversion"))
    except ValueError as error:
        raise HTTPError(400, str(error)) from None
    return webob.Response(body=_rendered(req.app.router.table, version, req.script_name or "/"),
                          content_type="application/json", charset=None)
