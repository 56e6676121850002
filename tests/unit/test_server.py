"""What each worker of ``allotment serve`` does around the application (allotment/server.py)."""

from __future__ import annotations

import gc
import threading
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


# -- the body read on the event loop (_BodyFirst) --------------------------------

def _scope(path: bytes = b"/", method: str = "GET", headers=(), query: bytes = b"") -> dict:
    return {"type": "http", "http_version": "1.1", "method": method, "scheme": "http",
            "raw_path": path, "path": path.decode("latin-1"), "query_string": query,
            "server": ("127.0.0.1", 8778), "client": ("10.0.0.7", 51234), "headers": list(headers)}


def test_the_environ_is_the_one_granians_wsgi_interface_builds():
    environ = server.wsgi_environ(_scope(
        b"/resource_providers/%ff/caf%C3%A9/a%2Fb", "POST", query=b"name=a%0ab",
        headers=[(b"host", b"placement:8778"), (b"content-type", b"application/json"), (b"content-length", b"2"),
                 (b"x-auth-token", b"admin"), (b"x-roles", b"a"), (b"x-roles", b"b"),
                 (b"x-odd", "caf\u00e9".encode())]))
    # PEP 3333: the decoded path's bytes read as Latin-1 (Placement reads %ff as \xff).
    assert environ["PATH_INFO"] == "/resource_providers/\xff/caf\xc3\xa9/a/b"
    assert environ["QUERY_STRING"] == "name=a%0ab"
    assert (environ["REQUEST_METHOD"], environ["SERVER_PROTOCOL"], environ["wsgi.url_scheme"]) == \
        ("POST", "HTTP/1.1", "http")
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"], environ["REMOTE_ADDR"]) == \
        ("127.0.0.1", "8778", "10.0.0.7")
    assert (environ["CONTENT_TYPE"], environ["CONTENT_LENGTH"]) == ("application/json", "2")
    assert "HTTP_CONTENT_TYPE" not in environ and "HTTP_CONTENT_LENGTH" not in environ
    assert environ["HTTP_HOST"] == "placement:8778"
    assert environ["HTTP_X_ROLES"] == "a,b"  # as granian joins a repeated header
    assert environ["HTTP_X_ODD"] == ""  # granian's reading of a value that is not ASCII
    assert environ["SCRIPT_NAME"] == ""


def test_the_environ_holds_nothing_of_the_process_environment(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("CONTENT_TYPE", "text/evil")
    environ = server.wsgi_environ(_scope())
    assert "HTTP_PROXY" not in environ and "CONTENT_TYPE" not in environ and "PATH" not in environ


class _Client:
    """An ASGI receive/send pair: the body in ``parts``, each after ``delay``
    seconds; then, when ``stalls``, nothing more (or with ``disconnect``,
    the client goes away)."""

    def __init__(self, parts=(), delay: float = 0.0, stalls: bool = False, disconnect: bool = False):
        self.parts = list(parts)
        self.delay = delay
        self.stalls = stalls or disconnect
        self.disconnect = disconnect
        self.received = 0
        self.sent: list[dict] = []

    async def receive(self):
        import asyncio

        await asyncio.sleep(self.delay)
        self.received += 1
        if not self.parts:
            if self.disconnect:
                return {"type": "http.disconnect"}
            await asyncio.sleep(3600)
        part = self.parts.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(self.parts) or self.stalls}

    async def send(self, message):
        self.sent.append(message)

    @property
    def status(self):
        return self.sent[0]["status"] if self.sent else None

    @property
    def body(self):
        return self.sent[1]["body"]


def _run(coroutine):
    """``asyncio.run`` in a thread of its own: a test that ran earlier in
    this process (Playwright's sync API, in the browser tests) may leave
    an event loop running in the main thread, where asyncio.run refuses."""
    import asyncio

    outcome: dict = {}

    def target():
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as error:  # re-raised in the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _echo_app(seen: list):
    def app(environ, start_response):
        body = environ["wsgi.input"].read()
        seen.append((dict(environ), body))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"got %d" % len(body)]

    return app


def _serve(scope, client, *, limit=1000, timeout=5.0, seen=None, buffer=server.BODY_BUFFER):
    import asyncio

    seen = [] if seen is None else seen
    adapter = server._BodyFirst(_echo_app(seen), threads=2, body_limit=limit, body_timeout=timeout, buffer=buffer)
    _run(adapter(scope, client.receive, client.send))
    return seen


def _post(length: str | None = None, chunked: bool = False) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", length.encode()))
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    return _scope(b"/resource_providers", "POST", headers)


def test_the_whole_body_reaches_the_application_in_a_thread():
    client = _Client([b'{"na', b'me": ', b'"x"}'])
    seen = _serve(_post("13"), client)
    assert client.status == 200 and client.body == b"got 13"
    environ, body = seen[0]
    assert body == b'{"name": "x"}'
    assert client.received == 3  # no read once the declared length is in


def test_a_body_that_does_not_arrive_in_time_is_408_and_never_reaches_the_application(caplog):
    import orjson

    client = _Client([b"{"] * 100, delay=0.1)
    with caplog.at_level("WARNING", logger="allotment.server"):
        seen = _serve(_post("100"), client, timeout=0.5)
    assert seen == []
    assert client.status == 408
    headers = dict(client.sent[0]["headers"])
    assert headers[b"Connection"] == b"close"
    error = orjson.loads(client.body)["errors"][0]
    assert (error["status"], error["title"]) == (408, "Request Timeout")
    assert error["request_id"] == headers[b"x-openstack-request-id"].decode()
    line, = [r.getMessage() for r in caplog.records if "did not arrive" in r.getMessage()]
    assert line.startswith(error["request_id"] + " POST /resource_providers")
    assert "of 100 bytes received" in line


