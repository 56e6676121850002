"""Every provider in memory, kept current from the database's change notes.

``GET /allocation_candidates`` computed afresh reads the inventories of the
requested classes with their usage, then the trees they belong to: on a
small cloud that reading is most of a request's cost, and most of it is
the same at every request (a claim changes one tree).  Where the database
says which providers each write changed (SQLite and PostgreSQL, migration
0004: see :mod:`allotment.db.changes`), a process keeps instead one
:class:`~allotment.domain.provider_tree.ProviderSnapshot` of *every*
provider -- its place in its tree, generation, traits, aggregates,
inventories and their usage -- and brings it up to date at each request
by reading again only the providers noted since:

* the change number is read first in the request's read transaction (as
  for reused answers); equal to the mirror's, the mirror is what a fresh
  read in that transaction would give, whoever wrote since (another
  process, another host, the reference Placement, hand-written SQL: the
  notes are made by triggers);
* else the providers noted since the mirror's number are read again (five
  statements, by id), in the same transaction (on PostgreSQL, whose reads
  run without one, in a REPEATABLE READ transaction with the notes), and
  a new snapshot made
  from the old one with them (:meth:`ProviderSnapshot.successor`): the trees
  not touched keep their objects and derived indexes, and the solver's
  results kept from them (:class:`~allotment.domain.provider_tree.KeptResults`);
* a change to a table of names (a class renamed, a trait deleted), a
  counter table made again, or more than half of the providers noted,
  reads everything again;
* a write of this process that knows all it changed (a new consumer's
  claim: :class:`allotment.db.changes.OwnWrite`) tells the mirror so once
  committed; a request that knew of such writes before it read its number
  (:meth:`ProviderMirror.mark`), when they account for every commit since
  the mirror's number, has the mirror follow them without reading the
  providers again (:meth:`ProviderMirror.wrote`);
* so does a database that is not the one the mirror was read from, or
  that went back in time (a restored backup, a point-in-time recovery, a
  promoted replica that had not received the last writes): its change
  number belongs to another history, or is smaller than the mirror's when
  read in a transaction that began after the mirror's
  (:func:`allotment.db.changes.went_back`).

The snapshot is never modified once made: a request holds the one it was
given while another thread makes the next.  A request whose transaction
is older than the mirror (SQLite: another thread has already moved it on
since the request's transaction began) is told so (:class:`MirrorAhead`):
a transaction begun again sees what the mirror holds.  (Reading the
database instead, as without a mirror, took seconds at 100,000 hosts
whose first trees are full, while claims streamed in.)

Bounded: once it would hold more than :data:`MAX_PROVIDERS` providers the
mirror is dropped and the process's requests read the database (until it
is restarted).  It holds what the per-provider
caches of :mod:`allotment.db.provider_cache` would hold for the
same cloud (they are not filled while the mirror serves): 2.0 KB per
flat host measured, equal inventory mappings and trait lists kept once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import changes, raw_rows, tables
from allotment.db.allocation_candidates import KnownNames, built_inventories
from allotment.db.provider_cache import ProviderCaches
from allotment.domain.allocation_candidates import MEMO_LIMIT, MEMO_UNITS_PER_TREE
from allotment.domain.provider_tree import KeptResults, Provider, ProviderInventory, ProviderSnapshot

RP = tables.resource_providers
INV = tables.inventories
ALLOC = tables.allocations
RC = tables.resource_classes
TRAITS = tables.traits
RP_TRAITS = tables.resource_provider_traits
AGG = tables.placement_aggregates
RP_AGG = tables.resource_provider_aggregates

LOG = logging.getLogger(__name__)

#: :meth:`ProviderMirror._pg_refresh`: the mirror cannot be brought up to
#: date by its single statement.
_SLOW = object()

#: Above this many providers no mirror is kept.
MAX_PROVIDERS = 1_000_000
#: Providers whose other rows are read together (see ``_providers``): in
#: a read of every provider, a range of ids; in a read of some, a list.
WINDOW = 4096
ID_WINDOW = 256
#: The statements that read providers, each as (every provider's rows, the
#: rows of the providers in the list ``ids``, those of ids ``lo`` to ``hi``).
_IDS = sa.bindparam("ids", expanding=True)
EVERY, LISTED, RANGE = 0, 1, 2


def _both(statement: sa.Select, column) -> tuple[sa.Select, sa.Select, sa.Select]:
    return (statement, statement.where(column.in_(_IDS)),
            statement.where(column.between(sa.bindparam("lo"), sa.bindparam("hi"))))


_PROVIDERS = _both(sa.select(RP.c.id, RP.c.uuid, RP.c.parent_provider_id,
                             sa.func.coalesce(RP.c.root_provider_id, RP.c.id), RP.c.generation), RP.c.id)


def _records(which: int) -> sa.Select:
    """Inventory records with their usage (what is allocated of a class a
    provider has no inventory of is not shown, as elsewhere), in (provider,
    class) order: the usage summed in a subquery of the same providers."""
    usage = sa.select(ALLOC.c.resource_provider_id, ALLOC.c.resource_class_id,
                      sa.func.sum(ALLOC.c.used).label("used")).group_by(
        ALLOC.c.resource_provider_id, ALLOC.c.resource_class_id)
    usage = _both(usage, ALLOC.c.resource_provider_id)[which].subquery()
    records = (sa.select(INV.c.resource_provider_id, INV.c.resource_class_id, INV.c.total, INV.c.reserved,
                         INV.c.min_unit, INV.c.max_unit, INV.c.step_size, INV.c.allocation_ratio,
                         sa.func.coalesce(usage.c.used, 0))
               .select_from(INV.outerjoin(usage, sa.and_(
                   usage.c.resource_provider_id == INV.c.resource_provider_id,
                   usage.c.resource_class_id == INV.c.resource_class_id)))
               .order_by(INV.c.resource_provider_id, INV.c.resource_class_id))
    return _both(records, INV.c.resource_provider_id)[which]


#: (every provider's, those listed, those of a range): inventory records
#: as (provider id, class id, total, reserved, min_unit, max_unit,
#: step_size, ratio, used).
_RECORDS = (_records(EVERY), _records(LISTED), _records(RANGE))
_TRAITS = _both(sa.select(RP_TRAITS.c.resource_provider_id, TRAITS.c.name)
                .join(TRAITS, TRAITS.c.id == RP_TRAITS.c.trait_id)
                .order_by(RP_TRAITS.c.resource_provider_id, RP_TRAITS.c.trait_id), RP_TRAITS.c.resource_provider_id)
_AGGREGATES = _both(sa.select(RP_AGG.c.resource_provider_id, AGG.c.uuid)
                    .join(AGG, AGG.c.id == RP_AGG.c.aggregate_id), RP_AGG.c.resource_provider_id)
_CLASSES = sa.select(RC.c.id, RC.c.name)

#: Writes of this process kept for the mirror to follow, at most.
OWN_WRITES_KEPT = 64
#: Writes tell the mirror what they changed while at least half of those
#: told were followed (the recent ones count most: the tallies are halved
#: every ``OWN_WRITES_WINDOW`` writes), for the first ``OWN_WRITES_WINDOW // 4``
#: and, as a probe, one in ``OWN_WRITES_PROBE`` otherwise.
OWN_WRITES_WINDOW = 64
OWN_WRITES_PROBE = 8

#: PostgreSQL: at most this many providers are read again in the statement
#: that reads the notes (:data:`_PG_REFRESH`); more take the windowed reads.
PG_AT_ONCE = 4096
#: PostgreSQL: the notes, and the rows of the providers changed since the
#: mirror's notes (unless noted more than ``most`` times, or everything:
#: then ``complete`` is false and they are not read), in one
#: statement: one snapshot without a transaction, one round trip where a
#: REPEATABLE READ transaction took seven.  Each of the rows the four
#: statements of ``_RECORDS``, ``_PROVIDERS``, ``_TRAITS`` and
#: ``_AGGREGATES`` read is given as one array per column, in their order.
_PG_REFRESH = raw_rows.HandWritten(
    "WITH " + changes.PG_CHANGED_SINCE.replace("%", "%%").format(
        folded="(SELECT %(folded)s::bigint)", snapshot="(SELECT %(snapshot)s::text)",
        count="(SELECT %(count)s::bigint)") + ", "
    # Whether the rows are read: not too many notes (of a provider each, or
    # more: a provider noted by several transactions), nor everything.
    "complete AS MATERIALIZED (SELECT (SELECT count(*) FROM changed) <= (SELECT %(most)s::bigint) "
    f"AND NOT EXISTS (SELECT FROM changed WHERE provider_id = {changes.EVERYTHING}) AS complete), "
    "ids AS MATERIALIZED (SELECT array_agg(provider_id) AS ids FROM changed "
    "WHERE (SELECT complete FROM complete)) "
    "SELECT " + changes.PG_NOTES_COLUMNS.replace("%", "%%") + ", (SELECT complete FROM complete), "
    "p.*, r.*, t.*, a.* FROM "
    "(SELECT " + ", ".join(f"array_agg({column} ORDER BY id)" for column in (
        "id", "uuid", "parent_provider_id", "coalesce(root_provider_id, id)", "generation")) +
    " FROM resource_providers WHERE id = ANY((SELECT ids FROM ids)::bigint[])) AS p, "
    "(SELECT " + ", ".join(f"array_agg({column} ORDER BY i.resource_provider_id, i.resource_class_id)" for column in (
        "i.resource_provider_id", "i.resource_class_id", "i.total", "i.reserved", "i.min_unit", "i.max_unit",
        "i.step_size", "i.allocation_ratio", "coalesce(u.used, 0)")) +
    " FROM inventories AS i LEFT OUTER JOIN (SELECT resource_provider_id, resource_class_id, sum(used) AS used "
    "FROM allocations WHERE resource_provider_id = ANY((SELECT ids FROM ids)::bigint[]) "
    "GROUP BY resource_provider_id, resource_class_id) AS u "
    "ON u.resource_provider_id = i.resource_provider_id AND u.resource_class_id = i.resource_class_id "
    "WHERE i.resource_provider_id = ANY((SELECT ids FROM ids)::bigint[])) AS r, "
    # The names by id, one lookup a row: a join would hash every trait and
    # aggregate (the planner cannot know how few providers changed).
    "(SELECT array_agg(resource_provider_id ORDER BY resource_provider_id, trait_id), "
    "array_agg((SELECT name FROM traits WHERE traits.id = trait_id) ORDER BY resource_provider_id, trait_id) "
    "FROM resource_provider_traits WHERE resource_provider_id = ANY((SELECT ids FROM ids)::bigint[])) AS t, "
    "(SELECT array_agg(resource_provider_id), array_agg((SELECT uuid FROM placement_aggregates "
    "WHERE placement_aggregates.id = aggregate_id)) "
    "FROM resource_provider_aggregates WHERE resource_provider_id = ANY((SELECT ids FROM ids)::bigint[])) AS a")


class Mirrored(NamedTuple):
    """The mirror at one change number: every provider, and what the solver
    computed from them that still holds (the candidates of each tree per
    query, each provider's and tree's summary)."""

    snapshot: ProviderSnapshot
    kept: KeptResults
    #: The names seen to exist since every provider was last read, shared
    #: by the snapshots that followed (a full read starts anew).
    names: KnownNames


def _grouped(rows) -> dict[int, list]:
    """Rows (provider id, ...) by provider: id -> the rows without it."""
    grouped: dict[int, list] = {}
    get = grouped.get
    for row in rows:
        found = get(row[0])
        if found is None:
            grouped[row[0]] = [row[1:]]
        else:
            found.append(row[1:])
    return grouped


def _grouped_names(rows) -> dict[int, list]:
    """Rows (provider id, name) by provider: id -> its names, in order."""
    grouped: dict[int, list] = {}
    get = grouped.get
    for pid, name in rows:
        found = get(pid)
        if found is None:
            grouped[pid] = [name]
        else:
            found.append(name)
    return grouped


class MirrorAhead(Exception):
    """SQLite: the mirror holds writes the request's transaction does not
    see (it began before another thread brought the mirror to ``mirror``);
    a read transaction begun again is served from it."""

    def __init__(self, mirror: int, number: int):
        super().__init__(f"the mirror is at change {mirror}, the transaction at {number}")


class ProviderMirror:
    """One process's snapshot of every provider (see the module doc).

    ``caches``: the process's per-generation caches, emptied when the
    database is seen gone back in time or replaced."""

    def __init__(self, caches: ProviderCaches) -> None:
        self._caches = caches
        self._lock = threading.Lock()
        #: (the change number it is current at, the Mirrored, the notes
        #: read with it: the number on SQLite, changes.PgNotes on PostgreSQL)
        self._state: tuple | None = None
        # Equal values kept once: trait lists, aggregate sets.
        self._kept: dict = {}
        #: Inventory mappings by their records (with usage), kept once.
        self._inventories: dict = {}
        #: Resource class names by id, read with every full read and when
        #: a partial read meets a class not among them.
        self._class_names: dict[int, str] | None = None
        #: Reads of everything, and of some providers (for tests and logs).
        self.full_reads = 0
        self.partial_reads = 0
        #: Set for good once there were too many providers to keep.
        self.too_big = False
        #: Times the database was seen gone back in time or replaced.
        self.rebuilds = 0
        #: This process's committed writes not yet followed, each with the
        #: :meth:`mark` it is known from (see :meth:`wrote`); guarded by
        #: ``_known_lock``, which is never held while the database is read.
        self._own: list[tuple[int, changes.OwnWrite]] = []
        self._marks = 0
        self._known_lock = threading.Lock()
        #: Such writes the mirror followed without reading (for tests).
        self.own_writes_followed = 0
        #: Writes told and followed lately, and writes asked about (see
        #: :meth:`wants_own_writes`).
        self._told, self._followed, self._asked = 0, 0, 0

    def mark(self) -> int:
        """Which of this process's committed writes are known now: taken
        before a request reads its change number and given to
        :meth:`snapshot`, which then follows only those.  Each committed
        before the number was read, so the request's snapshot holds it; a
        write told later may have committed after that snapshot was taken,
        and following it there would show the mirror a write the number
        does not count in place of one it does (see :meth:`wrote`)."""
        return self._marks

    def snapshot(self, conn: Connection, number: int | None, known: int | None = None) -> Mirrored | None:
        """Every provider as ``conn``'s transaction sees them, with the
        results kept from them, ``number`` being the change number read
        first in it; None when the caller
        must read the database itself (no trustworthy number, too many
        providers).  :class:`MirrorAhead` when the mirror is past this
        transaction (SQLite).  ``known``: the :meth:`mark` taken before
        ``number`` was read (None: no committed write is followed; the
        providers changed are read)."""
        if number is None or self.too_big:
            return None
        state = self._state
        if state is not None and state[0] == number:
            return state[1]
        seen = state
        with self._lock:
            state = self._state
            if state is not None and state[0] == number:
                return state[1]
            if state is not None and known is not None and self._own:
                followed = self._follow_own_writes(state, number, known)
                if followed is not None:
                    return followed
            if conn.dialect.name == "postgresql":
                if state is not seen and state is not None and changes.went_back(number, state[0]) is None:
                    # Another thread brought the mirror here while this one
                    # waited, and its number is not below this request's: it
                    # was read no earlier, so it holds every write this
                    # request must see (reads on PostgreSQL run without a
                    # transaction: a newer mirror is what a refresh of its
                    # own would give).  Readers queued behind one refresh
                    # thus do not each refresh again in turn.
                    return state[1]
                return self._pg_snapshot(conn, state)
            changed = None
            if state is not None:
                if state[0] > number and changes.same_history(state[0], number):
                    # This transaction began before the mirror's was read,
                    # or the database went back in time: a number read now
                    # in a transaction of its own tells which.
                    now, _ = changes.current_number(conn.engine)
                    reason = None if now is None else changes.went_back(state[0], now)
                    if reason:
                        self._forget(reason)
                        self._state = None
                        return None
                    raise MirrorAhead(state[0], number)
                changed = changes.changed_providers(conn, state[0], number)
                if changed is None:
                    self._forget(changes.went_back(state[0], number))
            return self._keep(number, self._changed(conn, state, changed), number)

    def wants_own_writes(self) -> bool:
        """Whether a write should find out what it changed, for the mirror
        to follow it.  It costs the write a count of the change log
        (PostgreSQL), which pays while the mirror follows most writes (one
        scheduler claiming, a quiet cloud) and not where other writers
        commit between nearly every claim and its next read (measured: 12%
        followed with 8 threads claiming through two applications in one
        process): then only a
        probe of one write in :data:`OWN_WRITES_PROBE` asks."""
        self._asked += 1
        told = self._told
        return (told < OWN_WRITES_WINDOW // 4 or self._followed * 2 >= told
                or self._asked % OWN_WRITES_PROBE == 0)

    def wrote(self, write: changes.OwnWrite) -> None:
        """Told of a write this process has committed: kept until the mirror
        passes the number it began from.

        Why following such writes is exact: a write that began from number
        *n* saw *n* commits, itself not among them, so it is commit *n* + 1
        or later.  One known at a request's :meth:`mark` had committed
        before the request read its number *N*, so it is among the first
        *N*.  With the mirror at *M*, the known writes that began from *M*
        or later are thus among commits *M* + 1 to *N*; when there are
        *N* - *M* of them (on SQLite, where a write counts each row it
        wrote and writes run one at a time, when their counts add up to
        *N* - *M*), they are all of those commits.  Applied in the order
        they began, each provider ends with the generation and records of
        the last of them that wrote to it: two writes to one provider both
        swap its generation, so the later one read it after the earlier one
        had committed (else its swap fails), usage included.  Any other
        commit (one that only removed allocations, say, after a claim's
        statement read the usage) is one not known: the count falls short,
        and the mirror reads the providers changed as before.  This holds
        for writes that swapped the generation of every provider whose
        records they carry, which :meth:`_follow_own_writes` checks.
        """
        with self._known_lock:
            if len(self._own) < OWN_WRITES_KEPT:
                self._marks += 1  # known from the next mark on
                self._own.append((self._marks, write))
        self._told += 1
        if self._told >= OWN_WRITES_WINDOW:
            self._told, self._followed = self._told // 2, self._followed // 2

    def _follow_own_writes(self, state: tuple, number: int, known: int) -> Mirrored | None:
        """The mirror of ``state`` after the committed writes known at mark
        ``known`` that take it to ``number`` exactly (see :meth:`wrote`);
        None when they do not (another commit came between, or a provider
        or class it does not know)."""
        at = state[0]
        if number <= at or not changes.same_history(at, number):
            return None
        with self._known_lock:
            chain = sorted((write for mark, write in self._own
                            if mark <= known and at <= write.number < number
                            and changes.same_history(at, write.number)), key=lambda write: write.number)
        if sum(write.after - write.number for write in chain) != number - at:
            return None
        snapshot, class_names = state[1].snapshot, self._class_names
        if class_names is None:
            return None
        changed: dict[int, Provider] = {}
        for write in chain:
            by_provider: dict[int, list[tuple]] = {}
            for (pid, _), record in write.records.items():
                by_provider.setdefault(pid, []).append(record)
            if not by_provider.keys() <= write.generations.keys():
                return None  # usage changed where no generation was swapped: see wrote()
            for pid, generation in write.generations.items():
                provider = changed.get(pid)
                if provider is None:
                    if pid not in snapshot:
                        return None
                    provider = snapshot.get(pid)
                inventories = dict(provider.inventories)
                for record in by_provider.get(pid, ()):
                    name = class_names.get(record[1])
                    if name is None or name not in inventories:
                        return None
                    inventories[name] = ProviderInventory(*record[2:8], used=int(record[8]))
                changed[pid] = dataclasses.replace(provider, generation=generation, inventories=inventories)
        try:
            mirrored = self._successor(state[1], list(changed.values()), set(changed))
        except ValueError:
            return None
        self.own_writes_followed += len(chain)
        self._followed += len(chain)
        # PostgreSQL's notes stay those of the last read: a refresh from them
        # reads these providers again, which gives what the mirror holds.
        return self._keep(number, mirrored, state[2] if isinstance(state[2], changes.PgNotes) else number)

    def known_names(self) -> KnownNames | None:
        """The names known in the current mirror's lineage (None: no mirror
        yet)."""
        state = self._state
        return None if state is None else state[1].names

    def _forget(self, reason: str | None) -> None:
        """The database is not the one the mirror was read from, or went back
        in time: nothing read from it before is kept (the mirror is read
        again whole, and the process's per-generation caches emptied)."""
        if reason is None:
            return
        LOG.warning("%s: reading every resource provider again", reason)
        self.rebuilds += 1
        with self._known_lock:
            self._own = []
        self._caches.forget()

    def _keep(self, number: int, mirrored: Mirrored | None, notes) -> Mirrored | None:
        if mirrored is None or len(mirrored.snapshot) > MAX_PROVIDERS:
            LOG.warning("more than %d resource providers: not kept in memory by this process", MAX_PROVIDERS)
            self.too_big, self._state, self._kept, self._inventories = True, None, {}, {}
            return None
        self._state = (number, mirrored, notes)
        if self._own:  # drop the writes the mirror has passed, or of another database
            with self._known_lock:
                self._own = [(mark, write) for mark, write in self._own
                             if write.number >= number and changes.same_history(write.number, number)]
        return mirrored

    def _changed(self, conn: Connection, state: tuple | None, changed: set[int] | None) -> Mirrored | None:
        """The snapshot ``state``'s with the ``changed`` providers read again
        (everything when unknown, a table of names or more than half)."""
        if changed is None or changes.EVERYTHING in changed or len(changed) * 2 > len(state[1].snapshot):
            return self._read_all(conn)
        try:
            return self._read_some(conn, state[1], changed)
        except ValueError:  # a tree left incomplete: cannot happen in one transaction
            return self._read_all(conn)

    def _pg_snapshot(self, conn: Connection, state: tuple | None) -> Mirrored | None:
        """PostgreSQL: ``conn`` reads without a transaction (each statement
        its own snapshot), so the notes and the providers are read in one
        REPEATABLE READ transaction of their own, which makes the mirror
        what the database held at one moment during this request (its
        change number is then the one the mirror is kept under).  A mirror
        that has notes to start from is first brought up to date by one
        statement (:meth:`_pg_refresh`)."""
        if state is not None:
            refreshed = self._pg_refresh(conn, state)
            if refreshed is not _SLOW:
                return refreshed
        cursor = conn.connection.cursor()
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            notes, changed = changes.pg_notes(conn, None if state is None else state[2])
            if notes is None:
                mirrored = None
            elif state is not None and notes.number == state[0]:
                mirrored = state[1]  # another thread has just brought it here
            else:
                # This transaction began after the mirror's: a smaller number,
                # or one of another database, is a database gone back in time
                # or replaced (pg_notes then gives no changes: read it all).
                if state is not None:
                    self._forget(changes.went_back(state[0], notes.number))
                mirrored = self._keep(notes.number, self._changed(conn, state, changed), notes)
            cursor.execute("COMMIT")
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        finally:
            cursor.close()
        return mirrored

    def _pg_refresh(self, conn: Connection, state: tuple):
        """PostgreSQL: the mirror ``state`` brought up to date by the single
        statement :data:`_PG_REFRESH`, or ``_SLOW`` where it cannot be (the
        notes not to be trusted, the database gone back or replaced,
        everything or too many providers changed, a class the mirror does
        not know, a tree left incomplete): the caller then reads as before,
        in a transaction, and finds out which."""
        most = min(PG_AT_ONCE, len(state[1].snapshot) // 2)
        row = raw_rows.one_row(conn, _PG_REFRESH, {**changes.pg_since(state[2]), "most": most})
        notes, changed = changes.pg_notes_in(row, state[2])
        complete = row[changes.PG_NOTES_WIDTH]
        if notes is None or changed is None or not complete:
            return _SLOW
        if notes.number == state[0]:
            return state[1]
        if not changed:  # a name added: no provider changed
            return self._keep(notes.number, state[1], notes)
        (ids, uuids, parents, roots, generations, *records, trait_ids, trait_names, aggregate_ids,
         aggregate_uuids) = (column or [] for column in row[changes.PG_NOTES_WIDTH + 1:])
        class_names = self._class_names
        if class_names is None or any(cls not in class_names for cls in records[1]):
            return _SLOW
        self._trim(state[1])
        providers = self._assembled(list(zip(ids, uuids, parents, roots, generations)), zip(*records),
                                    zip(trait_ids, trait_names), zip(aggregate_ids, aggregate_uuids), class_names)
        try:
            mirrored = self._successor(state[1], providers, changed)
        except ValueError:  # a tree left incomplete: cannot happen in one snapshot
            return _SLOW
        return self._keep(notes.number, mirrored, notes)

    def _read_all(self, conn: Connection) -> Mirrored | None:
        self.full_reads += 1
        self._kept, self._inventories = {}, {}
        started = time.perf_counter()
        providers = self._providers(conn, None)
        if providers is None:
            return None
        providers.sort(key=lambda prov: (prov.root_id, prov.id))
        snapshot = ProviderSnapshot(providers)
        LOG.info("provider mirror: read every provider (%d) in %.2f s", len(providers),
                 time.perf_counter() - started)
        # The candidates of each tree, and the summary of each provider,
        # while the tree does not change.
        return Mirrored(snapshot, KeptResults(max(MEMO_LIMIT, MEMO_UNITS_PER_TREE * len(snapshot.root_ids)),
                                              providers=len(snapshot), trees=len(snapshot.root_ids)),
                        KnownNames())

    def _read_some(self, conn: Connection, old: Mirrored, ids: set[int]) -> Mirrored | None:
        self._trim(old)
        providers = self._providers(conn, sorted(ids))
        if providers is None:
            return None
        return self._successor(old, providers, ids)

    def _trim(self, old: Mirrored) -> None:
        """Forget the equal values kept once when they outgrow the mirror."""
        if len(self._kept) + len(self._inventories) > 4 * len(old.snapshot) + 1024:
            self._kept, self._inventories = {}, {}

    def _successor(self, old: Mirrored, providers: list[Provider], ids: set[int]) -> Mirrored:
        """``old`` with the providers of ``ids`` replaced by ``providers``
        (those not among them are gone)."""
        self.partial_reads += 1
        snapshot, change = old.snapshot.successor(providers, ids)
        return Mirrored(snapshot, old.kept.after(change), old.names)

    def _providers(self, conn: Connection, ids: list[int] | None) -> list[Provider] | None:
        """The providers (every one, or those of ``ids`` that exist), built;
        None when there are more than :data:`MAX_PROVIDERS`.

        Past :data:`WINDOW` providers their inventories, usage, traits and
        aggregates are read a window at a time (all in the caller's
        transaction), so that the rows of one window, not of the whole
        cloud, are held while its providers are built: the first read of
        10,000 flat hosts peaked at 19.3 MB instead of 30.0 MB (what it
        keeps: 19.1 MB).  A read of every provider asks for each window's
        range of ids (the ids between its first and last provider's are
        all its own), which each table's index on the provider id serves
        as one range: on PostgreSQL a list of a thousand ids was planned as
        a scan of the table, 45 ms for a window of 430,000 providers'
        allocations."""
        rows = (raw_rows.rows(conn, _PROVIDERS[EVERY], {}) if ids is None
                else raw_rows.rows_in_parts(conn, _PROVIDERS[LISTED], {"ids": ids}))
        if ids is None and len(rows) > MAX_PROVIDERS:
            return None
        class_names = self._class_names
        if ids is None or class_names is None:
            class_names = self._class_names = dict(raw_rows.rows(conn, _CLASSES, {}))
        if ids is None and len(rows) <= WINDOW:
            return self._built(conn, rows, EVERY, {}, class_names)
        rows.sort()
        built: list[Provider] = []
        size = WINDOW if ids is None else ID_WINDOW
        for start in range(0, len(rows), size):
            window = rows[start:start + size]
            if ids is None:
                built += self._built(conn, window, RANGE, {"lo": window[0][0], "hi": window[-1][0]}, class_names)
            else:
                built += self._built(conn, window, LISTED, {"ids": [row[0] for row in window]}, class_names)
        return built

    def _built(self, conn: Connection, rows: list, which: int, params: dict, class_names: dict) -> list[Provider]:
        """The providers of ``rows`` (id, uuid, parent, root, generation),
        their other rows read by statement ``which`` with ``params``."""
        records = raw_rows.rows(conn, _RECORDS[which], params)
        if any(row[1] not in class_names for row in records):
            # A class made since the names were read (a new name notes no
            # provider; a renamed or deleted one makes a full read).
            class_names.update(raw_rows.rows(conn, _CLASSES, {}))
        return self._assembled(rows, records, raw_rows.rows(conn, _TRAITS[which], params),
                               raw_rows.rows(conn, _AGGREGATES[which], params), class_names)

    def _assembled(self, rows: list, record_rows, trait_rows, aggregate_rows, class_names: dict) -> list[Provider]:
        """The providers of ``rows`` (id, uuid, parent, root, generation)
        from their inventory records (provider id, class id, total,
        reserved, min_unit, max_unit, step_size, ratio, used) in (provider,
        class) order, (provider id, trait name) in trait id order and
        (provider id, aggregate uuid).

        A first read builds 430,000 providers here: the loops make no
        object a provider does not keep (no empty list per row grouped, no
        empty tuple or set per provider without traits or aggregates)."""
        records = _grouped(record_rows)
        traits = _grouped_names(trait_rows)
        aggregates = _grouped_names(aggregate_rows)
        kept = self._inventories
        once = self._once
        nothing: tuple = ()
        no_traits, no_aggregates = once(nothing), once(frozenset())
        built: list[Provider] = []
        add = built.append
        for pid, uuid, parent, root, generation in rows:
            own = records.get(pid)
            own = nothing if own is None else tuple(own)
            inventories = kept.get(own)
            if inventories is None:
                inventories = kept[own] = built_inventories([record[:-1] for record in own],
                                                            [int(record[-1]) for record in own], class_names)
            names = traits.get(pid)
            members = aggregates.get(pid)
            add(Provider(pid, uuid, parent, root, generation,
                         no_traits if names is None else once(tuple(names)),
                         no_aggregates if members is None else once(frozenset(members)), inventories))
        return built

    def _once(self, value):
        known = self._kept.get(value)
        if known is None:
            known = self._kept[value] = value
        return known
