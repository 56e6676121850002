"""``GET /metrics``: Prometheus metrics, in the text exposition format.

Off unless ``[allotment] metrics = true``; guarded like any other route
(authentication, then the policy rule ``allotment:metrics``, admin by
default) unless ``[allotment] metrics_public = true`` opens it to whoever
can reach the port.

* ``allotment_http_requests_total`` and the histogram
  ``allotment_http_request_duration_seconds``, by route template (``/
  resource_providers/{uuid}``, ``unmatched`` for paths no route has),
  method and status;
* ``allotment_allocation_candidates_returned``: a histogram of how many
  candidates ``GET /allocation_candidates`` answers;
* ``allotment_generation_conflicts_total``: 409
  ``placement.concurrent_update`` answers, by route and method;
* ``allotment_database_retries_total``: transactions re-run, by reason
  (``transient``: deadlock, serialization failure, lock; ``race``: a write
  that lost a race it may retry, such as a generation swap);
* ``allotment_grouped_claims_total``: with ``[allotment] claims_together``,
  claims that waited to be written with others, by ``outcome``
  (``committed``: in one transaction with them; ``alone``: the group
  could not commit, and each was written alone);
* capacity gauges per resource class, over the cloud
  (``allotment_resource_{total,reserved,capacity,used}``) and per
  aggregate (``allotment_aggregate_resource_...``, label ``aggregate``):
  one grouped query (:mod:`allotment.db.resource_totals`), reused for
  ``[allotment] metrics_capacity_cache_seconds``.

Several worker processes: prometheus_client's multi-process mode, chosen
by the environment variable ``PROMETHEUS_MULTIPROC_DIR`` before the
library is first imported (``allotment serve`` sets it up, see
:func:`allotment.server.prepare_metrics`).  Each worker then writes its
counters to files there and a scrape, whichever worker answers it, adds
them all up.  Without the variable each process counts only itself.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

import webob

from allotment.api.errors import HTTPError
from allotment.api.http import Request
from allotment.db import resource_totals

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
PATH = "/metrics"
CONCURRENT_UPDATE = "placement.concurrent_update"
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CANDIDATE_BUCKETS = (0, 1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 20000)


class Metrics:
    """The metrics of one application (one process)."""

    def __init__(self, conf, database, route_of: Callable[[str], str | None]):
        import prometheus_client as prom  # here: after PROMETHEUS_MULTIPROC_DIR is set (see above)

        prom.disable_created_metrics()  # the *_created series only add noise here
        self.public = conf.allotment.metrics_public
        self.multiprocess = bool(os.environ.get(MULTIPROCESS_ENV))
        self._route_of = route_of
        # In multi-process mode the values live in files, whatever registry
        # (none) the metric objects are in; a scrape reads every process's.
        self.registry = None if self.multiprocess else prom.CollectorRegistry()
        labels = ("route", "method", "status")
        self.requests = prom.Counter("allotment_http_requests", "HTTP requests answered.", labels,
                                     registry=self.registry)
        self.latency = prom.Histogram("allotment_http_request_duration_seconds",
                                      "Time to answer an HTTP request.", labels, buckets=LATENCY_BUCKETS,
                                      registry=self.registry)
        self.candidates = prom.Histogram("allotment_allocation_candidates_returned",
                                         "Allocation requests in a GET /allocation_candidates answer.",
                                         buckets=CANDIDATE_BUCKETS, registry=self.registry)
        self.conflicts = prom.Counter("allotment_generation_conflicts",
                                      "409 placement.concurrent_update answers.", ("route", "method"),
                                      registry=self.registry)
        self.retries = prom.Counter("allotment_database_retries", "Database transactions re-run.",
                                    ("reason",), registry=self.registry)
        self.grouped = prom.Counter("allotment_grouped_claims", "Claims written in a group with others "
                                    "(claims_together), by outcome.", ("outcome",), registry=self.registry)
        self.capacity = CapacityCollector(database, conf.allotment.metrics_capacity_cache_seconds)
        if self.registry is not None:
            self.registry.register(self.capacity)

    # -- recording ------------------------------------------------------------

    def observe_request(self, environ: dict, status: str, started: float) -> None:
        route = self._route_of(environ.get("PATH_INFO") or "/") or "unmatched"
        method = environ.get("REQUEST_METHOD", "")
        if method not in METHODS:
            method = "other"  # any token is a method to HTTP: keep the label set bounded
        code = str(status).split(" ", 1)[0]
        self.requests.labels(route, method, code).inc()
        self.latency.labels(route, method, code).observe(time.monotonic() - started)
        if code == "409" and environ.get("allotment.error_code") == CONCURRENT_UPDATE:
            self.conflicts.labels(route, method).inc()

    def observe_candidates(self, returned: int) -> None:
        self.candidates.observe(returned)

    def database_retry(self, reason: str) -> None:
        self.retries.labels(reason).inc()

    def claims_grouped(self, claims: int, committed: bool) -> None:
        self.grouped.labels("committed" if committed else "alone").inc(claims)

    # -- exposition -----------------------------------------------------------

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) of a scrape."""
        from prometheus_client import exposition

        registry = self.registry
        if registry is None:
            from prometheus_client import CollectorRegistry, multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            registry.register(self.capacity)
        encoder, content_type = exposition.choose_encoder(accept)
        return encoder(registry), content_type

    def public_route(self, app: Callable) -> Callable:
        """WSGI middleware answering ``GET /metrics`` itself, before
        authentication (``metrics_public``); everything else goes on to ``app``."""

        def answer(environ, start_response):
            if environ.get("PATH_INFO") == PATH and environ.get("REQUEST_METHOD") == "GET":
                body, content_type = self.render(environ.get("HTTP_ACCEPT"))
                start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))])
                return [body]
            return app(environ, start_response)

        return answer


