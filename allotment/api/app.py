"""The WSGI application: one pipeline from raw request to response.

Outermost first, as Placement orders its middleware:

1. request id, timing and the per-request log line;
2. CORS, when ``[cors]`` is configured (pre-flight needs no token);
3. authentication (keystone auth_token or noauth2): a request without a
   token is 401 whatever version it asks for, without version headers;
4. microversion negotiation (400/406) and the version headers on every
   response after it, errors included (``Vary`` where Placement sends it);
5. routing: 404 / 405 with ``Allow``; the route's microversion, media-type,
   Accept and policy declarations; the caller's context; then the handler.

Domain errors raised anywhere below become HTTP errors in one place
(``errors.from_domain``); anything unexpected is logged with its traceback
and answered with a 500 that reveals nothing of it.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable, Iterable

import webob
from oslo_config import cfg

from allotment import config, logs
from allotment.api import (
    allocations,
    auth,
    errors,
    inventories,
    microversion,
    policy,
    reshaper,
    resource_providers,
    traits,
    ui,
    usages,
)
from allotment.api.context import RequestContext
from allotment.api.endpoint import Endpoint, RouteTable
from allotment.api.health import PATH as HEALTH_PATH
from allotment.api.health import HealthCheck
from allotment.api.http import Request, is_plain_path_prefix, require_json_content
from allotment.api.metrics import Metrics
from allotment.api.request_id import GLOBAL_REQUEST_ID, REQUEST_ID_HEADER, new_request_id
from allotment.api.routes import TABLE
from allotment.api.state import ProcessState
from allotment.db.engine import CommitOutcomeUnknown, Database, is_unreachable, one_line
from allotment.domain import errors as domain

LOG = logging.getLogger("allotment.api")
#: The per-request line, under the name Placement logs it with.
REQUEST_LOG = logging.getLogger("placement.requestlog")


def _compile(template: str) -> re.Pattern:
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
    return re.compile("^" + pattern + "$")


class Router:
    """Matches paths to route entries."""

    def __init__(self, table: RouteTable):
        self.table = table
        self._static: dict[str, dict[str, Endpoint]] = {}
        self._dynamic: list[tuple[re.Pattern, dict[str, Endpoint]]] = []
        self._templates: dict[int, str] = {}
        for routes in (table.placement, table.own):
            for template, methods in routes.items():
                self._templates[id(methods)] = template
                if "{" in template:
                    self._dynamic.append((_compile(template), methods))
                else:
                    self._static[template] = methods
        # Fixed paths every method of which is public: no token needed.
        self._public = {template for template, methods in self._static.items()
                        if all(endpoint.policy is None for endpoint in methods.values())}

    def is_public(self, environ: dict) -> bool:
        """Whether the request's path needs no token (``GET /``, the API description)."""
        return (decoded_path(environ) or "/") in self._public

    def match(self, path: str) -> tuple[dict[str, Endpoint], dict[str, str]] | None:
        if len(path) > 1 and path.endswith("/"):
            return None
        methods = self._static.get(path)
        if methods is not None:
            return methods, {}
        for pattern, methods in self._dynamic:
            found = pattern.match(path)
            if found:
                return methods, found.groupdict()
        return None

    def template(self, path: str) -> str | None:
        """The route template a path matches (``/resource_providers/{uuid}``), if any."""
        found = self.match(path)
        return self._templates[id(found[0])] if found else None


