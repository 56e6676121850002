"""/allocations and /resource_providers/{uuid}/allocations over HTTP.

What changes with the microversion (requests):

* before 1.8: ``PUT`` takes a list of ``{resource_provider: {uuid}, resources}``
  and no owner; the consumer gets the configured incomplete project/user;
* 1.8: ``project_id`` and ``user_id`` are required;
* 1.12: the list becomes a dict keyed by provider uuid (as ``GET`` shows it);
* 1.13: ``POST /allocations`` writes several consumers in one transaction,
  and may empty a consumer with ``allocations: {}``;
* 1.28: ``consumer_generation`` is required (``null`` for a consumer the
  caller believes new) and ``PUT`` may empty a consumer too;
* 1.34: ``mappings`` (request group -> providers) is accepted, and ignored;
* 1.38: ``consumer_type`` is required.

and in responses: 1.12 adds ``project_id``/``user_id`` to ``GET
/allocations/{c}``, 1.28 the consumer generation (also per consumer under a
provider), 1.38 the consumer type ("unknown" when it has none).

Every write is one transaction (``db.allocations.write_allocations``),
re-run on the provider conflicts it caused itself up to ``[placement]
allocation_conflict_retry_count`` times.  Errors carry Placement's texts.
"""

from __future__ import annotations

import copy
import logging
import uuid as uuidlib
from typing import Any, Callable, Sequence

import webob

from allotment.api.errors import HTTPError
from allotment.api.http import Request, json_body, json_response, no_content
from allotment.api.microversion import Versioned
from allotment.db import allocations as db
from allotment.db.engine import CommitOutcomeUnknown
from allotment.domain import errors as domain

LOG = logging.getLogger(__name__)

# -- JSON schemas (their structure shapes jsonschema's messages: keep it) --

RC_PATTERN = "^[A-Z0-9_]+$"
UUID_PATTERN = "^[0-9a-fA-F-]{36}$"
GROUP_PATTERN = "[a-zA-Z0-9_-]{1,64}"
OWNER_ID = {"type": "string", "minLength": 1, "maxLength": 255}

_RESOURCES = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {RC_PATTERN: {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}

# Before 1.12: a list of provider entries.
PUT_SCHEMA_V1_0: dict = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "resource_provider": {
                        "type": "object",
                        "properties": {"uuid": {"type": "string", "format": "uuid"}},
                        "additionalProperties": False,
                        "required": ["uuid"],
                    },
                    "resources": _RESOURCES,
                },
                "required": ["resource_provider", "resources"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["allocations"],
    "additionalProperties": False,
}

PUT_SCHEMA_V1_8 = copy.deepcopy(PUT_SCHEMA_V1_0)
PUT_SCHEMA_V1_8["properties"].update(project_id=OWNER_ID, user_id=OWNER_ID)
PUT_SCHEMA_V1_8["required"] += ["project_id", "user_id"]

# From 1.12: a dict keyed by provider uuid, the shape GET returns.
PUT_SCHEMA_V1_12: dict = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "object",
            "minProperties": 1,
            "patternProperties": {
                UUID_PATTERN: {
                    "type": "object",
                    "properties": {
                        "generation": {"type": "integer"},  # as GET shows it; ignored
                        "resources": _RESOURCES,
                    },
                    "required": ["resources"],
                    "additionalProperties": False,
                },
            },
            "additionalProperties": False,
        },
        "project_id": OWNER_ID,
        "user_id": OWNER_ID,
    },
    "additionalProperties": False,
    "required": ["allocations", "project_id", "user_id"],
}

# One consumer's entry in POST /allocations: may be empty (remove them all).
_EMPTIABLE = copy.deepcopy(PUT_SCHEMA_V1_12)
_EMPTIABLE["properties"]["allocations"]["minProperties"] = 0


def _post(entry: dict) -> dict:
    return {"type": "object", "minProperties": 1, "additionalProperties": False,
            "patternProperties": {UUID_PATTERN: entry}}


POST_SCHEMA_V1_13 = _post(_EMPTIABLE)

_GENERATION = {"type": ["integer", "null"], "additionalProperties": False}
PUT_SCHEMA_V1_28 = copy.deepcopy(_EMPTIABLE)
PUT_SCHEMA_V1_28["properties"]["consumer_generation"] = _GENERATION
PUT_SCHEMA_V1_28["required"].append("consumer_generation")
POST_SCHEMA_V1_28 = _post(PUT_SCHEMA_V1_28)

_MAPPINGS = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {
        GROUP_PATTERN: {"type": "array", "minItems": 1, "items": {"type": "string", "format": "uuid"}},
    },
}
PUT_SCHEMA_V1_34 = copy.deepcopy(PUT_SCHEMA_V1_28)
PUT_SCHEMA_V1_34["properties"]["mappings"] = _MAPPINGS
POST_SCHEMA_V1_34 = _post(PUT_SCHEMA_V1_34)

