"""What every handler needs from a request and for a response.

* ``Request``: WebOb's request plus the negotiated ``version``, the caller's
  ``context``, the route's ``urlvars`` and the application (``req.app``:
  configuration, database, policy enforcer).
* ``json_body`` / ``query_params``: decode and validate a body or a query
  string against a JSON schema, with python-jsonschema's messages (clients
  match on them).
* ``json_response`` / ``no_content``: responses, with ``Last-Modified`` and
  ``Cache-Control`` added in one place from microversion 1.15.
"""

from __future__ import annotations

import datetime
import email.utils
import functools
import json
import math
import re
import time
import uuid as uuidlib
from typing import TYPE_CHECKING, Any

import jsonschema
import orjson
import webob

from allotment.api import errors
from allotment.api.errors import HTTPError
from allotment.api.microversion import Version
from allotment.api.endpoint import Endpoint, schema_at
from allotment.domain import fastschema

if TYPE_CHECKING:  # pragma: no cover
    from allotment.api.context import RequestContext

_FORMAT_CHECKER = jsonschema.FormatChecker()
_VALIDATORS: dict[int, Any] = {}
_QUICK: dict[int, Any] = {}


@_FORMAT_CHECKER.checks("uuid")
def _is_uuid_like(value: Any) -> bool:
    """Placement's notion of a UUID, not RFC 4122's string form.

    jsonschema's own ``uuid`` check insists on hyphens; Placement accepts
    any spelling that differs from the canonical hex only by case,
    hyphens, braces or a ``urn:``/``uuid:`` prefix (clients do send
    ``2290d4af9e6e400b9d651ee01376f71a``).
    """
    try:
        canonical = uuidlib.UUID(value).hex
    except (TypeError, ValueError, AttributeError):
        return False
    loose = value.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "").lower()
    return canonical == loose


class Request(webob.BaseRequest):
    """A WebOb request carrying what the pipeline worked out about it.

    WebOb's ``BaseRequest``: its ``Request`` keeps attributes set on it in
    the environ (``webob.adhoc_attrs``) and finds them there only after a
    failed attribute lookup, on every read of ``req.version``, ``req.app``
    or ``req.context``; here they are plain instance attributes.
    """

    version: Version
    context: "RequestContext"
    app: Any  # the Application (allotment.api.app, which imports this module)
    request_id: str
    endpoint: Endpoint

    def authorize(self, rule: str, target: dict | None = None) -> None:
        """Check ``rule`` for the caller; raises Forbidden (403)."""
        self.app.authorize(self.context, rule, target)

    @property
    def GET(self):  # noqa: N802 - WebOb's name
        """The decoded query string; 400 when it is not UTF-8 or holds a NUL.

        Checked when a handler first reads the query, so routes that take
        no query string ignore it, as Placement's do.
        """
        try:
            params = webob.BaseRequest.GET.fget(self)
        except UnicodeDecodeError as error:
            raise HTTPError(400, f"Invalid query string parameters: {error}") from None
        query = self.environ.get("QUERY_STRING", "")
        if "%00" in query or "\x00" in query:
            for key, value in params.items():
                if "\x00" in key or "\x00" in value:
                    raise HTTPError(400, "Invalid query string parameters: "
                                         + _NUL_MESSAGE % errors.short_repr(f"{key}={value}"))
        return params

    def unchecked_query(self) -> list[tuple[str, str]] | None:
        """The query's decoded pairs before ``GET``'s NUL check (``None``
        when it is not UTF-8: ``GET`` answers that).  For what Placement
        looks at before that check: the schema's verdict, policy targets."""
        try:
            return list(webob.BaseRequest.GET.fget(self).items())
        except UnicodeDecodeError:
            return None


#: A URL path prefix (a mount point, SCRIPT_NAME) that Location headers
#: may carry: segments of path characters, none empty (``//host`` names
#: another server), no backslash, no scheme.
_PATH_PREFIX = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)*")


def is_plain_path_prefix(text: str) -> bool:
    """Whether ``text`` is a mount point a URL on this server can start with."""
    return _PATH_PREFIX.fullmatch(text) is not None


def _validator(schema: dict):
    validator = _VALIDATORS.get(id(schema))
    if validator is None:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft4Validator)
        validator = cls(schema, format_checker=_FORMAT_CHECKER)
        _VALIDATORS[id(schema)] = validator
    return validator


def _best_error(validator, data: Any):
    """The error Placement reports when a document breaks several rules:
    jsonschema's ``best_match`` (the shallowest, most relevant), not the
    first one met (which depends on the order of the schema's keys)."""
    return jsonschema.exceptions.best_match(validator.iter_errors(data))


def _quick_check(schema: dict):
    """A quick yes for documents ``schema`` accepts (None: there is none), see fastschema."""
    try:
        return _QUICK[id(schema)]
    except KeyError:
        check = _QUICK[id(schema)] = fastschema.compile(schema, _FORMAT_CHECKER)
        return check


