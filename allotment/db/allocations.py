"""Allocations: reading them, and replacing consumers' allocations safely.

Writing
-------
``write_allocations(conn, requests)`` replaces the complete allocations of
one or more consumers inside the caller's transaction.  It is the single
writer behind ``PUT /allocations/{c}``, ``POST /allocations`` and the
reshaper, and runs these steps, in this order:

1. read the consumer records and their current allocations;
2. read the generation of every provider involved (the providers named in
   the request, and the providers a consumer is being emptied from) and
   refuse unknown providers;
3. check the client's consumer generations (1.28) and resolve resource
   class names (unknown names are refused);
4. compare-and-swap every affected provider's generation, in id order
   (``generations.bump_providers``), then every consumer's (or create it);
5. delete the consumers' old allocation rows (by primary key) and insert the
   new ones;
6. check capacity against the provider state *after*
   the write: inventory present, ``min_unit`` / ``max_unit`` / ``step_size``
   for each amount, and ``used <= (total - reserved) * allocation_ratio``
   unless the write does not increase the usage of that class on that
   provider (see below).

Over-capacity providers: an operator may lower an inventory below what is
already allocated.  Placement then still accepts writes that do not make it
worse (rewriting a consumer with the same or smaller amounts, moving it
away, a migration that swaps consumers): per provider and class, a write is
refused for capacity only when the usage after it exceeds the capacity *and*
is larger than the usage before it.  The write knows that difference
exactly (new amounts minus the consumers' old rows: ``_growth``),
because the generation swap of step 4 keeps every other writer that adds
usage out until we commit.

Why this is safe without locks: any writer that increases usage on a
provider bumps that provider's generation.  A writer that committed after
our step 2 read makes our swap in step 4 fail; a writer that comes later
waits for our row (the swap took it) and then fails its own swap.  So the
usage seen in step 6 is exactly the usage at commit.  Writers that only
*remove* allocations (``DELETE /allocations``, moving a consumer away from a
provider) may skip the bump, as Placement does: they can only make room.

Swapping provider generations before touching allocation rows matters on
MySQL: inserting an allocation takes a shared lock on its provider row (the
foreign key), and two transactions upgrading shared locks to the exclusive
one an UPDATE needs deadlock each other.  Deleting old rows by primary key
(not by consumer uuid) keeps InnoDB from taking gap locks that would make
concurrent claims deadlock too.

On PostgreSQL a claim for a new consumer whose project and user exist (a
scheduler's claim) makes the last swap of step 4, the consumer's row and
step 5's rows in one statement that also returns what step 6 reads
(``_claim_statement``): a flat claim is three messages to the server.

On PostgreSQL, in a process whose writes lately lost swaps
(``SwapContention``), the first read also locks the providers the swaps
will lock, in the same order (``_READ_FOR_WRITE_LOCKING``): under the
statement's READ COMMITTED rules, a row it waited for comes back as the
writer before it committed it, so the generations it reads are current
and its swaps cannot be lost.

A lost provider swap raises ``ProviderConflict``; the caller re-runs the
whole transaction (``RETRY_ON``), up to ``[placement]
allocation_conflict_retry_count`` times, as Placement retries the provider
conflicts it caused itself.  The re-run first locks the providers whose
swap was lost (``lock_first``), so under heavy contention on one provider
writers queue rather than lose round after round (with 16 writers on one
provider on PostgreSQL, 29 % of claims ran out of re-runs before that).
A consumer the client named a generation for is never retried: its
generation is stale and the client must re-read (``ConsumerConflict``,
``ConsumerGenerationConflict``).

For the reshaper
----------------
A reshape changes inventories and allocations of several providers in one
transaction.  As Placement does, it checks the consumers and providers
first (``check_consumers_and_providers``, which writes nothing), then
widens the inventories, then calls ``write_allocations`` (capacity checked
against the widened inventories), and narrows the inventories last
(:mod:`allotment.db.reshaper`).
"""

from __future__ import annotations

import collections
import datetime
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from allotment.db import changes, consumers, generations, raw_rows, tables
from allotment.db.engine import prepared, utcnow
from allotment.domain import inventory_fit
from allotment.domain.errors import BadRequest, ConcurrentUpdate, Conflict, NotFound

ALLOC = tables.allocations
RP = tables.resource_providers
RC = tables.resource_classes
INV = tables.inventories


# -- errors (messages are Placement's: clients match on them) --------------


class AllocationNamesUnknownProvider(BadRequest):
    """An allocation asks for a provider that does not exist (a 400: the request is wrong)."""

    def __init__(self, uuid: str):
        super().__init__(f"Allocation for resource provider '{uuid}' that does not exist.")


class AllocationNamesUnknownClass(BadRequest):
    """An allocation asks for a resource class that does not exist (a 400, as the provider's)."""

    def __init__(self, name: str):
        super().__init__(f"No such resource class {name}.")


class InvalidInventory(Conflict):
    """A provider has no inventory of a class the allocation asks for."""

    def __init__(self, resource_class: str, provider: str, message: str | None = None):
        super().__init__(message or f"Inventory for '{resource_class}' on resource provider "
                                    f"'{provider}' invalid.")


class CapacityExceeded(InvalidInventory):
    def __init__(self, resource_class: str, provider: str):
        super().__init__(resource_class, provider,
                         f"Unable to create allocation for '{resource_class}' on resource provider "
                         f"'{provider}'. The requested amount would exceed the capacity.")


class ConstraintsViolated(InvalidInventory):
    def __init__(self, resource_class: str, provider: str):
        super().__init__(resource_class, provider,
                         f"Unable to create allocation for '{resource_class}' on resource provider "
                         f"'{provider}'. The requested amount would violate inventory constraints.")


class ConsumerGenerationConflict(ConcurrentUpdate):
    """The client's consumer generation is not the current one (1.28)."""

    def __init__(self, expected: int | None, got: int | None):
        shown = "null" if expected is None else expected
        super().__init__(f"consumer generation conflict - expected {shown} but got {got}")


class ProviderConflict(ConcurrentUpdate):
    """A provider changed between our read and our write; safe to re-run.

    ``provider_ids`` are the providers the write had to bump: a re-run passes
    them to ``write_allocations(lock_first=...)``."""

    def __init__(self, provider_ids: Iterable[int] = ()) -> None:
        super().__init__("Another thread concurrently updated the resource provider data. "
                         "Please retry your update")
        self.provider_ids = sorted(set(provider_ids))


class ConsumerConflict(ConcurrentUpdate):
    """A consumer changed after the client read it: the client must re-read."""

    def __init__(self) -> None:
        super().__init__("Another thread concurrently updated the data. Please retry your update")


class UnguardedConsumerConflict(ConsumerConflict):
    """A consumer changed under a write that named no generation (before 1.28,
    or a DELETE): the stale generation was our own read, so re-running is safe."""


class NotTogether(Exception):
    """``write_allocations(together=True)`` of requests it does not write as
    one: each is to be written alone."""


