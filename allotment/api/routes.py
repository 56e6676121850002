"""The route table: every URL, method, handler, policy rule and version.

This is the place to look for "where is ``PUT /allocations``": each entry
names the handler (``module:function`` inside ``allotment.api``), the
policy rule checked before it runs, and the microversion the method
appeared in.  The dispatcher applies these declarations uniformly, so
handlers contain no boilerplate for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from allotment.api.microversion import Version


@dataclass(frozen=True)
class Endpoint:
    handler: str                 # "module:function" inside allotment.api
    policy: str | None           # checked before the handler; None: public
    min_version: Version = Version(1, 0)
    accepts_json: bool = False   # request body must be application/json (else 415)
    produces_json: bool = True   # Accept must allow application/json (else 406)
    too_old_status: int = 404    # answer to a request below min_version


def E(handler: str, policy: str | None, since: str = "1.0", *, body: bool = False,
      produces_json: bool = True, too_old: int = 404) -> Endpoint:
    major, minor = since.split(".")
    return Endpoint(handler, policy, Version(int(major), int(minor)), body, produces_json, too_old)


RP = "placement:resource_providers"
INV = RP + ":inventories"

# path template -> {method: Endpoint}
ROUTES: dict[str, dict[str, Endpoint]] = {
    "/": {
        "GET": E("root:home", None),
    },
    "/resource_providers": {
        "GET": E("resource_providers:list_resource_providers", RP + ":list"),
        "POST": E("resource_providers:create_resource_provider", RP + ":create", body=True),
    },
    "/resource_providers/{uuid}": {
        "GET": E("resource_providers:get_resource_provider", RP + ":show"),
        "PUT": E("resource_providers:update_resource_provider", RP + ":update", body=True),
        "DELETE": E("resource_providers:delete_resource_provider", RP + ":delete"),
    },
    "/resource_providers/{uuid}/inventories": {
        "GET": E("inventories:get_inventories", INV + ":list"),
        "POST": E("inventories:create_inventory", INV + ":create", body=True),
        "PUT": E("inventories:set_inventories", INV + ":update", body=True),
        # Placement answers 405 (not 404) to this method before 1.5.
        "DELETE": E("inventories:delete_inventories", INV + ":delete", "1.5", too_old=405),
    },
    "/resource_providers/{uuid}/inventories/{resource_class}": {
        "GET": E("inventories:get_inventory", INV + ":show"),
        "PUT": E("inventories:update_inventory", INV + ":update", body=True),
        "DELETE": E("inventories:delete_inventory", INV + ":delete"),
    },
    "/resource_providers/{uuid}/usages": {
        "GET": E("usages:list_usages", RP + ":usages"),
    },
    "/resource_providers/{uuid}/aggregates": {
        "GET": E("aggregates:get_aggregates", RP + ":aggregates:list", "1.1"),
        "PUT": E("aggregates:set_aggregates", RP + ":aggregates:update", "1.1", body=True),
    },
    "/resource_providers/{uuid}/allocations": {
        "GET": E("allocations:list_for_resource_provider", RP + ":allocations:list"),
    },
    "/resource_providers/{uuid}/traits": {
        "GET": E("traits:list_traits_for_resource_provider", RP + ":traits:list", "1.6"),
        "PUT": E("traits:update_traits_for_resource_provider", RP + ":traits:update", "1.6", body=True),
        "DELETE": E("traits:delete_traits_for_resource_provider", RP + ":traits:delete", "1.6"),
    },
    "/resource_classes": {
        "GET": E("resource_classes:list_resource_classes", "placement:resource_classes:list", "1.2"),
        "POST": E("resource_classes:create_resource_class", "placement:resource_classes:create", "1.2",
                  body=True),
    },
    "/resource_classes/{name}": {
        "GET": E("resource_classes:get_resource_class", "placement:resource_classes:show", "1.2"),
        # The body requirement depends on the version (1.2-1.6 body, 1.7+ none):
        # the handler checks it.
        "PUT": E("resource_classes:update_resource_class", "placement:resource_classes:update", "1.2"),
        "DELETE": E("resource_classes:delete_resource_class", "placement:resource_classes:delete", "1.2"),
    },
    "/traits": {
        "GET": E("traits:list_traits", "placement:traits:list", "1.6"),
    },
    "/traits/{name}": {
        "GET": E("traits:get_trait", "placement:traits:show", "1.6"),
        "PUT": E("traits:put_trait", "placement:traits:update", "1.6"),
        "DELETE": E("traits:delete_trait", "placement:traits:delete", "1.6"),
    },
    "/allocations": {
        "POST": E("allocations:set_allocations", "placement:allocations:manage", "1.13", body=True),
    },
    "/allocations/{consumer_uuid}": {
        "GET": E("allocations:list_for_consumer", "placement:allocations:list"),
        "PUT": E("allocations:set_allocations_for_consumer", "placement:allocations:update", body=True),
        "DELETE": E("allocations:delete_allocations", "placement:allocations:delete"),
    },
    "/allocation_candidates": {
        "GET": E("allocation_candidates:list_allocation_candidates",
                 "placement:allocation_candidates:list", "1.10"),
    },
    "/usages": {
        "GET": E("usages:get_total_usages", "placement:usages", "1.9"),
    },
    "/reshaper": {
        "POST": E("reshaper:reshape", "placement:reshaper:reshape", "1.30", body=True),
    },
    # Allotment's own routes, outside Placement's URL space.
    "/allotment/explain": {
        "GET": E("explain:explain", "allotment:explain"),
    },
    # 404 unless [allotment] metrics is on (see api/metrics.py).
    "/metrics": {
        "GET": E("metrics:scrape", "allotment:metrics", produces_json=False),
    },
}
