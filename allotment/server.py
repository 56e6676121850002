"""The production server: granian (HTTP in Rust), pre-forked worker processes.

Why granian: its HTTP/1 layer (hyper, on an event loop) reads requests
without a thread per connection, so clients that trickle their headers
or hold idle keep-alive connections cost a socket and a little memory,
never one of the threads that run the application; headers that do not
arrive within :data:`HEADER_TIMEOUT` seconds close the connection.  Only a
complete request head reaches a Python thread.

Request bodies: granian's WSGI interface lets the application's thread
read the body, with no time limit, so a client that sends its headers and
then its body a byte at a time (or never) held a request thread.  By
default the application is therefore served through granian's ASGI
interface by :class:`_BodyFirst`: the worker's event loop reads the whole
body (within :data:`BODY_TIMEOUT` seconds, else 408), and only then does a
thread run the WSGI application on it.  That costs two thread hand-offs
per request (docs/serving.md has the figures); ``--body-timeout 0`` serves
through granian's WSGI interface as before, for deployments behind a
proxy that buffers request bodies.  Measured against the
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

import asyncio
import collections
import ctypes
import gc
import glob
import io
import logging
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from typing import Callable, Iterable
from urllib.parse import unquote_to_bytes

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

#: Seconds a client has to send a request's whole body once its head has
#: arrived; a body that takes longer is answered 408 and the connection
#: closed (``--body-timeout``).
BODY_TIMEOUT = 30

#: Bodies up to this size are read whenever they come.  Larger ones share
#: :data:`BODY_BUFFER` per worker: a client that sends most of a large body
#: and then stalls holds its size in memory until :data:`BODY_TIMEOUT`.  A
#: chunked body (no declared size) counts as ``max_request_body_size``.
SMALL_BODY = 64 * 1024

#: Bytes of large bodies (over :data:`SMALL_BODY`) a worker holds at once,
#: at least one body of ``[allotment] max_request_body_size``; a large body
#: that finds it full waits (its time limit running) for room.
BODY_BUFFER = 64 * 1024 * 1024

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


# -- the body read on the event loop (granian's ASGI interface) ----------------

#: What granian's WSGI interface puts in every environ (besides the
#: process environment, which is left out here).
_BASE_ENVIRON = {
    "GATEWAY_INTERFACE": "CGI/1.1", "SCRIPT_NAME": "", "SERVER_SOFTWARE": "Granian",
    "wsgi.errors": sys.stderr, "wsgi.input_terminated": True, "wsgi.multiprocess": False,
    "wsgi.multithread": True, "wsgi.run_once": False, "wsgi.version": (1, 0),
}
_SEPARATE = frozenset(("CONTENT_TYPE", "CONTENT_LENGTH"))


def wsgi_environ(scope: dict) -> dict:
    """The WSGI environ of an ASGI HTTP ``scope``, as granian's WSGI
    interface builds it: PATH_INFO percent-decoded and read as Latin-1
    (PEP 3333), a header sent twice joined with commas, a header value
    that is not ASCII read as empty."""
    environ = _BASE_ENVIRON.copy()
    environ["REQUEST_METHOD"] = scope["method"]
    environ["PATH_INFO"] = unquote_to_bytes(scope["raw_path"]).decode("latin-1")
    environ["QUERY_STRING"] = scope["query_string"].decode("latin-1")
    environ["SERVER_PROTOCOL"] = "HTTP/" + scope["http_version"]
    environ["wsgi.url_scheme"] = scope["scheme"]
    server, client = scope.get("server"), scope.get("client")
    if server:
        environ["SERVER_NAME"], environ["SERVER_PORT"] = server[0], str(server[1])
    if client:
        environ["REMOTE_ADDR"] = client[0]
    for name, value in scope["headers"]:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key not in _SEPARATE:
            key = "HTTP_" + key
        text = value.decode("ascii") if value.isascii() else ""
        environ[key] = environ[key] + "," + text if key in environ else text
    return environ


def _run_wsgi(app: Callable, environ: dict) -> tuple[int, list, bytes]:
    """(status, headers, body) of one call of a WSGI application."""
    answer: list = []

    def start_response(status, headers, exc_info=None):
        answer[:] = (status, headers)

    result = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    return int(answer[0][:3]), answer[1], body


def _settle(future: asyncio.Future, result, error) -> None:
    if not future.done():  # not cancelled meanwhile
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


class _Threads:
    """``count`` threads that run a WSGI application for the event loop."""

    def __init__(self, app: Callable, count: int):
        self.app = app
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        for number in range(count):
            threading.Thread(target=self._serve, name=f"allotment-request-{number}", daemon=True).start()

    def run(self, environ: dict) -> asyncio.Future:
        """(status, headers, body), once a thread has run the application."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.jobs.put((loop, future, environ))
        return future

    def _serve(self) -> None:
        while True:
            loop, future, environ = self.jobs.get()
            result = error = None
            try:
                result = _run_wsgi(self.app, environ)
            except BaseException as failure:  # noqa: BLE001 - raised again in the loop
                error = failure
            loop.call_soon_threadsafe(_settle, future, result, error)
            del loop, future, environ, result, error


