"""/resource_providers/{uuid}/inventories: a provider's inventory over HTTP.

Each write is one transaction: read the provider, check the client's
generation, change the rows, bump the generation (compare-and-swap).  The
checks run in Placement's order — provider exists (404), body valid (400),
generation current (409), capacity left (400), classes known, nothing in
use — and every error carries Placement's wording and code, because
clients (nova's report client above all) match on them.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any, Callable, TypeVar

import webob
from sqlalchemy.engine import Connection

from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_body, json_response, latest, no_content
from allotment.db import inventories as db
from allotment.db.engine import utcnow
from allotment.domain import inventory_fit
from allotment.domain import errors as domain
from allotment.domain.inventories import (
    FIELDS,
    PROVIDER_CHANGED,
    Inventory,
    InventoryNotFound,
    ResourceClassNotFound,
    check_capacity,
)

T = TypeVar("T")

# -- JSON schemas (the structure shapes jsonschema's messages: keep it) ----

RC_PATTERN = "^[A-Z0-9_]+$"
# The largest single-precision float: the column's limit on MySQL.  Placement
# bounds allocation_ratio above by it; Allotment bounds it below too, on every
# backend, so a record that MySQL cannot store (Placement's 500 there) is
# refused alike everywhere, and `allotment db copy` never meets one.
SQL_SP_FLOAT_MAX = 3.40282e+38


def _bounded_int(minimum: int) -> dict:
    return {"type": "integer", "maximum": inventory_fit.MAX_INT, "minimum": minimum}


BASE_INVENTORY_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "total": _bounded_int(1),
        "reserved": _bounded_int(0),
        "min_unit": _bounded_int(1),
        "max_unit": _bounded_int(1),
        "step_size": _bounded_int(1),
        "allocation_ratio": {"type": "number", "maximum": SQL_SP_FLOAT_MAX, "minimum": -SQL_SP_FLOAT_MAX},
    },
    "required": ["total", "resource_provider_generation"],
    "additionalProperties": False,
}

POST_INVENTORY_SCHEMA = copy.deepcopy(BASE_INVENTORY_SCHEMA)
POST_INVENTORY_SCHEMA["properties"]["resource_class"] = {"type": "string", "pattern": RC_PATTERN}
POST_INVENTORY_SCHEMA["required"] = ["total", "resource_class"]

PUT_INVENTORY_RECORD_SCHEMA = copy.deepcopy(BASE_INVENTORY_SCHEMA)
PUT_INVENTORY_RECORD_SCHEMA["required"] = ["total"]

# A key that is not a class name is not checked by Placement's schema: its
# record goes through the capacity check and then the key is refused as an
# unknown class (400).  Extra fields and out-of-range numbers pass, as there;
# what Placement would trip over (not an object, no total, a number that is
# not a number: its 500) is still a schema error here.
UNKNOWN_CLASS_RECORD_SCHEMA: dict = {
    "type": "object",
    "properties": {name: {"type": "number"} for name in FIELDS},
    "required": ["total"],
}

PUT_INVENTORIES_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "inventories": {
            "type": "object",
            "patternProperties": {RC_PATTERN: PUT_INVENTORY_RECORD_SCHEMA},
            "additionalProperties": UNKNOWN_CLASS_RECORD_SCHEMA,
        },
    },
    "required": ["resource_provider_generation", "inventories"],
    "additionalProperties": False,
}


# -- helpers --------------------------------------------------------------


def _no_provider(uuid: str) -> domain.NotFound:
    return domain.NotFound(f"No resource provider with uuid {uuid} found")


def _provider(conn: Connection, uuid: str) -> db.Provider:
    provider = db.get_provider(conn, uuid)
    if provider is None:
        raise _no_provider(uuid)
    return provider


def _readable_provider(conn: Connection, uuid: str) -> db.Provider:
    """The provider for GET, with the doubled message Placement's readers give."""
    provider = db.get_provider(conn, uuid)
    if provider is None:
        message = _no_provider(uuid).message
        raise domain.NotFound(f"{message} : {message}")
    return provider


