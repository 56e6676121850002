"""tools/scalebench: Allotment (and the reference) over HTTP on a generated cloud.

The shared bench (``../shared/bench``) seeds its clouds through the API,
which limits it to clouds of a few tens of thousands of providers in
reasonable time.  This runner writes its cloud with ``tools/cloudgen``
(once per backend, size and seed: the result is kept as a template, a
SQLite file or a PostgreSQL database, and copied for each server), then
starts each server on its own copy and measures, with the bench's
conventions (p50 / p95, server CPU per request from ``/proc``, PostgreSQL
backends' CPU per request, ``--vs`` with alternating blocks):

``first-read``
    the first answers of a freshly started server (for Allotment: each
    worker reading every provider into its mirror; the worker's own log
    line says how long that read took), and the workers' memory after it;
``reads``
    allocation candidates of the shapes' queries, with ``limit=1000`` and
    without a limit, one client, A and B in alternating blocks;
``stream``
    M readers asking candidates (``limit=1000``), first alone (idle), then
    while N writers claim (``GET ...&limit=10``, ``PUT /allocations``,
    retrying a 409 up to five times; with ``--claim-rate``, that many
    claims a second in all, spread evenly), in rounds (``--stream-rounds``) with
    the servers taking turns: the readers' p50 / p95 idle and while
    writing, and each round's ratio, claims per second, CPU per claim;
    then every provider's usage and every claim checked in the database
    (over capacity, lost and phantom writes);
``claims``
    C clients each claiming K times, as the bench's claim race: server
    (and database) CPU per claim, then the same checks; with
    ``--claim-floor`` (PostgreSQL, flat clouds), then ``tools/claimfloor``'s
    least claim transaction at each server's pace and client count, and
    each server's database CPU per claim against it;
``statements``
    in process, without HTTP: the statements one claim sends (its
    ``GET /allocation_candidates?...&limit=10`` and its ``PUT``), listed,
    and the process CPU each costs (Allotment only).

Servers are commands with ``{config}`` and ``{port}``, as for the bench;
``ours``, ``ours-computed`` (``[allotment] candidates_cache_mb = 0``: every
answer computed) and ``reference`` name the usual ones.  A server gets a
Placement 16.0.0 database (``--placement-only`` cloud): Allotment takes
its copy over when it starts, as after a switch from Placement.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import http.client
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools" / "cloudgen"))

import sqlalchemy as sa  # noqa: E402

import cloud  # noqa: E402

VENV = Path(os.environ.get("ALLOTMENT_VENV", REPO / ".venv"))
OURS = f"{VENV}/bin/allotment serve --config-file {{config}} --port {{port}}"
COMPUTED = 'printf "\\n[allotment]\\ncandidates_cache_mb = 0\\n" >> {config} && ' + OURS


def _reference_serve() -> str:
    if os.environ.get("ALLOTMENT_REFERENCE_SERVE"):
        return os.environ["ALLOTMENT_REFERENCE_SERVE"]
    for candidate in (REPO.parent / "shared" / "reference" / "serve", Path("/work/shared/reference/serve")):
        if candidate.exists():
            return str(candidate)
    return str(REPO.parent / "shared" / "reference" / "serve")


PRESETS = {"ours": OURS, "ours-computed": COMPUTED,
           "reference": f"{_reference_serve()} --config-file {{config}} --port {{port}}"}
PG_DEFAULT = "postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
HEADERS = {"x-auth-token": "admin", "openstack-api-version": "placement 1.39",
           "accept": "application/json", "content-type": "application/json"}
SCENARIOS = ("first-read", "shapes", "reads", "stream", "claims", "statements")
#: The flavors of the ``shapes`` scenario: (VCPU, MEMORY_MB, DISK_GB).
FLAVORS = [(vcpu, memory, disk) for disk in (20, 10, 40) for vcpu in (1, 2, 4, 8)
           for memory in (2048, 4096, 1024, 8192, 16384)]

SIMPLE = "resources=VCPU:2,MEMORY_MB:4096,DISK_GB:20"
#: The bench's queries, per shape: (name, query without limit).
QUERIES = {
    "flat": [
        ("simple", SIMPLE),
        ("required+forbidden+member_of", SIMPLE + "&required=HW_CPU_X86_AVX2,!CUSTOM_MAINTENANCE"
                                                  "&member_of=in:{aggregates}"),
        ("any-of traits (1.39)", SIMPLE + "&required=in:HW_CPU_X86_AVX512F,CUSTOM_GOLD"
                                          "&required=!CUSTOM_MAINTENANCE"),
    ],
    "nested": [
        ("numa+vgpu isolate", "resources1=VCPU:2,MEMORY_MB:2048&resources2=VGPU:1&group_policy=isolate"),
        ("numa+vgpu same_subtree", "resources_CPU=VCPU:2,MEMORY_MB:2048&resources_GPU=VGPU:1"
                                   "&same_subtree=_CPU,_GPU&group_policy=none"),
        ("neutron vf+bw physnet same_subtree",
         "resources=DISK_GB:20&resources_CPU=VCPU:2,MEMORY_MB:2048"
         "&resources_NET=SRIOV_NET_VF:1,NET_BW_EGR_KILOBIT_PER_SEC:100000"
         "&required_NET=CUSTOM_PHYSNET_PHYSNET1,CUSTOM_VNIC_TYPE_DIRECT&same_subtree=_CPU,_NET&group_policy=none"),
        ("simple", SIMPLE),
    ],
    "sharing": [
        ("VCPU+shared DISK", "resources=VCPU:1,DISK_GB:100"),
        ("VCPU+MEM+shared DISK", "resources=VCPU:1,MEMORY_MB:2048,DISK_GB:100"),
    ],
}
#: A query few trees meet (one aggregate of about 50 hosts), without a
#: limit: its cost should follow its answer, not the cloud.
RARE = ("member_of one aggregate", "{query}&member_of={aggregate}")
CLAIM_QUERY = f"/allocation_candidates?{SIMPLE}&limit=10"
STREAM_QUERY = f"/allocation_candidates?{SIMPLE}&limit=1000"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def yardstick(report: dict, moment: str) -> float:
    """How fast this machine runs Python now: the seconds of a loop of 10^7
    additions at module level (``s += i``, as ``python3 -c`` runs it; timed
    over 2 x 10^6, the median of three), logged and kept in the report's
    ``meta`` under ``moment``.  This machine's speed moved 1.8x within one
    session: absolute figures need it beside them."""
    spent = []
    for _ in range(3):
        started = time.perf_counter()
        exec("s = 0\nfor i in range(2_000_000): s += i", {})  # globals, as the docs' loop
        spent.append(time.perf_counter() - started)
    seconds = round(statistics.median(spent) * 5, 3)
    report["meta"].setdefault("yardstick_s", {})[moment] = seconds
    walk, total = memory_walk()
    report["meta"].setdefault("memory_yardstick_s", {})[moment] = walk
    log(f"yardstick ({moment}): a loop of 10^7 additions takes {seconds:.2f} s; "
        f"a dict of 10^6 built, updated and summed {walk:.2f} s ({total} counted)")
    return seconds


def memory_walk() -> tuple[float, int]:
    """(seconds, keys counted) of the second yardstick: a dict too large
    for the CPU's caches built, every key updated once in scattered order,
    and summed; the median of three.  The loop of :func:`yardstick` stays in
    the caches; work that walks memory (building a mirror, answering from
    it, a claim) slowed 1.9x one morning while the loop held still, and 21
    claim races followed this one (correlation 0.78)."""
    memory = []
    for _ in range(3):
        started = time.perf_counter()
        table = dict.fromkeys(range(1_000_000), 0)
        for i in range(1_000_000):  # every key once, scattered (7919 is prime)
            table[i * 7919 % 1_000_000] += 1
        total = sum(table.values())
        del table
        memory.append(time.perf_counter() - started)
    return round(statistics.median(memory), 3), total


# -- the cloud ------------------------------------------------------------------


def _generator_digest() -> str:
    return hashlib.sha1((REPO / "tools" / "cloudgen" / "cloud.py").read_bytes()).hexdigest()[:8]


class CloudStore:
    """The generated cloud, kept as a template per (backend, shapes, seed,
    generator version), and copies of it for the servers."""

    def __init__(self, args: argparse.Namespace):
        self.backend = args.db
        self.shapes = args.cloud
        self.seed = args.seed
        self.full_first = args.full_first
        self.cache = Path(args.cache_dir)
        self.cache.mkdir(parents=True, exist_ok=True)
        spec = f"{self.backend} {self.shapes} {self.seed} {_generator_digest()}"
        if self.full_first:
            spec += f" full_first={self.full_first}"
        self.key = hashlib.sha1(spec.encode()).hexdigest()[:10]
        self.name = ("scalebench_" + "_".join(f"{s}{n}" for s, n in self.shapes)
                     + (f"_full{round(self.full_first * 100)}" if self.full_first else "") + "_" + self.key)
        self.summary_path = self.cache / f"{self.name}.json"
        self.pg_template = args.pg_url
        self.copies: list[str] = []

    def url(self, name: str) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.cache / (name + '.sqlite')}"
        return self.pg_template.format(name=name)

    def _admin(self) -> sa.Engine:
        return sa.create_engine(self.pg_template.format(name="postgres"), isolation_level="AUTOCOMMIT")

    def _drop(self, name: str) -> None:
        if self.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.cache / name) + ".sqlite" + suffix).unlink(missing_ok=True)
            return
        engine = self._admin()
        with engine.connect() as conn:
            if conn.exec_driver_sql("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).first():
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false ALLOW_CONNECTIONS true')
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        engine.dispose()

    def _seal(self) -> None:
        """Make the template read-only: every run measures a copy of it, and a
        server or profile pointed at the template by mistake (it happened:
        claims written into it, the cache none the wiser) fails instead of
        changing what later runs start from.  PostgreSQL: no connections (a
        copy needs none); SQLite: the file's mode."""
        if self.backend == "sqlite":
            os.chmod(self.cache / f"{self.name}.sqlite", 0o444)
            return
        engine = self._admin()
        with engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{self.name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')
            conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                                 (self.name,))
        engine.dispose()

    def template(self, regenerate: bool) -> dict:
        if self.summary_path.exists() and not regenerate:
            log(f"cloud: reusing {self.url(self.name)}")
            self._seal()  # a template cached before templates were sealed
            return json.loads(self.summary_path.read_text())
        self.summary_path.unlink(missing_ok=True)
        self._drop(self.name)
        if self.backend != "sqlite":
            engine = self._admin()
            with engine.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
            engine.dispose()
        log(f"cloud: generating {self.shapes} (seed {self.seed}) into {self.url(self.name)}")
        result = cloud.generate(self.url(self.name), cloud.Spec(self.shapes, self.seed, self.full_first),
                                placement_only=True)
        summary = {"seconds": result.seconds, "rows": result.rows,
                   "shapes": [vars(s) for s in result.shapes]}
        log(f"cloud: {sum(result.rows.values())} rows in {result.seconds:.1f} s")
        self._seal()
        self.summary_path.write_text(json.dumps(summary))
        return summary

    def copy(self, label: str) -> str:
        name = f"{self.name}_{label}_{uuidlib.uuid4().hex[:6]}".lower()
        if self.backend == "sqlite":
            shutil.copyfile(self.cache / f"{self.name}.sqlite", self.cache / f"{name}.sqlite")
        else:
            engine = self._admin()
            try:
                cloud.pg_copy(engine, self.name, name)
            finally:
                engine.dispose()
        self.copies.append(name)
        return self.url(name)

    def drop_copies(self) -> None:
        for name in self.copies:
            self._drop(name)
        self.copies = []


