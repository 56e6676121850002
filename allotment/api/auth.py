"""Authentication strategies: keystonemiddleware auth_token, or noauth2.

The root document (``GET /``) never needs a token, as upstream, so version
discovery works before a client has credentials; nor do the other public
routes (the API description), which the application names with
``is_public``.
"""

from __future__ import annotations

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
        from keystonemiddleware import auth_token

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


def wrap(app: WSGIApp, conf: cfg.ConfigOpts, strategy: str | None = None,
         is_public: Callable[[dict], bool] = _is_root) -> WSGIApp:
    """Put the authentication middleware ``strategy`` (default: the configured
    one) around ``app``; requests ``is_public`` accepts pass without a token."""
    if (strategy or conf.api.auth_strategy) == "noauth2":
        return NoAuth2(app, is_public)
    return KeystoneAuth(app, conf, is_public)
