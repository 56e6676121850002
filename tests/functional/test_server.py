"""The real server: ``allotment serve`` and the WSGI entry point, over sockets.

The ``api`` fixture skips the socket and the process model; these tests run
what an operator runs: a separate ``allotment serve`` process (gunicorn with
several workers) on a free port, with a ``placement.conf`` in a temp
directory and a database of its own on the selected backend.  They cover
what only a live server shows: the request id and per-request log line as
written by a worker, two deployments starting at once against one empty
database, and ``allotment.wsgi:application`` under an operator's gunicorn.

The helpers here are also used by test_cli.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import os_resource_classes
import os_traits
import pytest
import requests
import sqlalchemy as sa

from tests.conftest import create_database

START_TIMEOUT = 60
REQUEST_ID = re.compile(r"^req-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


# -- helpers (shared with test_cli.py) ------------------------------------

def allotment_command() -> list[str]:
    """The installed ``allotment`` script of the interpreter running the tests."""
    beside = Path(sys.executable).parent / "allotment"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("allotment")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from allotment.cli import main; sys.exit(main())"]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child: no config dir unless asked, no stray test settings."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("OS_PLACEMENT_CONFIG_DIR",)}
    env.update(extra)
    return env


def run_allotment(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(allotment_command() + list(args), capture_output=True, text=True,
                          env=env or clean_env(), timeout=timeout, stdin=subprocess.DEVNULL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(directory: Path, db_url: str, *, auth: str = "noauth2", extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "placement.conf"
    path.write_text(textwrap.dedent(f"""\
        [placement_database]
        connection = {db_url}

        [api]
        auth_strategy = {auth}
        """) + textwrap.dedent(extra))
    return path


@pytest.fixture
def fresh_db(tmp_path_factory):
    """The URL of a new, empty database on the selected backend."""
    url, drop = create_database(tmp_path_factory, "srv")
    yield url
    drop()


class LiveServer:
    """A server process in its own process group, its output in a log file."""

    def __init__(self, command: list[str], port: int, log_path: Path, env: dict | None = None):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env or clean_env(),
                                        start_new_session=True)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server did not answer within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


def serve(config: Path, *args: str, log_name: str = "server.log", env: dict | None = None) -> LiveServer:
    port = free_port()
    command = allotment_command() + ["serve", "--config-file", str(config), "--port", str(port),
                                     *args]
    return LiveServer(command, port, config.parent / log_name, env=env)


@contextlib.contextmanager
def running(config: Path, *args: str):
    """``allotment serve`` with this configuration, ready, and stopped afterwards."""
    live = serve(config, *args)
    try:
        live.wait_ready()
        yield live
    finally:
        live.stop()


@contextlib.contextmanager
def running_on_new_database(tmp_path_factory, label: str, *args: str):
    """``running`` on a fresh database of the selected backend, dropped afterwards."""
    url, drop = create_database(tmp_path_factory, label)
    config = write_config(tmp_path_factory.mktemp(label), url)
    try:
        with running(config, *args) as live:
            yield live
    finally:
        drop()


def get(server: LiveServer, path: str, version: str | None = None, token: str | None = "admin",
        headers: dict | None = None):
    headers = dict(headers or {})
    if version:
        headers["OpenStack-API-Version"] = f"placement {version}"
    if token:
        headers["X-Auth-Token"] = token
    return requests.get(server.url + path, headers=headers, timeout=30)


def wait_for_log(server: LiveServer, needle: str, timeout: float = 10) -> list[str]:
    """The log lines containing ``needle``, once at least one has been written."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in server.log().splitlines() if needle in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


# -- one server, several workers -----------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_on_new_database(tmp_path_factory, "srv", "--workers", "2", "--threads", "2") as live:
        yield live


def test_root_answers_without_a_token(server):
    resp = get(server, "/", token=None)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    version = resp.json()["versions"][0]
    assert (version["id"], version["min_version"], version["max_version"]) == ("v1.0", "1.0", "1.39")


def test_every_response_has_a_request_id(server):
    seen = set()
    for path, token, status in [("/", None, 200), ("/", "admin", 200),
                                ("/resource_providers", None, 401),
                                ("/no/such/thing", "admin", 404)]:
        resp = get(server, path, token=token)
        assert resp.status_code == status
        request_id = resp.headers["x-openstack-request-id"]
        assert REQUEST_ID.match(request_id), request_id
        seen.add(request_id)
    assert len(seen) == 4