class _Room:
    """Bytes of memory that large bodies share (event loop only)."""

    def __init__(self, size: int):
        self.free = size
        self.waiting: collections.deque = collections.deque()

    async def take(self, size: int) -> None:
        while self.free < size:
            future = asyncio.get_running_loop().create_future()
            self.waiting.append(future)
            try:
                await future
            finally:
                if future in self.waiting:
                    self.waiting.remove(future)
        self.free -= size

    def give(self, size: int) -> None:
        self.free += size
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(None)


class _BodyTimeout(Exception):
    pass


class _BodyFirst:
    """An ASGI application that serves a WSGI ``worker``: the event loop
    reads each request's whole body (no thread waits for a slow client),
    then one of ``threads`` threads runs the application on it.

    * A body that has not arrived within ``body_timeout`` seconds is
      answered 408 in Placement's error format (and logged), and the
      connection closed.
    * A declared ``Content-Length`` over ``body_limit`` is not read: the
      application answers 413 from the header alone.  A chunked body is
      read to one byte over the limit, so the application answers 413.
    """

    def __init__(self, worker: Callable, threads: int, body_limit: int, body_timeout: float = BODY_TIMEOUT,
                 buffer: int = BODY_BUFFER):
        self.threads = _Threads(worker, threads)
        self.body_limit = body_limit
        self.body_timeout = body_timeout
        self.room = _Room(max(buffer, body_limit + 1))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        environ = wsgi_environ(scope)
        length = environ.get("CONTENT_LENGTH")
        body = b""
        if length != "0" and (length or "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()):
            try:
                declared = int(length) if length else None
            except ValueError:  # "10,10" (the header sent twice): the application answers 400 unread
                declared = self.body_limit + 1
            if declared is None or declared <= self.body_limit:
                try:
                    body = await self._body(receive, declared)
                except _BodyTimeout as timeout:
                    await _send(send, *_timed_out(environ, *timeout.args))
                    return
        environ["wsgi.input"] = io.BytesIO(body)
        await _send(send, *await self.threads.run(environ))

    async def _body(self, receive, declared: int | None) -> bytes:
        wanted = self.body_limit + 1 if declared is None else declared
        large = wanted > SMALL_BODY
        chunks: list[bytes] = []
        received = 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        try:
            async with asyncio.timeout_at(deadline):
                if large:
                    await self.room.take(wanted)
                try:
                    while received < wanted:
                        message = await receive()
                        if message["type"] != "http.request":
                            # The client went away, or sent chunks that do not parse:
                            # as under WSGI the application gets what came (and
                            # answers 400, or nobody if nobody is left).
                            break
                        chunk = message.get("body", b"")
                        chunks.append(chunk)
                        received += len(chunk)
                        if not message.get("more_body"):
                            break
                finally:
                    if large:
                        self.room.give(wanted)
        except TimeoutError:
            raise _BodyTimeout(received, declared, self.body_timeout) from None
        return b"".join(chunks)


async def _send(send, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]})
    await send({"type": "http.response.body", "body": body})


def _timed_out(environ: dict, received: int, declared: int | None, timeout: float) -> tuple[int, list, bytes]:
    request_id = new_request_id()
    of = f" of {declared}" if declared is not None else ""
    LOG.warning("%s %s %s refused before reaching the application: 408, the body did not arrive "
                "within %gs (%d%s bytes received)", request_id, environ["REQUEST_METHOD"],
                logs.escape_for_log(environ["PATH_INFO"]), timeout, received, of)
    status_line, headers, body = errors.render(
        errors.HTTPError(408, f"The request body did not arrive within {timeout:g} seconds."),
        request_id=request_id, version=None, accept=environ.get("HTTP_ACCEPT"))
    return 408, list(headers) + [(REQUEST_ID_HEADER, request_id), ("Connection", "close")], body


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


#: Seconds a starting worker waits for another to finish choosing its CPU.
PIN_LOCK_WAIT = 2.0