def _body(req: Request) -> Any:
    """The validated body; a missing provider is reported before a bad body."""
    try:
        return json_body(req)
    except HTTPError:
        with req.app.db.read() as conn:
            _provider(conn, req.urlvars["uuid"])
        raise


def _write(req: Request, work: Callable[[Connection], T]) -> T:
    return req.app.db.run_write(work)


def _check_generation(provider: db.Provider, given: int) -> None:
    if given != provider.generation:
        raise domain.ConcurrentUpdate("resource provider generation conflict")


def _check_capacity(req: Request, inventories: list[Inventory], provider_uuid: str) -> None:
    check_capacity(inventories, provider_uuid, reserved_may_equal_total=req.version >= (1, 26))


def _one(inventory: Inventory, generation: int) -> dict:
    body = inventory.fields()
    if generation:  # Placement leaves a zero generation out of this body
        body["resource_provider_generation"] = generation
    return body


def _many(inventories: list[Inventory], generation: int) -> dict:
    return {
        "resource_provider_generation": generation,
        "inventories": {inv.resource_class: inv.fields() for inv in inventories},
    }


def _inventory_url(req: Request, uuid: str, resource_class: str) -> str:
    return f"{req.script_name}/resource_providers/{uuid}/inventories/{resource_class}"


# -- handlers -------------------------------------------------------------


def get_inventories(req: Request) -> webob.Response:
    """GET /resource_providers/{uuid}/inventories"""
    with req.app.db.read() as conn:
        provider = _readable_provider(conn, req.urlvars["uuid"])
        inventories = db.list_inventories(conn, provider.id)
    return _many_response(req, inventories, provider.generation,
                          latest(*(inv.last_modified for inv in inventories)))


def _many_response(req: Request, inventories: list[Inventory], generation: int,
                   last_modified: datetime.datetime | None) -> webob.Response:
    """A provider's inventories; Placement sends no Last-Modified when there are none
    (Cache-Control it still sends)."""
    response = json_response(req, _many(inventories, generation), last_modified=last_modified)
    if not inventories:
        response.headers.pop("Last-Modified", None)
    return response


def get_inventory(req: Request) -> webob.Response:
    """GET /resource_providers/{uuid}/inventories/{resource_class}"""
    uuid, resource_class = req.urlvars["uuid"], req.urlvars["resource_class"]
    with req.app.db.read() as conn:
        provider = _readable_provider(conn, uuid)
        inventory = db.get_inventory(conn, provider.id, resource_class)
    if inventory is None:
        raise domain.NotFound(f"No inventory of class {resource_class} for {uuid}")
    return json_response(req, _one(inventory, provider.generation),
                         last_modified=inventory.last_modified)


def create_inventory(req: Request) -> webob.Response:
    """POST /resource_providers/{uuid}/inventories: add one class (201)."""
    uuid = req.urlvars["uuid"]
    data = _body(req)
    inventory = Inventory.from_fields(data["resource_class"], data)

    def work(conn: Connection) -> int:
        provider = _provider(conn, uuid)
        failure = f"Unable to create inventory for resource provider {provider.uuid}"
        try:
            _check_capacity(req, [inventory], provider.uuid)
            return db.add_inventory(conn, provider, inventory)
        except domain.ConcurrentUpdate as error:
            raise domain.ConcurrentUpdate(f"Update conflict: {_reason(error)}") from None
        except (domain.BadRequest, ResourceClassNotFound) as error:
            raise domain.BadRequest(f"{failure}: {error.message}") from None

    generation = _write(req, work)
    location = _inventory_url(req, uuid, inventory.resource_class)
    return json_response(req, _one(inventory, generation), 201, last_modified=utcnow(),
                         headers={"Location": location})