#: What a caller of ``write_allocations`` / ``delete_allocations`` re-runs its
#: transaction on (bounded by ``allocation_conflict_retry_count``).
RETRY_ON: tuple[type[Exception], ...] = (ProviderConflict, UnguardedConsumerConflict,
                                         consumers.RecordRace)


# -- requests and results ---------------------------------------------------


@dataclass(frozen=True)
class ConsumerAllocations:
    """The complete new allocations of one consumer, as a writer asks for them.

    ``resources`` maps provider uuid -> {resource class: amount}; empty means
    "remove every allocation of this consumer" (and its record).
    ``project_id`` / ``user_id`` are external ids; ``None`` means the
    configured incomplete-consumer ids (writes before microversion 1.8).
    With ``check_generation`` (1.28) ``generation`` must equal the
    consumer's, or be ``None`` for a consumer without a record.  With
    ``set_consumer_type`` (1.38) ``consumer_type`` replaces the consumer's
    type; otherwise an existing consumer keeps its type and a new one has none.
    """

    consumer_uuid: str
    resources: Mapping[str, Mapping[str, int]]
    project_id: str | None = None
    user_id: str | None = None
    generation: int | None = None
    check_generation: bool = False
    consumer_type: str | None = None
    set_consumer_type: bool = False


@dataclass(frozen=True)
class Claim:
    """One allocation row written: ``amount`` of a class on a provider."""

    provider_id: int
    provider_uuid: str
    class_id: int
    class_name: str
    amount: int
    consumer_uuid: str


# -- writing ------------------------------------------------------------------


#: Writes of a process that read with locks (PostgreSQL) after one of its
#: writes lost a provider swap (see :class:`SwapContention`).
LOCKED_READS = 256


class SwapContention:
    """Whether this process's writes lately lost provider swaps to other
    writers: then its next :data:`LOCKED_READS` writes lock their providers
    as they first read them (``write_allocations(lock_read=True)``).

    Those writes lose no swap, so a race still going on shows itself again
    by the first swap lost once they are spent: 16 writes run again in
    3,200, where a quarter of them were (16 clients claiming against 2,000
    flat providers, two processes).  A process whose writes meet no other
    writer never locks at its first read: that costs its database about
    30 us a write (the lock's record), 4% of a claim.  Kept per process,
    the counts unguarded: a lost count under threads moves the mode by a
    write or so."""

    def __init__(self) -> None:
        self._left = 0

    def lock_read(self) -> bool:
        """Whether the next write should lock as it reads (and count it)."""
        if self._left <= 0:
            return False
        self._left -= 1
        return True

    def lost(self) -> None:
        """A write of this process lost a provider swap."""
        self._left = LOCKED_READS


def write_allocations(conn: Connection, requests: Sequence[ConsumerAllocations], *,
                      incomplete_owner: tuple[str, str], lock_first: Iterable[int] = (),
                      lock_read: bool = False, follow: bool = False,
                      together: bool = False) -> changes.OwnWrite | None:
    """Replace the allocations of every consumer in ``requests`` (see the module doc).

    Each consumer uuid may appear once.  ``incomplete_owner`` is the
    (project, user) recorded for requests without one.  Raises the errors
    above; the caller's transaction must roll back on any of them.
    ``lock_first`` (a re-run after ``ProviderConflict``: its
    ``provider_ids``) locks those providers before anything is read, so the
    re-run waits its turn instead of losing the swap again; it must then be
    the transaction's first write call.  ``lock_read`` (PostgreSQL; a
    process whose writes lately lost swaps, :class:`SwapContention`): the
    first read locks the providers, so no swap is lost (see the module doc).

    With ``follow``, returns what the write changed where it knows all of it
    (SQLite, writes that only add allocation rows; PostgreSQL, a new
    consumer's claim: :class:`changes.OwnWrite`), for the process's mirror
    of every provider once the transaction has committed, where the
    transaction wrote nothing else; else None.  It costs the write the
    change number: on PostgreSQL a count of the change log in the claim's
    statement, on SQLite two reads of the counter.

    ``together`` (with ``lock_read``, on PostgreSQL): the claims of several
    requests written as one (:mod:`allotment.api.claim_groups`), in one
    statement (:func:`_claims_for_new_consumers`), where each is a new
    consumer with allocations and an owner that exists; else
    :class:`NotTogether` is raised, writing nothing.  (Writes that also
    replace or remove allocations are not grouped: with a provider over
    capacity, what they are allowed depends on the order they run in.)
    """
    generations.lock_providers(conn, lock_first)
    found, names = _read_and_check(conn, requests, incomplete_owner, lock=lock_read)
    existing, old_rows, by_uuid, by_id, class_ids = (found.consumers, found.old_rows, found.providers,
                                                     found.generations, found.class_ids)
    emptied = {r.consumer_uuid for r in requests if not r.resources}
    # What emptied consumers give up.  Placement bumps the providers a
    # consumer is emptied from, not those it merely moves away from.
    given_up = [row for row in old_rows if row.consumer_uuid in emptied] if emptied else []
    release_ids = {row.provider_id for row in given_up}
    for name in names:
        if name not in class_ids:
            raise AllocationNamesUnknownClass(name)
    claims = [
        Claim(by_uuid[rp_uuid].id, rp_uuid, class_ids[name], name, amount, r.consumer_uuid)
        for r in requests
        for rp_uuid, resources in r.resources.items()
        for name, amount in resources.items()
    ]
    if any(claim.amount > inventory_fit.MAX_INT for claim in claims):
        # Larger than any column holds, and than any max_unit allows:
        # refuse with the constraint error before writing.
        _check_claims(conn, claims, after_write=False, given_up=given_up)

    bumped = {claim.provider_id for claim in claims} | release_ids
    # SQLite writes one transaction at a time: the change number before and
    # after this one's writes tell what it changed, to a mirror of every
    # provider, where it only adds rows (usage changes on its claims alone).
    counted = follow and conn.dialect.name == "sqlite" and claims and not old_rows
    began_from = changes.read_number(conn)[0] if counted else None
    if (conn.dialect.name == "postgresql" and len(requests) == 1 and claims and not old_rows
            and len(claims) <= _INSERT_ROWS_KEPT and requests[0].consumer_uuid not in existing):
        owner = _known_owner(requests[0], incomplete_owner, found.owners)
        if owner is not None:
            return _claim_for_new_consumer(conn, requests[0], owner, claims, sorted(bumped), by_id, follow)
    if together:
        owners = [_known_owner(r, incomplete_owner, found.owners) for r in requests]
        if not (lock_read and conn.dialect.name == "postgresql" and not old_rows and None not in owners
                and len(claims) <= _INSERT_ROWS_KEPT and len(bumped) <= _INSERT_ROWS_KEPT
                and all(r.resources and r.consumer_uuid not in existing for r in requests)):
            raise NotTogether()
        return _claims_for_new_consumers(conn, requests, owners, claims, sorted(bumped), by_id, follow)
    try:
        swapped = generations.bump_providers(conn, [(pid, by_id[pid]) for pid in bumped])
    except ConcurrentUpdate:
        raise ProviderConflict(bumped) from None
    _write_consumers(conn, requests, existing, incomplete_owner, {row.consumer_uuid for row in old_rows},
                     found.owners)
    old_ids = [row.id for row in old_rows]
    for part in raw_rows.parts(old_ids):
        conn.execute(_DELETE_ROWS, {"ids": part})
    records = None
    if claims:
        now = utcnow()
        rows = _row_values(claims, now)
        if conn.dialect.name == "sqlite":
            raw_rows.write(conn, _INSERT_ROW, rows)  # the DBAPI's executemany, as SQLAlchemy's
        elif len(rows) <= _INSERT_ROWS_KEPT:
            # One multi-row INSERT, as SQLAlchemy's insertmanyvalues sends,
            # but on the DBAPI cursor and, on PostgreSQL, prepared: one text
            # per number of rows.  Measured on PostgreSQL, in process, claims
            # of three rows: the server's CPU for the INSERT 0.32 -> 0.24 ms
            # (no parsing and planning), and with the consumer's row on the
            # cursor too, a claim's client instructions 9% fewer.
            values = _numbered(rows)
            if conn.dialect.name == "postgresql":
                # The capacity check's records come back from the INSERT itself.
                records = _by_pair(raw_rows.written_rows(conn, _insert_rows_read_usage(len(rows)), values))
            else:
                raw_rows.write(conn, _insert_rows(len(rows)), values)
        else:
            conn.execute(_INSERT_ROW, rows)  # one multi-row INSERT (SQLAlchemy's insertmanyvalues)
    records = _check_claims(conn, claims, after_write=True, growth=_growth(claims, old_rows), given_up=given_up,
                            records=records)
    if began_from is None:
        return None
    now_at = changes.read_number(conn)[0]
    if now_at is None or not changes.same_history(began_from, now_at):
        return None
    return changes.OwnWrite(began_from, swapped, records, after=now_at)