# -- servers and their CPU --------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_CLK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> tuple | None:
    """(session id, start time, CPU ticks, RSS bytes) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[3]), int(fields[19]), int(fields[11]) + int(fields[12]), int(fields[21]) * _PAGE


def _pss(pid: int) -> float | None:
    """A process's proportional set size in MiB (/proc/PID/smaps_rollup), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Server:
    """One server command on its own database copy, in its own session."""

    def __init__(self, label: str, template: str, db_url: str, workdir: Path, pg_admin: str | None):
        self.label = label
        self.template = PRESETS.get(template, template)
        self.db_url = db_url
        self.dir = Path(tempfile.mkdtemp(prefix=f"scalebench-{label}-", dir=workdir))
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.pg_admin = pg_admin
        self.db_name = sa.engine.make_url(db_url).database if db_url.startswith("postgresql") else None

    def start(self, timeout: float) -> float:
        config = self.dir / "placement.conf"
        config.write_text(f"[api]\nauth_strategy = noauth2\n[placement_database]\nconnection = {self.db_url}\n")
        command = self.template.format(config=shlex.quote(str(config)), port=self.port)
        self.log_path = self.dir / "server.log"
        started = time.perf_counter()
        self.proc = subprocess.Popen(["bash", "-c", command], stdout=open(self.log_path, "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir)
        deadline = started + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited while starting:\n{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/", headers=HEADERS)
                if conn.getresponse().status == 200:
                    conn.close()
                    return time.perf_counter() - started
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.label} did not answer within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_lines(self, needle: str) -> list[str]:
        try:
            return [line for line in self.log_path.read_text(errors="replace").splitlines() if needle in line]
        except OSError:
            return []

    def logged_times(self, path: str, since: float, until: float) -> list[float]:
        """The milliseconds Allotment's log gives for each answer to ``path``
        between two moments (its lines: '... "GET path" status: 200 ...
        time: 1.2ms'); nothing for a server that does not log them."""
        found = []
        needle = f'"GET {path}" status: 200'
        for line in self.log_lines(needle):
            try:
                stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
                spent = float(line.rsplit("time: ", 1)[1].rstrip().rstrip("ms"))
            except (ValueError, IndexError):
                continue
            if since <= stamp <= until:
                found.append(spent)
        return found

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None

    def processes(self) -> dict[int, tuple]:
        """pid -> _stat() of every process of the server's session."""
        if self.proc is None:
            return {}
        sid = self.proc.pid
        found = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = _stat(int(entry))
                if st is not None and st[0] == sid:
                    found[int(entry)] = st
        return found

    def db_processes(self) -> dict[int, tuple]:
        """pid -> _stat() of the PostgreSQL backends serving the server's database."""
        if self.db_name is None or self.pg_admin is None:
            return {}
        import psycopg2

        try:
            with psycopg2.connect(self.pg_admin) as conn, conn.cursor() as cursor:
                cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.db_name,))
                pids = [row[0] for row in cursor.fetchall()]
        except psycopg2.Error:
            return {}
        return {pid: st for pid in pids if (st := _stat(pid)) is not None}

    def rss(self) -> dict:
        """The resident memory of the server's processes, in MiB, and what
        they hold in proportion (PSS: a page shared by n processes counts
        1/n in each).  RSS counts the pages forked workers share with their
        master in every process; ``pss_total`` is what they hold together."""
        processes = self.processes()
        sizes = sorted((st[3] / 2**20 for st in processes.values()), reverse=True)
        pss = [size for size in map(_pss, processes) if size is not None]
        return {"largest": round(sizes[0], 1) if sizes else None, "total": round(sum(sizes), 1),
                "processes": [round(s, 1) for s in sizes],
                "pss_total": round(sum(pss), 1) if pss else None,
                "pss_processes": sorted((round(size, 1) for size in pss), reverse=True)}


