"""Answers of ``GET /allocation_candidates`` kept while nothing has changed.

An answer (its encoded JSON) is kept under the query string and
microversion that asked for it, with the database's change number read
*before* the data it was computed from (:mod:`allotment.db.changes`).  It
is given again only to a request that reads the same number first in its
own read transaction: no write to any table a candidate depends on has
committed in between, by anyone, so computing afresh would read the same
rows and give the same bytes.  (The answer depends on nothing else: the
options that shape it are part of the key, and randomised answers are
never kept.)

The number is the same for every answer, so one change retires them all:
the first request to see a new number empties the cache.  Memory is
bounded by ``[allotment] candidates_cache_mb`` (the encoded bodies plus a
small allowance per entry), least recently used first out; an answer
larger than a quarter of it is not kept.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

#: Bytes counted per entry beside its body (key, entry, dict slot).
ENTRY_OVERHEAD = 400


@dataclasses.dataclass(frozen=True)
class Answer:
    body: bytes
    #: allocation requests in it (for metrics)
    count: int
    #: whether generation stopped at the safety cap (logged again when reused)
    capped: bool = False


class AnswerCache:
    """A bounded LRU of answers valid at one change number; thread-safe."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[tuple, Answer] = collections.OrderedDict()
        self._number: int | None = None
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> int:
        """Bytes counted now."""
        return self._size

    def __len__(self) -> int:
        return len(self._entries)

    def _at(self, number: int) -> None:
        if number != self._number:
            self._entries.clear()
            self._size = 0
            self._number = number

    def get(self, key: tuple, number: int | None) -> Answer | None:
        """The answer kept for ``key`` at change number ``number``, if any."""
        if number is None:
            return None
        with self._lock:
            self._at(number)
            answer = self._entries.get(key)
            if answer is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return answer

    def put(self, key: tuple, number: int | None, answer: Answer) -> None:
        """Keep ``answer``, computed from data read after ``number`` was."""
        cost = len(answer.body) + ENTRY_OVERHEAD
        if number is None or cost * 4 > self.max_bytes:
            return
        # A copy of the size counted: orjson's bytes keep the room its
        # writer grew to (at least 4 KiB; about 1.4x a large body).
        answer = dataclasses.replace(answer, body=memoryview(answer.body).tobytes())
        with self._lock:
            if number != self._number:
                # Either older than what another request has seen (already
                # out of date) or newer (the next get empties the cache).
                return
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._size -= len(previous.body) + ENTRY_OVERHEAD
            self._entries[key] = answer
            self._size += cost
            while self._size > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._size -= len(dropped.body) + ENTRY_OVERHEAD
