"""WSGI entry point for operators' own servers (uwsgi, mod_wsgi, gunicorn).

``allotment.wsgi:application`` reads ``$OS_PLACEMENT_CONFIG_DIR/placement.conf``
(else ``/etc/placement/placement.conf`` and the other places Placement
looks) and a ``placement.conf.d``, as upstream's WSGI script does.  Like
Placement's application it brings the schema to head only when
``[placement_database] sync_on_startup`` is set; otherwise the schema must
be at head already (``placement-manage db sync``).  It is built on the
first request, so importing this module has no side effects.

:func:`started_application` builds it at once instead, waiting for the
database as ``[placement_database] max_retries`` / ``retry_interval`` say,
as Placement's ``placement.wsgi.api`` does when imported (the
``allotment-placement-wsgi`` distribution ships that module).

While the database cannot be served (it is unreachable, its schema is not
at head, or a Placement database waits for online data migrations), every
request gets a 503 in Placement's error format saying why, and the next
request tries again.
"""

from __future__ import annotations

import logging
import threading

import sqlalchemy as sa

from allotment import config_audit, service
from allotment.api import errors
from allotment.api.request_id import new_request_id
from allotment.db.engine import is_unreachable
from allotment.db.migrate import SchemaNotReady, why_unavailable

LOG = logging.getLogger(__name__)


_conf = None


def init_application(*, wait: bool = False):
    """The application of the configuration found as Placement finds it
    (read, and its unhonoured options warned about, once per process)."""
    global _conf
    if _conf is None:
        conf = service.load_config(None)
        config_audit.warn(conf)
        _conf = conf
    return service.build_application(_conf, prepare=None, wait=wait)


class _LazyApplication:
    """Build on first request, so importing this module has no side effects."""

    def __init__(self, init=init_application):
        self._app = None
        self._init = init
        self._lock = threading.Lock()

    def start(self) -> None:
        """Build now, waiting for the database; on failure, say why and
        leave it to the first request to try again."""
        try:
            with self._lock:
                if self._app is None:
                    self._app = self._init(wait=True)
        except Exception as error:  # noqa: BLE001 - logged; requests are answered 503 until it works
            if not _is_database_error(error):
                raise
            LOG.error("not serving yet: %s", why_unavailable(error))

    def __call__(self, environ, start_response):
        if self._app is None:
            try:
                with self._lock:
                    if self._app is None:
                        self._app = self._init()
            except Exception as error:  # noqa: BLE001 - answered as a 503, logged
                return self._unavailable(error, environ, start_response)
        return self._app(environ, start_response)

    @staticmethod
    def _unavailable(error, environ, start_response):
        if isinstance(error, SchemaNotReady):
            # Our own one line about the schema: nothing of the connection in it.
            http_error = errors.HTTPError(503, f"The Placement database is not ready: {error}",
                                          headers={"Retry-After": str(errors.RETRY_AFTER_SECONDS)})
        elif isinstance(error, sa.exc.SQLAlchemyError) or is_unreachable(error):
            # The driver's text names the database's address and user: the log only.
            http_error = errors.database_unavailable()
        else:
            raise error
        LOG.error("not serving yet: %s", why_unavailable(error))
        status, headers, body = errors.render(
            http_error, request_id=new_request_id(), version=None, accept=environ.get("HTTP_ACCEPT"))
        start_response(status, headers)
        return [body]


def _is_database_error(error: BaseException) -> bool:
    return isinstance(error, (SchemaNotReady, sa.exc.SQLAlchemyError)) or is_unreachable(error)


def started_application() -> _LazyApplication:
    """The application built now (see the module's note), for ``placement.wsgi.api``."""
    app = _LazyApplication()
    app.start()
    return app


application = _LazyApplication()