def scrape(req: Request) -> webob.Response:
    """GET /metrics (authenticated and authorised like any route)."""
    metrics = req.app.metrics
    if metrics is None:
        raise HTTPError(404)
    body, content_type = metrics.render(req.headers.get("Accept"))
    response = webob.Response(body=body, status=200, charset=None)
    response.headers["Content-Type"] = content_type
    return response


class CapacityCollector:
    """Capacity gauges per resource class, over the cloud and per aggregate,
    from one grouped query at most every ``ttl`` seconds."""

    def __init__(self, database, ttl: float):
        self.database = database
        self.ttl = ttl
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._sums: dict = {}

    def sums(self) -> dict:
        with self._lock:
            if time.monotonic() - self._read_at >= self.ttl:
                with self.database.read() as conn:
                    self._sums = resource_totals.capacity_sums(conn)
                self._read_at = time.monotonic()
            return self._sums

    def describe(self) -> Iterable:
        return ()  # computed at scrape time only

    def collect(self) -> Iterable:
        from prometheus_client.core import GaugeMetricFamily

        sums = self.sums()
        fields = (("total", "Inventory total"), ("reserved", "Inventory reserved"),
                  ("capacity", "Usable capacity: (total - reserved) * allocation_ratio"),
                  ("used", "Allocated"))
        for field, text in fields:
            cloud = GaugeMetricFamily(f"allotment_resource_{field}", f"{text}, summed over the cloud.",
                                      labels=("resource_class",))
            for rc, found in sorted(sums.get(None, {}).items()):
                cloud.add_metric((rc,), getattr(found, field))
            yield cloud
            per_aggregate = GaugeMetricFamily(
                f"allotment_aggregate_resource_{field}",
                f"{text}, summed over the providers in an aggregate (or whose root is).",
                labels=("aggregate", "resource_class"))
            for aggregate, classes in sorted((k, v) for k, v in sums.items() if k is not None):
                for rc, found in sorted(classes.items()):
                    per_aggregate.add_metric((aggregate, rc), getattr(found, field))
            yield per_aggregate
