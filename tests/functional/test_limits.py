"""Limits an operator can rely on: the largest body, the longest request line.

A body over ``[allotment] max_request_body_size`` is refused with 413
before it is read (a declared length at once, a chunked body as soon as
it passes the limit); under ``allotment serve`` a request line over 8190
bytes is refused with 414 in Placement's error format, and a request the
HTTP layer cannot parse gets a bare 400 and the connection is closed.
"""

from __future__ import annotations

import io
import socket
import time

import pytest
import webob

from allotment.config import DEFAULT_MAX_REQUEST_BODY_SIZE
from tests.conftest import ApiClient, make_conf
from tests.functional.test_server import running, write_config

LIMIT = 4096


@pytest.fixture
def small_api(db_url):
    from allotment.api.app import Application
    from allotment.service import database_from_config

    conf = make_conf(db_url, allotment__max_request_body_size=LIMIT)
    application = Application(conf, database_from_config(conf))
    yield ApiClient(application)
    application.db.dispose()


def _post_raw(api: ApiClient, body: bytes, *, chunked: bool = False):
    req = webob.Request.blank("/resource_providers", method="POST")
    req.headers.update({"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39",
                        "Content-Type": "application/json"})
    if chunked:
        req.environ["wsgi.input"] = io.BytesIO(body)
        req.environ.pop("CONTENT_LENGTH", None)
        req.environ["HTTP_TRANSFER_ENCODING"] = "chunked"
        req.environ["wsgi.input_terminated"] = True  # as gunicorn says of a chunked body
    else:
        req.body = body
    return req.get_response(api.application)


def _name_body(size: int) -> bytes:
    prefix, suffix = b'{"name": "', b'"}'
    return prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix


def test_default_limit_is_generous():
    assert DEFAULT_MAX_REQUEST_BODY_SIZE == 16 * 1024 * 1024


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_the_limit_is_413(small_api, chunked):
    response = _post_raw(small_api, _name_body(LIMIT + 1), chunked=chunked)
    assert response.status_code == 413
    error = response.json["errors"][0]
    assert error["status"] == 413
    assert f"the largest accepted is {LIMIT} bytes ([allotment] max_request_body_size)" in error["detail"]
    assert error["request_id"] == response.headers["x-openstack-request-id"]
    assert error["code"] == "placement.undefined_code"


@pytest.mark.parametrize("chunked", [False, True])
def test_body_at_the_limit_is_read(small_api, chunked):
    # Judged on its content: a 4 KiB name is too long for a provider (400).
    response = _post_raw(small_api, _name_body(LIMIT), chunked=chunked)
    assert response.status_code == 400
    assert "is too long" in response.json["errors"][0]["detail"]


# -- under allotment serve ------------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("limits"), f"sqlite:///{tmp_path_factory.mktemp('db')}/l.sqlite",
                          extra=f"\n[allotment]\nmax_request_body_size = {LIMIT}\n")
    with running(config, "--workers", "1", "--threads", "2") as server:
        yield server


def _exchange(server, head: str, body: bytes = b"", timeout: float = 10) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1") + body)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        head_part, _, rest = received.partition(b"\r\n\r\n")
        lines = head_part.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
        while len(rest) < int(headers.get("content-length", 0)):
            rest += sock.recv(65536)
        return int(lines[0].split()[1]), headers, rest


def test_a_huge_declared_body_is_refused_before_it_is_sent(live):
    started = time.monotonic()
    status, headers, body = _exchange(live, (
        "POST /resource_providers HTTP/1.1\r\nHost: x\r\nX-Auth-Token: admin\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"), b'{"name": "')
    assert status == 413
    assert b"The request body is 100000000 bytes" in body
    assert headers["x-openstack-request-id"] in body.decode()
    assert time.monotonic() - started < 5  # answered without waiting for the 100 MB


def test_a_chunked_body_over_the_limit_is_413(live):
    chunk = b"x" * 1000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(10)) + b"0\r\n\r\n"
    status, _, answer = _exchange(live, (
        "POST /resource_providers HTTP/1.1\r\nHost: x\r\nX-Auth-Token: admin\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"), body)
    assert status == 413
    assert b"The request body (sent in chunks) is larger" in answer


def test_a_request_line_over_8190_bytes_is_414_in_placement_format(live):
    import orjson

    status, headers, body = _exchange(live, f"GET /resource_providers?name={'a' * 8200} HTTP/1.1\r\n"
                                            "Host: x\r\nX-Auth-Token: admin\r\n\r\n")
    assert status == 414
    error = orjson.loads(body)["errors"][0]
    assert (error["status"], error["title"]) == (414, "Request-URI Too Long")
    assert "Request Line is too large" in error["detail"]
    assert error["request_id"] == headers["x-openstack-request-id"]


def test_a_request_line_of_8000_bytes_is_served(live):
    status, _, body = _exchange(live, f"GET /resource_providers?name={'a' * 8000} HTTP/1.1\r\n"
                                      "Host: x\r\nX-Auth-Token: admin\r\n\r\n")
    assert status == 200, body


def test_a_malformed_header_is_400_and_the_connection_closed(live):
    # granian's HTTP layer refuses it before any Python runs: no body, and
    # no request id (docs/serving.md).
    status, headers, body = _exchange(live, "GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n")
    assert status == 400
    assert headers["connection"] == "close"
    assert body == b""
