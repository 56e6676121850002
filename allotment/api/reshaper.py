"""POST /reshaper (1.30): move inventories and allocations in one transaction.

The body pairs two payloads clients already know: under ``inventories``,
for each provider, exactly the body of ``PUT
/resource_providers/{uuid}/inventories``; under ``allocations``, exactly
the body of ``POST /allocations`` at the same microversion (consumer
generations required; ``mappings`` accepted from 1.34; ``consumer_type``
required from 1.38), except that it may be empty.

The statuses and codes tell a client what to do next, so they are
Placement's, and so is the order of the checks (:mod:`allotment.db.reshaper`):

* 400 ``placement.resource_provider.not_found``: a provider listed under
  ``inventories`` does not exist;
* 409 ``placement.concurrent_update``: a provider or consumer changed since
  the client read it (re-read, recompute, retry);
* 400 (no code): an allocation names a provider that does not exist; new
  consumers are kept, as ``POST /allocations`` keeps them;
* 400 ``malformed reshaper data``: an unknown resource class;
* 409 (``Unable to allocate inventory``, no code): an allocation does not
  fit the inventory it draws on while both old and new records are there;
* 409 ``placement.inventory.inuse``: the final inventory leaves allocations
  on a class that no longer exists (nova's report client looks for this
  code when it reshapes).

Like Placement, the reshaper does not refuse an inventory whose reserved
amount exceeds its total (``PUT .../inventories`` does): such a record
simply has no room for allocations.
"""

from __future__ import annotations

import copy

import webob

from allotment.api import allocations as allocations_api
from allotment.api import inventories as inventories_api
from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_body, no_content
from allotment.api.microversion import Versioned
from allotment.db import allocations as allocations_db
from allotment.db import reshaper as db
from allotment.domain import errors as domain
from allotment.domain.inventories import Inventory

# -- JSON schemas ---------------------------------------------------------


def _schema(post_allocations: dict) -> dict:
    """The reshaper body around one version of the POST /allocations schema."""
    allocations = copy.deepcopy(post_allocations)
    # Nothing may be left to allocate (an inventory moves, its consumers are gone).
    allocations["minProperties"] = 0
    return {
        "type": "object",
        "properties": {
            "inventories": {
                "type": "object",
                "patternProperties": {
                    allocations_api.UUID_PATTERN: inventories_api.PUT_INVENTORIES_SCHEMA,
                },
                # Without an inventory there is nothing to reshape.
                "minProperties": 1,
                "additionalProperties": False,
            },
            "allocations": allocations,
        },
        "required": ["inventories", "allocations"],
        "additionalProperties": False,
    }


RESHAPER_SCHEMA_V1_30 = _schema(allocations_api.POST_SCHEMA_V1_28)
RESHAPER_SCHEMA_V1_34 = _schema(allocations_api.POST_SCHEMA_V1_34)
RESHAPER_SCHEMA_V1_38 = _schema(allocations_api.POST_SCHEMA_V1_38)

SCHEMAS = Versioned({"1.30": RESHAPER_SCHEMA_V1_30, "1.34": RESHAPER_SCHEMA_V1_34,
                     "1.38": RESHAPER_SCHEMA_V1_38})


# -- request → domain -----------------------------------------------------


def _inventories(data: dict) -> list[db.ProviderInventories]:
    """The providers' new inventories, in body order (the order of the checks)."""
    return [db.ProviderInventories(uuid, entry["resource_provider_generation"],
                                   {name: Inventory.from_fields(name, fields)
                                    for name, fields in entry["inventories"].items()})
            for uuid, entry in data.items()]


# -- handler --------------------------------------------------------------


def reshape(req: Request) -> webob.Response:
    """POST /reshaper: 204, or the error that says whether to re-read first."""
    data = json_body(req)
    inventories = _inventories(data["inventories"])
    # The consumers' new allocations, read exactly as POST /allocations reads them.
    allocations = allocations_api.consumers_allocations(req, data["allocations"])
    owner = allocations_api.incomplete_owner(req)

    def work(conn) -> None:
        db.reshape(conn, inventories, allocations, incomplete_owner=owner)

    try:
        # Only conflicts of our own making are re-run: every generation the
        # client gave is checked again by the re-run.
        req.app.db.run_write(work, retry_on=allocations_db.RETRY_ON,
                             retries=req.app.conf.placement.allocation_conflict_retry_count)
    except db.ProviderNotFound as error:
        raise HTTPError(400, f"Resource provider {error.uuid} in inventories not found: {error.message}",
                        code=domain.RESOURCE_PROVIDER_NOT_FOUND) from None
    except allocations_db.AllocationNamesUnknownProvider:
        allocations_api.keep_new_consumers(req, allocations)
        raise
    except (db.ProviderGenerationMismatch, allocations_db.ConsumerGenerationConflict):
        raise
    except domain.ConcurrentUpdate as error:
        raise HTTPError(409, f"update conflict: {error.message}", code=domain.CONCURRENT_UPDATE) from None
    except domain.InventoryInUse as error:
        raise HTTPError(409, f"update conflict: {error.message}", code=domain.INVENTORY_INUSE) from None
    except allocations_db.InvalidInventory as error:
        raise HTTPError(409, f"Unable to allocate inventory: {error.message}") from None
    except (allocations_db.AllocationNamesUnknownClass, domain.NotFound) as error:
        raise HTTPError(400, f"malformed reshaper data: {error.message}") from None
    return no_content(req)