PUT_SCHEMA_V1_38 = copy.deepcopy(PUT_SCHEMA_V1_34)
PUT_SCHEMA_V1_38["properties"]["consumer_type"] = {
    "type": "string", "pattern": RC_PATTERN, "minLength": 1, "maxLength": 255,
}
PUT_SCHEMA_V1_38["required"].append("consumer_type")
POST_SCHEMA_V1_38 = _post(PUT_SCHEMA_V1_38)

PUT_SCHEMAS = Versioned({"1.0": PUT_SCHEMA_V1_0, "1.8": PUT_SCHEMA_V1_8, "1.12": PUT_SCHEMA_V1_12,
                         "1.28": PUT_SCHEMA_V1_28, "1.34": PUT_SCHEMA_V1_34, "1.38": PUT_SCHEMA_V1_38})
POST_SCHEMAS = Versioned({"1.13": POST_SCHEMA_V1_13, "1.28": POST_SCHEMA_V1_28, "1.34": POST_SCHEMA_V1_34,
                          "1.38": POST_SCHEMA_V1_38})


# -- reading ----------------------------------------------------------------


def _consumer_uuid(value: str) -> str:
    """The canonical (dashed, lower-case) form of a consumer uuid; 400 if it is none."""
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise HTTPError(400, f"Malformed consumer_uuid: {value}") from None


def _canonical_or_raw(value: str) -> str:
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        return value


def list_for_consumer(req: Request) -> webob.Response:
    """GET /allocations/{consumer_uuid}: never 404, an unknown consumer has none."""
    consumer = _canonical_or_raw(req.urlvars["consumer_uuid"])
    with req.app.db.read() as conn:
        view = db.for_consumer(conn, consumer)
    body: dict[str, Any] = {"allocations": view.allocations if view else {}}
    if view is not None and req.version >= (1, 12):
        project, user = view.project, view.user
        if not view.has_record:
            project, user = incomplete_owner(req)
        body["project_id"] = project
        body["user_id"] = user
        if req.version >= (1, 28):
            body["consumer_generation"] = view.generation
        if req.version >= (1, 38):
            body["consumer_type"] = view.consumer_type or db.consumers.UNKNOWN_TYPE
    return json_response(req, body, last_modified=view.last_modified if view else None)


def list_for_resource_provider(req: Request) -> webob.Response:
    """GET /resource_providers/{uuid}/allocations: allocations keyed by consumer."""
    uuid = req.urlvars["uuid"]
    with req.app.db.read() as conn:
        view = db.for_provider(conn, uuid)
    if view is None:
        raise HTTPError(404, f"Resource provider '{uuid}' not found: "
                             f"No resource provider with uuid {uuid} found")
    allocations = view.allocations
    if req.version >= (1, 28):
        for consumer, entry in allocations.items():
            entry["consumer_generation"] = view.consumer_generations[consumer]
    return json_response(req, {"allocations": allocations, "resource_provider_generation": view.generation},
                         last_modified=view.last_modified)


# -- writing ----------------------------------------------------------------


def incomplete_owner(req: Request) -> tuple[str, str]:
    """The project and user recorded for a consumer whose request names none."""
    placement = req.app.conf.placement
    return placement.incomplete_consumer_project_id, placement.incomplete_consumer_user_id


def _provider_resources(req: Request, allocations: Any) -> dict[str, dict[str, int]]:
    """{provider uuid: resources} from either request format.

    A provider named twice (the list format before 1.12 allows it) keeps
    its last entry and the others are dropped, as Placement does.
    """
    if req.version >= (1, 12):
        pairs = [(uuid, entry["resources"]) for uuid, entry in allocations.items()]
    else:
        pairs = [(entry["resource_provider"]["uuid"], entry["resources"]) for entry in allocations]
    return {_canonical_or_raw(uuid): resources for uuid, resources in pairs}


def _request(req: Request, consumer: str, data: dict) -> db.ConsumerAllocations:
    return db.ConsumerAllocations(
        consumer_uuid=consumer,
        resources=_provider_resources(req, data["allocations"]),
        project_id=data.get("project_id"),
        user_id=data.get("user_id"),
        generation=data.get("consumer_generation"),
        check_generation=req.version >= (1, 28),
        consumer_type=data.get("consumer_type"),
        set_consumer_type=req.version >= (1, 38),
    )


def _write(req: Request, requests: list[db.ConsumerAllocations],
           class_not_found: Callable[[str], str]) -> None:
    """Run the write transaction, re-running it where Placement retries, and
    word its errors as Placement does; a claim of one consumer may be
    committed with others of the process (:mod:`allotment.api.claim_groups`)."""
    groups = req.app.state.claim_groups
    if groups is not None and len(requests) == 1 and _new_claim(requests[0]):
        groups.claim(requests[0], lambda: _write_alone(req, requests, class_not_found),
                     lambda group: _write_together(req, group))
    else:
        _write_alone(req, requests, class_not_found)