def validate(data: Any, schema: dict) -> Any:
    """Validate decoded JSON; 400 ``JSON does not validate: ...`` on failure."""
    quick = _quick_check(schema)
    if quick is None or not quick(data):
        error = _best_error(_validator(schema), data)
        if error is not None:
            raise HTTPError(400, f"JSON does not validate: {schema_error_text(error)}")
    bad = _non_finite(data)
    if bad is not None:
        # NaN and Infinity pass a "number" schema without a bound; no
        # quantity or ratio can be one (Placement fails on them with a 500).
        raise HTTPError(400, f"JSON does not validate: {bad} is not a finite number")
    return data


def schema_error_text(error) -> str:
    """python-jsonschema's full text of ``error``, as Placement answers it,
    with the offending value quoted in full when it is of a normal size
    and cut to :data:`errors.MAX_QUOTED` characters otherwise (the text
    quotes it twice, and pretty-printing a large value costs seconds)."""
    if len(error.message) <= errors.MAX_QUOTED and not _longer_than(error.instance, errors.MAX_QUOTED):
        return str(error)
    error.message = errors.cut(error.message)
    error.instance = _Quoted(errors.short_repr(error.instance))
    return str(error)


class _Quoted:
    """A value that prints as the (already cut) text it was given."""

    def __init__(self, text: str):
        self._text = text

    def __repr__(self) -> str:
        return self._text


def _longer_than(value: Any, limit: int) -> bool:
    """Whether ``value``'s repr would be longer than about ``limit``
    characters, found looking at no more than that much of it."""
    left = limit
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            left -= len(item) + 2
        elif isinstance(item, dict):
            left -= 2 + 4 * len(item)
            if left >= 0:
                pending.extend(item.keys())
                pending.extend(item.values())
        elif isinstance(item, list):
            left -= 2 + 2 * len(item)
            if left >= 0:
                pending.extend(item)
        else:
            left -= 8
        if left < 0:
            return True
    return False


def _non_finite(data: Any) -> float | None:
    if isinstance(data, float):
        return data if not math.isfinite(data) else None
    values = data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()
    for value in values:
        found = _non_finite(value)
        if found is not None:
            return found
    return None


_NUL_MESSAGE = "%s contains U+0000 (NUL), which no text in a request may contain"
#: Arrays and objects nested deeper than this are refused (400) before
#: anything walks them: Placement's deepest document (a reshape) nests 6.
MAX_JSON_DEPTH = 32
_TOO_DEEP = f"Malformed JSON: arrays and objects nested more than {MAX_JSON_DEPTH} levels deep"
# A run of 20 digits or more: an integer orjson would read as a float.
_LONG_INTEGER = re.compile(rb"[0-9]{20}")


def decode_json(body: bytes) -> Any:
    """Decode a JSON body as Placement does: 400 ``Malformed JSON`` if it is not JSON.

    orjson reads strict JSON fast.  What it refuses is read again with the
    standard library, which is what Placement answers with: its error
    messages ("Expecting property name enclosed in double quotes: ..."),
    a body that is not UTF-8, and the constants NaN, Infinity and
    -Infinity, which Python's JSON accepts (the schemas then refuse them
    where a string or an integer is due).  A lone surrogate (invalid
    Unicode no database can store) stays refused.  orjson reads integers
    beyond 64 bits as floats, which would then be refused as "not of type
    'integer'" although the client sent one; such (rare) bodies are read
    with the standard library too, which keeps every integer exact.
    Strings holding U+0000 are refused: PostgreSQL cannot store them, so
    no backend accepts them.
    """
    try:
        try:
            data = orjson.loads(body)
            if _LONG_INTEGER.search(body):
                data = json.loads(body)
        except ValueError as error:  # orjson.JSONDecodeError is one
            if str(error).startswith("depth limit exceeded"):
                raise HTTPError(400, _TOO_DEEP) from None
            data = _decode_lenient(body, error)
    except RecursionError:  # the standard library's reader, on a deep document
        raise HTTPError(400, _TOO_DEEP) from None
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _deeper_than(data, MAX_JSON_DEPTH):
        raise HTTPError(400, _TOO_DEEP)
    if b"\\u0000" in body:
        _refuse_nul(data)
    return data


