"""The direct interface: the Placement API in-process, without a server.

An offline upgrade script (every API process stopped, only the database
running) still has to change provider trees the way the API would, with
the same schema validation, microversion rules, policy and generation
checks.  So instead of a second, "internal" Python API, this module drives
the very WSGI application that ``allotment serve`` runs, through a
``requests.Session`` whose transport hands each request to the application
in the calling thread.  Nothing listens on a socket; only the database
connections go over the network.

    from allotment import config
    from allotment.direct import Direct

    with Direct(config.load("/etc/placement/placement.conf")) as client:
        providers = client.get("/resource_providers").json()
        client.post("/reshaper", json=payload, microversion="1.30")

Identity and policy
-------------------
The application is built with ``noauth2`` authentication whatever
``[api] auth_strategy`` says (keystone cannot be asked while the control
plane is down, and the caller already holds the database credentials, which
give it every power anyway).  The caller's ``ConfigOpts`` is not modified.
Each request carries, unless the caller sends its own headers:

* ``X-Auth-Token: admin`` — user ``admin``, project ``admin``, a
  project-scoped identity;
* ``X-Roles: admin,service`` — ``admin`` satisfies every legacy default and
  ``admin_or_service`` rule; ``service`` is what the new defaults require
  for ``POST /reshaper``.

Policy is still enforced on every request: a policy file that denies these
roles makes the direct interface answer 403 too.  Pass ``roles=`` (or
per-request ``X-Roles`` / ``X-Auth-Token`` headers) to act as someone else.

Microversions
-------------
Requests ask for ``latest`` unless ``Direct(..., microversion="1.30")``
chooses another default; ``client.get(..., microversion="1.14")`` or an
explicit ``OpenStack-API-Version`` header picks one per request.
"""

from __future__ import annotations

import io
import os
from typing import Any, Iterable
from urllib.parse import urlsplit

import requests
import requests.adapters
import requests.structures
import requests.utils
import webob
from oslo_config import cfg

from allotment import config as allotment_config
from allotment import service

#: The fake origin requests are addressed to; never resolved or connected to.
BASE_URL = "http://allotment.direct"
DEFAULT_ROLES = ("admin", "service")
DEFAULT_TOKEN = "admin"
MICROVERSION_HEADER = "OpenStack-API-Version"


class WSGIAdapter(requests.adapters.BaseAdapter):
    """A requests transport that answers each request by calling a WSGI app.

    The request is turned into a WSGI environ (WebOb builds it, with the
    PEP 3333 path decoding), the application runs in the calling thread,
    and its status, headers and body become an ordinary
    ``requests.Response``.
    """

    def __init__(self, app: Any):
        super().__init__()
        self.app = app

    def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None,
             verify: Any = True, cert: Any = None, proxies: Any = None) -> requests.Response:
        parts = urlsplit(request.url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        environ_request = webob.Request.blank(path, base_url=f"{parts.scheme}://{parts.netloc}",
                                              method=request.method)
        for name, value in request.headers.items():
            environ_request.headers[name] = value
        body = request.body
        if body is not None:
            if hasattr(body, "read"):
                body = body.read()
            if isinstance(body, str):
                body = body.encode("utf-8")
            environ_request.body = body
        wsgi_response = environ_request.get_response(self.app)
        return self._build_response(request, wsgi_response)

    @staticmethod
    def _build_response(request: requests.PreparedRequest,
                        wsgi_response: webob.Response) -> requests.Response:
        response = requests.Response()
        response.status_code = wsgi_response.status_code
        response.reason = wsgi_response.status.partition(" ")[2]
        response.headers = requests.structures.CaseInsensitiveDict(wsgi_response.headerlist)
        body = wsgi_response.body
        response._content = body
        response.raw = io.BytesIO(body)
        response.encoding = requests.utils.get_encoding_from_headers(response.headers)
        response.url = request.url
        response.request = request
        response.connection = None
        return response

    def close(self) -> None:
        """Nothing to release: there is no connection."""


class DirectSession(requests.Session):
    """A ``requests.Session`` bound to the in-process application.

    Paths may be given alone (``"/resource_providers"``); ``microversion=``
    sets the ``OpenStack-API-Version`` header of one request.
    """

    def __init__(self, app: Any, *, microversion: str = "latest", token: str = DEFAULT_TOKEN,
                 roles: Iterable[str] = DEFAULT_ROLES):
        super().__init__()
        self.app = app
        self.base_url = BASE_URL
        self.trust_env = False  # no proxies or netrc: nothing leaves the process
        self.mount(BASE_URL + "/", WSGIAdapter(app))
        self.headers.update({
            "Accept": "application/json",
            "X-Auth-Token": token,
            MICROVERSION_HEADER: f"placement {microversion}",
        })
        roles = ",".join(roles)
        if roles:
            self.headers["X-Roles"] = roles

    def request(self, method: str, url: str, *args: Any, microversion: str | None = None,
                **kwargs: Any) -> requests.Response:
        if url.startswith("/"):
            url = self.base_url + url
        if microversion is not None:
            headers = dict(kwargs.pop("headers", None) or {})
            headers[MICROVERSION_HEADER] = f"placement {microversion}"
            kwargs["headers"] = headers
        return super().request(method, url, *args, **kwargs)


class Direct:
    """Context manager: the API in-process against the configured database.

    ``config`` is a populated ``oslo_config.cfg.ConfigOpts`` (for example
    from :func:`allotment.config.load`) or the path of a ``placement.conf``.
    Entering migrates the schema to the latest revision (as ``allotment db
    sync`` would; ``migrate=False`` skips it) and yields a
    :class:`DirectSession`; leaving closes it and the database pool.
    ``microversion``, ``token`` and ``roles`` set the defaults every
    request carries (see the module doc).
    """

    def __init__(self, config: cfg.ConfigOpts | str | os.PathLike, *, microversion: str = "latest",
                 token: str = DEFAULT_TOKEN, roles: Iterable[str] = DEFAULT_ROLES,
                 migrate: bool = True):
        self._config = config
        self._microversion = microversion
        self._token = token
        self._roles = tuple(roles)
        self._migrate = migrate
        self._app: Any = None
        self._session: DirectSession | None = None

    def _conf(self) -> cfg.ConfigOpts:
        if isinstance(self._config, cfg.ConfigOpts):
            return self._config
        return allotment_config.load(os.fspath(self._config))

    def __enter__(self) -> DirectSession:
        self._app = service.build_application(self._conf(), prepare=self._migrate,
                                              auth_strategy="noauth2")
        self._session = DirectSession(self._app, microversion=self._microversion,
                                      token=self._token, roles=self._roles)
        return self._session

    def __exit__(self, *exc_info: Any) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._app is not None:
            self._app.db.engine.dispose()  # close the pooled connections now
            self._app = None
