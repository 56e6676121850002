"""``GET /healthcheck``: whether this server can serve now, for load balancers.

``GET /`` answers 200 as Placement defines it whatever the database does,
so a load balancer that checks it keeps sending requests to a server whose
database is gone.  This endpoint answers in the form of oslo.middleware's
healthcheck (what HAProxy checks and Kolla's ``healthcheck_curl`` are set
up for in other OpenStack services):

* ``GET``: ``200`` with the body ``OK`` (``text/plain``) while the database
  answers; ``503`` with the reason otherwise (``The database is
  unavailable``, or ``DISABLED BY FILE``); as JSON
  (``{"detailed": false, "reasons": [...]}``) or HTML when the client
  accepts that rather than plain text;
* ``HEAD``: ``204`` (healthy) or ``503``, no body.

No token is needed and no microversion applies.  ``[healthcheck]
backends = disable_by_file`` with ``disable_by_file_path`` (oslo.middleware's
options, registered by :mod:`allotment.config`) turns the server away from the load balancer while that file
exists, e.g. before maintenance.

The database is asked ``SELECT 1`` on a pooled connection, at most once a
second per process however many checks arrive, and never for longer than
:data:`PROBE_TIMEOUT` seconds (a database that does not answer at all is
reported as such rather than holding the check until the driver gives up).
"""

from __future__ import annotations

import html
import logging
import os
import threading
import time

import orjson
import webob.acceptparse
from oslo_config import cfg

from allotment.db.engine import Database, one_line

LOG = logging.getLogger(__name__)

PATH = "/healthcheck"
#: Seconds a probe's result is reused.
FRESH_SECONDS = 1.0
#: Seconds a check waits for the database's answer.
PROBE_TIMEOUT = 3.0
OK = "OK"
UNAVAILABLE = "The database is unavailable"
TIMED_OUT = "The database did not answer within %g s" % PROBE_TIMEOUT
DISABLED = "DISABLED BY FILE"
_OFFERS = ("text/plain", "text/html", "application/json")


class _Probe:
    """At most one ``SELECT 1`` in flight per process; its result kept a second."""

    def __init__(self, db: Database):
        self.db = db
        self._lock = threading.Lock()
        self._result: tuple[str | None, float] | None = None
        self._running: threading.Event | None = None

    def reason(self) -> str | None:
        """Why the database cannot be used now (None: it answered)."""
        with self._lock:
            if self._result is not None and time.monotonic() - self._result[1] < FRESH_SECONDS:
                return self._result[0]
            running = self._running
            if running is None:
                running = self._running = threading.Event()
                threading.Thread(target=self._run, args=(running,), name="allotment-healthcheck",
                                 daemon=True).start()
        if not running.wait(PROBE_TIMEOUT):
            return TIMED_OUT
        with self._lock:
            return self._result[0] if self._result is not None else TIMED_OUT

    def _run(self, done: threading.Event) -> None:
        reason = None
        try:
            with self.db.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1").scalar()
        except Exception as error:  # noqa: BLE001 - reported as unhealthy
            LOG.warning("health check: the database is unavailable: %s", one_line(error))
            reason = UNAVAILABLE
        with self._lock:
            self._result = (reason, time.monotonic())
            self._running = None
        done.set()


class HealthCheck:
    """The WSGI application answering :data:`PATH`."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database):
        """``conf``: with ``[healthcheck]`` registered (allotment.config does)."""
        group = conf.healthcheck
        self._disable_file = group.disable_by_file_path if "disable_by_file" in group.backends else None
        self._probe = _Probe(db)

    def reasons(self) -> list[str]:
        """Why this server should not be sent requests (empty: it may)."""
        if self._disable_file and os.path.exists(self._disable_file):
            return [DISABLED]
        reason = self._probe.reason()
        return [reason] if reason else []

    def __call__(self, environ: dict, start_response):
        reasons = self.reasons()
        healthy = not reasons
        method = environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD"):
            body = b"405 Method Not Allowed"
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain"),
                                                      ("Content-Length", str(len(body)))])
            return [body]
        if method == "HEAD":
            start_response("204 No Content" if healthy else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=UTF-8"), ("Content-Length", "0")])
            return [b""]
        shown = reasons or [OK]
        kind = _kind(environ.get("HTTP_ACCEPT"))
        if kind == "application/json":
            body = orjson.dumps({"detailed": False, "reasons": shown}, option=orjson.OPT_INDENT_2)
            content_type = "application/json"
        elif kind == "text/html":
            items = "".join(f"<TR><TD>{html.escape(reason)}</TD></TR>" for reason in shown)
            body = (f"<HTML>\n<HEAD><TITLE>Healthcheck Status</TITLE></HEAD>\n<BODY>\n"
                    f"<H2>Result of {len(shown)} checks:</H2>\n<TABLE>{items}</TABLE>\n</BODY>\n</HTML>").encode()
            content_type = "text/html; charset=UTF-8"
        else:
            body = "\n".join(shown).encode()
            content_type = "text/plain; charset=UTF-8"
        start_response("200 OK" if healthy else "503 Service Unavailable",
                       [("Content-Type", content_type), ("Content-Length", str(len(body)))])
        return [body]


def _kind(accept: str | None) -> str:
    """The media type of the answer: plain text unless the client prefers HTML or JSON."""
    if not accept:
        return "text/plain"
    offers = webob.acceptparse.create_accept_header(accept).acceptable_offers(list(_OFFERS))
    return offers[0][0] if offers else "text/plain"
