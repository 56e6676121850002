"""What each worker of ``allotment serve`` does around the application (allotment/server.py)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import orjson

from allotment import server


def _fake_app(seen: list):
    def app(environ, start_response):
        seen.append(dict(environ))
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]

    app.db = SimpleNamespace(dispose=lambda: seen.append("disposed"))
    return app


def _call(worker, **environ):
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = status, dict(headers)

    base = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1"}
    body = b"".join(worker(base | environ, start_response))
    return answer["status"], answer["headers"], body


def test_a_forked_worker_disposes_of_the_masters_connections_and_freezes_what_it_inherited():
    seen: list = []
    before = gc.get_freeze_count()
    try:
        server.worker_application(_fake_app(seen), timeout=0)
        assert seen == ["disposed"]
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


def test_a_request_line_over_the_limit_is_414_in_placement_format():
    seen: list = []
    worker = server._Worker(_fake_app(seen), timeout=0, environment={})
    status, headers, body = _call(worker, QUERY_STRING="name=" + "a" * 8200)
    assert status.startswith("414")
    error = orjson.loads(body)["errors"][0]
    assert error["request_id"] == headers["x-openstack-request-id"]
    assert "Request Line is too large" in error["detail"]
    assert seen == []
    assert _call(worker, QUERY_STRING="name=" + "a" * 8000)[0] == "200 OK"


def test_process_environment_never_reads_as_a_request_header():
    seen: list = []
    proxy = "http://proxy.example:3128"
    worker = server._Worker(_fake_app(seen), timeout=0, environment={"HTTP_PROXY": proxy, "PATH": "/bin"})
    # granian starts every environ from the process environment: the very string.
    _call(worker, HTTP_PROXY=proxy, PATH="/bin")
    assert "HTTP_PROXY" not in seen[-1]
    sent = "".join(["http://proxy.example", ":3128"])  # a header the client did send stays
    _call(worker, HTTP_PROXY=sent)
    assert seen[-1]["HTTP_PROXY"] == sent


def test_a_request_running_past_the_timeout_is_reported_stuck():
    worker = server._Worker(_fake_app([]), timeout=30, environment={})
    worker.running[1] = (100.0, {"PATH_INFO": "/slow"})
    assert worker.stuck(now=120.0) is None
    assert worker.stuck(now=131.0) == {"PATH_INFO": "/slow"}


def test_the_timeout_is_never_shorter_than_a_worker_needs_to_count_as_started():
    # granian stops serving when a worker dies within 5.5 s of its start.
    assert server._Worker(_fake_app([]), timeout=1, environment={}).timeout == server.MIN_TIMEOUT
