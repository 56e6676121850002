"""Slow and idle clients cannot starve ``allotment serve`` (its defaults).

64 connections that send a request line and then one header byte a second,
and 64 keep-alive connections left idle after one request: every normal
request (the root document, an authenticated read) is still answered
within 2 s, and the trickling connections are closed once the header
timeout has passed (allotment.server.HEADER_TIMEOUT).  The same for 64
writes that send their headers at once and then their body a byte a
second, or never: answered 408 once allotment.server.BODY_TIMEOUT has
passed.
"""

from __future__ import annotations

import http.client
import select
import socket
import time
import uuid

from allotment.server import BODY_TIMEOUT, HEADER_TIMEOUT
from tests.functional.test_server import running_on_new_database, wait_for_log

SLOW = 64
IDLE = 64
ANSWER_WITHIN = 2.0


def _answer_time(port: int, path: str, token: str | None, body: bytes | None = None) -> tuple[int, float]:
    """(status, seconds) of a GET, or with ``body`` a POST of JSON."""
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"X-Auth-Token": token} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        connection.request("GET" if body is None else "POST", path, body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        connection.close()


def test_slow_and_idle_connections_do_not_delay_other_clients(tmp_path_factory):
    with running_on_new_database(tmp_path_factory, "slow") as server:
        slow = []
        for _ in range(SLOW):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /resource_providers HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Auth-Token: ")
            slow.append(sock)
        idle = []
        for _ in range(IDLE):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.request("GET", "/")
            connection.getresponse().read()
            idle.append(connection)  # kept open: HTTP/1.1 keep-alive
        try:
            started = time.monotonic()
            times = []
            closed_at: dict[int, float] = {}
            next_byte = started
            while time.monotonic() - started < HEADER_TIMEOUT + 4 and len(closed_at) < SLOW:
                now = time.monotonic()
                if now >= next_byte:  # one more header byte a second on every open slow connection
                    next_byte = now + 1
                    for sock in slow:
                        if sock.fileno() not in closed_at:
                            try:
                                sock.send(b"a")
                            except OSError:
                                closed_at[sock.fileno()] = now - started
                if now - started < HEADER_TIMEOUT - 2:
                    for path, token in (("/", None), ("/resource_providers", "admin")):
                        status, took = _answer_time(server.port, path, token)
                        assert status == 200, path
                        times.append(took)
                readable, _, _ = select.select([s for s in slow if s.fileno() not in closed_at], [], [], 0.1)
                for sock in readable:  # the server answered or closed it: either way, it let go
                    closed_at[sock.fileno()] = time.monotonic() - started
            assert len(times) >= 10, times
            assert max(times) < ANSWER_WITHIN, sorted(times)[-5:]
            # Headers time out: every trickling connection was let go of.
            assert len(closed_at) == SLOW, f"{SLOW - len(closed_at)} slow connections still open"
            assert max(closed_at.values()) < HEADER_TIMEOUT + 4
            assert min(closed_at.values()) > HEADER_TIMEOUT - 2  # not before their time
        finally:
            for sock in slow:
                sock.close()
            for connection in idle:
                connection.close()


# -- slow bodies ----------------------------------------------------------------

BODY = 1000  # bytes each slow client declares and then sends a byte a second (or never)


def _slow_body_head(method: str, path: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Auth-Token: admin\r\n"
            "OpenStack-API-Version: placement 1.39\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BODY}\r\n\r\n").encode()


def test_slow_bodies_do_not_delay_other_clients_and_get_408(tmp_path_factory):
    """64 writes whose headers arrive at once and whose body comes a byte a
    second (or not at all): reads and writes of other clients are answered
    within 2 s each; each slow write is answered 408 once BODY_TIMEOUT has
    passed, logged, and its connection closed."""
    with running_on_new_database(tmp_path_factory, "slowbody") as server:
        provider = str(uuid.uuid4())
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("POST", "/resource_providers", body=b'{"name": "p", "uuid": "%s"}' % provider.encode(),
                           headers={"X-Auth-Token": "admin", "Content-Type": "application/json"})
        assert connection.getresponse().status == 201
        connection.close()
        heads = [_slow_body_head("POST", "/allocations"),
                 _slow_body_head("PUT", f"/resource_providers/{provider}/inventories"),
                 _slow_body_head("POST", "/resource_providers")]
        slow, silent = [], set()
        for number in range(SLOW):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(heads[number % 3])
            slow.append(sock)
            if number % 4 == 3:
                silent.add(sock)  # sends no byte of its body
        try:
            started = time.monotonic()
            times = []
            answered: dict[socket.socket, tuple[float, bytes]] = {}
            next_byte = started
            while time.monotonic() - started < BODY_TIMEOUT + 6 and len(answered) < SLOW:
                now = time.monotonic()
                if now >= next_byte:
                    next_byte = now + 1
                    for sock in slow:
                        if sock not in silent and sock not in answered:
                            try:
                                sock.send(b" ")
                            except OSError:
                                answered[sock] = (now - started, b"")
                if now - started < 8:
                    for path, token in (("/", None), ("/resource_providers", "admin")):
                        status, took = _answer_time(server.port, path, token)
                        assert status == 200, path
                        times.append(took)
                    status, took = _answer_time(server.port, "/resource_providers", "admin",
                                                body=b'{"name": "%s"}' % uuid.uuid4().hex.encode())
                    assert status == 201
                    times.append(took)
                waiting = [sock for sock in slow if sock not in answered]
                readable, _, _ = select.select(waiting, [], [], 0.1)
                for sock in readable:
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    answered[sock] = (time.monotonic() - started, data)
            assert len(times) >= 15, times
            assert max(times) < ANSWER_WITHIN, sorted(times)[-5:]
            assert len(answered) == SLOW, f"{SLOW - len(answered)} slow bodies still unanswered"
            at = [when for when, _ in answered.values()]
            assert BODY_TIMEOUT - 2 < min(at) and max(at) < BODY_TIMEOUT + 6, sorted(at)
            for when, data in answered.values():
                assert data.startswith(b"HTTP/1.1 408 "), data[:200]
                assert b"x-openstack-request-id: req-" in data.lower()
            for sock in slow:  # and the server closed the connection
                sock.settimeout(5)
                while sock.recv(65536):
                    pass
            lines = wait_for_log(server, "the body did not arrive")
            deadline = time.monotonic() + 5
            while len(lines) < SLOW and time.monotonic() < deadline:
                time.sleep(0.2)
                lines = wait_for_log(server, "the body did not arrive")
            assert len(lines) == SLOW, lines[-3:]
            assert any(f"PUT /resource_providers/{provider}/inventories" in line for line in lines)
            assert any("(0 of 1000 bytes received)" in line for line in lines)
        finally:
            for sock in slow:
                sock.close()