class Sampler:
    """CPU of each server's processes (and database backends), sampled every
    ``every`` seconds: a process that exits during a phase counts up to its
    last sample; one started during the phase counts in full."""

    def __init__(self, servers: list[Server], every: float = 0.25):
        self.servers = servers
        self.every = every
        self.latest: dict[str, dict[tuple, int]] = {s.label: {} for s in servers}
        self.latest_db: dict[str, dict[tuple, int]] = {s.label: {} for s in servers}
        self.peak_rss: dict[str, float] = {s.label: 0.0 for s in servers}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        for server in self.servers:
            procs = server.processes()
            dbs = server.db_processes()
            with self._lock:
                for pid, st in procs.items():
                    self.latest[server.label][(pid, st[1])] = st[2]
                    self.peak_rss[server.label] = max(self.peak_rss[server.label], st[3] / 2**20)
                for pid, st in dbs.items():
                    self.latest_db[server.label][(pid, st[1])] = st[2]

    def begin(self, label: str) -> tuple:
        self.sample()
        with self._lock:
            return label, dict(self.latest[label]), dict(self.latest_db[label])

    def end(self, token: tuple) -> tuple[float, float | None]:
        """(server CPU seconds, database CPU seconds or None) since ``begin``."""
        label, start, start_db = token
        self.sample()
        with self._lock:
            cpu = sum(ticks - start.get(key, 0) for key, ticks in self.latest[label].items())
            db = sum(ticks - start_db.get(key, 0) for key, ticks in self.latest_db[label].items())
        server = next(s for s in self.servers if s.label == label)
        return cpu / _CLK, (db / _CLK if server.db_name and server.pg_admin else None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


# -- HTTP -----------------------------------------------------------------------------


class Client:
    """One keep-alive connection to a server."""

    def __init__(self, port: int, timeout: float = 120.0):
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body=None) -> tuple[int | str, bytes, float]:
        """(status, or TIMEOUT / CONNECTION LOST; body; seconds)."""
        payload = None if body is None else json.dumps(body).encode()
        started = time.perf_counter()
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=payload, headers=HEADERS)
                response = self.conn.getresponse()
                data = response.read()
                return response.status, data, time.perf_counter() - started
            except socket.timeout:
                self.close()
                return "TIMEOUT", b"", time.perf_counter() - started
            except (http.client.HTTPException, ConnectionError, OSError):
                self.close()
                if attempt or time.perf_counter() - started > 1:
                    return "CONNECTION LOST", b"", time.perf_counter() - started
                started = time.perf_counter()  # a kept connection the server closed: once more
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def _digest(body: bytes) -> tuple[int, str]:
    data = json.loads(body)
    requests = data.get("allocation_requests", [])
    canon = sorted(json.dumps(r.get("allocations", r), sort_keys=True) for r in requests)
    return len(requests), hashlib.sha1("\n".join(canon).encode()).hexdigest()[:10]


# -- scenarios ------------------------------------------------------------------------


def queries(summary: dict, no_limit: bool) -> list[tuple[str, str]]:
    found = []
    seen = set()
    for shape in summary["shapes"]:
        aggregates = shape["aggregates"]
        for name, query in QUERIES[shape["shape"]]:
            query = query.format(aggregates=",".join(aggregates[:10]))
            if query in seen:
                continue
            seen.add(query)
            found.append((f"{name} limit=1000", f"/allocation_candidates?{query}&limit=1000"))
            if no_limit:
                found.append((f"{name} no limit", f"/allocation_candidates?{query}"))
        plain = "resources=VCPU:1,DISK_GB:100" if shape["shape"] == "sharing" else SIMPLE
        rare = RARE[1].format(query=plain, aggregate=aggregates[-1])
        if no_limit and rare not in seen:
            seen.add(rare)
            found.append((f"{RARE[0]} ({shape['shape']}), no limit", f"/allocation_candidates?{rare}"))
    return found


def first_read(servers: list[Server], summary: dict, args) -> dict:
    """The first answers of each freshly started server, on new connections
    (each may reach another worker: the slow ones are the workers' first)."""
    path = queries(summary, False)[0][1]
    result = {}
    for server in servers:
        times = []
        for _ in range(args.first_reads):
            client = Client(server.port, args.query_timeout)
            status, _, seconds = client.request("GET", path)
            client.close()
            times.append(round(seconds * 1000, 1) if status == 200 else str(status))
        lines = server.log_lines("provider mirror:")
        result[server.label] = {"answers_ms": times, "mirror_log": lines, "rss_mib": server.rss()}
        log(f"{server.label} first answers (ms): {times}")
        for line in lines:
            log(f"{server.label}   {line.strip()[-160:]}")
    return result


def many_shapes(servers: list[Server], sampler: Sampler, args) -> dict:
    """Many query shapes (flavors, ``limit=1000``) asked once each, then each
    again, on one connection a server (so of one worker), the servers taking
    turns request by request: what a scheduler's first asking of each of its
    flavors costs, against asking it again."""
    paths = [f"/allocation_candidates?resources=VCPU:{vcpu},MEMORY_MB:{memory},DISK_GB:{disk}&limit=1000"
             for vcpu, memory, disk in FLAVORS[:args.shapes]]
    clients = {s.label: Client(s.port, args.query_timeout) for s in servers}
    result: dict = {s.label: {} for s in servers}
    for phase in ("first", "again"):
        times: dict[str, list[float]] = {s.label: [] for s in servers}
        cpu = {s.label: [0.0, 0.0] for s in servers}
        failed: dict[str, list] = {s.label: [] for s in servers}
        for path in paths:
            for server in servers:
                token = sampler.begin(server.label)
                status, _, seconds = clients[server.label].request("GET", path)
                server_cpu, db_cpu = sampler.end(token)
                cpu[server.label][0] += server_cpu
                cpu[server.label][1] += db_cpu or 0.0
                if status == 200:
                    times[server.label].append(seconds)
                else:
                    failed[server.label].append(str(status))
        for server in servers:
            label, got = server.label, times[server.label]
            res = result[label][phase] = {
                "p50_ms": _ms(percentile(got, 50)), "p95_ms": _ms(percentile(got, 95)),
                "max_ms": _ms(max(got)) if got else None, "requests": len(paths),
                "server_cpu_ms": round(cpu[label][0] * 1000 / len(paths), 2),
                "db_cpu_ms": round(cpu[label][1] * 1000 / len(paths), 2) if server.db_name else None,
                "errors": failed[label]}
            db = f"+{res['db_cpu_ms']}" if res["db_cpu_ms"] is not None else ""
            log(f"{label} shapes, {phase} asking of {len(paths)}: p50 {res['p50_ms']} p95 {res['p95_ms']} "
                f"max {res['max_ms']} ms, cpu {res['server_cpu_ms']}{db} ms/req, errors {failed[label]}")
        if len(servers) == 2:
            a, b = (result[s.label][phase] for s in servers)
            if a["p50_ms"] and b["p50_ms"]:
                log(f"shapes, {phase} asking: B/A p50 {b['p50_ms'] / a['p50_ms']:.2f}x, "
                    f"server CPU {b['server_cpu_ms'] / max(a['server_cpu_ms'], 0.01):.2f}x")
    for client in clients.values():
        client.close()
    return result