def test_a_body_never_sent_is_408():
    client = _Client([])
    assert _serve(_post("10"), client, timeout=0.2) == []
    assert client.status == 408


def test_a_declared_body_over_the_limit_is_left_unread_for_the_application_to_refuse():
    client = _Client([b"x" * 2000])
    seen = _serve(_post("2000"), client, limit=1000)
    assert client.received == 0
    environ, body = seen[0]
    assert environ["CONTENT_LENGTH"] == "2000" and body == b""  # the application answers 413 from the length


def test_a_chunked_body_is_read_to_one_byte_over_the_limit():
    client = _Client([b"x" * 600] * 10)
    seen = _serve(_post(chunked=True), client, limit=1000)
    assert client.received == 2
    assert len(seen[0][1]) == 1200  # over the limit: the application's counter answers 413


def test_a_body_cut_short_reaches_the_application_as_under_wsgi():
    # granian says "disconnect" when the client goes away and when its chunks
    # do not parse; the application answers what came (a 400, never a 500).
    client = _Client([b"{"], disconnect=True)
    seen = _serve(_post(chunked=True), client)
    assert seen[0][1] == b"{"
    assert client.status == 200


def test_large_bodies_wait_for_room_in_the_buffer_within_their_time_limit():
    import asyncio

    async def scenario():
        seen: list = []
        adapter = server._BodyFirst(_echo_app(seen), threads=2, body_limit=server.SMALL_BODY * 4,
                                    body_timeout=0.5, buffer=server.SMALL_BODY * 4 + 1)
        stalled = _Client([b"x" * 10], stalls=True)  # holds the room: never finishes
        waiting = _Client([b"y" * (server.SMALL_BODY * 2)])
        small = _Client([b"z" * 100])
        size = server.SMALL_BODY * 2
        await asyncio.gather(
            adapter(_post(str(size + 10)), stalled.receive, stalled.send),
            adapter(_post(str(size)), waiting.receive, waiting.send),
            adapter(_post("100"), small.receive, small.send))
        return stalled, waiting, small

    stalled, waiting, small = _run(scenario())
    assert small.status == 200  # a small body never waits for room
    assert stalled.status == 408
    # The second large body found the room taken: its time ran out while it waited.
    assert waiting.status == 408 and waiting.received == 0


def test_the_worker_rules_hold_behind_the_adapter():
    import asyncio

    seen: list = []
    worker = server._Worker(_fake_app(seen), timeout=0, environment={})
    adapter = server._BodyFirst(worker, threads=1, body_limit=1000)
    client = _Client()
    _run(adapter(_scope(b"/resource_providers", query=b"name=" + b"a" * 8200), client.receive, client.send))
    assert client.status == 414 and seen == []


def _zombie_pid() -> int:
    """The pid of a process that has exited and was not waited for."""
    import os
    import subprocess
    import time

    child = subprocess.Popen(["true"])
    while True:
        with open(f"/proc/{child.pid}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.01)
    os.kill(child.pid, 0)  # still there
    return child.pid


def test_each_worker_takes_the_cpu_with_the_fewest_live_workers():
    import os
    import subprocess

    assert server.CpuPins.applies([0, 1], 2) and server.CpuPins.applies([0, 1, 2, 3], 2)
    assert not server.CpuPins.applies([0], 2) and not server.CpuPins.applies([0, 1], 3)
    pins = server.CpuPins([5, 3], workers=2)
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        first, second, third = (s.pid for s in sleepers)
        assert pins.choose(first) == 3 and pins.choose(second) == 5
        assert pins.choose(third) == 3  # one each: the first of them (a drained worker's successor)
        sleepers[0].kill()
        sleepers[0].wait()
        # 3 has one live worker left, 5 one; once the other worker of 3 has
        # exited too, a replacement goes to 3.
        sleepers[2].kill()
        sleepers[2].wait()
        assert pins.choose(os.getpid()) == 3
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    zombie = server.CpuPins([0, 1], workers=2)
    assert zombie.choose(_zombie_pid()) == 0
    assert zombie.choose(os.getpid()) == 0  # the first worker exited: not counted, zombie or not


def test_the_default_workers_are_the_cpus_this_process_may_use(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 5})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the machine's, not this process's
    assert server.default_workers() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7})
    assert server.default_workers() == 2


def test_a_worker_that_died_holding_the_choice_does_not_keep_the_next_from_starting(monkeypatch):
    import os
    import time

    monkeypatch.setattr(server, "PIN_LOCK_WAIT", 0.05)
    pins = server.CpuPins([0, 1], workers=2)
    held, done = threading.Event(), threading.Event()

    def holder():  # as a worker killed while choosing would leave it (the lock is re-entrant)
        pins.pids.get_lock().acquire()
        held.set()
        done.wait(10)
        pins.pids.get_lock().release()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        held.wait(10)
        started = time.monotonic()
        assert pins.choose(os.getpid()) == 0
        assert time.monotonic() - started < 5  # not until the holder lets go
        assert list(pins.pids.get_obj()).count(os.getpid()) == 1
    finally:
        done.set()
        thread.join()
