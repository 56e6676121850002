"""``allotment serve`` answers alike whether the body is read on the event
loop (the default, granian's ASGI interface) or by the request's thread
(``--body-timeout 0``, granian's WSGI interface).

The event loop path builds the WSGI environ itself (allotment.server.
wsgi_environ); every request here, most of them hostile, gets the same
status and the same body (request ids aside) from both, on one database.
"""

from __future__ import annotations

import re
import socket

import pytest

from tests.functional.test_server import running, write_config

LIMIT = 4096
_REQUEST_ID = re.compile(rb"req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ADMIN = "X-Auth-Token: admin\r\n"
_JSON = "Content-Type: application/json\r\n"


def _chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"


REQUESTS = [
    ("GET / HTTP/1.1\r\n", b""),
    (f"GET /resource_providers HTTP/1.1\r\n{_ADMIN}", b""),
    (f"HEAD /resource_providers HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /resource_providers/%ff HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /resource_providers/caf%C3%A9/inventories HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /allocations/%ff%fe HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /resource_providers/a%2Fb HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /resource_providers/%00 HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /traits?name=in:%ff HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /resource_providers?name=a%0ab HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /resource_providers?name={'a' * 8200} HTTP/1.1\r\n{_ADMIN}", b""),
    (f"GET /resource_providers HTTP/1.1\r\n{_ADMIN}OpenStack-API-Version: placement 1.2\r\n"
     "OpenStack-API-Version: placement 1.3\r\n", b""),
    ("GET /resource_providers HTTP/1.1\r\nX-Auth-Token: caf\xc3\xa9\r\n", b""),
    (f"GET /no/such/thing HTTP/1.1\r\n{_ADMIN}Accept: text/html\r\n", b""),
    (f"DELETE /resource_providers HTTP/1.1\r\n{_ADMIN}", b""),
    (f"POST /resource_providers HTTP/1.1\r\n{_JSON}Content-Length: 2\r\n", b"{}"),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}{_JSON}Content-Length: 2\r\n", b"{}"),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}{_JSON}Content-Length: 9\r\n", b"not json!"),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}Content-Length: 2\r\n", b"{}"),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}{_JSON}Content-Length: 2\r\nContent-Length: 2\r\n", b"{}"),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}{_JSON}Content-Length: {LIMIT + 1}\r\n", b"{"),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}{_JSON}Transfer-Encoding: chunked\r\n",
     _chunked(b'{"na', b'me": 5}')),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}{_JSON}Transfer-Encoding: chunked\r\n",
     _chunked(*[b" " * 1000] * 5)),
    (f"POST /resource_providers HTTP/1.1\r\n{_ADMIN}{_JSON}Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
     b"{}"),
    (f"PUT /resource_providers/00000000-0000-0000-0000-000000000000/inventories HTTP/1.1\r\n{_ADMIN}{_JSON}"
     "Content-Length: 57\r\n", b'{"resource_provider_generation": 0, "inventories": {}}   '),
    (f"POST /allocations HTTP/1.1\r\n{_ADMIN}{_JSON}OpenStack-API-Version: placement 1.39\r\n"
     "Content-Length: 17\r\n", b'{"c": [[[[[[]]]]]'),
]


def _answer(port: int, head: str, body: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall((head + "Host: 127.0.0.1\r\nConnection: close\r\n\r\n").encode("latin-1") + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    headers, _, content = rest.partition(b"\r\n\r\n")
    kept = sorted(line.lower() for line in headers.split(b"\r\n")
                  if line.lower().startswith((b"content-type", b"content-length", b"allow", b"openstack-api-version")))
    return int(status_line.split()[1]), _REQUEST_ID.sub(b"req-X", b"\r\n".join(kept) + b"\r\n\r\n" + content)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("interfaces"),
                          f"sqlite:///{tmp_path_factory.mktemp('db')}/i.sqlite",
                          extra=f"\n[allotment]\nmax_request_body_size = {LIMIT}\n")
    with running(config, "--workers", "1", "--threads", "2") as loop_read:
        with running(config, "--workers", "1", "--threads", "2", "--body-timeout", "0") as thread_read:
            yield loop_read, thread_read


@pytest.mark.parametrize("head, body", REQUESTS, ids=[head.split("\r\n")[0][:60] for head, _ in REQUESTS])
def test_both_ways_of_reading_the_body_answer_alike(both, head, body):
    loop_read, thread_read = both
    expected = _answer(thread_read.port, head, body)
    assert _answer(loop_read.port, head, body) == expected
    assert expected[0] < 500
