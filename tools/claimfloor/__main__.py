"""The database's CPU for the least a claim must do, at a given pace.

    tools/claimfloor --roots 2000 --clients 16 --rate 330 --rate 0

A claim needs, whatever server makes it, one transaction of PostgreSQL
that locks its provider, swaps the generation, writes the consumer and
its allocation rows, and reads the usage the capacity check needs.  This
tool sends that transaction, hand-written and as bare statements, from
pgbench (C, prepared statements), to copies of a generated cloud
(``tools/cloudgen``'s flat hosts), and reports the database backends' CPU per claim,
as ``tools/scalebench`` counts it for Allotment's claims:

* ``bare``: on the Placement layout alone, as the reference runs it;
* ``allotment``: on the same cloud taken over by Allotment (its change
  log and provider notes, kept by triggers on the tables the claim
  writes), with the log folded as Allotment folds it (one fold per
  ``changes.COMPACT_AT`` claims).

What a claim costs the database depends on its pace as much as on its
statements: a backend woken for each statement pays for the wake-up, and
commits that come together share their flush.  So each run is paced
(``--rate`` claims a second, all clients together; 0: as fast as they
go), and the figure to hold beside Allotment's is the one at the pace and
client count its own run had.  Each run verifies what it wrote: one
consumer and three allocation rows a claim.

``--claims-per-transaction K`` asks what committing claims together
would save (group commit): each transaction then makes K claims, each on
a provider of its own draw, in the same few statements whatever K is
(the providers locked and swapped in one statement each, the consumers
and their rows in one, the capacity check's read in one), and the pace
stays in claims a second.  Its K = 1 is the same claim in that form, to
hold the others against.

See docs/performance.md ("The floor of a claim") for what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools" / "cloudgen"))

import sqlalchemy as sa  # noqa: E402

import cloud  # noqa: E402
from allotment.db import changes  # noqa: E402

VARIANTS = ("bare", "allotment")
_CLK = os.sysconf("SC_CLK_TCK")

#: One claim of VCPU 2, MEMORY_MB 4096 and DISK_GB 20 from one provider
#: (classes 0, 1, 2), as plain statements, each in a message of its own;
#: ``:p``, the provider, is drawn from the first ``--providers``, and the
#: consumer's uuid is made by its row's INSERT.
CLAIM = """\\set p random(1, {providers})
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT id, uuid, generation FROM resource_providers WHERE id = :p FOR NO KEY UPDATE;
UPDATE resource_providers SET generation = generation + 1, updated_at = now() WHERE id = :p;
INSERT INTO consumers (uuid, project_id, user_id, consumer_type_id, generation, created_at, updated_at) VALUES (gen_random_uuid()::text, 1, 1, NULL, 1, now(), now()) RETURNING uuid AS consumer \\gset
INSERT INTO allocations (resource_provider_id, consumer_id, resource_class_id, used, created_at, updated_at) VALUES (:p, :consumer, 0, 2, now(), now()), (:p, :consumer, 1, 4096, now(), now()), (:p, :consumer, 2, 20, now(), now());
SELECT i.resource_class_id, i.total, i.reserved, i.min_unit, i.max_unit, i.step_size, i.allocation_ratio, (SELECT coalesce(sum(a.used), 0) FROM allocations a WHERE a.resource_provider_id = i.resource_provider_id AND a.resource_class_id = i.resource_class_id) FROM inventories i WHERE i.resource_provider_id = :p AND i.resource_class_id IN (0, 1, 2);
COMMIT;
"""


def _fold() -> str:
    """Allotment's fold of its change log (``changes.compact``), as a script."""
    text = " ".join(str(changes._PG_COMPACT).split())
    return (f"BEGIN;\nSELECT pg_try_advisory_xact_lock(hashtext('{changes.LOG}'));\n{text};\nCOMMIT;\n")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Clouds:
    """The two templates (``bare``, ``allotment``) of one cloud, and copies."""

    def __init__(self, server: str, shapes: list[tuple[str, int]], seed: int, full_first: float = 0.0):
        self.server = server.rstrip("/")
        tag = "_".join(f"{shape}{count}" for shape, count in shapes)
        run = uuidlib.uuid4().hex[:6]  # runs side by side (tests) keep apart
        # Templates and copies share the prefix, so a caller can tell its own.
        self.prefix = f"claimfloor_{tag}_s{seed}_{run}"
        self.names = {variant: f"{self.prefix}_{variant}" for variant in VARIANTS}
        self.shapes, self.seed, self.full_first = shapes, seed, full_first
        self.admin = sa.create_engine(f"{self.server}/postgres", isolation_level="AUTOCOMMIT")

    def url(self, name: str) -> str:
        return f"{self.server}/{name}"

    def _drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def make(self) -> None:
        for variant, name in self.names.items():
            self._drop(name)
            with self.admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            cloud.generate(self.url(name), cloud.Spec(self.shapes, self.seed, self.full_first),
                           placement_only=variant == "bare")
            log(f"cloud {self.shapes} (seed {self.seed}) generated into {name}")

    def copy(self, variant: str) -> str:
        name = f"{self.prefix}_copy_{uuidlib.uuid4().hex[:6]}"
        cloud.pg_copy(self.admin, self.names[variant], name)
        return name

    def drop(self, name: str) -> None:
        self._drop(name)

    def close(self) -> None:
        for name in self.names.values():
            self._drop(name)
        self.admin.dispose()


