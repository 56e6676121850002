"""HTTP errors in Placement's error format, and the one domain→HTTP mapping.

Body shape (every error, every route)::

    {"errors": [{"status": 404, "title": "Not Found", "detail": "...",
                 "request_id": "req-...", "code": "placement.undefined_code"}]}

``code`` appears from microversion 1.23.  Clients and the upstream suite
match on ``title`` and on substrings of ``detail``, so the titles are the
standard reason phrases and the detail starts with the generic explanation
of the status followed by the specific message.
"""

from __future__ import annotations

import html
import reprlib
from http import HTTPStatus

import orjson
import webob.acceptparse

from allotment.api.microversion import MAX_VERSION, MIN_VERSION
from allotment.domain import errors as domain

# The generic first sentence of ``detail`` for each status.
EXPLANATIONS = {
    400: "The server could not comply with the request since it is either malformed or otherwise incorrect.",
    401: "This server could not verify that you are authorized to access the document you requested.",
    403: "Access was denied to this resource.",
    404: "The resource could not be found.",
    405: "The method is not allowed for this resource.",
    406: "The resource could not be generated that was acceptable to your browser (content of type %s).",
    409: "There was a conflict when trying to complete your request.",
    415: "The request media type is not supported by this server.",
    500: "The server has either erred or is incapable of performing the requested operation.",
    503: "The server is currently unavailable. Please try again at a later time.",
}

#: Seconds a client is asked to wait (``Retry-After``) before repeating a
#: request the database could not serve: about what a Galera cluster takes
#: to re-form after losing a node, or a pool to reconnect.
RETRY_AFTER_SECONDS = 2


