"""A 3-node MariaDB Galera cluster on this machine, started by the tests themselves.

Debian's ``mariadb-server`` (10.11) and ``galera-4`` packages: each node is a
``mariadbd`` with its own data directory under one temporary directory, its
own ports on 127.0.0.1 (client, group communication, IST, SST), and
``wsrep_provider = /usr/lib/galera/libgalera_smm.so``.  Node 1 is made with
``mariadb-install-db`` and bootstraps the cluster; the others join it and
receive its state by rsync SST.

Debian's ``wsrep_sst_rsync``, run as root, starts an rsync daemon whose
modules write as ``nobody``, which cannot write a data directory owned by
anyone else; so under root the nodes run as the ``mysql`` user Debian's
package creates (``--user``), owner of the whole directory, and the rsync
daemon they start runs as that user too.  Run as any other user, the nodes
run as that user.

Used three ways:

* ``python -m tests.ha.galera start DIR`` starts a cluster in ``DIR`` (its
  description in ``DIR/cluster.json``) and returns; ``stop DIR`` ends it.
  ``scripts/test`` does so once per CI run and points the Galera pass at it
  with ``ALLOTMENT_GALERA_DIR`` (and ``ALLOTMENT_TEST_MYSQL_URL``, node 1).
* The ``galera`` fixture (tests/ha/conftest.py) uses that cluster, or starts
  one of its own for the session.
* Tests kill a node (``kill -9``), stop one, or start it again: it rejoins
  by IST.

:func:`missing` says why a cluster cannot be started here (packages not
installed); the fixture skips with that reason, except under ``CI=true``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = "mariadb-install-db"
SST_SCRIPT = "wsrep_sst_rsync"
CLUSTER_NAME = "allotment_test"
DESCRIPTION = "cluster.json"
#: How long a node may take to start, join (SST or IST) and say "Synced".
START_TIMEOUT = 120
#: Debian's apt package names, for messages.
PACKAGES = "mariadb-server galera-4 rsync"


def missing() -> str | None:
    """Why no cluster can be started on this machine (None: it can)."""
    if not os.path.exists(MARIADBD):
        return f"no {MARIADBD} (apt-get install {PACKAGES})"
    if not os.path.exists(PROVIDER):
        return f"no Galera provider {PROVIDER} (apt-get install galera-4)"
    for tool in (INSTALL_DB, SST_SCRIPT, "rsync"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (apt-get install {PACKAGES})"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("mysql")
        except KeyError:
            return "running as root without a 'mysql' user to run the nodes as (apt-get install mariadb-server)"
    return None


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


@dataclasses.dataclass
class Node:
    """One ``mariadbd`` of the cluster."""

    index: int          # 1-based
    port: int           # client connections
    gcomm_port: int     # group communication (4567)
    ist_port: int       # incremental state transfer (4568)
    sst_port: int       # state snapshot transfer (4444)
    base: str           # the cluster's directory

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def datadir(self) -> Path:
        return Path(self.base) / self.name

    @property
    def config(self) -> Path:
        return Path(self.base) / f"{self.name}.cnf"

    @property
    def pid_file(self) -> Path:
        return Path(self.base) / f"{self.name}.pid"

    @property
    def error_log(self) -> Path:
        return Path(self.base) / f"{self.name}.err"

    @property
    def socket(self) -> Path:
        return Path(self.base) / f"{self.name}.sock"

    def url(self, database: str = "", user: str = "root") -> str:
        return f"mysql+pymysql://{user}@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid


class GaleraCluster:
    """A cluster of :class:`Node` described in ``base/cluster.json``."""

    def __init__(self, base: str | Path, nodes: list[Node]):
        self.base = Path(base)
        self.nodes = nodes

    # -- making one ----------------------------------------------------------
    @classmethod
    def create(cls, base: str | Path | None = None, size: int = 3) -> "GaleraCluster":
        """A new cluster's layout (nothing started) in ``base`` (a new temporary directory)."""
        reason = missing()
        if reason:
            raise RuntimeError(f"cannot start a Galera cluster: {reason}")
        base = Path(base or tempfile.mkdtemp(prefix="allotment-galera-"))
        base.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(4 * size)
        nodes = [Node(i + 1, *ports[4 * i:4 * i + 4], base=str(base)) for i in range(size)]
        cluster = cls(base, nodes)
        cluster._write_configs()
        cluster.save()
        return cluster

    @classmethod
    def attach(cls, base: str | Path) -> "GaleraCluster":
        """The cluster described in ``base`` (started by another process)."""
        data = json.loads((Path(base) / DESCRIPTION).read_text())
        return cls(base, [Node(**node) for node in data["nodes"]])

    def save(self) -> None:
        (self.base / DESCRIPTION).write_text(json.dumps(
            {"nodes": [dataclasses.asdict(node) for node in self.nodes]}, indent=1))

    def _owner(self) -> tuple[int, int] | None:
        """(uid, gid) the nodes run as when we are root."""
        if os.geteuid() != 0:
            return None
        entry = pwd.getpwnam("mysql")
        return entry.pw_uid, entry.pw_gid

    def _write_configs(self) -> None:
        members = ",".join(f"127.0.0.1:{node.gcomm_port}" for node in self.nodes)
        owner = self._owner()
        for node in self.nodes:
            node.datadir.mkdir(exist_ok=True)
            lines = [
                "[mariadbd]",
                f"datadir={node.datadir}",
                f"socket={node.socket}",
                f"pid-file={node.pid_file}",
                f"log-error={node.error_log}",
                f"port={node.port}",
                "bind-address=127.0.0.1",
                "skip-name-resolve",
                # Small and quick: a test cluster, not a benchmark of MariaDB's I/O.
                "innodb_buffer_pool_size=96M",
                "innodb_log_file_size=16M",
                "innodb_flush_log_at_trx_commit=2",
                "max_connections=500",
                "binlog_format=ROW",
                "default_storage_engine=InnoDB",
                "innodb_autoinc_lock_mode=2",
                "wsrep_on=ON",
                f"wsrep_provider={PROVIDER}",
                f"wsrep_cluster_name={CLUSTER_NAME}",
                f"wsrep_cluster_address=gcomm://{members}",
                f"wsrep_node_address=127.0.0.1:{node.gcomm_port}",
                f"wsrep_node_name={node.name}",
                f'wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm_port};'
                f'ist.recv_addr=127.0.0.1:{node.ist_port};gcache.size=64M"',
                "wsrep_sst_method=rsync",
                f"wsrep_sst_receive_address=127.0.0.1:{node.sst_port}",
                "wsrep_slave_threads=2",
            ]
            if owner is not None:
                lines.append("user=mysql")
            node.config.write_text("\n".join(lines) + "\n")
        if owner is not None:
            os.chmod(self.base, 0o755)
            for path in [self.base, *self.base.rglob("*")]:
                os.chown(path, *owner)

    # -- running it ----------------------------------------------------------
    def start(self) -> "GaleraCluster":
        """Install node 1, bootstrap the cluster on it, and join the others (each Synced)."""
        first = self.nodes[0]
        result = subprocess.run(
            [INSTALL_DB, f"--defaults-file={first.config}", "--auth-root-authentication-method=normal",
             "--skip-test-db"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed:\n{result.stdout}\n{result.stderr}")
        self.start_node(1, bootstrap=True)
        # Tests connect over TCP as root without a password, as to the shared server.
        self.sql(1, "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; "
                    "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; "
                    "CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY ''; "
                    "GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION", socket_only=True)
        for node in self.nodes[1:]:
            self.start_node(node.index)
        return self

    def start_node(self, index: int, *, bootstrap: bool = False, wait: bool = True) -> None:
        """Start node ``index`` (it joins the cluster, or makes a new one with ``bootstrap``)."""
        node = self.node(index)
        command = [MARIADBD, f"--defaults-file={node.config}"]
        if bootstrap:
            command.append("--wsrep-new-cluster")
        with open(Path(self.base) / f"{node.name}.out", "ab") as out:
            subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=self.base)
        if wait:
            self.wait_synced(index)

    def wait_synced(self, index: int, timeout: float = START_TIMEOUT) -> None:
        """Until node ``index`` answers and is Synced in a primary component of every live node."""
        node = self.node(index)
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                state = self.status(index)
                last = repr(state)
                if (state.get("wsrep_local_state_comment") == "Synced"
                        and state.get("wsrep_cluster_status") == "Primary"
                        and state.get("wsrep_ready") == "ON"):
                    return
            except Exception as error:  # noqa: BLE001 - not up yet
                last = str(error)
            time.sleep(0.3)
        tail = node.error_log.read_text(errors="replace")[-3000:] if node.error_log.exists() else ""
        raise RuntimeError(f"{node.name} not Synced after {timeout}s ({last}):\n{tail}")

    def wait_size(self, size: int, timeout: float = 60) -> None:
        """Until every running node sees a primary cluster of ``size`` members."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sizes = []
            for node in self.nodes:
                if node.pid() is None:
                    continue
                try:
                    state = self.status(node.index)
                except Exception:  # noqa: BLE001 - still re-forming
                    sizes.append(None)
                    continue
                ok = state.get("wsrep_cluster_status") == "Primary" and state.get("wsrep_ready") == "ON"
                sizes.append(int(state.get("wsrep_cluster_size", 0)) if ok else None)
            if sizes and all(found == size for found in sizes):
                return
            time.sleep(0.3)
        raise RuntimeError(f"the cluster did not settle at {size} nodes within {timeout}s")

    def status(self, index: int) -> dict[str, str]:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=self.node(index).port, user="root", password="",
                               connect_timeout=2, read_timeout=5)
        try:
            with conn.cursor() as cursor:
                cursor.execute("SHOW STATUS LIKE 'wsrep_%'")
                return {name: str(value) for name, value in cursor.fetchall()}
        finally:
            conn.close()

    def sql(self, index: int, statements: str, *, socket_only: bool = False) -> list[tuple]:
        """Run ``;``-separated statements on node ``index`` as root; the last one's rows."""
        import pymysql

        node = self.node(index)
        if socket_only:  # before root may connect over TCP
            conn = pymysql.connect(unix_socket=str(node.socket), user="root", password="")
        else:
            conn = pymysql.connect(host="127.0.0.1", port=node.port, user="root", password="")
        try:
            rows: list[tuple] = []
            with conn.cursor() as cursor:
                for statement in filter(None, (part.strip() for part in statements.split(";"))):
                    cursor.execute(statement)
                    rows = list(cursor.fetchall())
            conn.commit()
            return rows
        finally:
            conn.close()

    def node(self, index: int) -> Node:
        return self.nodes[index - 1]

    def urls(self, database: str = "") -> list[str]:
        return [node.url(database) for node in self.nodes]

    def kill(self, index: int) -> None:
        """``kill -9`` node ``index`` (as a crash or a pulled cable would end it)."""
        pid = self.node(index).pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid)

    def stop_node(self, index: int, timeout: float = 60) -> None:
        """Shut node ``index`` down cleanly (SIGTERM)."""
        pid = self.node(index).pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not self._wait_gone(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid)

    @staticmethod
    def _wait_gone(pid: int, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            # Our child when we started it: reap it.
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
        return False

    def restart(self, index: int) -> None:
        """Start node ``index`` again after a kill or stop: it rejoins (IST) and is Synced."""
        self.start_node(index)

    def ensure_whole(self) -> None:
        """Every node running and Synced (a test that killed one and failed may have left it down)."""
        for node in self.nodes:
            if node.pid() is None:
                self.start_node(node.index)
        self.wait_size(len(self.nodes))

    def stop(self) -> None:
        """Stop every node: the last one cleanly, so the directory could be started again."""
        for node in reversed(self.nodes):
            self.stop_node(node.index)


#: Set by scripts/test for its Galera pass: the directory of a running cluster.
DIR_ENV = "ALLOTMENT_GALERA_DIR"


def shared() -> GaleraCluster | None:
    """The cluster the test run was pointed at (``$ALLOTMENT_GALERA_DIR``), if any."""
    directory = os.environ.get(DIR_ENV)
    return GaleraCluster.attach(directory) if directory else None


def spread(url: str, count: int) -> list[str]:
    """``count`` URLs of the database of ``url``: on the cluster the tests run
    on, each through the next node in turn (so that several servers or
    migrators of a test go through different nodes); elsewhere ``url`` itself."""
    cluster = shared()
    if cluster is None:
        return [url] * count
    import sqlalchemy as sa

    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "mysql" or parsed.port not in {node.port for node in cluster.nodes}:
        return [url] * count
    return [parsed.set(port=cluster.nodes[i % len(cluster.nodes)].port).render_as_string(hide_password=False)
            for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ha.galera", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop", "check"))
    parser.add_argument("directory", nargs="?", help="the cluster's directory (start: made if missing)")
    args = parser.parse_args(argv)
    if args.action == "check":
        reason = missing()
        print(reason or "a Galera cluster can be started here")
        return 3 if reason else 0
    if not args.directory:
        parser.error("a directory is needed")
    if args.action == "start":
        started = time.monotonic()
        cluster = GaleraCluster.create(args.directory)
        try:
            cluster.start()
        except Exception:
            cluster.stop()
            raise
        print(f"Galera cluster of {len(cluster.nodes)} nodes Synced in {time.monotonic() - started:.1f}s: "
              + " ".join(f"{node.name}=127.0.0.1:{node.port}" for node in cluster.nodes))
        return 0
    GaleraCluster.attach(args.directory).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
