"""The production server: granian (HTTP in Rust), pre-forked worker processes.

Why granian: its HTTP/1 layer (hyper, on an event loop) reads requests
without a thread per connection, so clients that trickle their headers
or hold idle keep-alive connections cost a socket and a little memory,
never one of the threads that run the application; headers that do not
arrive within :data:`HEADER_TIMEOUT` seconds close the connection.  Only a
complete request head reaches a Python thread.  Measured against the
threaded gunicorn worker it replaced (bench, small scale, one run with
both servers interleaved): 1.5-1.7x less server CPU per small read,
p50 0.78x, claims/s 1.41x; with 64 trickling and 64 idle connections held,
every normal request answered in under 0.05 s (gunicorn: none within 5 s).
docs/serving.md has the figures and the limits.

The application is built (and the schema migrated) once in the master;
the workers are forked from it and inherit it, then open their own
database connections.
"""

from __future__ import annotations

import ctypes
import gc
import glob
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from typing import Callable, Iterable

from allotment import logs
from allotment.api import errors
from allotment.api.request_id import REQUEST_ID_HEADER, new_request_id

LOG = logging.getLogger("allotment.server")

#: The longest request line (method, target, protocol) served, as
#: decoded; a longer one is answered 414 in Placement's error format.
MAX_REQUEST_LINE = 8190

#: Seconds a client has to send a complete request head once it starts,
#: and that an idle keep-alive connection is kept open.
HEADER_TIMEOUT = 10

#: The largest request head (request line and headers) read, in bytes;
#: a larger one is refused by the HTTP layer with 431.
MAX_HEAD_BYTES = 64 * 1024

#: Connections waiting to be accepted (listen backlog); requests in
#: progress per worker are bounded at this over the number of workers.
BACKLOG = 1024

#: Seconds the master waits for a worker to finish its requests when
#: stopping or reloading before it kills the worker.
GRACEFUL_TIMEOUT = 10

#: The shortest ``--timeout`` applied (seconds).
MIN_TIMEOUT = 10

#: Keys of a WSGI environ that a request sets (or may leave unset), which
#: must never come from the server's process environment (see _Worker).
_REQUEST_KEYS = ("CONTENT_TYPE", "CONTENT_LENGTH", "REMOTE_USER", "AUTH_TYPE", "SCRIPT_NAME")


class _Worker:
    """The application as one worker process serves it.

    * A request line over :data:`MAX_REQUEST_LINE` is answered 414 in
      Placement's error format (the HTTP layer's own limit is larger).
    * granian starts each request's environ from the worker's process
      environment: a variable named like a header (``HTTP_PROXY``) would
      read as one the client sent.  Those are taken out again (the very
      string objects, so a header the client did send stays).
    * A request running longer than ``timeout`` seconds means the worker
      is stuck: it logs which request and exits, and the master starts a
      new one (as gunicorn's ``--timeout`` did).
    """

    def __init__(self, app: Callable, timeout: float, environment: dict[str, str] | None = None):
        self.app = app
        # granian stops serving when a worker dies within 5.5 s of being
        # started: never so soon because of this rule.
        self.timeout = max(timeout, MIN_TIMEOUT) if timeout > 0 else 0
        environment = os.environ if environment is None else environment
        self._leaked = tuple((key, value) for key, value in environment.items()
                             if key.startswith("HTTP_") or key in _REQUEST_KEYS)
        #: thread id -> (start, request id, method, path) of the requests running.
        self.running: dict[int, tuple] = {}

    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        for key, value in self._leaked:
            if environ.get(key) is value:
                del environ[key]
        if environ.get("SCRIPT_NAME") is None:
            environ["SCRIPT_NAME"] = ""
        line = (len(environ.get("REQUEST_METHOD", "")) + len(environ.get("PATH_INFO", ""))
                + len(environ.get("QUERY_STRING", "")) + len(environ.get("SERVER_PROTOCOL", "")) + 3)
        if line > MAX_REQUEST_LINE:
            return _refuse(start_response, 414, f"Request Line is too large ({line} > {MAX_REQUEST_LINE})")
        thread = threading.get_ident()
        self.running[thread] = (time.monotonic(), environ)
        try:
            return self.app(environ, start_response)
        finally:
            self.running.pop(thread, None)

    def stuck(self, now: float) -> dict | None:
        """The environ of a request running for longer than the timeout, if any."""
        for started, environ in list(self.running.values()):
            if now - started > self.timeout:
                return environ
        return None

    def watch(self) -> None:
        """Exit the worker when a request is stuck (a daemon thread's loop)."""
        interval = max(0.5, min(5.0, self.timeout / 4))
        while True:
            time.sleep(interval)
            environ = self.stuck(time.monotonic())
            if environ is not None:
                LOG.error("%s %s %s still running after %ss: worker %d exits and is replaced",
                          environ.get("openstack.request_id", "-"), environ.get("REQUEST_METHOD"),
                          logs.escape_for_log(environ.get("PATH_INFO", "")), self.timeout, os.getpid())
                logging.shutdown()
                os._exit(1)


def _refuse(start_response, status: int, message: str) -> list[bytes]:
    request_id = new_request_id()
    LOG.warning("%s refused before reaching the application: %s", request_id, message)
    status_line, headers, body = errors.render(errors.HTTPError(status, message), request_id=request_id,
                                               version=None, accept=None)
    start_response(status_line, list(headers) + [(REQUEST_ID_HEADER, request_id), ("Connection", "close")])
    return [body]


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


def worker_application(app, timeout: float) -> _Worker:
    """What a freshly forked worker serves: ``app``, set up for this process."""
    # Connections opened in the master must not be shared with children.
    app.db.dispose()
    # Before the worker's threads start.
    _limit_malloc_arenas()
    worker = _Worker(app, timeout)
    if timeout > 0:
        threading.Thread(target=worker.watch, name="allotment-watchdog", daemon=True).start()
    # What the master made (modules, the application, about 100,000
    # objects) lives as long as the worker: out of the collector's sight,
    # a full collection walks only what the worker made since.  Measured
    # in process (small sharing cloud, 3,000 candidate requests): one
    # full collection of 54 ms without, none with.
    gc.freeze()
    return worker


#: prometheus_client's switch to multi-process mode (see api/metrics.py).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


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


def run(app, *, host: str, port: int, workers: int, threads: int, timeout: int,
        metrics_dir: str | None = None) -> None:
    """Serve ``app`` until SIGTERM/SIGINT (SIGHUP: replace the workers)."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server import Server

    # The workers are forked, so they inherit the application built here
    # (Python 3.14 would otherwise start them afresh).
    multiprocessing.set_start_method("fork", force=True)
    server = Server(
        "allotment", address=host, port=port, interface=Interfaces.WSGI, workers=workers,
        blocking_threads=threads, http=HTTPModes.http1, websockets=False, backlog=BACKLOG,
        http1_settings=HTTP1Settings(header_read_timeout=HEADER_TIMEOUT * 1000, keep_alive=True,
                                     max_buffer_size=MAX_HEAD_BYTES),
        log_level=LogLevels.warning, log_access=False,  # the application logs one line per request
        respawn_failed_workers=True, workers_kill_timeout=GRACEFUL_TIMEOUT)
    try:
        server.serve(target_loader=lambda _target: worker_application(app, timeout))
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
