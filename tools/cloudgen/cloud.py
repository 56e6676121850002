"""A synthetic cloud of any size, written straight into a database in
Placement 16.0.0's layout.

The bench (``../shared/bench``) seeds its clouds through the API: about
300 writes a second here, so a cloud of 100,000 hosts would take hours.
This writes the rows themselves, a batch of trees at a time (PostgreSQL:
``COPY``; SQLite and MySQL/MariaDB: one multi-row ``executemany`` per
table and batch), all in one transaction, then lets Allotment take the
database over as it takes over any Placement database (``allotment db
sync``: its change number and provider notes start from the rows as they
are, see ``allotment/db/changes.py``).  ``placement_only`` stops before
the take-over: the database is then what a Placement 16.0.0 deployment
would hold, and either server may be started on it.

Shapes (the bench's, so that the same queries mean the same thing):

* ``flat``: compute hosts with VCPU (64, ratio 4), MEMORY_MB (256 GiB,
  512 reserved) and DISK_GB (2,000, min 10, step 10); CPU traits drawn
  per host, one of CUSTOM_GOLD/SILVER/BRONZE on 60 %, CUSTOM_MAINTENANCE
  on 10 %; each in one of roots/50 aggregates.
* ``nested``: a root with DISK_GB and two NUMA children (VCPU 32 ratio 4,
  MEMORY_MB 128 GiB); 30 % of roots have a pGPU (VGPU 8) under one NUMA
  node, 50 % one SR-IOV PF per NUMA node (SRIOV_NET_VF 16,
  NET_BW_EGR_KILOBIT_PER_SEC 10 Gbit/s, a physnet trait): 4.3 providers a
  root on average.
* ``sharing``: roots/50 shared DISK_GB providers (MISC_SHARES_VIA_AGGREGATE,
  one in five aggregates has two), each aggregate with about 50 compute
  hosts that have VCPU and MEMORY_MB only.

Every host has one or two consumers using 30-60 % of it (15 % of hosts
are 99 % full on memory, so capacity filtering matters); with
``full_first``, that share of each shape's first roots is full too, as a
cloud fills whose schedulers take the first candidates (a nested host's
NUMA nodes both, so that the tree gives nothing); a nested host's
consumers use one NUMA node and the root's disk, some a VGPU or a VF with
bandwidth; a sharing host's first consumer takes disk from a shared
provider.  Consumers belong to roots/20 projects and roots/10 users (at
least 5 each), with consumer type INSTANCE.

Deterministic: the same (shapes, sizes, seed) give the same rows, uuids
and ids, whatever the backend and batch size.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import time
import uuid as uuidlib
from collections.abc import Iterator, Sequence

import sqlalchemy as sa

from allotment.db import migrate, reference_layout, standard_names, tables
from allotment.db.engine import Database

SHAPES = ("flat", "nested", "sharing")
#: Every row's created_at / updated_at (fixed: the output is deterministic).
STAMP = datetime.datetime(2026, 1, 1)
GIB = 1024
CPU_TRAITS = (("HW_CPU_X86_AVX2", 0.7), ("HW_CPU_X86_AVX512F", 0.3), ("HW_CPU_X86_SSE42", 0.9),
              ("HW_CPU_X86_AESNI", 0.8), ("STORAGE_DISK_SSD", 0.5), ("COMPUTE_VOLUME_MULTI_ATTACH", 0.4),
              ("CUSTOM_MAINTENANCE", 0.1))
TIERS = ("CUSTOM_GOLD", "CUSTOM_SILVER", "CUSTOM_BRONZE")
PHYSNETS = ("PHYSNET0", "PHYSNET1", "PHYSNET2")
CUSTOM_TRAITS = ("CUSTOM_MAINTENANCE", "CUSTOM_VNIC_TYPE_DIRECT", "CUSTOM_VGPU_NVIDIA_A16", *TIERS,
                 *(f"CUSTOM_PHYSNET_{name}" for name in PHYSNETS))
CONSUMER_TYPE = "INSTANCE"
#: Trees generated and written together.
BATCH_ROOTS = 4096


@dataclasses.dataclass(frozen=True)
class Inv:
    """An inventory record (class name first)."""

    rc: str
    total: int
    reserved: int = 0
    min_unit: int = 1
    max_unit: int | None = None
    step_size: int = 1
    ratio: float = 1.0

    @property
    def top(self) -> int:
        return self.total if self.max_unit is None else self.max_unit

    @property
    def capacity(self) -> int:
        return int((self.total - self.reserved) * self.ratio)


def _compute(vcpu: int, mem_gib: int, reserved: int) -> tuple[Inv, Inv]:
    return Inv("VCPU", vcpu, ratio=4.0), Inv("MEMORY_MB", mem_gib * GIB, reserved=reserved)


DISK = Inv("DISK_GB", 2000, min_unit=10, max_unit=2000, step_size=10)
SHARED_DISK = Inv("DISK_GB", 100_000, min_unit=10, max_unit=10_000, step_size=10)
VGPU = Inv("VGPU", 8)
VF = Inv("SRIOV_NET_VF", 16)
BANDWIDTH = Inv("NET_BW_EGR_KILOBIT_PER_SEC", 10_000_000)


@dataclasses.dataclass
class Spec:
    """What to generate: [(shape, roots)], the seed, and the share of each
    shape's first roots that are full."""

    shapes: Sequence[tuple[str, int]]
    seed: int = 42
    full_first: float = 0.0

    def __post_init__(self) -> None:
        for shape, roots in self.shapes:
            if shape not in SHAPES:
                raise ValueError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")
            if roots < 1:
                raise ValueError(f"{shape}: at least one root")
        if not 0.0 <= self.full_first <= 1.0:
            raise ValueError("full_first: a share between 0 and 1")