class Application:
    """Configuration, database and policy for one process, and the WSGI entry."""

    def __init__(self, conf: cfg.ConfigOpts, database: Database, *, auth_strategy: str | None = None):
        """``auth_strategy`` overrides ``[api] auth_strategy`` for this
        application only (the direct interface uses ``noauth2`` without
        changing the caller's configuration)."""
        self.conf = conf
        self.db = database
        self.enforcer = policy.make_enforcer(conf)
        self.router = Router(TABLE)
        #: Every cache the process keeps between requests (one owner).
        self.state = ProcessState(conf, database)
        self.metrics = None
        if conf.allotment.metrics:
            self.metrics = Metrics(conf, database, self.router.template)
            database.on_retry = self.metrics.database_retry
            if self.state.claim_groups is not None:
                self.state.claim_groups.on_group = self.metrics.claims_grouped
        #: GET /healthcheck, for load balancers (answered before authentication).
        self.health = HealthCheck(conf, database)
        # Innermost first; Placement's order: request id, CORS,
        # authentication, then microversion negotiation and the handler (so
        # a request without a token is 401 whatever version it asks for).
        inner: Callable = self._dispatch
        inner = self._guard(inner)
        inner = self._versioned(inner)
        inner = auth.wrap(inner, conf, strategy=auth_strategy, is_public=self.router.is_public)
        if self.metrics is not None and self.metrics.public:
            inner = self.metrics.public_route(inner)
        if conf.allotment.ui:
            inner = ui.slash_redirect(inner)
        if conf.cors.allowed_origin:
            from oslo_middleware import cors  # imported only when configured: a heavy module

            inner = cors.CORS(inner, conf)
        if config.is_embedded_default(conf) and auth_strategy is None:  # not the in-process client
            inner = auth.loopback_hosts_only(inner)
        if conf.oslo_middleware.enable_proxy_headers_parsing:
            # The proxy's Forwarded / X-Forwarded-Proto, -Host, -For and
            # -Prefix (SCRIPT_NAME) headers, trusted only when the operator
            # says a proxy sets them, as in Placement.
            from oslo_middleware import http_proxy_to_wsgi  # only when configured, as cors

            inner = http_proxy_to_wsgi.HTTPProxyToWSGI(_plain_mount_point(inner), conf)
        self._inner = inner

    # -- policy -----------------------------------------------------------
    def authorize(self, context: RequestContext, rule: str, target: dict | None = None) -> None:
        policy.authorize(self.enforcer, context, rule, target)

    # -- WSGI -------------------------------------------------------------
    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        started = time.monotonic()
        request_id = new_request_id()
        environ["openstack.request_id"] = request_id
        global_id = environ.get("HTTP_X_OPENSTACK_REQUEST_ID")
        if global_id is not None and GLOBAL_REQUEST_ID.fullmatch(global_id):
            environ["openstack.global_request_id"] = global_id
        state = {"status": "500", "length": 0}

        def _start(status, headers, exc_info=None):
            state["status"] = status
            for name, value in headers:
                if name.lower() == "content-length":
                    state["length"] = value
            return start_response(status, list(headers) + [(REQUEST_ID_HEADER, request_id)], exc_info)

        try:
            if environ.get("PATH_INFO") == HEALTH_PATH:
                return self.health(environ, _start)
            return self._inner(environ, _start)
        finally:
            self._log(environ, state["status"], state["length"], environ.get("allotment.version"), started)
            if self.metrics is not None:
                self.metrics.observe_request(environ, state["status"], started)

    def _versioned(self, app: Callable) -> Callable:
        """Microversion negotiation (400/406 before anything else) and the
        version headers on every response after it: ``OpenStack-API-Version``
        always, ``Vary`` unless the error says otherwise (see HTTPError.vary)."""

        def versioned(environ, start_response):
            try:
                version = microversion.negotiate(environ.get("HTTP_OPENSTACK_API_VERSION"))
            except (microversion.InvalidVersion, microversion.UnacceptableVersion) as error:
                unacceptable = isinstance(error, microversion.UnacceptableVersion)
                http_error = errors.HTTPError(406 if unacceptable else 400, f"Invalid microversion: {error}",
                                              negotiation=unacceptable)
                if unacceptable:
                    http_error.explanation = _not_acceptable_explanation(environ)
                status_line, headers, body = self._render(environ, http_error, None)
                start_response(status_line, headers)
                return [body]
            environ["allotment.version"] = version
            version_header, vary_header = microversion.response_headers(version)

            def _start(status, headers, exc_info=None):
                headers = list(headers) + [version_header]
                if environ.pop("allotment.no_vary", False) is False:
                    headers.append(vary_header)
                return start_response(status, headers, exc_info)

            return app(environ, _start)

        return versioned

    def _log(self, environ, status, length, version, started) -> None:
        """One line per request, in Placement's words, with the request's
        context (request ids, user, project) for oslo.log to show."""
        if not REQUEST_LOG.isEnabledFor(logging.INFO):
            return
        path = environ.get("PATH_INFO", "")
        query = environ.get("QUERY_STRING")
        if query:
            path += "?" + query
        if not path.isprintable():
            # A decoded %0a would otherwise start a line of the client's making.
            path = logs.escape_for_log(path)
        # The record made here rather than by LOG.info, which would walk the
        # stack to find where it was called from: a fifth of the line's cost.
        code = Application._log.__code__
        record = REQUEST_LOG.makeRecord(
            REQUEST_LOG.name, logging.INFO, code.co_filename, code.co_firstlineno,
            '%s "%s %s" status: %s len: %s microversion: %s time: %.1fms',
            (environ.get("REMOTE_ADDR") or "-", logs.escape_for_log(environ.get("REQUEST_METHOD") or ""), path,
             str(status).split(" ")[0], length, version or "-", (time.monotonic() - started) * 1000), None,
            code.co_name)
        context = logs.request_context(environ)
        for key in _CLIENT_NAMED:
            value = context[key]
            if value and not value.isprintable():
                # noauth2 takes the user and project from the client's token.
                context[key] = logs.escape_for_log(value)
        record.context = context
        REQUEST_LOG.handle(record)

    def _guard(self, app: Callable) -> Callable:
        """Turn exceptions into error responses (inside CORS, so they get its headers)."""

        def guarded(environ, start_response):
            try:
                return app(environ, start_response)
            except errors.HTTPError as error:
                http_error = error
            except domain.PlacementError as error:
                http_error = errors.from_domain(error)
                if error.status == 403 or (error.status == 404 and not _handler_answers_not_found(environ, error)):
                    http_error.vary = False
            except CommitOutcomeUnknown:
                # write() has logged the error.
                http_error = errors.outcome_unknown()
            except Exception as error:  # noqa: BLE001 - the last line of defence
                if not is_unreachable(error):
                    LOG.exception("unexpected error", extra={"context": logs.request_context(environ)})
                    http_error = errors.HTTPError(500, "An unexpected error occurred; see the server log "
                                                       f"for request {environ.get('openstack.request_id')}.")
                else:
                    LOG.warning("database unavailable: %s", one_line(error),
                                extra={"context": logs.request_context(environ)})
                    http_error = errors.database_unavailable()
            if http_error.status == 404 and environ.get("allotment.handler") in _NOT_FOUND_ECHOED:
                http_error.message = _echoed(http_error.message)
            environ["allotment.error_code"] = http_error.code
            if not http_error.vary:
                environ["allotment.no_vary"] = True
            status_line, headers, body = self._render(environ, http_error, environ.get("allotment.version"))
            start_response(status_line, headers)
            return [body]

        return guarded

    @staticmethod
    def _render(environ, http_error, version):
        return errors.render(http_error, request_id=environ.get("openstack.request_id", ""), version=version,
                             accept=environ.get("HTTP_ACCEPT"), head=environ.get("REQUEST_METHOD") == "HEAD")

    # -- routing ----------------------------------------------------------
    def _dispatch(self, environ: dict, start_response) -> Iterable[bytes]:
        req = Request(environ)
        req.version = environ["allotment.version"]
        req.request_id = environ["openstack.request_id"]
        req.app = self
        req.context = RequestContext.from_environ(environ, req.request_id)
        environ["allotment.handler"] = None
        _check_content_length(environ)
        if environ.get("CONTENT_LENGTH") or environ.get("HTTP_TRANSFER_ENCODING"):
            # Only then is there a body (and the option worth reading: oslo.config is slow to ask).
            _limit_body(environ, self.conf.allotment.max_request_body_size)
        path = decoded_path(environ)
        if "\x00" in path:
            # No write accepts a NUL, so nothing can be named with one (and
            # PostgreSQL could not even be asked).
            raise errors.HTTPError(404, vary=False)
        found = self.router.match(path or "/")
        if found is None:
            raise errors.HTTPError(404, vary=False)
        methods, urlvars = found
        endpoint = methods.get(req.method)
        if endpoint is None:
            allowed = ", ".join(methods)  # in the route table's order, as Placement lists them
            raise errors.HTTPError(405, "The method specified is not allowed for this resource.",
                                   headers={"Allow": allowed}, explanation=_not_allowed_explanation(req))
        environ["allotment.handler"] = endpoint.handler
        if req.version < endpoint.min_version:
            raise errors.HTTPError(endpoint.too_old_status, explanation=_not_allowed_explanation(req)
                                   if endpoint.too_old_status == 405 else None)
        if endpoint.produces_json and endpoint.checks_accept and req.method == "GET":
            _check_accept(req)
        if endpoint.accepts_json:
            require_json_content(req)
        req.urlvars = urlvars
        req.endpoint = endpoint
        if endpoint.policy:
            req.authorize(endpoint.policy)
        response: webob.Response = endpoint.handler(req)
        return response(environ, start_response)