def _new_claim(request: db.ConsumerAllocations) -> bool:
    """Whether ``request`` says it claims for a new consumer (a null
    consumer generation, 1.28 on): the only writes grouped (a write that
    replaces allocations would make its group fail)."""
    return bool(request.resources) and request.check_generation and request.generation is None


def _write_together(req: Request, requests: Sequence[db.ConsumerAllocations]) -> bool:
    """Claims of several requests in one transaction, run once: whether it
    committed.  Anything else (a lost swap, a consumer that exists, an error
    of any claim) leaves each to be written alone, and words nothing; but a
    commit whose outcome is unknown is raised, to every claim of the group."""
    mirror = req.app.state.mirror
    follow = mirror is not None and mirror.wants_own_writes()
    try:
        written = req.app.db.run_write(lambda conn: db.write_allocations(
            conn, requests, incomplete_owner=incomplete_owner(req), lock_read=True, follow=follow, together=True))
    except CommitOutcomeUnknown:
        raise
    except db.ProviderConflict:
        req.app.state.swap_contention.lost()
        return False
    except Exception:  # noqa: BLE001 - each claim, written alone, tells its own
        return False
    if written is not None:
        try:
            mirror.wrote(written)
        except Exception:  # noqa: BLE001 - committed: its claims must not be written again
            LOG.exception("the provider mirror could not follow a group of claims")
    return True


def _write_alone(req: Request, requests: list[db.ConsumerAllocations],
                 class_not_found: Callable[[str], str]) -> None:
    """``requests`` in a transaction of their own (see :func:`_write`)."""
    owner = incomplete_owner(req)

    contended: list[int] = []  # the providers of a lost swap: a re-run locks them first
    mirror = req.app.state.mirror
    follow = mirror is not None and mirror.wants_own_writes()
    contention = req.app.state.swap_contention
    lock_read = contention.lock_read()

    def work(conn):
        try:
            return db.write_allocations(conn, requests, incomplete_owner=owner, lock_first=contended,
                                        lock_read=lock_read, follow=follow)
        except db.ProviderConflict as conflict:
            contended[:] = conflict.provider_ids
            contention.lost()
            raise

    try:
        written = req.app.db.run_write(work, retry_on=db.RETRY_ON,
                                       retries=req.app.conf.placement.allocation_conflict_retry_count)
    except db.AllocationNamesUnknownProvider:
        keep_new_consumers(req, requests)
        raise
    except db.AllocationNamesUnknownClass as error:
        raise HTTPError(400, class_not_found(error.message)) from None
    except db.InvalidInventory as error:
        raise HTTPError(409, f"Unable to allocate inventory: {error.message}") from None
    except db.ConsumerGenerationConflict:
        raise
    except domain.ConcurrentUpdate as error:
        raise HTTPError(409, "Inventory and/or allocations changed while attempting to allocate: "
                             f"{error.message}", code=domain.CONCURRENT_UPDATE) from None
    if written is not None:
        # Committed: the process's mirror may follow it without reading it back.
        mirror.wrote(written)


def keep_new_consumers(req: Request, requests: list[db.ConsumerAllocations]) -> None:
    """After a write refused for an unknown provider: the new consumers stay
    (generation 0), as in Placement, which records them before it looks the
    providers up."""
    req.app.db.run_write(
        lambda conn: db.keep_new_consumers(conn, requests, incomplete_owner=incomplete_owner(req)),
        retry_on=(db.consumers.RecordRace,), retries=1)


def set_allocations_for_consumer(req: Request) -> webob.Response:
    """PUT /allocations/{consumer_uuid}: replace one consumer's allocations."""
    consumer = _consumer_uuid(req.urlvars["consumer_uuid"])
    data = json_body(req)
    request = _request(req, consumer, data)
    _write(req, [request],
           lambda message: f"Unable to allocate inventory for consumer {consumer}: {message}")
    return no_content(req)


def consumers_allocations(req: Request, data: dict) -> list[db.ConsumerAllocations]:
    """The allocations of a POST /allocations body (also the reshaper's
    ``allocations``), one per consumer; 400 for a consumer named twice."""
    requests: dict[str, db.ConsumerAllocations] = {}
    for key, entry in data.items():
        consumer = _consumer_uuid(key)
        if consumer in requests:
            raise HTTPError(400, f"Allocations for consumer '{key}' are given more than once.")
        requests[consumer] = _request(req, consumer, entry)
    return list(requests.values())


def set_allocations(req: Request) -> webob.Response:
    """POST /allocations (1.13): replace several consumers' allocations atomically."""
    _write(req, consumers_allocations(req, json_body(req)), lambda message: f"Unable to allocate inventory {message}")
    return no_content(req)


def delete_allocations(req: Request) -> webob.Response:
    """DELETE /allocations/{consumer_uuid}: remove every allocation of a consumer."""
    consumer = _canonical_or_raw(req.urlvars["consumer_uuid"])
    req.app.db.run_write(lambda conn: db.delete_allocations(conn, consumer), retry_on=db.RETRY_ON,
                         retries=req.app.conf.placement.allocation_conflict_retry_count)
    return no_content(req)
