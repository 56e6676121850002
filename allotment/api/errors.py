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
from http import HTTPStatus

import orjson

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
}


class HTTPError(Exception):
    """An error response; ``message`` is the request-specific part of detail."""

    def __init__(self, status: int, message: str = "", *, code: str | None = None,
                 headers: dict[str, str] | None = None, explanation: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or domain.DEFAULT
        self.headers = headers or {}
        self.explanation = explanation

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


def _wants_html(accept: str | None) -> bool:
    if not accept:
        return False
    lowered = accept.lower()
    return "text/html" in lowered and "application/json" not in lowered and "*/*" not in lowered


def render(error: HTTPError, *, request_id: str, version: tuple[int, int] | None,
           accept: str | None) -> tuple[str, list[tuple[str, str]], bytes]:
    """(status line, headers, body) for ``error``, in the form the client accepts."""
    status_line = f"{error.status} {error.title}"
    detail = error.detail()
    if _wants_html(accept):
        body = (f"<html><head><title>{error.status} {html.escape(error.title)}</title></head>"
                f"<body><h1>{error.status} {html.escape(error.title)}</h1>"
                f"{html.escape(detail)}</body></html>").encode()
        content_type = "text/html; charset=UTF-8"
    else:
        entry = {"status": error.status, "title": error.title, "detail": detail,
                 "request_id": request_id}
        if version is not None and version >= (1, 23):
            entry["code"] = error.code
        body = orjson.dumps({"errors": [entry]})
        content_type = "application/json"
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    headers.extend(error.headers.items())
    return status_line, headers, body
