"""The production server: gunicorn, pre-forking worker processes.

gunicorn is a mature pre-fork WSGI server: several processes (no GIL
contention between them), each with a few threads for requests waiting on
the database, workers restarted if they hang, graceful reloads on SIGHUP.
The application is built (and the schema migrated) once in the master;
each worker then opens its own database connections after the fork.
"""

from __future__ import annotations

from gunicorn.app.base import BaseApplication


class _Server(BaseApplication):
    def __init__(self, app, options: dict):
        self._app = app
        self._options = options
        super().__init__()

    def load_config(self):
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self):
        return self._app


def _post_fork(server, worker):
    # Connections opened in the master must not be shared with children.
    server.app._app.db.dispose()


def run(app, *, host: str, port: int, workers: int, threads: int, timeout: int) -> None:
    options = {
        "bind": f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
        "workers": workers,
        "threads": threads,
        "worker_class": "gthread" if threads > 1 else "sync",
        "timeout": timeout,
        "graceful_timeout": 10,
        "keepalive": 5,
        "accesslog": None,  # the application logs one line per request itself
        "loglevel": "warning",
        "post_fork": _post_fork,
        "proc_name": "allotment",
    }
    _Server(app, options).run()