def test_error_body_carries_the_request_id(server):
    resp = get(server, "/no/such/thing", version="1.23")
    assert resp.status_code == 404
    assert resp.json()["errors"][0]["request_id"] == resp.headers["x-openstack-request-id"]


def test_one_log_line_per_request(server):
    """Method, path with query, status, microversion and duration, exactly once."""
    cases = [("/", None, "1.17", 200), ("/no/such/thing?a=1", "admin", "1.23", 404),
             ("/", None, "latest", 200)]
    for path, token, version, status in cases:
        resp = get(server, path, version=version, token=token)
        assert resp.status_code == status
        request_id = resp.headers["x-openstack-request-id"]
        lines = wait_for_log(server, request_id)
        assert len(lines) == 1, lines
        line = lines[0]
        assert f'"GET {path}"' in line
        assert f"status: {status}" in line
        expected_version = "1.39" if version == "latest" else version
        assert f"microversion: {expected_version}" in line
        assert re.search(r"time: \d+(\.\d+)?ms", line), line


def test_rejected_microversion_is_logged_too(server):
    resp = get(server, "/", version="1.99")
    assert resp.status_code == 406
    lines = wait_for_log(server, resp.headers["x-openstack-request-id"])
    assert len(lines) == 1 and "status: 406" in lines[0]


def test_concurrent_requests_are_served_by_several_workers(server):
    """Parallel clients all get answers; the log shows more than one worker pid."""
    statuses = []

    def client():
        for _ in range(10):
            statuses.append(get(server, "/", token=None).status_code)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 60
    pids = {line.split()[2] for line in server.log().splitlines() if '"GET /"' in line}
    assert len(pids) >= 2, pids


# -- two deployments, one new database ------------------------------------

def _count(db_url: str, table: str) -> int:
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
    finally:
        engine.dispose()


def test_two_servers_starting_together_migrate_one_database_safely(fresh_db, tmp_path):
    """Both create/upgrade the schema and sync the standard names at once; both serve."""
    configs = [write_config(tmp_path / name, fresh_db) for name in ("a", "b")]
    servers = [serve(config, "--workers", "2", "--threads", "1") for config in configs]
    try:
        for live in servers:
            live.wait_ready()
        for live in servers:
            assert get(live, "/no/such/thing").status_code == 404
            assert "Traceback" not in live.log(), live.log()
    finally:
        for live in servers:
            live.stop()
    status = run_allotment("status", "--config-file", str(configs[0]))
    assert status.returncode == 0, status.stdout + status.stderr
    assert _count(fresh_db, "resource_classes") == len(os_resource_classes.STANDARDS)
    assert _count(fresh_db, "traits") == len(os_traits.get_traits())


# -- the WSGI entry point --------------------------------------------------

def gunicorn_wsgi(config: Path) -> LiveServer:
    """An operator's gunicorn serving allotment.wsgi:application, its
    configuration found through $OS_PLACEMENT_CONFIG_DIR (not waited for)."""
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1",
               "allotment.wsgi:application"]
    return LiveServer(command, port, config.parent.parent / "gunicorn.log",
                      env=clean_env(OS_PLACEMENT_CONFIG_DIR=str(config.parent)))


def test_wsgi_application_finds_its_config_through_os_placement_config_dir(fresh_db, tmp_path):
    """An operator's gunicorn serving allotment.wsgi:application (which
    migrates, as Placement's does, because sync_on_startup says so)."""
    config = write_config(tmp_path / "etc", fresh_db, extra="[placement_database]\nsync_on_startup = true\n")
    live = gunicorn_wsgi(config)
    try:
        live.wait_ready()
        # noauth2 from that file: the admin token gets past authentication...
        assert get(live, "/no/such/thing").status_code == 404
        # ...and no token does not.
        assert get(live, "/resource_providers", token=None).status_code == 401
    finally:
        live.stop()
    # The schema was built in the database that file names.
    version = run_allotment("db", "version", "--config-file", str(config))
    head = run_allotment("status", "--config-file", str(config))
    assert version.returncode == 0 and version.stdout.strip() not in ("", "None")
    assert head.returncode == 0, head.stdout + head.stderr


# -- the provider mirror, read before the workers are forked --------------

def _put(live: LiveServer, path: str, body: dict, version: str = "1.39"):
    headers = {"X-Auth-Token": "admin", "OpenStack-API-Version": f"placement {version}"}
    return requests.put(live.url + path, json=body, headers=headers, timeout=30)