def _block(client: Client, path: str, count: int, budget: float) -> tuple[list[float], list]:
    times, failures = [], []
    deadline = time.perf_counter() + budget
    for _ in range(count):
        status, _, seconds = client.request("GET", path)
        if status != 200:
            failures.append(status)
            if not isinstance(status, int):
                break
        else:
            times.append(seconds)
        if time.perf_counter() > deadline:
            break
    return times, failures


def reads(servers: list[Server], summary: dict, sampler: Sampler, args) -> list[dict]:
    results = []
    clients = {s.label: Client(s.port, args.query_timeout) for s in servers}
    for name, path in queries(summary, not args.limited_only):
        entry = {"query": name, "path": path, "results": {}}
        results.append(entry)
        alive = []
        for server in servers:
            status, body, seconds = clients[server.label].request("GET", path)
            res = entry["results"][server.label] = {"first_ms": round(seconds * 1000, 1)}
            if status != 200:
                res["failed"] = str(status)
                log(f"{server.label} {name}: {status} after {seconds:.1f} s; not measured")
                continue
            res["n"], res["digest"] = _digest(body)
            alive.append(server)
            for _ in range(args.warmup):
                clients[server.label].request("GET", path)
        times: dict[str, list[float]] = {s.label: [] for s in alive}
        cpu = {s.label: [0.0, 0.0, 0] for s in alive}
        order = [alive[(i // 2 + i % 2) % len(alive)] if len(alive) == 2 else alive[0]
                 for i in range(args.rounds)] if alive else []
        per_block = max(1, args.reps // max(1, args.rounds))
        for server in order:
            label = server.label
            budget = args.max_seconds / max(1, args.rounds)
            token = sampler.begin(label)
            got, failures = _block(clients[label], path, per_block, budget)
            server_cpu, db_cpu = sampler.end(token)
            times[label] += got
            cpu[label][0] += server_cpu
            cpu[label][1] += db_cpu or 0.0
            cpu[label][2] += len(got) + len(failures)
            if failures:
                entry["results"][label].setdefault("errors", []).extend(str(f) for f in failures)
        for server in alive:
            label = server.label
            while len(times[label]) < args.min_reps:  # a slow server: at least this many
                token = sampler.begin(label)
                got, failures = _block(clients[label], path, 1, args.query_timeout)
                server_cpu, db_cpu = sampler.end(token)
                times[label] += got
                cpu[label][0] += server_cpu
                cpu[label][1] += db_cpu or 0.0
                cpu[label][2] += 1
                if failures:
                    break
            res = entry["results"][label]
            count = cpu[label][2]
            res.update(p50_ms=_ms(percentile(times[label], 50)), p95_ms=_ms(percentile(times[label], 95)),
                       requests=len(times[label]),
                       server_cpu_ms=round(cpu[label][0] * 1000 / count, 2) if count else None,
                       db_cpu_ms=(round(cpu[label][1] * 1000 / count, 2)
                                  if count and server.db_name else None))
        _print_read(entry, [s.label for s in servers])
    for client in clients.values():
        client.close()
    return results


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _print_read(entry: dict, labels: list[str]) -> None:
    parts = []
    for label in labels:
        res = entry["results"].get(label, {})
        if "failed" in res:
            parts.append(f"{label}: {res['failed']} after {res['first_ms'] / 1000:.1f} s")
            continue
        cpu = f"{res.get('server_cpu_ms')}" + (f"+{res['db_cpu_ms']}" if res.get("db_cpu_ms") is not None else "")
        parts.append(f"{label}: p50 {res.get('p50_ms')} p95 {res.get('p95_ms')} ms, cpu {cpu} ms/req, "
                     f"n={res.get('n')}")
    ratio = ""
    if len(labels) == 2:
        a, b = (entry["results"].get(label, {}) for label in labels)
        if a.get("p50_ms") and b.get("p50_ms"):
            ratio = f"  B/A p50 {b['p50_ms'] / a['p50_ms']:.1f}x"
            if a.get("n") != b.get("n"):
                ratio += "  <<count differs>>"
            elif "no limit" in entry["query"] and a.get("digest") != b.get("digest"):
                ratio += "  <<answers differ>>"
    log(f"{entry['query']}: " + " | ".join(parts) + ratio)


class ClaimRun:
    """Writers claiming: GET candidates (limit=10), pick one at random,
    PUT it for a new consumer of the run's project; a 409 fetches again
    (up to five retries)."""

    def __init__(self, server: Server, args, seed: str):
        self.server = server
        self.args = args
        rng = random.Random(f"claims-{seed}")
        self.project = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        self.user = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        self.seed = seed
        self.lock = threading.Lock()
        self.successes: dict[str, dict] = {}
        self.latencies: list[float] = []
        self.stats = collections.Counter()
        self.samples: list[str] = []

    def claim(self, client: Client, rng: random.Random) -> None:
        consumer = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        started = time.perf_counter()
        for _ in range(6):
            status, body, _ = client.request("GET", CLAIM_QUERY)
            with self.lock:
                self.stats["gets"] += 1
            if status != 200:
                self._error(f"GET {status} {body[:200]!r}")
                return
            found = json.loads(body)["allocation_requests"]
            if not found:
                with self.lock:
                    self.stats["no_candidates"] += 1
                return
            pick = rng.choice(found)["allocations"]
            status, body, _ = client.request("PUT", f"/allocations/{consumer}", {
                "allocations": pick, "project_id": self.project, "user_id": self.user,
                "consumer_generation": None, "consumer_type": "INSTANCE"})
            with self.lock:
                self.stats["puts"] += 1
                if status == 204:
                    self.successes[consumer] = pick
                    self.latencies.append(time.perf_counter() - started)
                    return
                if status != 409:
                    self._error(f"PUT {status} {body[:200]!r}", locked=True)
                    return
                self.stats["conflicts"] += 1
        with self.lock:
            self.stats["gave_up"] += 1

    def _error(self, text: str, locked: bool = False) -> None:
        if not locked:
            with self.lock:
                return self._error(text, True)
        self.stats["errors"] += 1
        if len(self.samples) < 5:
            self.samples.append(text)

    def writer(self, k: int, stop: threading.Event | None, count: int | None, every: float | None = None,
               first: float = 0.0) -> None:
        """Claims one after another, or (``every``: seconds) one each
        ``every`` seconds from ``first`` seconds on, as a steady stream would
        bring them (a claim late by more than ``every`` moves the schedule
        rather than set off a burst)."""
        rng = random.Random(f"{self.seed}-{k}")
        client = Client(self.server.port, self.args.query_timeout)
        done = 0
        due = time.perf_counter() + first
        while (stop is None or not stop.is_set()) and (count is None or done < count):
            if every is not None:
                wait = due - time.perf_counter()
                if wait > 0:
                    if stop is not None and stop.wait(wait):
                        break
                    if stop is None:
                        time.sleep(wait)
                elif wait < -every:
                    due = time.perf_counter()
                due += every
            self.claim(client, rng)
            done += 1
        client.close()


def verify(server: Server, run: ClaimRun) -> dict:
    """Every provider within capacity; the run's consumers hold exactly what
    each successful PUT wrote (no lost, no phantom write)."""
    engine = sa.create_engine(server.db_url)
    try:
        with engine.connect() as conn:
            over = conn.exec_driver_sql(
                "SELECT count(*) FROM inventories i JOIN (SELECT resource_provider_id, resource_class_id, "
                "sum(used) AS used FROM allocations GROUP BY resource_provider_id, resource_class_id) a "
                "ON a.resource_provider_id = i.resource_provider_id AND a.resource_class_id = i.resource_class_id "
                "WHERE a.used > (i.total - i.reserved) * i.allocation_ratio").scalar()
            rows = conn.exec_driver_sql(
                "SELECT a.consumer_id, rp.uuid, rc.name, a.used FROM allocations a "
                "JOIN consumers c ON c.uuid = a.consumer_id JOIN projects p ON p.id = c.project_id "
                "JOIN resource_providers rp ON rp.id = a.resource_provider_id "
                "JOIN resource_classes rc ON rc.id = a.resource_class_id "
                "WHERE p.external_id = '%s'" % run.project).all()
    finally:
        engine.dispose()
    found: dict[str, dict] = {}
    for consumer, provider, rc, used in rows:
        found.setdefault(consumer, {}).setdefault(provider, {"resources": {}})["resources"][rc] = used
    lost = [c for c in run.successes if c not in found]
    phantom = [c for c in found if c not in run.successes]
    different = [c for c in run.successes if c in found and found[c] != run.successes[c]]
    return {"over_capacity": over, "lost": len(lost), "phantom": len(phantom), "different": len(different),
            "checked_consumers": len(run.successes)}


def _claims_summary(run: ClaimRun, seconds: float, cpu: tuple, label: str) -> dict:
    ok = len(run.successes)
    server_cpu, db_cpu = cpu
    requests = run.stats["gets"] + run.stats["puts"]
    return {"claims": ok, "seconds": round(seconds, 2), "claims_per_s": round(ok / seconds, 1) if seconds else None,
            "claim_p50_ms": _ms(percentile(run.latencies, 50)), "claim_p95_ms": _ms(percentile(run.latencies, 95)),
            **dict(run.stats), "error_samples": run.samples,
            "server_cpu_ms_per_claim": round(server_cpu * 1000 / ok, 2) if ok else None,
            "db_cpu_ms_per_claim": round(db_cpu * 1000 / ok, 2) if ok and db_cpu is not None else None,
            "server_cpu_ms_per_request": round(server_cpu * 1000 / requests, 2) if requests else None}


def claims(servers: list[Server], sampler: Sampler, args) -> dict:
    """The claim race, each server's claims in ``--claim-rounds`` blocks,
    the servers taking turns and the order swapped each round: with two
    servers, each round's ratio of CPU per claim compares two moments close
    together (on this machine two runs one after the other differed by up to
    1.24x, mostly in favour of the second).  With several rounds the memory
    yardstick (:func:`memory_walk`) is taken before each, and each server's
    figures are given by round with their medians: a claim's CPU moved
    1.4x between runs minutes apart, with the machine's memory speed, so a
    target is judged on the median of several."""
    result: dict = {}
    runs = {server.label: ClaimRun(server, args, f"{args.seed}-claims") for server in servers}
    for server in servers:
        warm(server, args)
    rounds = max(1, args.claim_rounds)
    blocks = [args.claims_per_client // rounds + (1 if i < args.claims_per_client % rounds else 0)
              for i in range(rounds)]
    spent = {server.label: [0.0, 0.0, None] for server in servers}  # seconds, server CPU, database CPU
    by_round: dict[str, list] = {server.label: [] for server in servers}
    for number, block in enumerate(blocks):
        walk = memory_walk()[0] if rounds > 1 else None  # outside every sampled block
        for server in (servers if number % 2 == 0 else servers[::-1]):
            run = runs[server.label]
            done = len(run.successes)
            token = sampler.begin(server.label)
            started = time.perf_counter()
            # Writers numbered afresh each round: each draws its own consumers.
            threads = [threading.Thread(target=run.writer, args=(number * args.claim_clients + k, None, block))
                       for k in range(args.claim_clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds = time.perf_counter() - started
            server_cpu, db_cpu = sampler.end(token)
            totals = spent[server.label]
            totals[0] += seconds
            totals[1] += server_cpu
            if db_cpu is not None:
                totals[2] = (totals[2] or 0.0) + db_cpu
            ok = len(run.successes) - done
            by_round[server.label].append({
                "claims": ok, "server_cpu_ms_per_claim": round(server_cpu * 1000 / ok, 2) if ok else None,
                "db_cpu_ms_per_claim": round(db_cpu * 1000 / ok, 2) if ok and db_cpu is not None else None,
                "memory_yardstick_s": walk})
    for server in servers:
        seconds, server_cpu, db_cpu = spent[server.label]
        res = _claims_summary(runs[server.label], seconds, (server_cpu, db_cpu), server.label)
        res["verify"] = verify(server, runs[server.label])
        if rounds > 1:
            res["rounds"] = by_round[server.label]
            res["median"] = _round_medians(by_round[server.label])
        result[server.label] = res
        _print_claims(server.label, res)
        if rounds > 1:
            _print_rounds(server.label, by_round[server.label], res["median"])
    if rounds > 1 and len(servers) == 2:
        result["ratios"] = ratios = {}
        for figure in ("server_cpu_ms_per_claim", "db_cpu_ms_per_claim"):
            pairs = [(a[figure], b[figure]) for a, b in zip(by_round["A"], by_round["B"])]
            each = [round(b / a, 2) for a, b in pairs if a and b]
            if each:
                ratios[figure] = {"by_round": each, "median": round(statistics.median(each), 2)}
                log(f"claims: B/A {figure} by round {', '.join(map(str, each))}; median {ratios[figure]['median']}")
    return result


def claim_floor(claimed: dict, args) -> dict:
    """After the claims (servers stopped): ``tools/claimfloor``'s least claim
    transaction, on Placement's layout and on Allotment's, at each server's
    pace and with its clients, on a flat cloud like the run's, and each
    server's database CPU per claim against the floor of Allotment's
    layout.  Its claims draw from the first 10 providers when there are
    several clients (the race's claims take one of the 10 candidates of
    ``limit=10``, from the front of the cloud as it fills)."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("claimfloor", REPO / "tools" / "claimfloor" / "__main__.py")
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    roots = sum(count for _, count in args.cloud)
    clouds = floor.Clouds(args.pg_url.format(name="").rstrip("/"), [("flat", roots)], args.seed, args.full_first)
    options = types.SimpleNamespace(seconds=args.claim_floor_seconds, claims=0,
                                    pgbench=shutil.which("pgbench") or "pgbench")
    providers = min(10, roots) if args.claim_clients > 1 else roots
    result: dict = {"providers": providers}
    try:
        clouds.make()
        with tempfile.TemporaryDirectory(prefix="claimfloor-") as tmp:
            scripts = floor.write_scripts(Path(tmp), providers)
            for label, res in claimed.items():
                if not isinstance(res, dict) or not res.get("claims_per_s") or res.get("db_cpu_ms_per_claim") is None:
                    continue
                rate = round(res["claims_per_s"])
                runs = {variant: floor.run(clouds, variant, args.claim_clients, rate, options, scripts)
                        for variant in floor.VARIANTS}
                ratio = round(res["db_cpu_ms_per_claim"] / runs["allotment"]["db_cpu_ms_per_claim"], 2)
                result[label] = {"rate": rate, **{f"{variant}_db_cpu_ms_per_claim": run["db_cpu_ms_per_claim"]
                                                  for variant, run in runs.items()},
                                 "db_cpu_ms_per_claim": res["db_cpu_ms_per_claim"], "to_allotment_floor": ratio}
                log(f"{label} claim floor at {rate}/s, {args.claim_clients} clients: database CPU per claim "
                    f"{res['db_cpu_ms_per_claim']} ms, {ratio}x the least claim transaction on Allotment's layout "
                    f"({runs['allotment']['db_cpu_ms_per_claim']} ms; "
                    f"{runs['bare']['db_cpu_ms_per_claim']} ms on Placement's alone)")
    finally:
        clouds.close()
    return result


def _round_medians(rounds: list[dict]) -> dict:
    """The median of each figure over the rounds that have it."""
    medians = {}
    for figure in ("server_cpu_ms_per_claim", "db_cpu_ms_per_claim"):
        values = [r[figure] for r in rounds if r[figure] is not None]
        if values:
            medians[figure] = round(statistics.median(values), 2)
    return medians


def _print_rounds(label: str, rounds: list[dict], medians: dict) -> None:
    parts = []
    for figure, name in (("server_cpu_ms_per_claim", "server"), ("db_cpu_ms_per_claim", "database")):
        if figure in medians:
            values = ", ".join(str(r[figure]) for r in rounds)
            parts.append(f"{name} {values} ms a claim (median {medians[figure]})")
    walks = [r["memory_yardstick_s"] for r in rounds]
    log(f"{label} claims by round: {'; '.join(parts)}; memory yardstick before each "
        f"{', '.join(f'{w:.2f}' for w in walks)} s")


def _print_claims(label: str, res: dict, prefix: str = "claims") -> None:
    cpu = f"{res.get('server_cpu_ms_per_claim')}" + (f" + db {res['db_cpu_ms_per_claim']}"
                                                      if res.get("db_cpu_ms_per_claim") is not None else "")
    v = res["verify"]
    log(f"{label} {prefix}: {res['claims']} in {res['seconds']} s ({res['claims_per_s']}/s), "
        f"p50 {res['claim_p50_ms']} p95 {res['claim_p95_ms']} ms, cpu {cpu} ms/claim, "
        f"409s {res.get('conflicts', 0)}, errors {res.get('errors', 0)} {res['error_samples'][:2]}; "
        f"over capacity {v['over_capacity']}, lost {v['lost']}, phantom {v['phantom']}, "
        f"different {v['different']}")


def _readers(server: Server, args, stop: threading.Event, times: list, failures: list) -> list[threading.Thread]:
    def reader() -> None:
        client = Client(server.port, args.query_timeout)
        while not stop.is_set():
            status, _, seconds = client.request("GET", STREAM_QUERY)
            (times if status == 200 else failures).append(seconds if status == 200 else status)
        client.close()

    return [threading.Thread(target=reader) for _ in range(args.readers)]


def warm(server: Server, args) -> None:
    """Every worker's first answers (Allotment: its mirror's first read)
    before anything is measured: rounds of parallel requests on new
    connections, which a busy worker leaves to the others."""
    def one(path: str) -> None:
        client = Client(server.port, args.query_timeout)
        client.request("GET", path)
        client.close()

    for _ in range(3):
        threads = [threading.Thread(target=one, args=(path,)) for path in (STREAM_QUERY, CLAIM_QUERY) * 4]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU of the machine so far (/proc/stat):
    how busy the machine was, client and database server included."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
    return sum(fields) - idle, sum(fields)


def _stream_phase(server: Server, sampler: Sampler, args, run: ClaimRun, writers: range, seconds: float,
                  phase: dict) -> tuple:
    """One phase: the readers (and ``writers`` writers of ``run``) for
    ``seconds`` (the writers numbered ``writers``: a number seeds a
    writer's consumers, so each round has new ones); what it measured is
    added to ``phase``.  Returns the
    phase's p50 as logged (None: the server logs none) and as the client
    saw it."""
    stop = threading.Event()
    times: list[float] = []
    failures: list = []
    threads = _readers(server, args, stop, times, failures)
    # --claim-rate: the writers' claims spread evenly over time, that many
    # a second in all; else each writer claims again as soon as it is done.
    every = len(writers) / args.claim_rate if args.claim_rate and len(writers) else None
    threads += [threading.Thread(target=run.writer, args=(k, stop, None, every, i / args.claim_rate if every else 0.0))
                for i, k in enumerate(writers)]
    before = run.stats["gets"] + run.stats["puts"]
    machine = _machine_ticks()
    token = sampler.begin(server.label)
    started = time.perf_counter()
    wall = time.time()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    cpu = sampler.end(token)
    busy, total = (after - before for after, before in zip(_machine_ticks(), machine))
    own = server.logged_times(STREAM_QUERY, wall, time.time())
    phase["machine_busy"] += busy
    phase["machine_total"] += total
    phase["times"] += times
    phase["own"] += own
    phase["failures"] += failures
    phase["seconds"] += time.perf_counter() - started
    phase["requests"] += len(times) + len(failures) + run.stats["gets"] + run.stats["puts"] - before
    phase["server_cpu"] += cpu[0]
    phase["db_cpu"] = None if cpu[1] is None or phase["db_cpu"] is None else phase["db_cpu"] + cpu[1]
    return percentile(own, 50), percentile(times, 50)


def stream(servers: list[Server], sampler: Sampler, args) -> dict:
    """Readers alone (idle), then readers while writers claim, in
    ``--stream-rounds`` rounds of the two phases, the servers taking turns
    (the order swapped every round), so that the machine's drift -- the
    idle p50 of one server moves by 2x between runs of 20 s here -- falls
    on both phases and both servers alike.  The p50s are of every phase's
    reads together; each round's ratio is listed too (its spread)."""
    result = {}
    rounds = max(1, args.stream_rounds)
    seconds = args.stream_seconds / rounds
    state = {}
    for server in servers:
        warm(server, args)
        state[server.label] = {
            "run": ClaimRun(server, args, f"{args.seed}-stream"),
            "rounds": [],
            **{phase: {"times": [], "own": [], "failures": [], "seconds": 0.0, "requests": 0, "server_cpu": 0.0,
                       "db_cpu": 0.0, "machine_busy": 0, "machine_total": 0} for phase in ("idle", "writing")}}
    for number in range(rounds):
        for server in (servers if number % 2 == 0 else servers[::-1]):
            own = state[server.label]
            idle = _stream_phase(server, sampler, args, own["run"], range(0), seconds, own["idle"])
            busy = _stream_phase(server, sampler, args, own["run"],
                                 range(number * args.writers, (number + 1) * args.writers), seconds, own["writing"])
            own["rounds"].append({"logged": round(busy[0] / idle[0], 2) if idle[0] and busy[0] else None,
                                  "client": round(busy[1] / idle[1], 2) if idle[1] and busy[1] else None})
    for server in servers:
        own = state[server.label]
        res = result[server.label] = {}
        for phase in ("idle", "writing"):
            got = own[phase]
            res[phase] = {"reads": len(got["times"]), "read_p50_ms": _ms(percentile(got["times"], 50)),
                          # As the server's log says (Allotment's: the time it
                          # spent on each answer, without HTTP and the client).
                          "logged_read_p50_ms": percentile(got["own"], 50),
                          "logged_read_p95_ms": percentile(got["own"], 95),
                          "read_p95_ms": _ms(percentile(got["times"], 95)),
                          "read_failures": [str(f) for f in got["failures"][:5]],
                          "read_failure_count": len(got["failures"]), "seconds": round(got["seconds"], 1),
                          # The share of the machine's CPUs busy (every process).
                          "machine_busy": (round(got["machine_busy"] / got["machine_total"], 2)
                                           if got["machine_total"] else None),
                          "server_cpu_ms_per_request": (round(got["server_cpu"] * 1000 / got["requests"], 2)
                                                        if got["requests"] else None),
                          "db_cpu_ms_per_request": (round(got["db_cpu"] * 1000 / got["requests"], 2)
                                                    if got["requests"] and got["db_cpu"] is not None else None)}
        run = own["run"]
        claims = res["writing"]["claims"] = _claims_summary(run, own["writing"]["seconds"], (0.0, None), server.label)
        # The phases' CPU serves the readers too: per request, above.
        claims.pop("server_cpu_ms_per_claim"), claims.pop("db_cpu_ms_per_claim")
        claims.pop("server_cpu_ms_per_request")
        claims["verify"] = verify(server, run)
        res["rounds"] = own["rounds"]
        idle, busy = res["idle"]["read_p50_ms"], res["writing"]["read_p50_ms"]
        res["writing_over_idle_p50"] = round(busy / idle, 2) if idle and busy else None
        logged = res["idle"]["logged_read_p50_ms"], res["writing"]["logged_read_p50_ms"]
        spread = [r["logged"] for r in own["rounds"] if r["logged"]]
        if all(logged):
            res["logged_writing_over_idle_p50"] = round(logged[1] / logged[0], 2)
            log(f"{server.label} stream, as its log says: readers p50 idle {logged[0]} ms "
                f"(p95 {res['idle']['logged_read_p95_ms']}), while writing {logged[1]} ms "
                f"(p95 {res['writing']['logged_read_p95_ms']}): x{res['logged_writing_over_idle_p50']}; "
                f"by round x{', x'.join(str(r) for r in spread)}")
        log(f"{server.label} stream: readers p50 idle {idle} ms (p95 {res['idle']['read_p95_ms']}), while "
            f"writing {busy} ms (p95 {res['writing']['read_p95_ms']}): x{res['writing_over_idle_p50']} "
            f"(by round x{', x'.join(str(r['client']) for r in own['rounds'])}); "
            f"{res['writing']['reads']} reads, {res['writing']['read_failure_count']} failed; server CPU "
            f"per request idle {res['idle']['server_cpu_ms_per_request']}, while writing "
            f"{res['writing']['server_cpu_ms_per_request']} ms; machine busy idle "
            f"{res['idle']['machine_busy']:.0%}, while writing {res['writing']['machine_busy']:.0%}")
        _print_claims(server.label, res["writing"]["claims"], "stream claims")
    if len(servers) == 2:
        a, b = (result[s.label]["writing"]["read_p50_ms"] for s in servers)
        if a and b:
            result["b_over_a_writing_p50"] = round(b / a, 1)
            log(f"stream: B/A readers' p50 while writing {b / a:.1f}x")
        a, b = (result[s.label]["writing"]["logged_read_p50_ms"] for s in servers)
        if a and b:
            result["b_over_a_logged_writing_p50"] = round(b / a, 2)
            log(f"stream: B/A readers' p50 while writing, as logged, {b / a:.2f}x")
    return result


def statements(db_url: str, args) -> dict:
    """In process: the statements of one claim (its GET and its PUT), and
    each request's process CPU over ``--statement-claims`` claims."""
    sys.path.insert(0, str(REPO))
    import webob

    from allotment import config, service

    conf = config.load(None, dev_defaults=True, args=[])
    conf.set_override("connection", db_url, group="placement_database")
    conf.set_override("auth_strategy", "noauth2", group="api")
    app = service.build_application(conf)
    seen: list[str] = []
    tracing = [False]

    def note(sql) -> None:
        if tracing[0]:
            seen.append(" ".join(str(sql).split()))

    engine = app.db.engine
    if engine.dialect.name == "sqlite":
        @sa.event.listens_for(engine, "connect")
        def _trace(dbapi_conn, _record):
            dbapi_conn.set_trace_callback(note)
    else:
        import psycopg2.extensions

        @sa.event.listens_for(engine, "connect")
        def _cursor(dbapi_conn, _record):
            # Beside the engine's own cursor class (which sends a
            # transaction's BEGIN with its first statement): what each
            # message sent held, as sent.
            class Noting(dbapi_conn.cursor_factory or psycopg2.extensions.cursor):
                def execute(self, query, vars=None):
                    try:
                        return super().execute(query, vars)
                    finally:
                        if self.query is not None:
                            note(self.query.decode())

            dbapi_conn.cursor_factory = Noting
    engine.dispose()

    def call(method: str, path: str, body=None):
        request = webob.Request.blank(path, method=method, headers=HEADERS)
        if body is not None:
            request.body = json.dumps(body).encode()
        return request.get_response(app)

    rng = random.Random(f"statements-{args.seed}")
    project, user = str(uuidlib.UUID(int=rng.getrandbits(128))), str(uuidlib.UUID(int=rng.getrandbits(128)))
    cpu = {"GET": [], "PUT": []}
    listed: dict[str, list[str]] = {}
    for i in range(args.statement_claims + 3):
        consumer = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        record = i == 2  # after two claims: connections, plans and the mirror are warm
        for method in ("GET", "PUT"):
            seen.clear()
            tracing[0] = record
            started = time.process_time()
            if method == "GET":
                response = call("GET", CLAIM_QUERY)
                pick = rng.choice(json.loads(response.body)["allocation_requests"])["allocations"]
            else:
                response = call("PUT", f"/allocations/{consumer}", {
                    "allocations": pick, "project_id": project, "user_id": user,
                    "consumer_generation": None, "consumer_type": "INSTANCE"})
                assert response.status_int == 204, response.body
            spent = time.process_time() - started
            tracing[0] = False
            if record:
                listed[method] = list(seen)
            elif i > 2:
                cpu[method].append(spent)
    engine.dispose()
    if engine.dialect.name == "sqlite":
        # SQLite's trace repeats a statement's text for each statement its
        # triggers run: one entry each, with that count.
        for method, texts in listed.items():
            collapsed: list[str] = []
            for text in texts:
                if collapsed and collapsed[-1].split(" [+", 1)[0] == text:
                    base, _, more = collapsed[-1].partition(" [+")
                    count = int(more.split(" ", 1)[0]) + 1 if more else 1
                    collapsed[-1] = f"{base} [+{count} statements of its triggers]"
                else:
                    collapsed.append(text)
            listed[method] = collapsed
    result = {"statements": listed,
              "cpu_ms": {method: round(statistics.median(values) * 1000, 3) for method, values in cpu.items()}}
    for method, texts in listed.items():
        log(f"statements of a claim's {method} ({len(texts)}):")
        for text in texts:
            log(f"    {text[:160]}{' ' + text[text.index(' [+'):] if ' [+' in text else ''}")
    log(f"in-process CPU per request, median of {args.statement_claims}: {result['cpu_ms']}")
    return result


# -- main -----------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(prog="tools/scalebench", description=__doc__.split("\n\n")[0])
    p.add_argument("--cloud", action="append", default=[], metavar="SHAPE=ROOTS",
                   help="the cloud to generate (repeatable; default nested=2000)")
    p.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    p.add_argument("--pg-url", default=PG_DEFAULT, help="PostgreSQL URL template with {name}")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--full-first", type=float, default=0.0, metavar="SHARE",
                   help="the cloud: this share of each shape's first roots full (tools/cloudgen --full-first)")
    p.add_argument("--serve", default="ours-computed", help="A: a preset (ours, ours-computed, reference) "
                                                            "or a command with {config} and {port}")
    p.add_argument("--vs", help="B: a second server, measured in the same run")
    p.add_argument("--scenario", action="append", choices=SCENARIOS)
    p.add_argument("--reps", type=int, default=40, help="measured requests per read query and server")
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="alternating A/B blocks per query")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-seconds", type=float, default=20.0, help="time budget per query and server")
    p.add_argument("--query-timeout", type=float, default=120.0)
    p.add_argument("--limited-only", action="store_true", help="reads: only the limit=1000 queries")
    p.add_argument("--first-reads", type=int, default=6, help="first-read: answers on new connections")
    p.add_argument("--shapes", type=int, default=len(FLAVORS),
                   help=f"shapes: how many flavors to ask of (at most {len(FLAVORS)})")
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--claim-rate", type=float, default=0.0,
                   help="stream: the writers' claims a second in all, evenly spread (0: as fast as they can)")
    p.add_argument("--stream-seconds", type=float, default=20.0,
                   help="stream: seconds of each phase (idle, writing) in all, split over the rounds")
    p.add_argument("--stream-rounds", type=int, default=4,
                   help="stream: rounds of the two phases, the servers taking turns")
    p.add_argument("--claim-clients", type=int, default=16)
    p.add_argument("--claims-per-client", type=int, default=25)
    p.add_argument("--claim-rounds", type=int, default=1,
                   help="claims: each server's claims in this many blocks, the servers taking turns; "
                        "each block after a memory yardstick, its CPU per claim given, and the medians")
    p.add_argument("--claim-floor", action="store_true",
                   help="claims, PostgreSQL, flat clouds: then the least transaction a claim needs "
                        "(tools/claimfloor), at each server's pace and client count, and each server's "
                        "database CPU per claim against it")
    p.add_argument("--claim-floor-seconds", type=int, default=10,
                   help="--claim-floor: seconds of each run of the floor (two a server)")
    p.add_argument("--statement-claims", type=int, default=200)
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--cache-dir", default=os.environ.get("SCALEBENCH_CACHE", "/tmp/scalebench-cache"),
                   help="where generated clouds (SQLite files, summaries) are kept between runs")
    p.add_argument("--regenerate", action="store_true", help="generate the cloud again even if kept")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--keep", action="store_true", help="keep the servers' directories and database copies")
    args = p.parse_args(argv)
    args.cloud = [(shape, int(roots)) for shape, _, roots in (item.partition("=") for item in args.cloud)] \
        or [("nested", 2000)]
    args.scenario = args.scenario or ["first-read", "reads"]
    if args.claim_floor and (args.db != "postgresql" or any(shape != "flat" for shape, _ in args.cloud)):
        p.error("--claim-floor: PostgreSQL and a flat cloud only (the floor's claim takes a flat host)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    store = CloudStore(args)
    summary = store.template(args.regenerate)
    pg_admin = None
    if args.db == "postgresql":
        admin = sa.engine.make_url(args.pg_url.format(name="postgres"))
        pg_admin = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    report: dict = {"args": {k: v for k, v in vars(args).items()}, "cloud": summary, "meta": {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg": os.getloadavg(), "cpus": os.cpu_count()}}
    shapes = ", ".join(f"{s['shape']} {s['roots']} roots ({s['providers']} providers)" for s in summary["shapes"])
    log(f"cloud: {shapes}; load average {os.getloadavg()[0]:.1f}")
    yardstick(report, "start")
    workdir = Path(tempfile.mkdtemp(prefix="scalebench-"))
    failed = False
    try:
        if "statements" in args.scenario:
            report["statements"] = statements(store.copy("statements"), args)
        http_scenarios = [s for s in args.scenario if s != "statements"]
        if not http_scenarios:
            return 0
        templates = [("A", args.serve)] + ([("B", args.vs)] if args.vs else [])
        servers = [Server(label, template, store.copy(label), workdir, pg_admin) for label, template in templates]
        report["servers"] = {s.label: s.template for s in servers}
        for server in servers:
            log(f"{server.label}: {server.template}")
        sampler = Sampler(servers)
        try:
            for server in servers:
                seconds = server.start(args.start_timeout)
                report.setdefault("start_seconds", {})[server.label] = round(seconds, 1)
                log(f"{server.label} answered after {seconds:.1f} s; RSS {server.rss()}")
            if "first-read" in args.scenario:
                report["first_read"] = first_read(servers, summary, args)
            if "shapes" in args.scenario:
                yardstick(report, "shapes")
                report["shapes"] = many_shapes(servers, sampler, args)
            if "reads" in args.scenario:
                yardstick(report, "reads")
                report["reads"] = reads(servers, summary, sampler, args)
                report["rss_after_reads"] = {s.label: s.rss() for s in servers}
                log(f"RSS after reads (MiB): {report['rss_after_reads']}")
            if "stream" in args.scenario:
                yardstick(report, "stream")
                report["stream"] = stream(servers, sampler, args)
            if "claims" in args.scenario:
                yardstick(report, "claims")
                report["claims"] = claims(servers, sampler, args)
            report["rss_end"] = {s.label: s.rss() for s in servers}
            report["peak_rss"] = {label: round(v, 1) for label, v in sampler.peak_rss.items()}
            log(f"RSS at the end (MiB): {report['rss_end']}; largest process's peak {report['peak_rss']}")
        finally:
            sampler.close()
            for server in servers:
                server.stop()
        if "claims" in report and args.claim_floor:
            yardstick(report, "claim floor")
            report["claim_floor"] = claim_floor(report["claims"], args)
        for section in ("stream", "claims"):
            for label, res in report.get(section, {}).items():
                if not isinstance(res, dict):
                    continue
                checked = res.get("verify") or res.get("writing", {}).get("claims", {}).get("verify")
                if checked and (checked["over_capacity"] or checked["lost"] or checked["phantom"]
                                or checked["different"]):
                    log(f"!!! {label} {section}: VERIFICATION FAILED {checked}")
                    failed = True
    finally:
        report["meta"]["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
        yardstick(report, "end")
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        if args.keep:
            log(f"kept {workdir} and the database copies {store.copies}")
        else:
            store.drop_copies()
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0