def update_inventory(req: Request) -> webob.Response:
    """PUT /resource_providers/{uuid}/inventories/{resource_class}"""
    uuid, resource_class = req.urlvars["uuid"], req.urlvars["resource_class"]
    data = _body(req)
    inventory = Inventory.from_fields(resource_class, data)

    def work(conn: Connection) -> int:
        provider = _provider(conn, uuid)
        _check_generation(provider, data["resource_provider_generation"])
        failure = f"for resource provider {provider.uuid}"
        try:
            _check_capacity(req, [inventory], provider.uuid)
            return db.update_inventory(conn, provider, provider.generation, inventory)
        except domain.ConcurrentUpdate as error:
            raise domain.ConcurrentUpdate(f"update conflict: {_reason(error)}") from None
        except InventoryNotFound as error:
            raise domain.BadRequest(
                f"No inventory record with resource class {failure}: {error.message}") from None
        except domain.BadRequest as error:
            raise domain.BadRequest(f"Unable to update inventory {failure}: {error.message}") from None

    generation = _write(req, work)
    return json_response(req, _one(inventory, generation), last_modified=utcnow())


def set_inventories(req: Request) -> webob.Response:
    """PUT /resource_providers/{uuid}/inventories: replace the whole set."""
    uuid = req.urlvars["uuid"]
    data = _body(req)
    inventories = [Inventory.from_fields(name, fields) for name, fields in data["inventories"].items()]

    def work(conn: Connection) -> int:
        provider = _provider(conn, uuid)
        _check_generation(provider, data["resource_provider_generation"])
        failure = f"for resource provider {provider.uuid}"
        try:
            _check_capacity(req, inventories, provider.uuid)
            return db.replace_inventories(
                conn, provider.id, provider.generation,
                {inv.resource_class: inv for inv in inventories}, provider_uuid=provider.uuid)
        except ResourceClassNotFound as error:
            raise domain.BadRequest(
                f"Unknown resource class in inventory {failure}: {error.message}") from None
        except domain.InventoryInUse as error:
            raise domain.InventoryInUse(f"update conflict: {error.message}") from None
        except domain.ConcurrentUpdate as error:
            raise domain.ConcurrentUpdate(f"update conflict: {_reason(error)}") from None
        except domain.BadRequest as error:
            raise domain.BadRequest(f"Unable to update inventory {failure}: {error.message}") from None

    generation = _write(req, work)
    return _many_response(req, inventories, generation, utcnow())


def delete_inventory(req: Request) -> webob.Response:
    """DELETE /resource_providers/{uuid}/inventories/{resource_class}"""
    uuid, resource_class = req.urlvars["uuid"], req.urlvars["resource_class"]

    def work(conn: Connection) -> int:
        provider = _provider(conn, uuid)
        try:
            return db.delete_inventory(conn, provider, resource_class)
        except (domain.ConcurrentUpdate, domain.InventoryInUse) as error:
            # Placement reports an in-use class here with the concurrent-update code.
            raise domain.ConcurrentUpdate(
                f"Unable to delete inventory of class {resource_class}: {_reason(error)}") from None
        except (InventoryNotFound, ResourceClassNotFound) as error:
            reason = error.message
            if isinstance(error, InventoryNotFound):
                reason = f"No inventory of class {resource_class} found for delete"
            raise domain.NotFound(
                f"No inventory of class {resource_class} found for delete: {reason}") from None

    _write(req, work)
    return no_content(req)


def delete_inventories(req: Request) -> webob.Response:
    """DELETE /resource_providers/{uuid}/inventories (1.5): remove every class."""
    uuid = req.urlvars["uuid"]

    def work(conn: Connection) -> int:
        provider = _provider(conn, uuid)
        try:
            return db.replace_inventories(conn, provider.id, provider.generation, {},
                                          provider_uuid=provider.uuid)
        except domain.ConcurrentUpdate:
            raise domain.ConcurrentUpdate(
                f"Unable to delete inventory for resource provider {provider.uuid} because the "
                "inventory was updated by another process. Please retry your request.") from None

    _write(req, work)
    return no_content(req)


def _reason(error: domain.PlacementError) -> str:
    """The inner sentence of a conflict: Placement's, for a lost generation swap."""
    if type(error) is domain.ConcurrentUpdate:
        return PROVIDER_CHANGED
    return error.message
