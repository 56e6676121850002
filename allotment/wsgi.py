"""WSGI entry point for operators' own servers (uwsgi, mod_wsgi, gunicorn).

``allotment.wsgi:application`` reads ``$OS_PLACEMENT_CONFIG_DIR/placement.conf``
or ``/etc/placement/placement.conf``, as upstream's WSGI script does, and
brings the schema to head before serving.  While the database cannot be
served (it is unreachable, or a Placement database waits for ``allotment db
online-data-migrations``), every request gets a 503 in Placement's error
format saying why, and the next request tries again.
"""

from __future__ import annotations

import logging
import threading
import uuid

from allotment import service

LOG = logging.getLogger(__name__)


def init_application():
    return service.build_application(service.load_config(None))


class _LazyApplication:
    """Build on first request, so importing this module has no side effects."""

    def __init__(self, init=init_application):
        self._app = None
        self._init = init
        self._lock = threading.Lock()

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
        import sqlalchemy as sa

        from allotment.api import errors
        from allotment.db.migrate import SchemaNotReady

        from allotment.db.engine import is_unreachable, one_line

        if isinstance(error, SchemaNotReady):
            # Our own one line about the schema: nothing of the connection in it.
            LOG.error("not serving yet: %s", error)
            http_error = errors.HTTPError(503, f"The Placement database is not ready: {error}",
                                          headers={"Retry-After": str(errors.RETRY_AFTER_SECONDS)})
        elif isinstance(error, sa.exc.SQLAlchemyError) or is_unreachable(error):
            # The driver's text names the database's address and user: the log only.
            LOG.error("not serving yet: database error: %s", one_line(error))
            http_error = errors.database_unavailable()
        else:
            raise error
        status, headers, body = errors.render(
            http_error, request_id=f"req-{uuid.uuid4()}", version=None, accept=environ.get("HTTP_ACCEPT"))
        start_response(status, headers)
        return [body]


application = _LazyApplication()