def database_unavailable() -> HTTPError:
    """503: the database cannot be reached now; nothing was changed.

    Says only that: the error the driver raised (which names the
    database's address and user) goes to the server's log."""
    return HTTPError(503, "The database is unavailable, so the request was not carried out; "
                          "nothing was changed. Try again in a few seconds.",
                     headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def outcome_unknown() -> HTTPError:
    """503: the connection was lost while the change was being committed."""
    return HTTPError(503, "The connection to the database was lost while this change was being "
                          "committed: it may or may not have been made. Read it back, or send the "
                          "same request again: the generations it carries make that safe (a change "
                          "already made answers 409 or 404 and is not made twice).",
                     headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


#: The most characters of a client's value an error text quotes: a value
#: of a normal size is quoted whole (clients match Placement's texts), a
#: larger one is cut, so that a 16 MiB body cannot make a 64 MiB answer.
MAX_QUOTED = 2048


def cut(text: str, limit: int = MAX_QUOTED) -> str:
    """``text``, or its first and last characters (``limit`` in all) and how
    many were left out between them: the end of a message says what is
    wrong with the value quoted before it ("... is too long")."""
    if len(text) <= limit:
        return text
    tail = limit // 4
    return f"{text[:limit - tail]}... ({len(text) - limit} more characters) ...{text[-tail:]}"


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 4
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 256
_SHORT_REPR.maxlist = _SHORT_REPR.maxdict = _SHORT_REPR.maxtuple = 16


def short_repr(value) -> str:
    """``repr(value)`` when it is short; otherwise an abridged one (as
    :mod:`reprlib` abridges, at bounded cost), cut to :data:`MAX_QUOTED`."""
    if isinstance(value, str) and len(value) <= MAX_QUOTED:
        return cut(repr(value))
    return cut(_SHORT_REPR.repr(value))


class HTTPError(Exception):
    """An error response; ``message`` is the request-specific part of detail.

    ``vary``: whether the response carries ``Vary: openstack-api-version``
    besides the version header.  Placement sends it on errors its handlers
    answer, not on those raised before or around a handler (no route,
    policy, a missing object nobody caught), and clients and caches see the
    difference.  ``negotiation``: a 406 for a microversion we do not serve;
    its body says which we do (``min_version``/``max_version``).
    """

    def __init__(self, status: int, message: str = "", *, code: str | None = None,
                 headers: dict[str, str] | None = None, explanation: str | None = None,
                 vary: bool = True, negotiation: bool = False):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or domain.DEFAULT
        self.headers = headers or {}
        self.explanation = explanation
        self.vary = vary
        self.negotiation = negotiation

    @property
    def title(self) -> str:
        return HTTPStatus(self.status).phrase

    def detail(self) -> str:
        explanation = self.explanation
        if explanation is None:
            explanation = EXPLANATIONS.get(self.status, "")
        if not self.message:
            return explanation
        return f"{explanation}\n\n {self.message}  ".rstrip() if explanation else self.message


def from_domain(error: domain.PlacementError) -> HTTPError:
    """The single place where domain exceptions become HTTP statuses."""
    return HTTPError(error.status, error.message, code=error.code)


def effective_accept(accept: str | None) -> str:
    """The Accept header as errors are formatted for it: none (or ``*/*``)
    counts as ``application/json``, as in Placement."""
    if not accept or accept.strip() == "*/*":
        return "application/json"
    return accept


def error_format(accept: str | None) -> str:
    """``html``, ``json`` or ``plain``: the best of HTML and JSON the client
    accepts (ties go to HTML, listed first), else plain text."""
    offers = webob.acceptparse.create_accept_header(effective_accept(accept)).acceptable_offers(
        ["text/html", "application/json"])
    if not offers:
        return "plain"
    return "html" if offers[0][0] == "text/html" else "json"


UNAUTHORIZED = ("This server could not verify that you are authorized to access the document you "
                "requested. Either you supplied the wrong credentials (e.g., bad password), or your "
                "browser does not understand how to supply the credentials required.")


def unauthorized(accept: str | None) -> tuple[str, list[tuple[str, str]], bytes]:
    """The 401 noauth2 answers a request without a token: not in Placement's
    error format (it comes before any Placement code runs) but in the plain
    WSGI one, as Placement's own noauth2 answers it."""
    kind = error_format(accept)
    if kind == "json":
        body = orjson.dumps({"message": UNAUTHORIZED + "<br /><br />\n\n\n", "code": "401 Unauthorized",
                             "title": "Unauthorized"})
        content_type = "application/json"
    elif kind == "html":
        body = _html("401 Unauthorized", UNAUTHORIZED, "")
        content_type = "text/html; charset=UTF-8"
    else:
        body = f"401 Unauthorized\n\n{UNAUTHORIZED}\n\n   ".encode()
        content_type = "text/plain; charset=UTF-8"
    return "401 Unauthorized", [("Content-Type", content_type), ("Content-Length", str(len(body)))], body


def _html(status: str, explanation: str, message: str) -> bytes:
    return (f"<html>\n <head>\n  <title>{status}</title>\n </head>\n <body>\n  <h1>{status}</h1>\n"
            f"  {html.escape(explanation)}<br /><br />\n{html.escape(message)}\n\n </body>\n</html>").encode()


def render(error: HTTPError, *, request_id: str, version: tuple[int, int] | None,
           accept: str | None, head: bool = False) -> tuple[str, list[tuple[str, str]], bytes]:
    """(status line, headers, body) for ``error``, in the form the client
    accepts: JSON in Placement's error format, or HTML or plain text for a
    client that accepts neither JSON nor anything.  A HEAD request gets the
    status and headers only."""
    status_line = f"{error.status} {error.title}"
    if head:
        return status_line, [("Content-Type", "text/html; charset=UTF-8"), ("Content-Length", "0")] + \
            list(error.headers.items()), b""
    explanation = error.explanation
    if explanation is None:
        explanation = EXPLANATIONS.get(error.status, "")
    kind = error_format(accept)
    if kind == "html":
        body = _html(status_line, explanation, error.message)
        content_type = "text/html; charset=UTF-8"
    elif kind == "plain":
        body = f"{status_line}\n\n{error.detail()}".encode()
        content_type = "text/plain; charset=UTF-8"
    else:
        entry = {"status": error.status, "title": error.title, "detail": error.detail(),
                 "request_id": request_id}
        if version is not None and version >= (1, 23):
            entry["code"] = error.code
        if error.negotiation:
            entry["max_version"] = str(MAX_VERSION)
            entry["min_version"] = str(MIN_VERSION)
        body = orjson.dumps({"errors": [entry]})
        content_type = "application/json"
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    headers.extend(error.headers.items())
    return status_line, headers, body
