"""Authentication strategies: keystonemiddleware auth_token, or noauth2.

The root document (``GET /``) never needs a token, as upstream, so version
discovery works before a client has credentials; nor do the other public
routes (the API description), which the application names with
``is_public``.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Callable

from oslo_config import cfg

from allotment.api import errors

LOG = logging.getLogger(__name__)

WSGIApp = Callable


def _is_root(environ: dict) -> bool:
    return environ.get("PATH_INFO", "") in ("", "/")


def _unauthorized(environ, start_response):
    status_line, headers, body = errors.unauthorized(environ.get("HTTP_ACCEPT"))
    if environ.get("REQUEST_METHOD") == "HEAD":
        headers, body = [("Content-Type", "text/html; charset=UTF-8"), ("Content-Length", "0")], b""
    start_response(status_line, headers)
    return [body]


class NoAuth2:
    """Trust the token: ``user[:project]``; ``X-Roles`` overrides the roles.

    For tests and development only: whoever can reach the port is whoever
    they claim to be.
    """

    def __init__(self, app: WSGIApp, is_public: Callable[[dict], bool] = _is_root):
        self.app = app
        self._is_public = is_public

    def __call__(self, environ, start_response):
        token = environ.get("HTTP_X_AUTH_TOKEN")
        if token is None:
            if self._is_public(environ):
                return self.app(environ, start_response)
            return _unauthorized(environ, start_response)
        user, _, project = token.partition(":")
        project = project or user
        environ["HTTP_X_USER_ID"] = user
        # As upstream: the token's project goes to X-Tenant-Id, so an explicit
        # X-Project-Id header sent by the client takes precedence.
        environ["HTTP_X_TENANT_ID"] = project
        if "HTTP_X_ROLES" not in environ:
            environ["HTTP_X_ROLES"] = "admin" if user == "admin" else ""
        return self.app(environ, start_response)


class KeystoneAuth:
    """keystonemiddleware auth_token, skipped for the public routes.

    auth_token removes the identity headers a client sent and sets them
    from the validated token.  A request that still names no user (a token
    it could not validate, under ``delay_auth_decision``) is 401, as
    Placement answers it: auth_token adds its ``WWW-Authenticate`` on the
    way out.
    """

    def __init__(self, app: WSGIApp, conf: cfg.ConfigOpts, is_public: Callable[[dict], bool] = _is_root):
        from keystonemiddleware import auth_token  # heavy, and needed only with keystone

        self.app = app
        self._is_public = is_public
        self._protected = auth_token.AuthProtocol(_require_user(app), {"oslo_config_config": conf})

    def __call__(self, environ, start_response):
        if self._is_public(environ):
            return self.app(environ, start_response)
        return self._protected(environ, start_response)


def _require_user(app: WSGIApp) -> WSGIApp:
    def with_user(environ, start_response):
        if environ.get("HTTP_X_USER_ID") is None and environ.get("HTTP_X_USER") is None:
            LOG.debug("%s has no user id after authentication: 401", environ.get("openstack.request_id"))
            return _unauthorized(environ, start_response)
        return app(environ, start_response)

    return with_user


def _is_loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback interface:
    ``localhost`` (or a name under ``.localhost``), 127.0.0.0/8 or ``[::1]``,
    with or without a port."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        if not bracket or (rest and not (rest[:1] == ":" and rest[1:].isdigit())):
            return False
    else:
        name, colon, port = host.rpartition(":")
        if not colon:
            name = host
        elif not port.isdigit():
            return False
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def loopback_hosts_only(app: WSGIApp) -> WSGIApp:
    """Refuse (400) a request whose ``Host`` is not a loopback name.

    For the embedded default (noauth2 on 127.0.0.1, no configuration file),
    where whoever reaches the port is admin: a web page open in the
    operator's browser could otherwise reach it through a name of its own
    that it makes resolve to 127.0.0.1 (DNS rebinding); the browser then
    sends that name as ``Host``.
    """

    def checked(environ, start_response):
        host = environ.get("HTTP_HOST")
        if host is not None and not _is_loopback_host(host):
            LOG.warning("%s refused: Host %r is not a loopback name (embedded default, noauth2)",
                        environ.get("openstack.request_id"), host[:100])
            status_line, headers, body = errors.render(
                errors.HTTPError(400, "The embedded default (noauth2, no configuration file) answers only "
                                      "requests addressed to localhost, 127.0.0.1 or [::1]."),
                request_id=environ.get("openstack.request_id", ""), version=None,
                accept=environ.get("HTTP_ACCEPT"), head=environ.get("REQUEST_METHOD") == "HEAD")
            start_response(status_line, headers)
            return [body]
        return app(environ, start_response)

    return checked


def wrap(app: WSGIApp, conf: cfg.ConfigOpts, strategy: str | None = None,
         is_public: Callable[[dict], bool] = _is_root) -> WSGIApp:
    """Put the authentication middleware ``strategy`` (default: the configured
    one) around ``app``; requests ``is_public`` accepts pass without a token."""
    if (strategy or conf.api.auth_strategy) == "noauth2":
        return NoAuth2(app, is_public)
    return KeystoneAuth(app, conf, is_public)
