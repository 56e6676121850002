"""Domain errors and Placement's machine-readable error codes.

Every layer raises these; the API layer maps each class to one HTTP status
in a single place (``allotment.api.errors``), so handlers never translate
exceptions by hand.  ``code`` is the value clients see in ``errors[].code``
from microversion 1.23.
"""

from __future__ import annotations

# Placement's published error codes.
DEFAULT = "placement.undefined_code"
INVENTORY_INUSE = "placement.inventory.inuse"
CONCURRENT_UPDATE = "placement.concurrent_update"
DUPLICATE_NAME = "placement.duplicate_name"
PROVIDER_IN_USE = "placement.resource_provider.inuse"
PROVIDER_CANNOT_DELETE_PARENT = "placement.resource_provider.cannot_delete_parent"
RESOURCE_PROVIDER_NOT_FOUND = "placement.resource_provider.not_found"
ILLEGAL_DUPLICATE_QUERYPARAM = "placement.query.duplicate_key"
QUERYPARAM_BAD_VALUE = "placement.query.bad_value"
QUERYPARAM_MISSING_VALUE = "placement.query.missing_value"


class PlacementError(Exception):
    """Base class: a message meant for the client, and an optional code."""

    status = 500
    default_code = DEFAULT

    def __init__(self, message: str = "", code: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code


class BadRequest(PlacementError):
    status = 400


class Forbidden(PlacementError):
    status = 403


class NotFound(PlacementError):
    status = 404


class Conflict(PlacementError):
    status = 409


class ConcurrentUpdate(Conflict):
    """A generation compare-and-swap lost against another writer."""

    default_code = CONCURRENT_UPDATE


class InventoryInUse(Conflict):
    default_code = INVENTORY_INUSE


class DuplicateName(Conflict):
    default_code = DUPLICATE_NAME