def test_workers_start_with_the_provider_mirror_read_by_the_master(fresh_db, tmp_path):
    """``allotment serve`` reads every provider once, before it forks: the
    workers' first candidate answers read only what changed since, and a
    change made after the fork is in the next answer."""
    from allotment.db import changes
    from tests.conftest import BACKEND

    if BACKEND not in changes.NOTING_BACKENDS:
        pytest.skip(f"no provider mirror on {BACKEND}")
    config = write_config(tmp_path / "seed", fresh_db)
    uuids = [f"00000000-0000-4000-8000-00000000000{index}" for index in range(3)]
    with running(config) as live:
        for index, uuid in enumerate(uuids):
            created = requests.post(live.url + "/resource_providers",
                                    json={"name": f"host{index}", "uuid": uuid},
                                    headers={"X-Auth-Token": "admin",
                                             "OpenStack-API-Version": "placement 1.39"}, timeout=30)
            assert created.status_code == 200, created.text
            answer = _put(live, f"/resource_providers/{uuid}/inventories",
                          {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}}})
            assert answer.status_code == 200, answer.text
    with running(config, "--workers", "2", "--threads", "2") as live:
        started = live.log()
        assert "read every provider (3)" in started and "before the workers start" in started, started
        path = "/allocation_candidates?resources=VCPU:4"
        counts = []

        def client():
            for _ in range(5):
                answer = get(live, path, version="1.39")
                counts.append(len(answer.json()["allocation_requests"]) if answer.ok else answer.status_code)

        threads = [threading.Thread(target=client) for _ in range(6)]  # new connections: both workers
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert counts == [3] * 30
        fourth = "00000000-0000-4000-8000-000000000009"
        requests.post(live.url + "/resource_providers", json={"name": "host9", "uuid": fourth},
                      headers={"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"},
                      timeout=30).raise_for_status()
        _put(live, f"/resource_providers/{fourth}/inventories",
             {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}}}).raise_for_status()
        for _ in range(8):
            answer = get(live, path, version="1.39")
            assert answer.status_code == 200 and len(answer.json()["allocation_requests"]) == 4
        log = live.log()
    assert log.count("provider mirror: read every provider") == 1, log
    worker_pids = {line.split()[2] for line in log.splitlines() if "GET /allocation_candidates" in line}
    assert len(worker_pids) == 2, log


# -- workers bound to CPUs ------------------------------------------------

def _workers_cpus(live: LiveServer) -> list[set[str]]:
    """For each worker process of ``live``, the CPU lists its threads may run on."""
    found = []
    for child in Path(f"/proc/{live.process.pid}/task/{live.process.pid}/children").read_text().split():
        lists = set()
        for thread in Path(f"/proc/{child}/task").iterdir():
            for line in (thread / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    lists.add(line.split(":", 1)[1].strip())
        found.append(lists)
    return found


def _bound_workers(live: LiveServer, count: int, timeout: float = 20.0) -> list[set[str]]:
    """:func:`_workers_cpus` once ``count`` workers each run on one CPU, or
    as they are at ``timeout``: a worker binds itself as it starts, and one
    may answer a request while the other is still starting."""
    deadline = time.monotonic() + timeout
    while True:
        found = _workers_cpus(live)
        if len(found) == count and all(len(lists) == 1 and next(iter(lists)).isdigit() for lists in found):
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for two workers")
def test_each_worker_runs_on_a_cpu_of_its_own(tmp_path_factory):
    """With as many CPUs as workers, every thread of a worker is bound to
    one CPU and no two workers share one; ``--cpu-affinity off`` leaves them
    free, as with more workers than CPUs."""
    allowed = os.sched_getaffinity(0)
    with running_on_new_database(tmp_path_factory, "pin", "--workers", "2") as live:
        assert get(live, "/", token=None).status_code == 200
        bound = _bound_workers(live, 2)
        assert len(bound) == 2 and all(len(lists) == 1 for lists in bound), bound
        cpus = [next(iter(lists)) for lists in bound]
        assert len(set(cpus)) == 2 and {int(cpu) for cpu in cpus} <= allowed
        assert wait_for_log(live, "bound to a CPU of its own")
    for args in (("--workers", "2", "--cpu-affinity", "off"), ("--workers", str(len(allowed) + 1))):
        with running_on_new_database(tmp_path_factory, "free", *args) as live:
            free = _workers_cpus(live)
            assert len(free) == int(args[1]) and all(len(lists) == 1 for lists in free)
            master = [line.split(":", 1)[1].strip() for line in
                      Path(f"/proc/{live.process.pid}/status").read_text().splitlines()
                      if line.startswith("Cpus_allowed_list:")]
            assert [next(iter(lists)) for lists in free] == master * len(free)
            assert "bound to a CPU" not in live.log()