def _deeper_than(data: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` deep in ``data``
    (level by level, without recursion)."""
    level = [data]
    for _ in range(limit):
        inner: list = []
        for value in level:
            if isinstance(value, dict):
                inner.extend(v for v in value.values() if isinstance(v, (dict, list)))
            elif isinstance(value, list):
                inner.extend(v for v in value if isinstance(v, (dict, list)))
        if not inner:
            return False
        level = inner
    return True


def _decode_lenient(body: bytes, strict_error: ValueError) -> Any:
    try:
        data = json.loads(body.decode("utf-8"))
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are
        raise HTTPError(400, f"Malformed JSON: {error}") from None
    if _has_lone_surrogate(data):
        raise HTTPError(400, f"Malformed JSON: {strict_error}") from None
    return data


def _has_lone_surrogate(data: Any) -> bool:
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(data, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in data.items())
    if isinstance(data, list):
        return any(_has_lone_surrogate(v) for v in data)
    return False


def _refuse_nul(data: Any) -> None:
    if isinstance(data, str):
        if "\x00" in data:
            raise HTTPError(400, "JSON does not validate: " + _NUL_MESSAGE % errors.short_repr(data))
    elif isinstance(data, dict):
        for key, value in data.items():
            _refuse_nul(key)
            _refuse_nul(value)
    elif isinstance(data, list):
        for value in data:
            _refuse_nul(value)


def require_json_content(req: Request) -> None:
    """415 unless the body is declared as JSON (handlers with optional bodies call this)."""
    content_type = req.content_type or None
    if content_type != "application/json":
        raise errors.HTTPError(415, f"The media type {content_type} is not supported, use application/json",
                               explanation=f"The request media type {content_type} "
                                           "is not supported by this server. ")


#: "The schema the route table declares" (the default of json_body/query_params).
ROUTE_SCHEMA: Any = object()


def json_body(req: Request, schema: Any = ROUTE_SCHEMA) -> Any:
    """The request body as JSON, validated against the route's body schema
    at the request's version (none declared there: not validated).

    Pass ``schema`` only for a body the route table cannot declare: the
    OpenAPI document shows the declared one.
    """
    data = decode_json(req.body)
    if schema is ROUTE_SCHEMA:
        schema = schema_at(req.endpoint.body, req.version)
    if schema is not None:
        validate(data, schema)
    return data


def query_params(req: Request, schema: Any = ROUTE_SCHEMA) -> dict[str, str]:
    """The query string as a dict (last value of a repeated key wins),
    validated against the route's query schema at the request's version.

    Failures are 400 ``Invalid query string parameters: ...`` with
    python-jsonschema's message, which clients match on, as for bodies.
    """
    if schema is ROUTE_SCHEMA:
        schema = schema_at(req.endpoint.query, req.version)
    if schema is not None:
        # The schema first, as Placement: an unknown or missing parameter
        # is reported before a NUL in some value (req.GET refuses those).
        pairs = req.unchecked_query()
        if pairs is not None:
            check_query(pairs, schema)
    return dict(req.GET)


def check_query(pairs: list[tuple[str, str]], schema: dict) -> None:
    """400 ``Invalid query string parameters: ...`` unless ``schema``
    accepts the query's pairs (the last value of a repeated key)."""
    document = dict(pairs)
    quick = _quick_check(schema)
    error = None if quick is not None and quick(document) else _best_error(_validator(schema), document)
    if error is not None:
        raise HTTPError(400, f"Invalid query string parameters: {schema_error_text(error)}")


@functools.lru_cache(maxsize=1)
def _date_of_second(second: int) -> str:
    """The HTTP date of a second; the last one kept: "now" is asked for on
    most responses, many within the same second."""
    return email.utils.formatdate(second, usegmt=True)


def http_date(moment: datetime.datetime | None) -> str:
    if moment is None:
        return _date_of_second(int(time.time()))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return email.utils.format_datetime(moment.astimezone(datetime.timezone.utc), usegmt=True)


def latest(*moments: datetime.datetime | None) -> datetime.datetime | None:
    """The most recent of some timestamps (None when there are none)."""
    present = [m for m in moments if m is not None]
    return max(present) if present else None


def json_response(req: Request, body: Any, status: int = 200, *,
                  last_modified: datetime.datetime | None = None,
                  cache_headers: bool = True,
                  headers: dict[str, str] | None = None) -> webob.Response:
    """A JSON response; from 1.15 it carries Last-Modified and Cache-Control.

    ``last_modified`` is the newest change of what the body describes; when
    unknown (or for collections that may be empty) the current time is
    used, as Placement does.
    """
    return encoded_json_response(req, orjson.dumps(body), status, last_modified=last_modified,
                                 cache_headers=cache_headers, headers=headers)


def encoded_json_response(req: Request, data: bytes, status: int = 200, *,
                          last_modified: datetime.datetime | None = None,
                          cache_headers: bool = True,
                          headers: dict[str, str] | None = None) -> webob.Response:
    """:func:`json_response` of a body already encoded."""
    response = webob.Response(body=data, status=status, content_type="application/json", charset=None)
    if cache_headers:
        _add_cache_headers(req, response, last_modified)
    if headers:
        response.headers.update(headers)
    return response


def no_content(req: Request, status: int = 204, headers: dict[str, str] | None = None, *,
               cache_headers: bool = False,
               last_modified: datetime.datetime | None = None) -> webob.Response:
    """An empty response; ``cache_headers`` for the few (``/traits/{name}``) that carry them."""
    response = webob.Response(status=status)
    del response.content_type
    if cache_headers:
        _add_cache_headers(req, response, last_modified)
    if headers:
        response.headers.update(headers)
    return response


def _add_cache_headers(req: Request, response: webob.Response,
                       last_modified: datetime.datetime | None) -> None:
    if req.version >= (1, 15):
        # Appended to the list: a new response has neither header yet.
        response.headerlist.extend((("Cache-Control", "no-cache"), ("Last-Modified", http_date(last_modified))))