def grouped_claims(count: int, providers: int) -> str:
    """A transaction of ``count`` claims like :data:`CLAIM`'s, each from a
    provider drawn from the first ``providers``, in statements whose number
    does not grow with ``count``: the providers locked in id order (a
    provider drawn twice is locked and swapped once), swapped, the
    consumers written with their allocation rows, the usage read."""
    numbers = range(1, count + 1)
    draws = "".join(f"\\set p{k} random(1, {providers})\n" for k in numbers)
    ids = ", ".join(f":p{k}" for k in numbers)
    chosen = ", ".join(f"({k}, :p{k}::int)" for k in numbers)
    return (
        f"{draws}BEGIN ISOLATION LEVEL READ COMMITTED;\n"
        f"SELECT id, uuid, generation FROM resource_providers WHERE id IN ({ids}) ORDER BY id FOR NO KEY UPDATE;\n"
        f"UPDATE resource_providers SET generation = generation + 1, updated_at = now() WHERE id IN ({ids});\n"
        "WITH made AS (INSERT INTO consumers (uuid, project_id, user_id, consumer_type_id, generation, "
        "created_at, updated_at) SELECT gen_random_uuid()::text, 1, 1, NULL, 1, now(), now() "
        f"FROM generate_series(1, {count}) RETURNING uuid), "
        "numbered AS (SELECT uuid, row_number() OVER () AS k FROM made), "
        f"chosen AS (SELECT * FROM (VALUES {chosen}) AS v (k, p)) "
        "INSERT INTO allocations (resource_provider_id, consumer_id, resource_class_id, used, created_at, "
        "updated_at) SELECT chosen.p, numbered.uuid, r.class, r.amount, now(), now() "
        "FROM numbered JOIN chosen USING (k) CROSS JOIN (VALUES (0, 2), (1, 4096), (2, 20)) AS r (class, amount);\n"
        "SELECT i.resource_provider_id, i.resource_class_id, i.total, i.reserved, i.min_unit, i.max_unit, "
        "i.step_size, i.allocation_ratio, (SELECT coalesce(sum(a.used), 0) FROM allocations a "
        "WHERE a.resource_provider_id = i.resource_provider_id AND a.resource_class_id = i.resource_class_id) "
        f"FROM inventories i WHERE i.resource_provider_id IN ({ids}) AND i.resource_class_id IN (0, 1, 2);\n"
        "COMMIT;\n")


def write_scripts(directory: Path, providers: int, grouped: Iterable[int] = ()) -> Path:
    """The claim's and the fold's pgbench scripts, in ``directory``; with
    ``grouped``, ``claims-{K}.sql`` for each K (:func:`grouped_claims`)."""
    (directory / "claim.sql").write_text(CLAIM.format(providers=providers))
    for count in grouped:
        (directory / f"claims-{count}.sql").write_text(grouped_claims(count, providers))
    (directory / "fold.sql").write_text(_fold())
    return directory