@dataclasses.dataclass
class ShapeSummary:
    """What the runner and the checks need to know of one generated shape."""

    shape: str
    roots: int
    providers: int = 0
    inventories: int = 0
    consumers: int = 0
    allocations: int = 0
    aggregates: list[str] = dataclasses.field(default_factory=list)
    projects: list[str] = dataclasses.field(default_factory=list)
    #: The first few roots' uuids (for in_tree and per-provider queries).
    sample_roots: list[str] = dataclasses.field(default_factory=list)
    #: project -> class -> units allocated
    usages: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


def _uuid(rng: random.Random) -> str:
    return str(uuidlib.UUID(int=rng.getrandbits(128), version=4))


class _Rows:
    """Rows of one batch, by table, ids handed out as they are made."""

    def __init__(self, ids: dict[str, int], class_ids: dict[str, int], trait_ids: dict[str, int],
                 consumer_type_id: int):
        self.ids = ids
        self.class_ids = class_ids
        self.trait_ids = trait_ids
        self.consumer_type_id = consumer_type_id
        self.tables: dict[str, list[tuple]] = {name: [] for name in _COLUMNS}
        #: (provider, name, parent id, root id), written once the batch is
        #: complete (a provider's generation counts the claims on it).
        self.pending: list[tuple] = []

    def next_id(self, table: str) -> int:
        self.ids[table] += 1
        return self.ids[table]


#: Columns written, per table, in writing order (parents before children).
_COLUMNS = {
    "placement_aggregates": ("id", "uuid", "created_at", "updated_at"),
    "projects": ("id", "external_id", "created_at", "updated_at"),
    "users": ("id", "external_id", "created_at", "updated_at"),
    "resource_providers": ("id", "uuid", "name", "generation", "parent_provider_id", "root_provider_id",
                           "created_at", "updated_at"),
    "inventories": ("id", "resource_provider_id", "resource_class_id", "total", "reserved", "min_unit",
                    "max_unit", "step_size", "allocation_ratio", "created_at", "updated_at"),
    "resource_provider_traits": ("resource_provider_id", "trait_id", "created_at", "updated_at"),
    "resource_provider_aggregates": ("resource_provider_id", "aggregate_id", "created_at", "updated_at"),
    "consumers": ("id", "uuid", "project_id", "user_id", "generation", "consumer_type_id", "created_at",
                  "updated_at"),
    "allocations": ("id", "resource_provider_id", "consumer_id", "resource_class_id", "used", "created_at",
                    "updated_at"),
}


