"""The route table: every URL, method, handler, policy rule, schema and version.

This is the place to look for "where is ``PUT /allocations``": each
:class:`~allotment.api.endpoint.Endpoint` names the handler function, the
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

from allotment.api import (
    aggregates,
    allocation_candidates,
    allocations,
    capacity_view,
    explain,
    inventories,
    metrics,
    openapi,
    reshaper,
    resource_classes,
    resource_providers,
    root,
    traits,
    ui,
    usages,
)
from allotment.api.endpoint import OWN_PREFIX, Answer, Endpoint, RouteTable
from allotment.api.microversion import Version

#: The prefixes of the policy rules of providers and of their inventories.
PROVIDER_RULES = "placement:resource_providers"
INVENTORY_RULES = PROVIDER_RULES + ":inventories"

# path template -> {method: Endpoint}
ROUTES: dict[str, dict[str, Endpoint]] = {
    "/": {
        "GET": Endpoint(root.home, None, checks_accept=False),
    },
    "/resource_providers": {
        "GET": Endpoint(resource_providers.list_resource_providers, PROVIDER_RULES + ":list",
                        query=resource_providers.LIST_QUERY),
        "POST": Endpoint(resource_providers.create_resource_provider, PROVIDER_RULES + ":create",
                         body=resource_providers.CREATE_BODY,
                         answers=(Answer(201), Answer(200, json=True, since=Version(1, 20)))),
    },
    "/resource_providers/{uuid}": {
        # Methods in the order a 405's Allow header lists them, as Placement's.
        "GET": Endpoint(resource_providers.get_resource_provider, PROVIDER_RULES + ":show"),
        "DELETE": Endpoint(resource_providers.delete_resource_provider, PROVIDER_RULES + ":delete",
                           answers=(Answer(204),)),
        "PUT": Endpoint(resource_providers.update_resource_provider, PROVIDER_RULES + ":update",
                        body=resource_providers.UPDATE_BODY),
    },
    "/resource_providers/{uuid}/inventories": {
        "GET": Endpoint(inventories.get_inventories, INVENTORY_RULES + ":list"),
        "POST": Endpoint(inventories.create_inventory, INVENTORY_RULES + ":create",
                         body=inventories.POST_INVENTORY_SCHEMA, answers=(Answer(201, json=True),)),
        "PUT": Endpoint(inventories.set_inventories, INVENTORY_RULES + ":update",
                        body=inventories.PUT_INVENTORIES_SCHEMA),
        # Placement answers 405 (not 404) to this method before 1.5.
        "DELETE": Endpoint(inventories.delete_inventories, INVENTORY_RULES + ":delete", min_version=Version(1, 5),
                           answers=(Answer(204),), too_old_status=405),
    },
    "/resource_providers/{uuid}/inventories/{resource_class}": {
        "GET": Endpoint(inventories.get_inventory, INVENTORY_RULES + ":show"),
        "PUT": Endpoint(inventories.update_inventory, INVENTORY_RULES + ":update",
                        body=inventories.BASE_INVENTORY_SCHEMA),
        "DELETE": Endpoint(inventories.delete_inventory, INVENTORY_RULES + ":delete", answers=(Answer(204),)),
    },
    "/resource_providers/{uuid}/usages": {
        "GET": Endpoint(usages.list_usages, PROVIDER_RULES + ":usages"),
    },
    "/resource_providers/{uuid}/aggregates": {
        "GET": Endpoint(aggregates.get_aggregates, PROVIDER_RULES + ":aggregates:list", min_version=Version(1, 1)),
        "PUT": Endpoint(aggregates.set_aggregates, PROVIDER_RULES + ":aggregates:update", min_version=Version(1, 1),
                        body=aggregates.SET_BODY),
    },
    "/resource_providers/{uuid}/allocations": {
        "GET": Endpoint(allocations.list_for_resource_provider, PROVIDER_RULES + ":allocations:list"),
    },
    "/resource_providers/{uuid}/traits": {
        "GET": Endpoint(traits.list_traits_for_resource_provider, PROVIDER_RULES + ":traits:list",
                        min_version=Version(1, 6)),
        "PUT": Endpoint(traits.update_traits_for_resource_provider, PROVIDER_RULES + ":traits:update",
                        min_version=Version(1, 6), body=traits.SET_PROVIDER_TRAITS),
        "DELETE": Endpoint(traits.delete_traits_for_resource_provider, PROVIDER_RULES + ":traits:delete",
                           min_version=Version(1, 6), answers=(Answer(204),)),
    },
    "/resource_classes": {
        "GET": Endpoint(resource_classes.list_resource_classes, "placement:resource_classes:list",
                        min_version=Version(1, 2)),
        "POST": Endpoint(resource_classes.create_resource_class, "placement:resource_classes:create",
                         min_version=Version(1, 2), body=resource_classes.RESOURCE_CLASS_SCHEMA,
                         answers=(Answer(201),)),
    },
    "/resource_classes/{name}": {
        "GET": Endpoint(resource_classes.get_resource_class, "placement:resource_classes:show",
                        min_version=Version(1, 2)),
        # A body (rename) from 1.2 to 1.6, none (create if missing) from 1.7:
        # the handler checks the media type.
        "PUT": Endpoint(resource_classes.update_resource_class, "placement:resource_classes:update",
                        min_version=Version(1, 2), body=resource_classes.UPDATE_BODY,
                        answers=(Answer(200, json=True),
                                 Answer(201, since=Version(1, 7)), Answer(204, since=Version(1, 7))),
                        accepts_json=False),
        "DELETE": Endpoint(resource_classes.delete_resource_class, "placement:resource_classes:delete",
                           min_version=Version(1, 2), answers=(Answer(204),)),
    },
    "/traits": {
        "GET": Endpoint(traits.list_traits, "placement:traits:list", min_version=Version(1, 6),
                        query=traits.LIST_TRAITS_QUERY),
    },
    "/traits/{name}": {
        "GET": Endpoint(traits.get_trait, "placement:traits:show", min_version=Version(1, 6), answers=(Answer(204),)),
        "PUT": Endpoint(traits.put_trait, "placement:traits:update", min_version=Version(1, 6),
                        answers=(Answer(201), Answer(204))),
        "DELETE": Endpoint(traits.delete_trait, "placement:traits:delete", min_version=Version(1, 6),
                           answers=(Answer(204),)),
    },
    "/allocations": {
        "POST": Endpoint(allocations.set_allocations, "placement:allocations:manage", min_version=Version(1, 13),
                         body=allocations.POST_SCHEMAS, answers=(Answer(204),)),
    },
    "/allocations/{consumer_uuid}": {
        "GET": Endpoint(allocations.list_for_consumer, "placement:allocations:list"),
        "PUT": Endpoint(allocations.set_allocations_for_consumer, "placement:allocations:update",
                        body=allocations.PUT_SCHEMAS, answers=(Answer(204),)),
        "DELETE": Endpoint(allocations.delete_allocations, "placement:allocations:delete", answers=(Answer(204),)),
    },
    "/allocation_candidates": {
        "GET": Endpoint(allocation_candidates.list_allocation_candidates, "placement:allocation_candidates:list",
                        min_version=Version(1, 10), query=allocation_candidates.QUERY),
    },
    "/usages": {
        "GET": Endpoint(usages.get_total_usages, "placement:usages", min_version=Version(1, 9),
                        query=usages.TOTAL_USAGES_QUERY),
    },
    "/reshaper": {
        "POST": Endpoint(reshaper.reshape, "placement:reshaper:reshape", min_version=Version(1, 30),
                         body=reshaper.SCHEMAS, answers=(Answer(204),)),
    },
}

# Allotment's own routes, outside Placement's URL space: under OWN_PREFIX,
# except /metrics where Prometheus scrapers look.  A policy rule, or None
# for public; versioned=False where the microversion does not matter.
OWN_ROUTES: dict[str, dict[str, Endpoint]] = {
    OWN_PREFIX + "openapi.json": {
        "GET": Endpoint(openapi.serve_document, None, query=openapi.DOCUMENT_QUERY, versioned=False),
    },
    # The query of GET /allocation_candidates, read at the request's microversion.
    OWN_PREFIX + "explain": {
        "GET": Endpoint(explain.explain, "allotment:explain", query=allocation_candidates.QUERY),
    },
    # The capacity view: 404 unless [allotment] ui is on (api/ui.py, api/capacity_view.py).
    # The page and its two files are public (they hold no data; the page asks
    # for a token), the JSON needs allotment:capacity.
    **{OWN_PREFIX + "ui" + name: {
        "GET": Endpoint(handler, None, answers=(Answer(200),), produces_json=False, versioned=False),
    } for name, handler in (("", ui.page), ("/app.js", ui.script), ("/app.css", ui.stylesheet))},
    OWN_PREFIX + "capacity": {
        "GET": Endpoint(capacity_view.overview, "allotment:capacity", query=capacity_view.OVERVIEW_QUERY,
                        versioned=False),
    },
    OWN_PREFIX + "capacity/trees": {
        "GET": Endpoint(capacity_view.trees, "allotment:capacity", query=capacity_view.TREES_QUERY, versioned=False),
    },
    OWN_PREFIX + "capacity/providers": {
        "GET": Endpoint(capacity_view.provider_names, "allotment:capacity", query=capacity_view.NAMES_QUERY,
                        versioned=False),
    },
    OWN_PREFIX + "capacity/providers/{uuid}": {
        "GET": Endpoint(capacity_view.provider, "allotment:capacity", query=capacity_view.NO_QUERY, versioned=False),
    },
    OWN_PREFIX + "capacity/projects": {
        "GET": Endpoint(capacity_view.projects, "allotment:capacity", query=capacity_view.NO_QUERY, versioned=False),
    },
    # 404 unless [allotment] metrics is on (see api/metrics.py).
    "/metrics": {
        "GET": Endpoint(metrics.scrape, "allotment:metrics", answers=(Answer(200),), produces_json=False,
                        versioned=False),
    },
}

#: Both, for the dispatcher and the OpenAPI document.
TABLE = RouteTable(ROUTES, OWN_ROUTES)