def check_consumers_and_providers(conn: Connection, requests: Sequence[ConsumerAllocations], *,
                                  incomplete_owner: tuple[str, str]) -> None:
    """The first checks of ``write_allocations``, alone and writing nothing:
    the consumers' generations, then the providers named.

    For the reshaper, where Placement makes them before it touches any
    inventory (and so before an unknown inventory class is noticed).
    """
    _read_and_check(conn, requests, incomplete_owner)


def _read_and_check(conn: Connection, requests: Sequence[ConsumerAllocations],
                    incomplete_owner: tuple[str, str], lock: bool = False) -> tuple[_Found, list[str]]:
    """Everything ``write_allocations`` reads, with the consumers' generations
    and the providers checked; also the class names asked for, in order.
    ``lock``: see :func:`_read_for_write`."""
    wanted = list(dict.fromkeys(uuid for r in requests for uuid in r.resources))
    names = list(dict.fromkeys(name for r in requests for res in r.resources.values() for name in res))
    found = _read_for_write(conn, requests, wanted, names, incomplete_owner, lock)
    # Placement checks the consumers' generations before it looks the
    # providers up (see ``keep_new_consumers``).
    _check_consumer_generations(requests, found.consumers)
    for uuid in wanted:
        if uuid not in found.providers:
            raise AllocationNamesUnknownProvider(uuid)
    return found, names


def keep_new_consumers(conn: Connection, requests: Sequence[ConsumerAllocations], *,
                       incomplete_owner: tuple[str, str]) -> None:
    """Give every consumer among ``requests`` that has no record one at generation 0.

    For a write that ``write_allocations`` refused with ``AllocationNamesUnknownProvider``,
    in a transaction of its own: Placement records new consumers before it
    looks the providers up, and a write refused for an unknown provider
    leaves them behind (the next write of such a consumer must name
    generation 0, not null).  Writes refused later (classes, capacity)
    leave nothing, as here.
    """
    existing, _ = _read_consumers(conn, [r.consumer_uuid for r in requests])
    for request in requests:
        if request.consumer_uuid not in existing:
            consumers.insert(conn, request.consumer_uuid, _owner(conn, request, None, incomplete_owner),
                             generation=0)


def _growth(claims: Sequence[Claim], old_rows: Sequence[_OldRow]) -> dict[tuple[int, int], int]:
    """Per claimed (provider id, class id): new amounts minus the old rows replaced."""
    growth: dict[tuple[int, int], int] = {}
    for claim in claims:
        key = (claim.provider_id, claim.class_id)
        growth[key] = growth.get(key, 0) + claim.amount
    for row in old_rows:
        key = (row.provider_id, row.class_id)
        if key in growth:
            growth[key] -= row.amount
    return growth


class _OldRow(NamedTuple):
    id: int
    consumer_uuid: str
    provider_id: int
    class_id: int
    amount: int


# The statements of the write path are built once, with expanding IN
# parameters, so each is compiled once per process rather than per request.
_C, _P, _U = tables.consumers, tables.projects, tables.users
_CONSUMERS_AND_ROWS = sa.union_all(
    sa.select(sa.literal_column("'c'").label("kind"), _C.c.id, _C.c.uuid, _C.c.generation, _C.c.project_id,
              _C.c.user_id, _C.c.consumer_type_id, _P.c.external_id, _U.c.external_id)
    .join(_P, _P.c.id == _C.c.project_id)
    .join(_U, _U.c.id == _C.c.user_id)
    .where(_C.c.uuid.in_(sa.bindparam("consumer_uuids", expanding=True))),
    sa.select(sa.literal_column("'a'"), ALLOC.c.id, ALLOC.c.consumer_id, ALLOC.c.used, ALLOC.c.resource_provider_id,
              ALLOC.c.resource_class_id, sa.null(), sa.null(), sa.null())
    .where(ALLOC.c.consumer_id.in_(sa.bindparam("row_uuids", expanding=True))),
)
_DELETE_ROWS = prepared(sa.delete(ALLOC).where(ALLOC.c.id.in_(sa.bindparam("ids", expanding=True))))
_ROW_COLUMNS = ("resource_provider_id", "consumer_id", "resource_class_id", "used", "created_at", "updated_at")
_INSERT_ROW = sa.insert(ALLOC).values({name: sa.bindparam(name) for name in _ROW_COLUMNS})
#: Allocation rows written by one multi-row INSERT of its own text (the
#: PostgreSQL server keeps each prepared): a claim writes one row for each
#: class and provider, a few.  More are written by SQLAlchemy's
#: insertmanyvalues.
_INSERT_ROWS_KEPT = 16
_INSERT_ROWS: dict[int, sa.Insert] = {}


