"""The production server: gunicorn, pre-forking worker processes.

gunicorn is a mature pre-fork WSGI server: several processes (no GIL
contention between them), each with a few threads for requests waiting on
the database, workers restarted if they hang, graceful reloads on SIGHUP.
The application is built (and the schema migrated) once in the master;
each worker then opens its own database connections after the fork.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

from gunicorn.app.base import BaseApplication

#: prometheus_client's switch to multi-process mode (see api/metrics.py).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


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


def prepare_metrics(conf) -> str | None:
    """With ``[allotment] metrics`` on, make every worker count into one
    place: a directory for prometheus_client's multi-process mode, named in
    the environment before the library is imported (the workers inherit
    it).  An operator's own ``PROMETHEUS_MULTIPROC_DIR`` is used, emptied of
    a previous run's files; otherwise a new one is made (and removed at
    exit).  Returns the directory this call made, if any."""
    if not conf.allotment.metrics:
        return None
    directory = os.environ.get(METRICS_DIR_ENV)
    if directory:
        os.makedirs(directory, exist_ok=True)
        for stale in glob.glob(os.path.join(directory, "*.db")):
            os.remove(stale)
        return None
    directory = tempfile.mkdtemp(prefix="allotment-metrics-")
    os.environ[METRICS_DIR_ENV] = directory
    return directory


def _child_exit(server, worker):
    if os.environ.get(METRICS_DIR_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def run(app, *, host: str, port: int, workers: int, threads: int, timeout: int,
        metrics_dir: str | None = None) -> None:
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
        "child_exit": _child_exit,
        "proc_name": "allotment",
    }
    try:
        _Server(app, options).run()
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
