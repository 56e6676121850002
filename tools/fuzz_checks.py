"""Schemathesis checks for Allotment (loaded by tools/fuzz through SCHEMATHESIS_HOOKS).

``placement_error_format``: no answer is a 5xx, and every 4xx is in
Placement's error format: a JSON body ``{"errors": [{"status", "title",
"detail", "request_id"[, "code"]}]}`` whose status is the response's, whose
request id is the ``x-openstack-request-id`` header's, and which carries a
``code`` from microversion 1.23 on.
"""

from __future__ import annotations

import json
import re

import schemathesis

REQUEST_ID = re.compile(r"^req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
VERSION = re.compile(r"placement ([0-9]+)\.([0-9]+)$")


def _header(response, name: str) -> str | None:
    values = response.headers.get(name.lower()) or response.headers.get(name)
    if isinstance(values, list):
        return values[0] if values else None
    return values


def _noauth2_unauthorized(body: bytes) -> bool:
    """noauth2's 401 comes before any Placement code, in the plain WSGI
    format Placement's own noauth2 answers with (``message``, ``code``,
    ``title``), not in the error format."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("code") == "401 Unauthorized" and \
        data.get("title") == "Unauthorized" and isinstance(data.get("message"), str)


def _refused_by_the_http_layer(status: int, headers: dict, body: bytes) -> bool:
    """granian's HTTP layer refuses a request it cannot parse (a target over
    64 KiB: 414; a head over its limit: 431; a malformed header: 400)
    before any of Allotment runs: an empty body, the connection closed, no
    request id (docs/serving.md)."""
    return status in (400, 414, 431) and body == b"" and (headers.get("connection") or "").lower() == "close" \
        and not headers.get("x-openstack-request-id")


def problems(status: int, headers: dict, body: bytes, version: tuple[int, int] | None) -> list[str]:
    """What is wrong with one answer (empty: nothing); plain data, so it is unit-testable."""
    if status >= 500:
        return [f"a server error: {status}"]
    if status < 400:
        return []
    if _refused_by_the_http_layer(status, headers, body):
        return []
    found = []
    request_id = headers.get("x-openstack-request-id")
    if not request_id or not REQUEST_ID.match(request_id):
        found.append(f"no request id header (got {request_id!r})")
    if not (headers.get("content-type") or "").startswith("application/json"):
        return found + [f"a {status} that is not JSON: {headers.get('content-type')!r}"]
    if status == 401 and _noauth2_unauthorized(body):
        return found
    try:
        errors = json.loads(body)["errors"]
        error = errors[0]
    except (ValueError, KeyError, IndexError, TypeError):
        return found + [f"a {status} that is not in Placement's error format: {body[:200]!r}"]
    if len(errors) != 1:
        found.append("more than one error")
    for key, kind in (("status", int), ("title", str), ("detail", str), ("request_id", str)):
        if not isinstance(error.get(key), kind):
            found.append(f"error {key} missing or not a {kind.__name__}")
    if error.get("status") != status:
        found.append(f"error status {error.get('status')} in a {status} answer")
    if request_id and error.get("request_id") != request_id:
        found.append("the error's request_id is not the header's")
    if version is not None and version >= (1, 23) and not isinstance(error.get("code"), str):
        found.append("no error code at 1.23 or later")
    return found


@schemathesis.check
def placement_error_format(ctx, response, case):
    """No 5xx; every 4xx in Placement's error format, with its request id."""
    sent = (case.headers or {}).get("OpenStack-API-Version", "")
    match = VERSION.match(sent.strip()) if isinstance(sent, str) else None
    # A header that is not exactly "placement X.Y" may be refused (400/406)
    # before any version applies: no code is required then.
    version = (int(match.group(1)), int(match.group(2))) if match else None
    if version is not None and not (1, 0) <= version <= (1, 39):
        version = None  # refused (406) before any version applies
    headers = {name: _header(response, name) for name in ("x-openstack-request-id", "content-type", "connection")}
    found = problems(response.status_code, headers, response.content, version)
    if found:
        raise AssertionError("; ".join(found))
