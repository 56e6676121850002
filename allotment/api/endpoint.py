"""What a route declares: its handler, policy rule, schemas, versions and answers.

The route table (``allotment.api.routes``) is made of these; the
dispatcher (``allotment.api.app``), the request helpers that validate with
the declared schemas (``allotment.api.http``) and the OpenAPI document
(``allotment.api.openapi``) read them.  This module imports no handler,
so every one of those modules can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from allotment.api.microversion import Version, Versioned

#: The prefix of every URL that is Allotment's own rather than Placement's.
OWN_PREFIX = "/allotment/"

#: A JSON schema as a route declares it: a dict, a :class:`Versioned` set
#: of them, or a function of the request's version giving one (or None).
Schema = dict | Versioned | Callable[[Version], dict | None]


@dataclass(frozen=True)
class Answer:
    """A success status, from microversion ``since`` (None: from the
    endpoint's first version) until a later answer of the endpoint replaces it."""
    status: int
    json: bool = False           # the answer has a JSON body
    since: Version | None = None


@dataclass(frozen=True)
class Endpoint:
    handler: Callable[..., Any]  # called with the Request, returns the webob Response
    policy: str | None           # checked before the handler; None: public, no token needed
    min_version: Version = Version(1, 0)
    body: Schema | None = None   # the body's JSON schema
    query: Schema | None = None  # the query string's JSON schema
    # Success statuses: the newest ``since`` that applies at a version
    # wins; several answers may share one version.
    answers: tuple[Answer, ...] = (Answer(200, json=True),)
    # The request body must be application/json (else 415); None: whenever
    # a body schema is declared (a handler whose body depends on the
    # version says False and checks it itself).
    accepts_json: bool | None = None
    produces_json: bool = True   # Accept must allow application/json (else 406)
    too_old_status: int = 404    # answer to a request below min_version
    versioned: bool = True       # the OpenStack-API-Version header matters to it
    checks_accept: bool = True   # 406 unless Accept allows JSON (Placement's root document does not check)

    def __post_init__(self):
        if self.accepts_json is None:
            object.__setattr__(self, "accepts_json", self.body is not None)

    def answers_at(self, version: tuple[int, int]) -> list[tuple[int, bool]]:
        """The success statuses at ``version`` (with whether they carry JSON)."""
        applicable = [self._since(answer) for answer in self.answers if self._since(answer) <= version]
        if not applicable:
            return []
        newest = max(applicable)
        return [(answer.status, answer.json) for answer in self.answers if self._since(answer) == newest]

    def _since(self, answer: Answer) -> Version:
        return self.min_version if answer.since is None else answer.since


@dataclass(frozen=True, eq=False)  # hashable by identity: documents are kept per table
class RouteTable:
    """Every route: path template -> {method: Endpoint}."""
    placement: dict[str, dict[str, Endpoint]]  # Placement's URL space
    own: dict[str, dict[str, Endpoint]]        # Allotment's own, outside it


def schema_at(declared: Schema | None, version: tuple[int, int]) -> dict | None:
    """The JSON schema a route's ``body`` or ``query`` gives at ``version``."""
    if isinstance(declared, Versioned):
        return declared.at(version)
    if callable(declared):
        return declared(version)
    return declared