def _row_values(claims: Sequence[Claim], now: datetime.datetime) -> list[dict]:
    """The allocation rows of ``claims``, as :data:`_INSERT_ROW` names their values."""
    return [{"resource_provider_id": c.provider_id, "consumer_id": c.consumer_uuid,
             "resource_class_id": c.class_id, "used": c.amount, "created_at": now, "updated_at": now}
            for c in claims]


def _numbered(rows: list[dict]) -> dict:
    """The values of ``rows`` as :func:`_insert_rows` names them (``{column}_{row}``)."""
    return {f"{name}_{i}": value for i, row in enumerate(rows) for name, value in row.items()}


def _insert_rows(count: int) -> sa.Insert:
    """The INSERT of ``count`` allocation rows, its parameters named
    ``{column}_{row}``."""
    statement = _INSERT_ROWS.get(count)
    if statement is None:
        statement = _INSERT_ROWS[count] = sa.insert(ALLOC).values(
            [{name: sa.bindparam(f"{name}_{i}") for name in _ROW_COLUMNS} for i in range(count)])
    return statement


#: PostgreSQL: per number of rows, the INSERT of :func:`_insert_rows` and,
#: in the same statement, what the capacity check reads after it
#: (:data:`_INVENTORY_USAGE` for the providers and classes written).
_INSERT_ROWS_READ_USAGE: dict[int, sa.Select] = {}


def _insert_rows_read_usage(count: int) -> sa.Select:
    """PostgreSQL: the INSERT of ``count`` allocation rows (parameters as
    :func:`_insert_rows`'), returning the inventory records of the providers
    and classes it wrote with their usage after it, as
    :data:`_INVENTORY_USAGE` reads them after a separate INSERT.  The
    statement reads the allocations as they were before it (a statement
    does not see what its own ``WITH`` writes), so the rows it inserts are
    added to them; everything else is read at the statement's start, as
    the separate check read it at its own.  One statement, and one round
    trip, fewer per claim."""
    statement = _INSERT_ROWS_READ_USAGE.get(count)
    if statement is None:
        new = _insert_rows(count).returning(
            ALLOC.c.resource_provider_id, ALLOC.c.resource_class_id, ALLOC.c.used).cte("new_rows")
        mine = (new.c.resource_provider_id == INV.c.resource_provider_id,
                new.c.resource_class_id == INV.c.resource_class_id)
        added = sa.select(sa.func.coalesce(sa.func.sum(new.c.used), 0)).where(*mine).scalar_subquery()
        statement = _INSERT_ROWS_READ_USAGE[count] = (
            sa.select(*_INVENTORY_COLUMNS, (_USED + added).label("used"))
            .where(INV.c.resource_provider_id.in_(sa.select(new.c.resource_provider_id)),
                   INV.c.resource_class_id.in_(sa.select(new.c.resource_class_id))))
    return statement


#: PostgreSQL: per number of rows, a new consumer's claim in one
#: statement (:func:`_claim_statement`).
_CLAIM_STATEMENTS: dict[tuple[int, bool], sa.Select] = {}
_NEW_CONSUMER_COLUMNS = ("uuid", "project_id", "user_id", "consumer_type_id", "generation")


def _claim_statement(count: int, numbered: bool) -> sa.Select:
    """PostgreSQL: the last generation swap of a claim for a new consumer,
    the consumer's row and the ``count`` allocation rows, in one statement
    that returns what the capacity check reads (as
    :func:`_insert_rows_read_usage` does) and whether the swap and the
    consumer's row were made.

    The consumer's row is written from the swap's result, so only once the
    swap has its provider (the same order as separate statements: the
    provider, then the consumer).  The allocation rows are written whatever
    the swap found; a swap that found its provider moved makes the caller
    roll everything back.  A statement reads at its start, before the swap
    may wait for another writer of that provider: that is what the write's
    first read saw (every writer that adds usage swaps the generation, so
    one that committed since makes the swap fail), but for writers that
    only removed allocations since, which can only make room."""
    statement = _CLAIM_STATEMENTS.get((count, numbered))
    if statement is None:
        swapped = (sa.update(RP)
                   .where(RP.c.id == sa.bindparam("swap_id"), RP.c.generation == sa.bindparam("expected"))
                   .values(generation=sa.bindparam("new"), updated_at=sa.bindparam("now"))
                   .returning(RP.c.id).cte("swapped"))
        consumer = (sa.insert(tables.consumers)
                    .from_select([*_NEW_CONSUMER_COLUMNS, "created_at", "updated_at"], sa.select(
                        *[sa.bindparam(name) for name in _NEW_CONSUMER_COLUMNS],
                        sa.bindparam("now"), sa.bindparam("now")).select_from(swapped))
                    .returning(tables.consumers.c.id).cte("new_consumer"))
        records = _insert_rows_read_usage(count).subquery("records")
        one = sa.select(sa.literal_column("1").label("one")).subquery("one")
        # The consumer's count is there for its WITH to be written at all
        # (a WITH the statement does not name is left out of it).
        statement = _CLAIM_STATEMENTS[count, numbered] = (
            sa.select(sa.select(sa.func.count()).select_from(swapped).scalar_subquery().label("swapped"),
                      sa.select(sa.func.count()).select_from(consumer).scalar_subquery().label("consumers"),
                      *(sa.literal_column(column) for column in changes.PG_BEGAN_FROM_COLUMNS if numbered),
                      *records.c)
            .select_from(one.outerjoin(records, sa.true())))
    return statement


#: Where a claim statement's row has the records (after the swap's and the
#: consumer's counts, and the change number's columns when ``numbered``).
_CLAIM_RECORDS_AT = {False: 2, True: 2 + len(changes.PG_BEGAN_FROM_COLUMNS)}


def _known_owner(request: ConsumerAllocations, incomplete_owner: tuple[str, str],
                 known: Mapping[tuple[str, str], int]) -> consumers.Owner | None:
    """The owner a new consumer of ``request`` gets, when the write's first
    read found its project, user and type (else None: one must be written)."""
    project, user, new_type = _owner_names(request, incomplete_owner)
    ids = (known.get(("P", project)), known.get(("U", user)),
           known.get(("T", new_type)) if new_type is not None else None)
    if ids[0] is None or ids[1] is None or (new_type is not None and ids[2] is None):
        return None
    return consumers.Owner(*ids)


