"""Microversions: parsing the request header and the table of versions.

Handlers ask ``req.version >= (1, 28)``; routes declare the version a
method appears in.  ``VERSIONS`` records what each version added so the
whole history sits in one place.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

SERVICE_TYPE = "placement"
HEADER = "OpenStack-API-Version"


class Version(NamedTuple):
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


# What each microversion added or changed (the authoritative list).
VERSIONS: dict[str, str] = {
    "1.0": "Initial version",
    "1.1": "Resource provider aggregates",
    "1.2": "Custom resource classes",
    "1.3": "member_of filter on GET /resource_providers",
    "1.4": "resources filter on GET /resource_providers",
    "1.5": "DELETE all inventories of a provider",
    "1.6": "Traits",
    "1.7": "PUT /resource_classes/{name} without a body, idempotent",
    "1.8": "project_id and user_id required when writing allocations",
    "1.9": "GET /usages",
    "1.10": "GET /allocation_candidates",
    "1.11": "allocation links on resource providers",
    "1.12": "dict format for PUT /allocations/{consumer}",
    "1.13": "POST /allocations for many consumers",
    "1.14": "nested resource providers (parent/root, in_tree)",
    "1.15": "Last-Modified and Cache-Control headers",
    "1.16": "limit on GET /allocation_candidates",
    "1.17": "required traits on GET /allocation_candidates",
    "1.18": "required traits on GET /resource_providers",
    "1.19": "provider generation in aggregate bodies; 409 on a stale one",
    "1.20": "POST /resource_providers returns the provider body",
    "1.21": "member_of on GET /allocation_candidates",
    "1.22": "forbidden traits",
    "1.23": "error codes in error bodies",
    "1.24": "repeated member_of",
    "1.25": "granular request groups and group_policy",
    "1.26": "inventory reserved may equal total",
    "1.27": "all resource classes in provider_summaries",
    "1.28": "consumer generations",
    "1.29": "nested providers in allocation candidates",
    "1.30": "POST /reshaper",
    "1.31": "in_tree on GET /allocation_candidates",
    "1.32": "forbidden aggregates",
    "1.33": "string suffixes for request groups",
    "1.34": "mappings in allocation requests",
    "1.35": "root_required",
    "1.36": "same_subtree and resourceless request groups",
    "1.37": "re-parenting and un-parenting providers",
    "1.38": "consumer types",
    "1.39": "any-traits (in:) in required and root_required",
}

MIN_VERSION = Version(1, 0)
MAX_VERSION = Version(*map(int, max(VERSIONS, key=lambda v: tuple(map(int, v.split(".")))).split(".")))

class InvalidVersion(ValueError):
    """The header is malformed (400)."""


class UnacceptableVersion(ValueError):
    """The header names a version we do not serve (406)."""


def _placement_value(header_value: str) -> str | None:
    """The placement entry of ``OpenStack-API-Version``.

    The header may list several services, comma-separated; as Placement,
    the last placement entry wins and entries that are not "SERVICE
    VERSION" are ignored.
    """
    for part in reversed(header_value.split(",")):
        bits = part.strip().split(None, 1)
        if len(bits) == 2 and bits[0].lower() == SERVICE_TYPE:
            return bits[1].strip()
    return None


def _parse_request_version(value: str) -> Version:
    """``MAJOR.MINOR`` read as Placement reads it: each side with Python's
    ``int`` (so ``1.05`` is 1.5 and ``-1.2`` is well formed); anything else
    is malformed, with the reason in the message clients see."""
    parts = value.split(".", 1)
    try:
        numbers = [int(part) for part in parts]
    except ValueError as error:
        raise InvalidVersion(f"invalid version string: {value}; {error}") from None
    if len(numbers) == 1:
        raise InvalidVersion(f"invalid version string: {value}; "
                             "Version.__new__() missing 1 required positional argument: 'minor'")
    return Version(*numbers)


#: Header values already read and the version each asks for: clients send
#: the same few on every request.  Bounded (the header is the client's to
#: choose); only values that ask for a version we serve are kept.
_NEGOTIATED: dict[str | None, Version] = {}
MAX_NEGOTIATED = 256


def negotiate(header_value: str | None) -> Version:
    """The version a request asked for; the minimum when it asked for none.

    Malformed: ``InvalidVersion`` (400); well formed but not one we serve
    (``1.99``, ``-1.2``, ``0.9``): ``UnacceptableVersion`` (406).
    """
    version = _NEGOTIATED.get(header_value)
    if version is None:
        version = _negotiate(header_value)
        if len(_NEGOTIATED) < MAX_NEGOTIATED:
            _NEGOTIATED[header_value] = version
    return version


def _negotiate(header_value: str | None) -> Version:
    value = _placement_value(header_value) if header_value else None
    if not value:
        return MIN_VERSION
    if value == "latest":
        return MAX_VERSION
    version = _parse_request_version(value)
    if not (version.major == MAX_VERSION.major and MIN_VERSION <= version <= MAX_VERSION):
        raise UnacceptableVersion(f"Unacceptable version header: {value}")
    return version


@functools.lru_cache(maxsize=None)  # one per version served
def response_headers(version: Version) -> tuple[tuple[str, str], tuple[str, str]]:
    # Placement sends the header name lower-cased in Vary; clients match on it.
    return (HEADER, f"{SERVICE_TYPE} {version}"), ("Vary", HEADER.lower())


def parse(value: str) -> Version:
    """``"1.28"`` -> ``Version(1, 28)`` (for declarations, not for requests)."""
    major, _, minor = value.partition(".")
    return Version(int(major), int(minor))


class Versioned:
    """Something that changes with the microversion, declared as steps:
    ``Versioned({"1.0": a, "1.14": b})`` is ``a`` from 1.0 to 1.13 and ``b``
    from 1.14 on (``None`` for "nothing": e.g. no body any more).

    Handlers and the OpenAPI document read the same steps, so what a
    version accepts is written down once.
    """

    def __init__(self, steps: dict[str, object]):
        self.steps = sorted((parse(since), value) for since, value in steps.items())

    def at(self, version: tuple[int, int]):
        found = None
        for since, value in self.steps:
            if since > version:
                break
            found = value
        return found