def default_workers() -> int:
    """Worker processes when ``--workers`` is not given: one per CPU this
    process may use (a container's cpuset or ``taskset`` may allow fewer
    than the machine has), at least 2."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(2, cpus)


class CpuPins:
    """Each worker process bound to one CPU of its own (``--cpu-affinity``).

    A worker's event loop, request threads and granian's runtime hand every
    request to each other several times; each hand-off wakes a sleeping
    thread, and a thread woken on another CPU costs that CPU an interrupt
    and its caches.  Bound to one CPU, a worker's threads wake where they
    ran.  The GIL lets a worker's Python use one CPU at a time anyway.
    Measured on a 2-core machine, 2 workers, 16 clients claiming (the
    bench's race, 4 runs each way, both builds in every run): server CPU
    per claim 0.79x on SQLite and 0.86x on PostgreSQL (the database's
    0.89x), claims/s 1.37x and 1.19x; one client's ``GET /`` 0.64-0.69 ->
    0.49-0.54 ms of CPU (docs/serving.md).

    The master makes one before the workers are forked; each worker takes
    the CPU with the fewest live workers (a replaced worker's CPU is free
    again once it has exited) and binds every thread it has, and the ones
    it starts later inherit it.
    """

    def __init__(self, cpus: Iterable[int], workers: int):
        self.cpus = sorted(cpus)
        # Room for every worker to be replaced twice while the old one drains.
        self.pids = multiprocessing.get_context("fork").Array("i", [0] * (3 * workers + len(self.cpus)))

    @staticmethod
    def applies(cpus: Iterable[int], workers: int) -> bool:
        """Whether ``workers`` can have a CPU each (of ``cpus``, this process's)."""
        return hasattr(os, "sched_setaffinity") and 0 < workers <= len(list(cpus))

    def take(self) -> int:
        """Bind this process's threads to the CPU :meth:`choose` gives; that CPU."""
        cpu = self.choose(os.getpid())
        for thread in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(thread), {cpu})
            except OSError:  # the thread ended meanwhile
                pass
        return cpu

    def choose(self, pid: int) -> int:
        """The CPU with the fewest live workers (the first of them), counted
        for ``pid`` from now on."""
        count = len(self.cpus)
        lock = self.pids.get_lock()
        # A worker killed while it held the lock (for microseconds) must not
        # keep every later one from starting: past the wait, choose unlocked.
        locked = lock.acquire(timeout=PIN_LOCK_WAIT)
        pids = self.pids.get_obj()  # the array itself: its items would each take the lock
        try:
            taken = [bool(other) and _alive(other) for other in pids]
            live = [sum(taken[slot::count]) for slot in range(count)]
            target = live.index(min(live))
            free = next((slot for slot in range(target, len(taken), count) if not taken[slot]), None)
            if free is not None:  # else more workers live than ever planned: bound, not counted
                pids[free] = pid
        finally:
            if locked:
                lock.release()
        return self.cpus[target]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited worker not yet reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


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
        body_timeout: float = BODY_TIMEOUT, metrics_dir: str | None = None, pin: bool = True) -> None:
    """Serve ``app`` until SIGTERM/SIGINT (SIGHUP: replace the workers).

    With ``body_timeout`` > 0 through :class:`_BodyFirst` (granian's ASGI
    interface), else through granian's WSGI interface.  With ``pin``, each
    worker bound to a CPU of its own where there are enough
    (:class:`CpuPins`)."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server import Server

    # The workers are forked, so they inherit the application built here
    # (Python 3.14 would otherwise start them afresh).
    multiprocessing.set_start_method("fork", force=True)
    body_limit = app.conf.allotment.max_request_body_size
    body_first = body_timeout > 0

    pins = None
    if pin:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if CpuPins.applies(cpus, workers):
            pins = CpuPins(cpus, workers)
            LOG.info("each of the %d workers bound to a CPU of its own (of %s)", workers,
                     ",".join(map(str, cpus)))
        else:
            LOG.info("workers not bound to CPUs: %d workers, %d CPUs", workers, len(cpus))

    def load(_target):
        if pins is not None:
            pins.take()
        worker = worker_application(app, timeout)
        if body_first:
            return _BodyFirst(worker, threads, body_limit, body_timeout)
        return worker

    server = Server(
        "allotment", address=host, port=port, interface=Interfaces.ASGINL if body_first else Interfaces.WSGI,
        workers=workers, blocking_threads=1 if body_first else threads,  # ASGI: _BodyFirst's threads
        http=HTTPModes.http1, websockets=False, backlog=BACKLOG,
        http1_settings=HTTP1Settings(header_read_timeout=HEADER_TIMEOUT * 1000, keep_alive=True,
                                     max_buffer_size=MAX_HEAD_BYTES),
        log_level=LogLevels.warning, log_access=False,  # the application logs one line per request
        respawn_failed_workers=True, workers_kill_timeout=GRACEFUL_TIMEOUT)
    try:
        server.serve(target_loader=load)
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