def _claim_for_new_consumer(conn: Connection, request: ConsumerAllocations, owner: consumers.Owner,
                            claims: list[Claim], bumped: list[int], read: Mapping[int, int],
                            follow: bool) -> changes.OwnWrite | None:
    """Steps 4-6 of :func:`write_allocations` for a consumer without a
    record or rows, whose owner exists (PostgreSQL): the swaps in id order,
    the last of them in one statement with the consumer's row, the
    allocation rows and the capacity check's read
    (:func:`_claim_statement`).  A flat claim is then three messages:
    ``BEGIN`` with the first read, that statement, ``COMMIT``.

    With ``follow``, what the claim changed, once committed
    (:class:`changes.OwnWrite`): the generations it swapped and, read by
    that same statement, the records of every (provider, class) it
    allocates from with its usage after it; else (or without a change
    number) None."""
    *first, last = bumped
    try:
        generations.bump_providers(conn, [(pid, read[pid]) for pid in first])
    except ConcurrentUpdate:
        raise ProviderConflict(bumped) from None
    now = utcnow()
    values = {"swap_id": last, "expected": read[last], "new": read[last] + 1, "now": now,
              "uuid": request.consumer_uuid, "project_id": owner.project_id, "user_id": owner.user_id,
              "consumer_type_id": owner.consumer_type_id, "generation": 1, **_numbered(_row_values(claims, now))}
    try:
        rows = raw_rows.written_rows(conn, _claim_statement(len(claims), follow), values)
    except sa.exc.IntegrityError:  # the consumer's row, made by another transaction since our read
        raise consumers.RecordRace(f"consumer {request.consumer_uuid}") from None
    at = _CLAIM_RECORDS_AT[follow]
    records = _by_pair(row[at:] for row in rows if row[at] is not None)
    return _claimed(conn, rows[0][0], 1, rows[0][2:at], records, claims, bumped, read, follow)


def _claimed(conn: Connection, swapped: int, swaps: int, began: Sequence, records: dict,
             claims: list[Claim], bumped: list[int], read: Mapping[int, int],
             follow: bool) -> changes.OwnWrite | None:
    """After a claim statement (:func:`_claim_statement`,
    :data:`_CLAIMS_STATEMENTS`) that made ``swapped`` of its ``swaps``
    swaps, read the change number's columns ``began`` (with ``follow``)
    and ``records``: raise where a swap was lost or the capacity check
    fails, else what the claims changed, for the mirror (with ``follow``;
    see :func:`_claim_for_new_consumer`)."""
    if swapped != swaps:
        raise ProviderConflict(bumped)
    _check_claims(conn, claims, after_write=True, growth=_growth(claims, ()), records=records)
    if not follow:
        return None
    number = changes.pg_began_from(*began)
    if number is None:
        return None
    return changes.OwnWrite(number, {pid: read[pid] + 1 for pid in bumped}, records, after=number + 1)


def _claims_text(numbered: bool) -> str:
    """PostgreSQL: :func:`_claim_statement` for several new consumers at
    once, one text for any number of them (each number a statement of its
    own would be prepared on every connection, one after another as
    groups come in every size): every provider's generation swap
    (``swap_ids`` from ``expected``), the consumers' rows (``uuids``,
    ``projects``, ``users``, ``types``; written only if every swap held)
    and the allocation rows (``row_providers``, ``row_consumers``,
    ``row_classes``, ``row_amounts``), as arrays.  One row: how many swaps
    and consumers were made, the change number's columns when
    ``numbered``, then the inventory record of every (provider, class)
    written, with its usage after the statement, one array per column of
    :data:`_INVENTORY_COLUMNS` and the usage.  For a transaction whose
    first read locked those providers (``_READ_FOR_WRITE_LOCKING``): the
    swaps then find what it read, and take no lock of their own in a new
    order."""
    began = "".join(f", {column}" for column in changes.PG_BEGAN_FROM_COLUMNS) if numbered else ""
    # The record's columns (``_Record``: the inventory's, then ``used``), as
    # the single claim's statement and the capacity check read them.
    inventory = ", ".join(f"i.{column}" for column in _Record._fields[:-1])
    records = ", ".join(f"array_agg(records.{column} ORDER BY records.resource_provider_id, "
                        "records.resource_class_id)" for column in _Record._fields)
    return (
        "WITH swapped AS (UPDATE resource_providers AS rp SET generation = rp.generation + 1, "
        "updated_at = %(now)s::timestamp FROM unnest(%(swap_ids)s::integer[], %(expected)s::integer[]) "
        "AS s (id, expected) WHERE rp.id = s.id AND rp.generation = s.expected RETURNING rp.id), "
        "made AS (INSERT INTO consumers (uuid, project_id, user_id, consumer_type_id, generation, created_at, "
        "updated_at) SELECT c.uuid, c.project_id, c.user_id, c.type_id, 1, %(now)s::timestamp, "
        "%(now)s::timestamp FROM unnest(%(uuids)s::text[], %(projects)s::integer[], %(users)s::integer[], "
        "%(types)s::integer[]) AS c (uuid, project_id, user_id, type_id) "
        "WHERE (SELECT count(*) FROM swapped) = cardinality(%(swap_ids)s::integer[]) RETURNING id), "
        "new_rows AS (INSERT INTO allocations (resource_provider_id, consumer_id, resource_class_id, used, "
        "created_at, updated_at) SELECT r.provider_id, r.consumer_id, r.class_id, r.amount, %(now)s::timestamp, "
        "%(now)s::timestamp FROM unnest(%(row_providers)s::integer[], %(row_consumers)s::text[], "
        "%(row_classes)s::integer[], %(row_amounts)s::integer[]) AS r (provider_id, consumer_id, class_id, amount) "
        "RETURNING resource_provider_id, resource_class_id, used), "
        "added AS (SELECT resource_provider_id, resource_class_id, sum(used) AS used FROM new_rows "
        "GROUP BY resource_provider_id, resource_class_id), "
        # Read at the statement's start: the allocations before its own rows.
        f"records AS (SELECT {inventory}, coalesce((SELECT sum(a.used) FROM allocations AS a "
        "WHERE a.resource_provider_id = i.resource_provider_id AND a.resource_class_id = i.resource_class_id), 0) "
        "+ added.used AS used FROM inventories AS i JOIN added ON added.resource_provider_id = "
        "i.resource_provider_id AND added.resource_class_id = i.resource_class_id) "
        f"SELECT (SELECT count(*) FROM swapped), (SELECT count(*) FROM made){began}, {records} FROM records")


def _claims_for_new_consumers(conn: Connection, requests: Sequence[ConsumerAllocations],
                              owners: Sequence[consumers.Owner], claims: list[Claim], bumped: list[int],
                              read: Mapping[int, int], follow: bool) -> changes.OwnWrite | None:
    """Steps 4-6 of :func:`write_allocations` for several consumers without a
    record or rows, whose owners exist, after a first read that locked
    their providers (PostgreSQL): every swap, the consumers' rows, the
    allocation rows and the capacity check's read in one statement
    (:data:`_CLAIMS_STATEMENTS`), so the claims of several requests are
    three messages together, as one claim is alone.  Returns what
    :func:`_claim_for_new_consumer` returns, for all of them."""
    values = {"now": utcnow(), "swap_ids": bumped, "expected": [read[pid] for pid in bumped],
              "uuids": [r.consumer_uuid for r in requests], "projects": [o.project_id for o in owners],
              "users": [o.user_id for o in owners], "types": [o.consumer_type_id for o in owners],
              "row_providers": [c.provider_id for c in claims], "row_consumers": [c.consumer_uuid for c in claims],
              "row_classes": [c.class_id for c in claims], "row_amounts": [c.amount for c in claims]}
    try:
        row = raw_rows.one_row(conn, _CLAIMS_STATEMENTS[follow], values)
    except sa.exc.IntegrityError:  # a consumer's row, made by another transaction since our read
        raise consumers.RecordRace("consumers " + ", ".join(r.consumer_uuid for r in requests)) from None
    at = _CLAIM_RECORDS_AT[follow]
    columns = row[at:]
    records = {} if columns[0] is None else _by_pair(zip(*columns))
    return _claimed(conn, row[0], len(bumped), row[2:at], records, claims, bumped, read, follow)


