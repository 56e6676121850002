"""Slow and idle clients cannot starve ``allotment serve`` (its defaults).

64 connections that send a request line and then one header byte a second,
and 64 keep-alive connections left idle after one request: every normal
request (the root document, an authenticated read) is still answered
within 2 s, and the trickling connections are closed once the header
timeout has passed (allotment.server.HEADER_TIMEOUT).
"""

from __future__ import annotations

import http.client
import select
import socket
import time

from allotment.server import HEADER_TIMEOUT
from tests.functional.test_server import running_on_new_database

SLOW = 64
IDLE = 64
ANSWER_WITHIN = 2.0


def _answer_time(port: int, path: str, token: str | None) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"X-Auth-Token": token} if token else {})
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
