"""The production server: gunicorn, pre-forking worker processes.

gunicorn is a mature pre-fork WSGI server: several processes (no GIL
contention between them), each with a few threads for requests waiting on
the database, workers restarted if they hang, graceful reloads on SIGHUP.
The application is built (and the schema migrated) once in the master;
each worker then opens its own database connections after the fork.
"""

from __future__ import annotations

import ctypes
import gc
import glob
import os
import shutil
import tempfile
import time
import uuid

from gunicorn import util
from gunicorn.app.base import BaseApplication
from gunicorn.http import errors as http_errors
from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

from allotment.api import errors

#: The longest request line (method, path, query string, protocol) served:
#: gunicorn's largest finite limit; a longer one is answered 414.
MAX_REQUEST_LINE = 8190

# gunicorn's own refusals of a request it could not parse, and their
# statuses (names looked up, as older gunicorns lack some of them).
_STATUSES = {"LimitRequestLine": 414, "LimitRequestHeaders": 431, "ExpectationFailed": 417,
             "ForbiddenProxyRequest": 403, "UnsupportedTransferCoding": 501}
_BAD_REQUESTS = ("InvalidRequestLine", "InvalidRequestMethod", "InvalidHTTPVersion", "InvalidHeader",
                 "InvalidHeaderName", "InvalidProxyLine", "InvalidProxyHeader", "InvalidSchemeHeaders",
                 "ObsoleteFolding", "InvalidChunkSize", "ChunkMissingTerminator", "InvalidChunkExtension",
                 "InvalidH2CPreface", "NoMoreData")


def _status_for(error: Exception) -> int | None:
    """The status gunicorn answers a request it refused to parse (None: not such an error)."""
    for name, status in _STATUSES.items():
        cls = getattr(http_errors, name, None)
        if cls is not None and isinstance(error, cls):
            return status
    refused = tuple(getattr(http_errors, name) for name in _BAD_REQUESTS if hasattr(http_errors, name))
    return 400 if isinstance(error, refused) else None


class _PlacementErrors:
    """A worker that answers the requests gunicorn itself refuses (request
    line too long, malformed headers) in Placement's error format, with a
    request id, like every other error, instead of gunicorn's HTML page."""

    def handle_error(self, req, client, addr, exc):
        status = _status_for(exc)
        if status is None:
            return super().handle_error(req, client, addr, exc)
        request_id = "req-" + str(uuid.uuid4())
        self.log.warning("%s refused before reaching the application from %s: %s",
                         request_id, (addr or ("",))[0], exc)
        status_line, headers, body = errors.render(errors.HTTPError(status, str(exc)), request_id=request_id,
                                                   version=None, accept=None)
        head = [f"HTTP/1.1 {status_line}", "Connection: close", f"x-openstack-request-id: {request_id}"]
        head += [f"{name}: {value}" for name, value in headers]
        try:
            util.write_nonblock(client, ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        except Exception:  # noqa: BLE001 - the client may be gone; as gunicorn does
            self.log.debug("Failed to send error message.")


#: Longest time between two heartbeats a worker sends the arbiter (at
#: most a tenth of ``--timeout``).
HEARTBEAT_INTERVAL = 1.0


class _SparseHeartbeat:
    """A worker that tells the arbiter it is alive once a second, not on
    every pass of its loop.

    gunicorn's workers call ``notify`` (an ``os.utime`` of the worker's
    heartbeat file) each time round their loop: two or three times per
    request for the threaded worker.  The arbiter only checks that the
    file was touched within ``--timeout`` seconds (120 by default).
    """

    _last_heartbeat = float("-inf")

    def notify(self):
        now = time.monotonic()
        if now - self._last_heartbeat >= min(HEARTBEAT_INTERVAL, self.timeout / 10):
            self._last_heartbeat = now
            super().notify()


class PlacementThreadWorker(_PlacementErrors, _SparseHeartbeat, ThreadWorker):
    """gunicorn's threaded worker, refusing in Placement's error format."""


class PlacementSyncWorker(_PlacementErrors, _SparseHeartbeat, SyncWorker):
    """gunicorn's single-threaded worker, refusing in Placement's error format."""

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


#: glibc malloc arenas per worker, unless ``MALLOC_ARENA_MAX`` is set in
#: the environment.  glibc gives a thread that finds the arena busy an
#: arena of its own, and freed memory stays with each: after concurrent
#: requests every thread's arena grew to the largest answer it built.
#: Measured at large scale (10,000 hosts, SQLite, 8 parallel clients,
#: then 40 no-limit candidate requests): 136 MB per worker by default,
#: 118 MB with one arena.  Python holds the GIL for its own allocations,
#: so one arena costs little waiting.
MALLOC_ARENAS = 1
_M_ARENA_MAX = -8  # glibc's mallopt parameter


def _limit_malloc_arenas() -> None:
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: nothing to set
        return
    mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


def _post_fork(server, worker):
    # Connections opened in the master must not be shared with children.
    server.app._app.db.dispose()
    # Before the worker's threads start.
    _limit_malloc_arenas()
    # What the master made (modules, the application, about 100,000
    # objects) lives as long as the worker: out of the collector's sight,
    # a full collection walks only what the worker made since.  Measured
    # in process (small sharing cloud, 3,000 candidate requests): one
    # full collection of 54 ms without, none with.
    gc.freeze()


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
        "worker_class": "allotment.server." + ("PlacementThreadWorker" if threads > 1 else "PlacementSyncWorker"),
        "limit_request_line": MAX_REQUEST_LINE,
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