_T = tables.consumer_types


def _many(name: str) -> sa.BindParameter:
    return sa.bindparam(name, expanding=True)


def _branch(kind: str, *columns) -> sa.Select:
    """A branch of _READ_FOR_WRITE: its kind, then ``columns`` and NULLs (nine in all)."""
    return sa.select(sa.literal_column(f"'{kind}'"), *columns, *[sa.null()] * (8 - len(columns)))


# The branches of the write's first read that look names up: the classes
# named, and the projects, users and consumer types the new records may need.
_BY_NAME = (
    _branch("r", RC.c.id, RC.c.name).where(RC.c.name.in_(_many("names"))),
    _branch("P", _P.c.id, _P.c.external_id).where(_P.c.external_id.in_(_many("projects"))),
    _branch("U", _U.c.id, _U.c.external_id).where(_U.c.external_id.in_(_many("users"))),
    _branch("T", _T.c.id, _T.c.name).where(_T.c.name.in_(_many("types"))),
)
# The providers a write swaps: those named, and those its consumers hold
# allocations against (by their ids).
_NAMED = RP.c.uuid.in_(_many("uuids"))
_HELD = sa.select(ALLOC.c.resource_provider_id).where(ALLOC.c.consumer_id.in_(_many("held_uuids")))
# Everything a write reads before it changes anything, in one statement (one
# round trip, and on PostgreSQL one snapshot): the consumers' records and
# rows, the providers named and those the consumers hold allocations
# against (their generations), the classes named, and the ids of the
# projects, users and consumer types the new records may need.
_READ_FOR_WRITE = prepared(sa.union_all(
    _CONSUMERS_AND_ROWS.selects[0],
    _CONSUMERS_AND_ROWS.selects[1],
    # Providers named, and (a second branch: an OR would scan the table)
    # those held; one held and named comes twice, the same row.
    _branch("p", RP.c.id, RP.c.uuid, RP.c.generation).where(_NAMED),
    _branch("p", RP.c.id, RP.c.uuid, RP.c.generation).where(RP.c.id.in_(_HELD)),
    *_BY_NAME,
))


# PostgreSQL: the same read, which also takes the row locks the swaps of
# step 4 take (FOR NO KEY UPDATE), of the providers named and held, in id
# order as the swaps go.  A writer then waits for the writers of its
# providers before it reads their generations, rather than reading, losing
# the swap to one of them, rolling back and running again behind
# ``lock_first``.  Measured in the race of 16 clients on 2,000 flat
# providers (tools/scalebench): a quarter of the claims lost their first
# swap so (857 rollbacks in 3,200 claims; with the lock taken here, 100:
# the claims refused for capacity).  With the lock taken while the
# process's writes lose swaps (SwapContention), server and database spent
# 0.94 and 0.93 of their CPU per claim in that race, and 0.92 and 0.94 in
# the shared bench's claim race (median of 4 runs), with more claims a
# second and a lower p95.  The locks are held from this read to COMMIT
# rather than from the swap: one round trip longer for a claim of a new
# consumer.  Where no other writer is met the lock is a cost only
# (SwapContention).  A write whose lists are too long for one statement
# locks part by part, so not in one id order: a deadlock with another
# such write is PostgreSQL's to find, and transient (run_write retries).
_LOCKED = (sa.select(RP.c.id, RP.c.uuid, RP.c.generation)
           .where(RP.c.id.in_(sa.union(sa.select(RP.c.id).where(_NAMED), _HELD)))
           .order_by(RP.c.id).with_for_update(key_share=True).cte("locked").prefix_with("MATERIALIZED"))
_READ_FOR_WRITE_LOCKING = prepared(sa.union_all(
    _CONSUMERS_AND_ROWS.selects[0],
    _CONSUMERS_AND_ROWS.selects[1],
    _branch("p", _LOCKED.c.id, _LOCKED.c.uuid, _LOCKED.c.generation),
    *_BY_NAME,
))


@dataclass
class _Found:
    """What ``_read_for_write`` read."""

    consumers: dict[str, consumers.Consumer] = field(default_factory=dict)
    old_rows: list[_OldRow] = field(default_factory=list)
    providers: dict[str, Row] = field(default_factory=dict)
    #: provider id -> generation, of the providers named and those held
    generations: dict[int, int] = field(default_factory=dict)
    class_ids: dict[str, int] = field(default_factory=dict)
    #: ("P" | "U" | "T", external id or type name) -> id, of those that exist
    owners: dict[tuple[str, str], int] = field(default_factory=dict)


def _read_for_write(conn: Connection, requests: Sequence[ConsumerAllocations], wanted: Sequence[str],
                    names: Sequence[str], incomplete_owner: tuple[str, str], lock: bool = False) -> _Found:
    """The reads of ``write_allocations``, in one query (one a part of
    lists too long for one statement: ``raw_rows.rows_in_parts``); with
    ``lock`` on PostgreSQL, the one that locks the providers named and held
    (:data:`_READ_FOR_WRITE_LOCKING`)."""
    uuids = [r.consumer_uuid for r in requests]
    projects, users, types = set(), set(), set()
    for r in requests:
        project, user, new_type = _owner_names(r, incomplete_owner)
        projects.add(project)
        users.add(user)
        if new_type is not None:
            types.add(new_type)
    found = _Found()
    # On the DBAPI cursor (raw_rows): SQLAlchemy's expansion of eight IN
    # lists and its result set-up cost more than the statement itself.
    statement = _READ_FOR_WRITE_LOCKING if lock and conn.dialect.name == "postgresql" else _READ_FOR_WRITE
    for kind, ident, text, generation, number, user_id, type_id, project, user in raw_rows.rows_in_parts(
            conn, statement, {"consumer_uuids": uuids, "row_uuids": uuids, "held_uuids": uuids,
                                    "uuids": list(wanted), "names": list(names), "projects": list(projects),
                                    "users": list(users), "types": list(types)}):
        if kind == "c":
            found.consumers[text] = consumers.Consumer(ident, text, generation, number, user_id, project, user,
                                                       type_id)
        elif kind == "a":  # an allocation row: amount, provider and class in the consumer's columns
            found.old_rows.append(_OldRow(ident, text, number, user_id, generation))
        elif kind == "p":
            found.providers[text] = _Provider(ident, text, generation)
            found.generations[ident] = generation
        elif kind == "r":
            found.class_ids[text] = ident
        else:
            found.owners[(kind, text)] = ident
    return found