class _Provider:
    """A provider being generated: its id, uuid, inventories and how many
    writes touched it (its generation)."""

    __slots__ = ("id", "uuid", "inventories", "generation")

    def __init__(self, pid: int, uuid: str, inventories: Sequence[Inv]):
        self.id, self.uuid, self.inventories, self.generation = pid, uuid, {i.rc: i for i in inventories}, 0


class _ShapeWriter:
    """Generates one shape's trees, root by root, into batches of rows."""

    def __init__(self, shape: str, roots: int, seed: int, prefix: str, summary: ShapeSummary,
                 aggregate_ids: dict[str, int], owner_ids: dict[str, int], full_first: float = 0.0):
        self.shape = shape
        self.roots = roots
        #: roots numbered below this are full
        self.full_below = int(roots * full_first)
        self.full = False
        self.rng = random.Random(f"{seed}-{shape}-{roots}")
        self.prefix = prefix
        self.summary = summary
        rng = self.rng
        self.aggregates = [_uuid(rng) for _ in range(max(1, roots // 50))]
        self.projects = [_uuid(rng) for _ in range(max(5, roots // 20))]
        self.users = [_uuid(rng) for _ in range(max(5, roots // 10))]
        summary.aggregates = list(self.aggregates)
        summary.projects = list(self.projects)
        self.aggregate_ids = aggregate_ids
        self.owner_ids = owner_ids
        self.shared: dict[str, list[_Provider]] = {}

    # -- rows ---------------------------------------------------------------

    def names(self, rows: _Rows) -> None:
        """The aggregates, projects and users of the shape (first batch)."""
        for uuid in self.aggregates:
            self.aggregate_ids[uuid] = aid = rows.next_id("placement_aggregates")
            rows.tables["placement_aggregates"].append((aid, uuid, STAMP, STAMP))
        for kind, table, names in (("P", "projects", self.projects), ("U", "users", self.users)):
            for name in names:
                self.owner_ids[kind + name] = oid = rows.next_id(table)
                rows.tables[table].append((oid, name, STAMP, STAMP))

    def provider(self, rows: _Rows, name: str, parent: _Provider | None, root: _Provider | None,
                 inventories: Sequence[Inv] = (), traits: Sequence[str] = (),
                 aggregates: Sequence[str] = ()) -> _Provider:
        prov = _Provider(rows.next_id("resource_providers"), _uuid(self.rng), inventories)
        prov.generation = bool(inventories) + bool(traits) + bool(aggregates)
        rows.pending.append((prov, name, parent.id if parent else None, (root or prov).id))
        for inv in inventories:
            rows.tables["inventories"].append((
                rows.next_id("inventories"), prov.id, rows.class_ids[inv.rc], inv.total, inv.reserved,
                inv.min_unit, inv.top, inv.step_size, inv.ratio, STAMP, STAMP))
        self.summary.inventories += len(inventories)
        for trait in sorted(set(traits)):
            rows.tables["resource_provider_traits"].append((prov.id, rows.trait_ids[trait], STAMP, STAMP))
        for agg in aggregates:
            rows.tables["resource_provider_aggregates"].append((prov.id, self.aggregate_ids[agg], STAMP, STAMP))
        self.summary.providers += 1
        if parent is None and len(self.summary.sample_roots) < 200:
            self.summary.sample_roots.append(prov.uuid)
        return prov

    def consumer(self, rows: _Rows, allocations: dict[_Provider, dict[str, int]]) -> None:
        rng = self.rng
        uuid = _uuid(rng)
        project, user = rng.choice(self.projects), rng.choice(self.users)
        written = [(prov, rc, amount) for prov, res in allocations.items() for rc, amount in res.items() if amount]
        if not written:
            return
        rows.tables["consumers"].append((
            rows.next_id("consumers"), uuid, self.owner_ids["P" + project], self.owner_ids["U" + user], 1,
            rows.consumer_type_id, STAMP, STAMP))
        usage = self.summary.usages.setdefault(project, {})
        for prov in dict.fromkeys(prov for prov, _, _ in written):
            prov.generation += 1
        for prov, rc, amount in written:
            rows.tables["allocations"].append((rows.next_id("allocations"), prov.id, uuid, rows.class_ids[rc],
                                               amount, STAMP, STAMP))
            usage[rc] = usage.get(rc, 0) + amount
        self.summary.consumers += 1
        self.summary.allocations += len(written)

    def cpu_traits(self) -> list[str]:
        rng = self.rng
        found = [name for name, share in CPU_TRAITS if rng.random() < share]
        if rng.random() < 0.6:
            found.append(rng.choice(TIERS))
        return found

    @staticmethod
    def _split(amount: float, k: int, inv: Inv) -> list[int]:
        """``amount`` split over ``k`` consumers, each within max_unit and
        a multiple of the step (0 where below min_unit)."""
        share = min(amount / k, inv.top)
        each = int(share // inv.step_size * inv.step_size)
        return [each if each >= inv.min_unit else 0] * k

    def host_consumers(self, rows: _Rows, compute: _Provider, disk: _Provider | None,
                       extra: dict[_Provider, dict[str, int]]) -> None:
        """One or two consumers using 30-60 % of a host (99 % of its memory
        on 15 % of hosts and on the first roots of ``full_first``), the
        first of them also holding ``extra``."""
        rng = self.rng
        full = rng.random() < 0.15 or self.full
        used = 0.99 if full else rng.uniform(0.3, 0.6)
        k = rng.randint(1, 2)
        vcpu, memory = compute.inventories["VCPU"], compute.inventories["MEMORY_MB"]
        vcpus = self._split(vcpu.capacity * used, k, vcpu)
        if full:
            vcpus = [min(v, 8) for v in vcpus]
        mems = self._split(memory.capacity * used, k, dataclasses.replace(memory, step_size=512))
        disks = [0] * k
        if disk is not None:
            inv = disk.inventories["DISK_GB"]
            disks = self._split(inv.capacity * used, k, inv)
        for j in range(k):
            allocations: dict[_Provider, dict[str, int]] = {compute: {"VCPU": vcpus[j], "MEMORY_MB": mems[j]}}
            if disk is not None:
                allocations.setdefault(disk, {})["DISK_GB"] = disks[j]
            if j == 0:
                for prov, res in extra.items():
                    allocations.setdefault(prov, {}).update(res)
            self.consumer(rows, allocations)

    # -- trees --------------------------------------------------------------

    def tree(self, rows: _Rows, i: int) -> None:
        self.full = i < self.full_below
        getattr(self, "_" + self.shape)(rows, i)

    def _flat(self, rows: _Rows, i: int) -> None:
        host = self.provider(rows, f"{self.prefix}{i:06d}", None, None, (*_compute(64, 256, 512), DISK),
                             self.cpu_traits(), [self.rng.choice(self.aggregates)])
        self.host_consumers(rows, host, host, {})

    def _nested(self, rows: _Rows, i: int) -> None:
        rng = self.rng
        name = f"{self.prefix}{i:06d}"
        root = self.provider(rows, name, None, None, (DISK,), self.cpu_traits(), [rng.choice(self.aggregates)])
        numa = [self.provider(rows, f"{name}-numa{j}", root, root, _compute(32, 128, 256)) for j in range(2)]
        extra: dict[_Provider, dict[str, int]] = {}
        if rng.random() < 0.3:
            j = rng.randrange(2)
            gpu = self.provider(rows, f"{name}-numa{j}-pgpu0", numa[j], root, (VGPU,), ["CUSTOM_VGPU_NVIDIA_A16"])
            if rng.random() < 0.5:
                extra[gpu] = {"VGPU": 1}
        if rng.random() < 0.5:
            for j in range(2):
                physnet = rng.choice(PHYSNETS)
                nic = self.provider(rows, f"{name}-numa{j}-pf0", numa[j], root, (VF, BANDWIDTH),
                                    [f"CUSTOM_PHYSNET_{physnet}", "CUSTOM_VNIC_TYPE_DIRECT", "HW_NIC_SRIOV"])
                if j == 0 and rng.random() < 0.5:
                    extra[nic] = {"SRIOV_NET_VF": 1, "NET_BW_EGR_KILOBIT_PER_SEC": 100_000}
        used = rng.randrange(2)
        self.host_consumers(rows, numa[used], root, extra)
        if self.full:  # the other node too, without the disk the first took
            self.host_consumers(rows, numa[1 - used], None, {})

    def _sharing(self, rows: _Rows, i: int) -> None:
        rng = self.rng
        if not self.shared:  # the shared disks first, in the first batch
            for a, agg in enumerate(self.aggregates):
                count = 2 if rng.random() < 0.2 else 1
                self.shared[agg] = [
                    self.provider(rows, f"{self.prefix}disk-{a:05d}-{c}", None, None, (SHARED_DISK,),
                                  ["MISC_SHARES_VIA_AGGREGATE", "STORAGE_DISK_SSD"], [agg])
                    for c in range(count)]
        agg = self.aggregates[i % len(self.aggregates)]
        host = self.provider(rows, f"{self.prefix}{i:06d}", None, None, _compute(64, 256, 512),
                             self.cpu_traits(), [agg])
        disk = rng.choice(self.shared[agg])
        self.host_consumers(rows, host, None, {disk: {"DISK_GB": 10 * rng.randint(2, 20)}})


# -- writing ------------------------------------------------------------------


def _copy_text(rows: list[tuple]) -> str:
    out = io.StringIO()
    for row in rows:
        out.write("\t".join("\\N" if v is None else str(v) for v in row))
        out.write("\n")
    return out.getvalue()


class _Sink:
    """Writes rows on one DBAPI connection, in one transaction."""

    def __init__(self, raw, backend: str):
        self.raw = raw
        self.backend = backend
        self.cursor = raw.cursor()
        self.written: dict[str, int] = {}

    def write(self, table: str, rows: list[tuple]) -> None:
        if not rows:
            return
        columns = _COLUMNS[table]
        if self.backend == "postgresql":
            self.cursor.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN", io.StringIO(_copy_text(rows)))
        else:
            mark = "?" if self.backend == "sqlite" else "%s"
            self.cursor.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join([mark] * len(columns))})", rows)
        self.written[table] = self.written.get(table, 0) + len(rows)


def _batches(total: int) -> Iterator[range]:
    for start in range(0, total, BATCH_ROOTS):
        yield range(start, min(total, start + BATCH_ROOTS))


def _prefixes(spec: Spec) -> list[str]:
    """Provider name prefixes, distinct per shape (and per repeated shape)."""
    short = {"flat": "cn", "nested": "nn", "sharing": "sn"}
    seen: dict[str, int] = {}
    result = []
    for shape, _ in spec.shapes:
        count = seen[shape] = seen.get(shape, 0) + 1
        result.append(f"{short[shape]}{'' if count == 1 else count}-")
    return result


@dataclasses.dataclass
class Result:
    shapes: list[ShapeSummary]
    seconds: float
    rows: dict[str, int]
    taken_over: bool


def _analyze(engine: sa.Engine) -> None:
    """The planner's statistics of the new rows, as a database that grew by
    use would have them (PostgreSQL's autovacuum would gather them some
    minutes later; without them it plans a lookup of a thousand ids as a
    scan of the table)."""
    if engine.dialect.name == "mysql":
        return
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        # PostgreSQL: VACUUM too (the visibility map of the new rows), so
        # that autovacuum has nothing left to do on the fresh cloud.
        cursor.execute("VACUUM ANALYZE" if engine.dialect.name == "postgresql" else "ANALYZE")
        if engine.dialect.name == "sqlite":
            # Everything into the database file itself, none left in its
            # write-ahead log: a copy of the file is then the whole cloud.
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        cursor.close()
        raw.commit()
    finally:
        raw.close()


def pg_copy(admin: sa.Engine, template: str, name: str) -> None:
    """PostgreSQL: database ``name``, a copy of the generated cloud in
    ``template``, through ``admin`` (an AUTOCOMMIT engine on another
    database).  Autovacuum may be at a template just written for a while,
    and a copy waits for no one: its workers on that database are stopped
    (they come back later) and the copy tried again, for two minutes."""
    for attempt in range(120):
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            return
        except sa.exc.OperationalError as error:
            if "being accessed by other users" not in str(error) or attempt == 119:
                raise
            with admin.connect() as conn:
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                    "AND backend_type = 'autovacuum worker'", (template,))
            time.sleep(1)


def generate(url: str, spec: Spec, *, placement_only: bool = False, log=lambda message: None) -> Result:
    """Write the cloud of ``spec`` into the empty database at ``url``.

    The schema is laid out first (Placement 16.0.0's, with the standard
    resource classes and traits), the rows written in one transaction,
    and then, unless ``placement_only``, Allotment's own migrations run,
    as ``allotment db sync`` does on a Placement database."""
    started = time.perf_counter()
    db = Database(url)
    engine = db.engine
    with engine.connect() as conn:
        if reference_layout.state(conn) != "empty":
            raise SystemExit(f"cloudgen: the database at {engine.url!r} is not empty: give an empty one")
    with db.write() as conn:
        reference_layout.adopt(conn)
    standard_names.sync(db)
    with db.write() as conn:
        existing = set(conn.execute(sa.select(tables.traits.c.name)).scalars())
        missing = [name for name in CUSTOM_TRAITS if name not in existing]
        if missing:
            conn.execute(sa.insert(tables.traits), [{"name": name, "created_at": STAMP} for name in missing])
        conn.execute(sa.insert(tables.consumer_types), [{"name": CONSUMER_TYPE, "created_at": STAMP}])
    backend = engine.dialect.name
    with engine.connect() as conn:
        class_ids = dict(conn.execute(sa.select(tables.resource_classes.c.name, tables.resource_classes.c.id)).all())
        trait_ids = dict(conn.execute(sa.select(tables.traits.c.name, tables.traits.c.id)).all())
        type_id = conn.execute(sa.select(tables.consumer_types.c.id)
                               .where(tables.consumer_types.c.name == CONSUMER_TYPE)).scalar_one()
    ids = {name: 0 for name in _COLUMNS}
    summaries = []
    raw = engine.raw_connection()
    try:
        # One transaction (the engine's connections to SQLite and
        # PostgreSQL leave transactions to the caller).
        manual = backend in ("sqlite", "postgresql")
        if manual:
            raw.cursor().execute("BEGIN IMMEDIATE" if backend == "sqlite" else "BEGIN")
        sink = _Sink(raw, backend)
        aggregate_ids: dict[str, int] = {}
        owner_ids: dict[str, int] = {}
        for (shape, roots), prefix in zip(spec.shapes, _prefixes(spec)):
            summary = ShapeSummary(shape, roots)
            summaries.append(summary)
            writer = _ShapeWriter(shape, roots, spec.seed, prefix, summary, aggregate_ids, owner_ids,
                                  spec.full_first)
            for number, batch in enumerate(_batches(roots)):
                rows = _Rows(ids, class_ids, trait_ids, type_id)
                if number == 0:
                    writer.names(rows)
                for i in batch:
                    writer.tree(rows, i)
                rows.tables["resource_providers"] = [
                    (prov.id, prov.uuid, name, prov.generation, parent, root, STAMP, STAMP)
                    for prov, name, parent, root in rows.pending]
                for table in _COLUMNS:
                    sink.write(table, rows.tables[table])
                log(f"{shape}: {batch.stop}/{roots} roots, {summary.providers} providers "
                    f"({time.perf_counter() - started:.1f} s)")
        raw.cursor().execute("COMMIT") if manual else raw.commit()
    except BaseException:
        raw.cursor().execute("ROLLBACK") if manual else raw.rollback()
        raise
    finally:
        raw.close()
    with db.write() as conn:
        reference_layout.restart_id_sequences(conn)
    if not placement_only:
        migrate.upgrade(engine)
    _analyze(engine)
    engine.dispose()  # its connections closed, not left to the collector: a template must have none
    return Result(summaries, time.perf_counter() - started, dict(sink.written), not placement_only)