def _plain_mount_point(app: Callable) -> Callable:
    """Keep SCRIPT_NAME only when it is a plain path: a prefix forwarded as
    ``evil.example`` or ``//evil.example`` would put another host in every
    Location header (WebOb joins it to the host)."""

    def checked(environ, start_response):
        script_name = environ.get("SCRIPT_NAME", "")
        if script_name and not is_plain_path_prefix(script_name):
            LOG.warning("%s forwarded mount point %r ignored: not a plain path",
                        environ.get("openstack.request_id"), script_name[:100])
            environ["SCRIPT_NAME"] = ""
        return app(environ, start_response)

    return checked


#: Context values that may come from the client (noauth2's token): escaped like the path.
_CLIENT_NAMED = ("user", "project", "tenant", "domain", "user_domain", "project_domain", "system_scope")


def decoded_path(environ: dict) -> str:
    """PATH_INFO as text: UTF-8, or Latin-1 when the bytes are not UTF-8.

    A WSGI server hands PATH_INFO over as the raw bytes read as Latin-1.
    Bytes that are not UTF-8 cannot name anything stored, and Placement
    reads them as Latin-1 (``/resource_providers/%ff`` is 404 "No resource
    provider with uuid \\xff found"), so the request goes on as Placement's
    does instead of failing to decode.
    """
    raw = environ.get("PATH_INFO", "")
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return raw


