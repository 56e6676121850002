"""``GET /allotment/ui``: the capacity view's page and its two files.

Public (the files hold no data: the page asks for a token and then reads
the API with it), 404 unless ``[allotment] ui`` is on.  The page is served
with a Content-Security-Policy that lets it load scripts, styles and data
from this server only.  ``/allotment/ui/`` (with the slash people type) is
redirected to ``/allotment/ui`` before authentication by
:func:`slash_redirect`, for that exact path only: a redirect carries no
data, and every other path ending in a slash still goes through the token
check (and then 404).
"""

from __future__ import annotations

import webob

from allotment import ui
from allotment.api.errors import HTTPError
from allotment.api.http import Request, is_plain_path_prefix
from allotment.api.endpoint import OWN_PREFIX

PAGE = OWN_PREFIX + "ui"
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                           "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def page(req: Request) -> webob.Response:
    """The capacity view's page (HTML)."""
    return _asset(req, "")


def script(req: Request) -> webob.Response:
    """The capacity view's script."""
    return _asset(req, "/app.js")


def stylesheet(req: Request) -> webob.Response:
    """The capacity view's style sheet."""
    return _asset(req, "/app.css")


def _asset(req: Request, which: str) -> webob.Response:
    if not req.app.conf.allotment.ui:
        raise HTTPError(404)
    name, content_type = ui.ASSETS[which]
    response = webob.Response(body=ui.read(name), status=200, charset=None)
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    if name == "index.html":
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Frame-Options"] = "DENY"
    return response


def slash_redirect(app):
    """WSGI middleware: ``GET /allotment/ui/`` -> 301 ``/allotment/ui``.

    Always to this server: the mount point (SCRIPT_NAME) is kept only when
    it is a plain path."""

    def redirect(environ, start_response):
        if environ.get("PATH_INFO") == PAGE + "/" and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            prefix = environ.get("SCRIPT_NAME", "")
            location = (prefix if is_plain_path_prefix(prefix) else "") + PAGE
            start_response("301 Moved Permanently", [("Location", location), ("Content-Length", "0")])
            return [b""]
        return app(environ, start_response)

    return redirect