class _Provider(NamedTuple):
    id: int
    uuid: str
    generation: int


def _read_consumers(conn: Connection, uuids: Sequence[str]
                    ) -> tuple[dict[str, consumers.Consumer], list[_OldRow]]:
    """The consumer records among ``uuids`` and all their allocation rows, one query."""
    records: dict[str, consumers.Consumer] = {}
    rows: list[_OldRow] = []
    for kind, ident, uuid, generation, number, user_id, type_id, project, user in conn.execute(
            _CONSUMERS_AND_ROWS, {"consumer_uuids": uuids, "row_uuids": uuids}):
        if kind == "c":
            records[uuid] = consumers.Consumer(ident, uuid, generation, number, user_id, project, user, type_id)
        else:  # an allocation row: amount, provider and class in the consumer's columns
            rows.append(_OldRow(ident, uuid, number, user_id, generation))
    return records, rows


def _check_consumer_generations(requests: Sequence[ConsumerAllocations],
                                existing: Mapping[str, consumers.Consumer]) -> None:
    for request in requests:
        if not request.check_generation:
            continue
        record = existing.get(request.consumer_uuid)
        current = record.generation if record is not None else None
        if request.generation != current:
            raise ConsumerGenerationConflict(current, request.generation)


def _write_consumers(conn: Connection, requests: Sequence[ConsumerAllocations],
                     existing: Mapping[str, consumers.Consumer],
                     incomplete_owner: tuple[str, str], holding: set[str],
                     known_owners: dict[tuple[str, str], int] | None = None) -> None:
    """Swap the generation of (or create, or delete) every consumer written.

    Emptying a consumer deletes its record when it held allocations.  As
    Placement does, emptying a consumer that has no record *creates* one at
    generation 0 (its next write must name 0, not null), and emptying a
    record that holds nothing leaves it as it is.

    Existing records go first, in id order, so that two transactions never
    wait on each other's consumers in opposite orders.
    """
    def order(request: ConsumerAllocations) -> tuple[int, int, str]:
        record = existing.get(request.consumer_uuid)
        return (0, record.id, "") if record else (1, 0, request.consumer_uuid)

    for request in sorted(requests, key=order):
        record = existing.get(request.consumer_uuid)
        conflict = ConsumerConflict if request.check_generation else UnguardedConsumerConflict
        try:
            if not request.resources:
                if record is None:
                    consumers.insert(conn, request.consumer_uuid,
                                     _owner(conn, request, None, incomplete_owner, known_owners), generation=0)
                elif request.consumer_uuid in holding:
                    consumers.delete(conn, record)
                continue
            owner = _owner(conn, request, record, incomplete_owner, known_owners)
            if record is not None:
                consumers.bump(conn, record, owner)
            else:
                consumers.insert(conn, request.consumer_uuid, owner, generation=1)
        except consumers.RecordRace:
            raise
        except ConcurrentUpdate:
            raise conflict() from None


def _owner_names(request: ConsumerAllocations, incomplete_owner: tuple[str, str]) -> tuple[str, str, str | None]:
    """The project and user ``request`` names (the incomplete-consumer ids
    when it names none), and the consumer type it sets (None: it sets none)."""
    project, user = ((request.project_id, request.user_id) if request.project_id is not None
                     else incomplete_owner)
    return project, user, request.consumer_type if request.set_consumer_type else None


def _owner(conn: Connection, request: ConsumerAllocations, record: consumers.Consumer | None,
           incomplete_owner: tuple[str, str],
           known: dict[tuple[str, str], int] | None = None) -> consumers.Owner:
    project, user, new_type = _owner_names(request, incomplete_owner)
    if record is not None and (record.project, record.user) == (project, user) and new_type is None:
        return consumers.Owner(record.project_id, record.user_id, record.consumer_type_id)
    owner = consumers.ensure_owner(conn, project, user, new_type, known=known)
    if new_type is None:
        owner = consumers.Owner(owner.project_id, owner.user_id,
                                record.consumer_type_id if record is not None else None)
    return owner


_USED = (
    sa.select(sa.func.coalesce(sa.func.sum(ALLOC.c.used), 0))
    .where(ALLOC.c.resource_provider_id == INV.c.resource_provider_id,
           ALLOC.c.resource_class_id == INV.c.resource_class_id)
    .scalar_subquery()
)
#: An inventory record's columns, as the capacity check reads them (then its usage).
_INVENTORY_COLUMNS = (INV.c.resource_provider_id, INV.c.resource_class_id, INV.c.total, INV.c.reserved,
                      INV.c.min_unit, INV.c.max_unit, INV.c.step_size, INV.c.allocation_ratio)
_INVENTORY_USAGE = prepared(
    sa.select(*_INVENTORY_COLUMNS, _USED.label("used"))
    .where(INV.c.resource_provider_id.in_(sa.bindparam("provider_ids", expanding=True)),
           INV.c.resource_class_id.in_(sa.bindparam("class_ids", expanding=True)))
)


#: An inventory record with the units allocated from it (``used``), named
#: as the statement's columns (what ``inventory_fit.InventoryLimits`` asks for).
_Record = collections.namedtuple("_Record", _INVENTORY_USAGE.selected_columns.keys())

#: PostgreSQL: the statement of :func:`_claims_text`, without and with
#: the change number's columns (here, below the record it reads).
_CLAIMS_STATEMENTS = {numbered: raw_rows.HandWritten(_claims_text(numbered)) for numbered in (False, True)}


def _bare_classes(conn: Connection, claims: list[Claim], given_up: Sequence[_OldRow]) -> str:
    """The classes Placement names when a provider has no inventory at all:
    every class the request allocates and every class its emptied consumers
    give up (Placement checks those as allocations of 0), in class id
    order; asked of the reference Placement."""
    names = {claim.class_id: claim.class_name for claim in claims}
    unnamed = sorted({row.class_id for row in given_up} - names.keys())
    if unnamed:
        names.update(conn.execute(sa.select(RC.c.id, RC.c.name).where(RC.c.id.in_(unnamed))).all())
    return ", ".join(names[class_id] for class_id in sorted(names))


def _inventory_usage(conn: Connection, provider_ids: set[int], class_ids: set[int]) -> dict[tuple[int, int], tuple]:
    """Inventory records with the total amount allocated from each, one query
    (one a part of a list of providers too long for one statement)."""
    return _by_pair(raw_rows.rows_in_parts(conn, _INVENTORY_USAGE, {"provider_ids": sorted(provider_ids),
                                                                    "class_ids": sorted(class_ids)},
                                           split=("provider_ids",)))


def _by_pair(rows) -> dict[tuple[int, int], tuple]:
    """Rows of :data:`_INVENTORY_USAGE`'s columns, by (provider id, class id)."""
    return {(row[0], row[1]): _Record(*row) for row in rows}


