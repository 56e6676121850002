"""WSGI entry point for operators' own servers (uwsgi, mod_wsgi, gunicorn).

``allotment.wsgi:application`` reads ``$OS_PLACEMENT_CONFIG_DIR/placement.conf``
or ``/etc/placement/placement.conf``, as upstream's WSGI script does, and
brings the schema to head before serving.
"""

from __future__ import annotations

from allotment import service


def init_application():
    return service.build_application(service.load_config(None))


class _LazyApplication:
    """Build on first request, so importing this module has no side effects."""

    def __init__(self):
        self._app = None

    def __call__(self, environ, start_response):
        if self._app is None:
            self._app = init_application()
        return self._app(environ, start_response)


application = _LazyApplication()