def _cpu_ticks(pid: int) -> tuple[int, int] | None:
    """(start time, user + system ticks) of a process, or None once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[19]), int(fields[11]) + int(fields[12])


class BackendCpu:
    """CPU of the backends of one database, sampled every ``every`` seconds
    (a backend that exits counts up to its last sample)."""

    def __init__(self, admin: sa.Engine, database: str, every: float = 0.05):
        self.admin, self.database, self.every = admin, database, every
        self.ticks: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        with self.admin.connect() as conn:
            pids = [row[0] for row in conn.exec_driver_sql(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.database,))]
        for pid in pids:
            got = _cpu_ticks(pid)
            if got is not None:
                self.ticks[(pid, got[0])] = got[1]

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def seconds(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.ticks.values()) / _CLK


def _count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()


def run(clouds: Clouds, variant: str, clients: int, rate: float, args, scripts: Path,
        grouped: int | None = None) -> dict:
    """One pgbench run on a fresh copy of ``variant``'s cloud; with
    ``grouped``, that many claims a transaction (:func:`grouped_claims`)."""
    name = clouds.copy(variant)
    engine = sa.create_engine(clouds.url(name))
    per = grouped or 1
    try:
        before = {table: _count(engine, table) for table in ("consumers", "allocations")}
        # One fold in COMPACT_AT transactions: each adds one row to the log.
        script = "claim.sql" if grouped is None else f"claims-{grouped}.sql"
        files = ["-f", f"{scripts / script}@{changes.COMPACT_AT}"]
        if variant == "allotment":
            files += ["-f", f"{scripts / 'fold.sql'}@1"]
        length = (["-T", str(args.seconds), "-R", f"{rate / per:g}"] if rate
                  else ["-t", str(max(1, args.claims // clients // per))])
        url = sa.engine.make_url(clouds.url(name))
        command = [args.pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
                   "-h", url.host or "127.0.0.1", "-p", str(url.port or 5432), "-U", url.username or "postgres",
                   *length, *files, name]
        cpu = BackendCpu(clouds.admin, name)
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.monotonic() - started
        db_seconds = cpu.seconds()
        if done.returncode:
            raise SystemExit(f"pgbench failed ({done.returncode}):\n{done.stderr[-3000:]}")
        after = {table: _count(engine, table) for table in ("consumers", "allocations")}
    finally:
        engine.dispose()
        clouds.drop(name)
    if db_seconds == 0:
        raise SystemExit(f"{variant}: the run ended before its backends' CPU could be read: give it more claims")
    claims = after["consumers"] - before["consumers"]
    rows = after["allocations"] - before["allocations"]
    if claims <= 0 or rows != 3 * claims:
        raise SystemExit(f"{variant}: {claims} consumers and {rows} allocation rows written: not one claim each")
    result = {"variant": variant, "clients": clients, "rate": rate, "claims": claims,
              "claims_per_transaction": grouped, "claims_per_second": round(claims / seconds, 1),
              "db_cpu_ms_per_claim": round(db_seconds * 1000 / claims, 3)}
    together = "" if grouped is None else f", {grouped} a transaction"
    log(f"{variant:9} clients {clients:3} pace {rate or 'free':>5}{together}: {claims} claims, "
        f"{result['claims_per_second']}/s, db CPU {result['db_cpu_ms_per_claim']} ms/claim")
    return result


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="postgresql+psycopg2://postgres@127.0.0.1:5432",
                        help="the PostgreSQL server (a URL without a database)")
    parser.add_argument("--roots", type=int, default=2000, help="flat hosts in the cloud (tools/cloudgen's)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--clients", type=int, action="append", help="pgbench clients (repeatable; default 1, 16)")
    parser.add_argument("--rate", type=float, action="append",
                        help="claims a second, all clients together; 0: unpaced (repeatable; default 0)")
    parser.add_argument("--providers", type=int, default=0,
                        help="draw each claim's provider from the first N (contention); 0: all of them")
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="default: both")
    parser.add_argument("--claims", type=int, default=3000, help="claims of an unpaced run")
    parser.add_argument("--seconds", type=int, default=10, help="length of a paced run")
    parser.add_argument("--claims-per-transaction", type=int, action="append", metavar="K",
                        help="K claims in each transaction, in statements whose number does not grow with K "
                             "(repeatable; its 1 is the same claim in that form); default: the claim above")
    parser.add_argument("--rounds", type=int, default=1, help="the runs again, taking turns")
    parser.add_argument("--pgbench", default=shutil.which("pgbench") or "pgbench")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    # Flat hosts only: provider ids 1..roots, each with VCPU, MEMORY_MB
    # and DISK_GB (classes 0, 1, 2), as the claim script takes them.
    clouds = Clouds(args.server, [("flat", args.roots)], args.seed)
    providers = min(args.providers or args.roots, args.roots)
    results = []
    try:
        clouds.make()
        with tempfile.TemporaryDirectory(prefix="claimfloor-") as tmp:
            scripts = write_scripts(Path(tmp), providers, args.claims_per_transaction or ())
            for _ in range(args.rounds):
                for clients in args.clients or [1, 16]:
                    for rate in args.rate or [0.0]:
                        for grouped in args.claims_per_transaction or [None]:
                            for variant in args.variant or VARIANTS:
                                results.append(run(clouds, variant, clients, rate, args, scripts, grouped))
    finally:
        clouds.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"roots": args.roots, "providers": providers, "runs": results},
                                              indent=1))
    return results


if __name__ == "__main__":
    main()
