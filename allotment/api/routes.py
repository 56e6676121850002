"""The route table: every URL, method, handler, policy rule, schema and version.

This is the place to look for "where is ``PUT /allocations``": each entry
names the handler (``module:function`` inside ``allotment.api``), the
policy rule checked before it runs, the microversion the method appeared
in, the JSON schemas its body and query string are validated with, and the
statuses it answers on success.  The dispatcher applies these declarations
uniformly, handlers validate with the schemas named here
(``http.json_body`` / ``http.query_params``), and the OpenAPI document
(``allotment/api/openapi.py``) is generated from this table, so the three
cannot drift apart.

``ROUTES`` is Placement's URL space; ``OWN_ROUTES`` is Allotment's own,
everything under ``/allotment/``, which Placement never uses.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from allotment.api.microversion import Version, Versioned, parse

#: The prefix of every URL that is Allotment's own rather than Placement's.
OWN_PREFIX = "/allotment/"


@dataclass(frozen=True)
class Endpoint:
    handler: str                 # "module:function" inside allotment.api
    policy: str | None           # checked before the handler; None: public, no token needed
    min_version: Version = Version(1, 0)
    accepts_json: bool = False   # request body must be application/json (else 415)
    produces_json: bool = True   # Accept must allow application/json (else 406)
    too_old_status: int = 404    # answer to a request below min_version
    body: str | None = None      # "module:NAME": the body's JSON schema (dict, Versioned or version -> dict)
    query: str | None = None     # "module:NAME": the query string's JSON schema, likewise
    # Success statuses: (since, status, has a JSON body), the newest that
    # applies at a version wins; several statuses may share one version.
    answers: tuple[tuple[Version, int, bool], ...] = ()
    versioned: bool = True       # the OpenStack-API-Version header matters to it
    checks_accept: bool = True   # 406 unless Accept allows JSON (Placement's root document does not check)

    def answers_at(self, version: tuple[int, int]) -> list[tuple[int, bool]]:
        """The success statuses at ``version`` (with whether they carry JSON)."""
        applicable = [since for since, _, _ in self.answers if since <= version]
        if not applicable:
            return []
        newest = max(applicable)
        return [(status, has_json) for since, status, has_json in self.answers if since == newest]


def E(handler: str, policy: str | None, since: str = "1.0", *, body: str | None = None,
      json_required: bool | None = None, query: str | None = None, ok: str = "200 json",
      produces_json: bool = True, too_old: int = 404, versioned: bool = True,
      checks_accept: bool = True) -> Endpoint:
    """An endpoint.  ``ok`` lists the success statuses: ``"201"``, ``"200 json"``,
    ``"1.0: 201; 1.20: 200 json"``, ``"201, 204"``.  A body schema implies
    that the body must be JSON unless ``json_required`` says otherwise (a
    handler whose body depends on the version checks it itself)."""
    answers = []
    for step in ok.split(";"):
        since_text, _, statuses = step.rpartition(":")
        step_since = parse(since_text.strip()) if since_text else parse(since)
        for status in statuses.split(","):
            code, _, kind = status.strip().partition(" ")
            answers.append((step_since, int(code), kind == "json"))
    accepts_json = body is not None if json_required is None else json_required
    return Endpoint(handler, policy, parse(since), accepts_json, produces_json, too_old, body, query,
                    tuple(answers), versioned, checks_accept)


def resolve(reference: str):
    """The object a ``module:NAME`` reference names, inside ``allotment.api``."""
    module_name, name = reference.split(":")
    return getattr(importlib.import_module(f"allotment.api.{module_name}"), name)


def schema_at(reference: str | None, version: tuple[int, int]) -> dict | None:
    """The JSON schema a ``body``/``query`` reference gives at ``version``."""
    if reference is None:
        return None
    declared = resolve(reference)
    if isinstance(declared, Versioned):
        return declared.at(version)
    if callable(declared):
        return declared(version)
    return declared


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

RP = "placement:resource_providers"
INV = RP + ":inventories"

# path template -> {method: Endpoint}
ROUTES: dict[str, dict[str, Endpoint]] = {
    "/": {
        "GET": E("root:home", None, checks_accept=False),
    },
    "/resource_providers": {
        "GET": E("resource_providers:list_resource_providers", RP + ":list",
                 query="resource_providers:LIST_QUERY"),
        "POST": E("resource_providers:create_resource_provider", RP + ":create",
                  body="resource_providers:CREATE_BODY", ok="1.0: 201; 1.20: 200 json"),
    },
    "/resource_providers/{uuid}": {
        # Methods in the order a 405's Allow header lists them, as Placement's.
        "GET": E("resource_providers:get_resource_provider", RP + ":show"),
        "DELETE": E("resource_providers:delete_resource_provider", RP + ":delete", ok="204"),
        "PUT": E("resource_providers:update_resource_provider", RP + ":update",
                 body="resource_providers:UPDATE_BODY"),
    },
    "/resource_providers/{uuid}/inventories": {
        "GET": E("inventories:get_inventories", INV + ":list"),
        "POST": E("inventories:create_inventory", INV + ":create",
                  body="inventories:POST_INVENTORY_SCHEMA", ok="201 json"),
        "PUT": E("inventories:set_inventories", INV + ":update", body="inventories:PUT_INVENTORIES_SCHEMA"),
        # Placement answers 405 (not 404) to this method before 1.5.
        "DELETE": E("inventories:delete_inventories", INV + ":delete", "1.5", too_old=405, ok="204"),
    },
    "/resource_providers/{uuid}/inventories/{resource_class}": {
        "GET": E("inventories:get_inventory", INV + ":show"),
        "PUT": E("inventories:update_inventory", INV + ":update", body="inventories:BASE_INVENTORY_SCHEMA"),
        "DELETE": E("inventories:delete_inventory", INV + ":delete", ok="204"),
    },
    "/resource_providers/{uuid}/usages": {
        "GET": E("usages:list_usages", RP + ":usages"),
    },
    "/resource_providers/{uuid}/aggregates": {
        "GET": E("aggregates:get_aggregates", RP + ":aggregates:list", "1.1"),
        "PUT": E("aggregates:set_aggregates", RP + ":aggregates:update", "1.1", body="aggregates:SET_BODY"),
    },
    "/resource_providers/{uuid}/allocations": {
        "GET": E("allocations:list_for_resource_provider", RP + ":allocations:list"),
    },
    "/resource_providers/{uuid}/traits": {
        "GET": E("traits:list_traits_for_resource_provider", RP + ":traits:list", "1.6"),
        "PUT": E("traits:update_traits_for_resource_provider", RP + ":traits:update", "1.6",
                 body="traits:SET_PROVIDER_TRAITS"),
        "DELETE": E("traits:delete_traits_for_resource_provider", RP + ":traits:delete", "1.6", ok="204"),
    },
    "/resource_classes": {
        "GET": E("resource_classes:list_resource_classes", "placement:resource_classes:list", "1.2"),
        "POST": E("resource_classes:create_resource_class", "placement:resource_classes:create", "1.2",
                  body="resource_classes:RESOURCE_CLASS_SCHEMA", ok="201"),
    },
    "/resource_classes/{name}": {
        "GET": E("resource_classes:get_resource_class", "placement:resource_classes:show", "1.2"),
        # A body (rename) from 1.2 to 1.6, none (create if missing) from 1.7:
        # the handler checks the media type.
        "PUT": E("resource_classes:update_resource_class", "placement:resource_classes:update", "1.2",
                 body="resource_classes:UPDATE_BODY", json_required=False,
                 ok="1.2: 200 json; 1.7: 201, 204"),
        "DELETE": E("resource_classes:delete_resource_class", "placement:resource_classes:delete", "1.2",
                    ok="204"),
    },
    "/traits": {
        "GET": E("traits:list_traits", "placement:traits:list", "1.6", query="traits:LIST_TRAITS_QUERY"),
    },
    "/traits/{name}": {
        "GET": E("traits:get_trait", "placement:traits:show", "1.6", ok="204"),
        "PUT": E("traits:put_trait", "placement:traits:update", "1.6", ok="201, 204"),
        "DELETE": E("traits:delete_trait", "placement:traits:delete", "1.6", ok="204"),
    },
    "/allocations": {
        "POST": E("allocations:set_allocations", "placement:allocations:manage", "1.13",
                  body="allocations:POST_SCHEMAS", ok="204"),
    },
    "/allocations/{consumer_uuid}": {
        "GET": E("allocations:list_for_consumer", "placement:allocations:list"),
        "PUT": E("allocations:set_allocations_for_consumer", "placement:allocations:update",
                 body="allocations:PUT_SCHEMAS", ok="204"),
        "DELETE": E("allocations:delete_allocations", "placement:allocations:delete", ok="204"),
    },
    "/allocation_candidates": {
        "GET": E("allocation_candidates:list_allocation_candidates",
                 "placement:allocation_candidates:list", "1.10", query="allocation_candidates:QUERY"),
    },
    "/usages": {
        "GET": E("usages:get_total_usages", "placement:usages", "1.9", query="usages:TOTAL_USAGES_QUERY"),
    },
    "/reshaper": {
        "POST": E("reshaper:reshape", "placement:reshaper:reshape", "1.30", body="reshaper:SCHEMAS", ok="204"),
    },
}

# Allotment's own routes, outside Placement's URL space: under OWN_PREFIX,
# except /metrics where Prometheus scrapers look.  A policy rule, or None
# for public; versioned=False where the microversion does not matter.
OWN_ROUTES: dict[str, dict[str, Endpoint]] = {
    OWN_PREFIX + "openapi.json": {
        "GET": E("openapi:serve_document", None, query="openapi:DOCUMENT_QUERY", versioned=False),
    },
    # The query of GET /allocation_candidates, read at the request's microversion.
    OWN_PREFIX + "explain": {
        "GET": E("explain:explain", "allotment:explain", query="allocation_candidates:QUERY"),
    },
    # The capacity view: 404 unless [allotment] ui is on (api/ui.py, api/capacity.py).
    # The page and its two files are public (they hold no data; the page asks
    # for a token), the JSON needs allotment:capacity.
    **{OWN_PREFIX + "ui" + name: {
        "GET": E(f"ui:{handler}", None, produces_json=False, ok="200", versioned=False),
    } for name, handler in (("", "page"), ("/app.js", "script"), ("/app.css", "stylesheet"))},
    OWN_PREFIX + "capacity": {
        "GET": E("capacity:overview", "allotment:capacity", query="capacity:OVERVIEW_QUERY", versioned=False),
    },
    OWN_PREFIX + "capacity/trees": {
        "GET": E("capacity:trees", "allotment:capacity", query="capacity:TREES_QUERY", versioned=False),
    },
    OWN_PREFIX + "capacity/providers": {
        "GET": E("capacity:provider_names", "allotment:capacity", query="capacity:NAMES_QUERY", versioned=False),
    },
    OWN_PREFIX + "capacity/providers/{uuid}": {
        "GET": E("capacity:provider", "allotment:capacity", query="capacity:NO_QUERY", versioned=False),
    },
    OWN_PREFIX + "capacity/projects": {
        "GET": E("capacity:projects", "allotment:capacity", query="capacity:NO_QUERY", versioned=False),
    },
    # 404 unless [allotment] metrics is on (see api/metrics.py).
    "/metrics": {
        "GET": E("metrics:scrape", "allotment:metrics", produces_json=False, ok="200", versioned=False),
    },
}