def _check_claims(conn: Connection, claims: list[Claim], *, after_write: bool,
                  growth: Mapping[tuple[int, int], int] | None = None,
                  given_up: Sequence[_OldRow] = (),
                  records: dict[tuple[int, int], tuple] | None = None) -> dict[tuple[int, int], tuple]:
    """Raise the first capacity rule the claims break, as Placement reports it;
    else return the records checked (read here unless given).

    ``after_write``: usage already includes the claims.  Otherwise (the
    oversized-amount guard, before writing) only presence and unit rules
    can fail, because those amounts exceed every ``max_unit``.  With
    ``growth``, usage over capacity is refused only where the write
    increased it.  ``given_up``: the allocations that consumers of the same
    request give up (their classes are named too when a provider has no
    inventory at all, see :func:`_bare_classes`).  ``records``: what
    :func:`_inventory_usage` would read, read already.
    """
    if not claims:
        return {}
    if records is None:
        records = _inventory_usage(conn, {c.provider_id for c in claims}, {c.class_id for c in claims})
    with_inventory = {pid for pid, _ in records}
    bare = list(dict.fromkeys(c.provider_uuid for c in claims if c.provider_id not in with_inventory))
    if bare:
        raise InvalidInventory(_bare_classes(conn, claims, given_up), ", ".join(bare))
    for claim in claims:
        record = records.get((claim.provider_id, claim.class_id))
        if record is None:
            raise InvalidInventory(claim.class_name, claim.provider_uuid)
        if inventory_fit.unit_violation(record, claim.amount) is not None:
            raise ConstraintsViolated(claim.class_name, claim.provider_uuid)
        if (after_write and int(record.used) > inventory_fit.inventory_capacity(record)
                and (growth is None or growth.get((claim.provider_id, claim.class_id), 0) > 0)):
            raise CapacityExceeded(claim.class_name, claim.provider_uuid)
    return records


def delete_allocations(conn: Connection, consumer_uuid: str) -> None:
    """Remove every allocation of a consumer, and its record.

    Placement bumps no provider generation here (removing allocations only
    makes room).  The consumer record is deleted by compare-and-swap on the
    generation read, so a concurrent rewrite of the consumer is noticed
    (``UnguardedConsumerConflict``: re-run, then the new allocations go).
    """
    records, rows = _read_consumers(conn, [consumer_uuid])
    record = records.get(consumer_uuid)
    ids = [row.id for row in rows]
    if not ids:
        raise NotFound(f"No allocations for consumer '{consumer_uuid}'")
    if record is not None:
        try:
            consumers.delete(conn, record)
        except ConcurrentUpdate:
            raise UnguardedConsumerConflict() from None
    for part in raw_rows.parts(ids):
        conn.execute(sa.delete(ALLOC).where(ALLOC.c.id.in_(part)))


# -- reading ----------------------------------------------------------------


@dataclass
class ConsumerView:
    """A consumer's allocations as ``GET /allocations/{c}`` shows them.

    ``has_record`` is false for allocations written before consumer
    records existed: they have no generation, project or user yet.
    """

    allocations: dict[str, dict]
    has_record: bool
    generation: int | None
    project: str | None
    user: str | None
    consumer_type: str | None
    last_modified: datetime.datetime | None


_FOR_CONSUMER = prepared(
    sa.select(RP.c.uuid, RP.c.generation, RC.c.name, ALLOC.c.used, ALLOC.c.created_at,
              ALLOC.c.updated_at, _C.c.id.label("consumer_id"), _C.c.generation.label("consumer_generation"),
              _P.c.external_id.label("project"), _U.c.external_id.label("user"),
              _T.c.name.label("consumer_type"))
    .select_from(ALLOC)
    .join(RP, RP.c.id == ALLOC.c.resource_provider_id)
    .join(RC, RC.c.id == ALLOC.c.resource_class_id)
    .outerjoin(_C, _C.c.uuid == ALLOC.c.consumer_id)
    .outerjoin(_P, _P.c.id == _C.c.project_id)
    .outerjoin(_U, _U.c.id == _C.c.user_id)
    .outerjoin(_T, _T.c.id == _C.c.consumer_type_id)
    .where(ALLOC.c.consumer_id == sa.bindparam("consumer"))
)


def for_consumer(conn: Connection, consumer_uuid: str) -> ConsumerView | None:
    """The consumer's allocations by provider uuid (one query); None if it has none."""
    rows = conn.execute(_FOR_CONSUMER, {"consumer": consumer_uuid}).all()
    if not rows:
        return None
    allocations: dict[str, dict] = {}
    for row in rows:
        entry = allocations.setdefault(row.uuid, {"generation": row.generation, "resources": {}})
        entry["resources"][row.name] = row.used
    first = rows[0]
    return ConsumerView(
        allocations=allocations,
        has_record=first.consumer_id is not None,
        generation=first.consumer_generation,
        project=first.project,
        user=first.user,
        consumer_type=first.consumer_type,
        last_modified=_newest(rows),
    )


@dataclass
class ProviderView:
    """A provider's allocations as ``GET /resource_providers/{u}/allocations`` shows them."""

    generation: int
    allocations: dict[str, dict]
    consumer_generations: dict[str, int | None]
    last_modified: datetime.datetime | None


_FOR_PROVIDER = prepared(
    sa.select(RP.c.generation.label("provider_generation"), ALLOC.c.consumer_id, RC.c.name,
              ALLOC.c.used, ALLOC.c.created_at, ALLOC.c.updated_at,
              _C.c.generation.label("consumer_generation"))
    .select_from(RP)
    .outerjoin(ALLOC, ALLOC.c.resource_provider_id == RP.c.id)
    .outerjoin(RC, RC.c.id == ALLOC.c.resource_class_id)
    .outerjoin(_C, _C.c.uuid == ALLOC.c.consumer_id)
    .where(RP.c.uuid == sa.bindparam("provider"))
)


def for_provider(conn: Connection, provider_uuid: str) -> ProviderView | None:
    """Allocations against a provider by consumer uuid (one query); None if no such provider."""
    rows = conn.execute(_FOR_PROVIDER, {"provider": provider_uuid}).all()
    if not rows:
        return None
    allocations: dict[str, dict] = {}
    generations_: dict[str, int | None] = {}
    for row in rows:
        if row.consumer_id is None:
            continue
        allocations.setdefault(row.consumer_id, {"resources": {}})["resources"][row.name] = row.used
        generations_[row.consumer_id] = row.consumer_generation
    present = [row for row in rows if row.consumer_id is not None]
    return ProviderView(rows[0].provider_generation, allocations, generations_, _newest(present))


def _newest(rows: Sequence[Row]) -> datetime.datetime | None:
    stamps = [row.updated_at or row.created_at for row in rows]
    stamps = [s for s in stamps if s is not None]
    return max(stamps) if stamps else None