def _check_content_length(environ: dict) -> None:
    length = environ.get("CONTENT_LENGTH")
    if not length:
        return
    try:
        size = int(length)
    except ValueError:
        raise errors.HTTPError(400, "content-length header must be an integer", vary=False) from None
    if size > 0 and not environ.get("CONTENT_TYPE"):
        raise errors.HTTPError(400, "content-type header required when content-length > 0", vary=False)


def _limit_body(environ: dict, limit: int) -> None:
    """413 for a body over ``limit`` bytes, before any of it is read.

    A declared Content-Length says so at once; a chunked body (no length)
    is read through a counter that stops at the limit.
    """
    length = environ.get("CONTENT_LENGTH")
    if length and int(length) > limit:
        raise _too_large(f"The request body is {int(length)} bytes", limit)
    if not length and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        environ["wsgi.input"] = _LimitedInput(environ["wsgi.input"], limit)


def _too_large(what: str, limit: int) -> errors.HTTPError:
    return errors.HTTPError(413, f"{what}; the largest accepted is {limit} bytes "
                                 "([allotment] max_request_body_size).")


class _LimitedInput:
    """``wsgi.input`` that refuses (413) to deliver more than ``limit`` bytes."""

    def __init__(self, stream, limit: int):
        self._stream = stream
        self._left = limit
        self._limit = limit

    def read(self, size: int = -1) -> bytes:
        return self._counted(self._stream.read(self._wanted(size)))

    def readline(self, size: int = -1) -> bytes:
        return self._counted(self._stream.readline(self._wanted(size)))

    def _wanted(self, size: int | None) -> int:
        # One byte beyond the limit tells a body at the limit from a longer one.
        return self._left + 1 if size is None or size < 0 else min(size, self._left + 1)

    def _counted(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            raise _too_large("The request body (sent in chunks) is larger", self._limit)
        return data

    def __iter__(self):
        return iter(self.readline, b"")


#: Accept headers that take JSON for certain, without parsing them.
_TAKES_JSON = frozenset(("application/json", "*/*"))


def _check_accept(req: Request) -> None:
    accept = req.environ.get("HTTP_ACCEPT")
    if not accept or accept in _TAKES_JSON:
        return
    if not req.accept.acceptable_offers(["application/json"]):
        raise errors.HTTPError(406, "Only application/json is provided",
                               explanation=_not_acceptable_explanation(req.environ))


def _not_allowed_explanation(req: Request) -> str:
    return f"The method {req.method} is not allowed for this resource. "


def _not_acceptable_explanation(environ: dict) -> str:
    # Placement's wording, unclosed parenthesis and trailing space included.
    accept = errors.effective_accept(environ.get("HTTP_ACCEPT"))
    return f"The resource could not be generated that was acceptable to your browser (content of type {accept}. "


# Handlers of which Placement answers a missing object itself (so the 404
# carries Vary like any answer of theirs); elsewhere the lookup's NotFound
# escapes the handler and the 404 carries the version header only.
_NOT_FOUND_ANSWERED = frozenset({
    traits.list_traits_for_resource_provider, traits.get_trait, traits.delete_trait,
    usages.list_usages,
    resource_providers.delete_resource_provider,
    inventories.get_inventories, inventories.get_inventory,
    allocations.list_for_resource_provider, allocations.set_allocations_for_consumer,
    allocations.set_allocations, allocations.delete_allocations,
    reshaper.reshape,
})


def _handler_answers_not_found(environ: dict, error: domain.PlacementError) -> bool:
    handler = environ.get("allotment.handler")
    if handler in (inventories.update_inventory, inventories.delete_inventory):
        # Only a missing inventory is answered there; a missing provider or class escapes.
        return not error.message.startswith(("No resource provider", "No such resource class"))
    return handler in _NOT_FOUND_ANSWERED


# Handlers of which Placement's 404 text repeats the lookup's message
# ("No resource provider with uuid X found: No resource provider with uuid
# X found"): clients that match the whole text see it.
_NOT_FOUND_ECHOED = frozenset({usages.list_usages})


def _echoed(message: str) -> str:
    half = (len(message) - 2) // 2
    if message[:half] == message[half + 2:] and message[half:half + 2] == ": ":
        return message  # already in that form
    return f"{message}: {message}"
