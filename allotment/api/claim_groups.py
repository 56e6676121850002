"""Claims of one process committed together (``[allotment] claims_together``).

A scheduler's claim (``PUT /allocations/{new consumer}``) is one small
transaction; most of what it costs the database is the transaction itself:
its messages, the wake-ups of its backend, the triggers' firings per
statement, the commit's flush.  When several claims are waiting in one
process at once, this module lets one of them write them all in one
transaction (group commit), as ``POST /allocations`` writes several
consumers: the same statements whatever their number.

Only claims that say their consumer is new (``consumer_generation``
null, microversion 1.28 on) are grouped; other writes go as without
this module.  No claim waits for company: a claim that finds no other
claim of the process being written writes alone, at once.  Claims that
arrive meanwhile queue; when the running write ends, the first of them
writes the queue (or as much of it as one transaction takes) in one
transaction, and so on.  The price: a worker writes one claim or group
at a time, so a claim that waits long (for a provider's lock another
host holds, say) holds up the claims queued behind it, where without
this module they would have been written beside it.

A group either commits as a whole or changes nothing; then each of its
claims is written again alone, by its own request, exactly as without
this module (its errors, retries and messages are its own).  After
groups refused in a row (:data:`REFUSED_IN_A_ROW`), the process's next
claims (:data:`ALONE_AFTER_REFUSAL`) are written alone at once: where
most claims are refused, most groups would be.  So grouping
changes no answer a client can tell apart, but one: two claims of a group
on one provider advance its generation once, as one ``POST /allocations``
does, where two transactions would advance it twice.  A client never sees
a generation between them either way.

What a group's transaction needs is in :func:`allotment.db.allocations.write_allocations`
(several new consumers whose owners exist, on PostgreSQL: three messages).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

LOG = logging.getLogger(__name__)

#: At most this many claims a group.
MOST_CLAIMS = 8
#: At most this many allocation rows a group: as many as
#: ``write_allocations(together=True)`` writes as one (its
#: ``_INSERT_ROWS_KEPT``; it refuses more with ``NotTogether``).
MOST_ROWS = 16
#: Writes of claims a process runs at once; claims beyond wait and are
#: written together next.
WRITERS = 1
#: After this many groups in a row that could not commit, the process's
#: next :data:`ALONE_AFTER_REFUSAL` claims are written alone, at once, as
#: without groups: where most claims are refused (a cloud at the edge of
#: its capacity) most groups are, and each of their claims would be
#: written twice.  (In a race on a cloud with room, 5-7% of the groups were
#: refused, seldom two in a row.)
REFUSED_IN_A_ROW = 2
ALONE_AFTER_REFUSAL = 32

#: What a waiting claim is told.
_COMMITTED, _ALONE, _LEAD, _FAILED = "committed", "alone", "lead", "failed"


@dataclass(eq=False)
class _Waiting:
    request: object
    rows: int
    event: threading.Event = field(default_factory=threading.Event)
    told: str = ""
    #: with ``_LEAD``: the group this claim now writes, itself first
    group: list = field(default_factory=list)
    #: with ``_FAILED``: what its group's write raised
    error: BaseException | None = None


def rows_of(request) -> int:
    """The allocation rows a request writes (one per provider and class)."""
    return sum(len(resources) for resources in request.resources.values())


class ClaimGroups:
    """The claims of one process, written alone or in groups (see the module doc).

    ``groups`` and ``grouped``: how many groups of more than one claim
    committed, and how many claims they held; ``on_group(claims,
    committed)`` is told of every group of more than one claim (the
    metrics)."""

    def __init__(self, most_claims: int = MOST_CLAIMS, most_rows: int = MOST_ROWS, writers: int = WRITERS):
        self.most_claims, self.most_rows, self.writers = most_claims, most_rows, writers
        self._lock = threading.Lock()
        self._queue: list[_Waiting] = []
        #: writes running (at most ``writers``)
        self._running = 0
        #: groups refused in a row, and claims still to be written alone since
        self._refused = 0
        self._alone_left = 0
        self.groups = 0
        self.grouped = 0
        self.on_group: Callable[[int, bool], None] | None = None

    def claim(self, request, alone: Callable[[], None], together: Callable[[Sequence], bool]) -> None:
        """Write ``request``: ``alone()`` writes it in a transaction of its own
        (and raises its errors); ``together(requests)`` writes a group in one
        transaction and says whether it committed, where it did not having
        changed nothing.  What ``together`` raises (only what leaves the
        outcome unknown: each claim written again could be written twice)
        is raised to every claim of the group."""
        me = _Waiting(request, rows_of(request))
        with self._lock:
            if self._alone_left > 0:
                self._alone_left -= 1
                lead = None
            elif self._running >= self.writers:
                self._queue.append(me)
                lead = False
            else:
                self._running += 1
                lead = True
        if lead is None:  # lately refused: alone, beside the other writes
            alone()
            return
        if not lead:
            me.event.wait()
            if me.told == _COMMITTED:
                return
            if me.told == _ALONE:
                alone()
                return
            if me.told == _FAILED:
                raise me.error
        group = me.group or [me]
        committed = False
        failure: BaseException | None = None
        try:
            if len(group) == 1:
                # No company: the write as without groups, in this thread.
                alone()
                committed = True
                return
            committed = together([waiting.request for waiting in group])
        except BaseException as error:
            failure = error
            raise
        finally:
            # The others and the next group first: nothing below may keep them waiting.
            for other in group[1:]:
                other.told = _COMMITTED if committed else _FAILED if failure is not None else _ALONE
                other.error = failure
                other.event.set()
            if len(group) > 1 and failure is None:
                with self._lock:
                    if committed:
                        self.groups += 1
                        self.grouped += len(group)
                        self._refused = 0
                    else:
                        self._refused += 1
                        if self._refused >= REFUSED_IN_A_ROW:
                            self._refused = 0
                            self._alone_left = ALONE_AFTER_REFUSAL
            self._next()
            if len(group) > 1 and failure is None and self.on_group is not None:
                try:
                    self.on_group(len(group), committed)
                except Exception:  # noqa: BLE001 - a count must not fail the claims
                    LOG.exception("could not count a group of claims")
        if not committed:
            alone()

    def _next(self) -> None:
        """A running write ended: the first claim waiting writes the next group."""
        with self._lock:
            if not self._queue:
                self._running -= 1
                return
            group, rows, uuids, left = [], 0, set(), []
            for waiting in self._queue:
                uuid = waiting.request.consumer_uuid
                if (len(group) < self.most_claims and rows + waiting.rows <= self.most_rows
                        and uuid not in uuids) or not group:
                    group.append(waiting)
                    rows += waiting.rows
                    uuids.add(uuid)
                else:
                    left.append(waiting)
            self._queue = left
        first = group[0]
        first.group = group
        first.told = _LEAD
        first.event.set()
