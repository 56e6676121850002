"""The garbage collector held off while a request builds and drops its objects.

The pause is the API's, at the edge: the handlers that run the solver
(``GET /allocation_candidates``, ``GET /allotment/explain``) hold it around
reading, solving and shaping the answer; the solver and the database layer
know nothing of it.  :data:`gc_paused` is the process's one switch: the
collector is process-wide, and two counters would switch it on under each
other.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator


class CollectorPause:
    """Hold off the cyclic garbage collector while a request's objects
    pile up; safe with several threads per process.

    A request builds tens of thousands of small containers (snapshot,
    candidates, summaries) and none forms a cycle, yet with the collector
    on, each full collection walks every object of the process again
    (measured: about a third of a 2,000-root request, 60% of 300k
    candidates).  Reference counting still frees everything.

    The collector is off while at least one holder is inside (a counter,
    not "was it enabled", so one thread ending cannot switch it back on
    under another, nor leave it off).  Should holders overlap without a
    break for longer than :attr:`MAX_PAUSE` seconds, the one leaving then
    runs a collection, so cycles made elsewhere cannot pile up forever.
    """

    MAX_PAUSE = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._we_disabled = False
        self._since = 0.0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._we_disabled = gc.isenabled()
                gc.disable()
                self._since = time.monotonic()
            self._holders += 1
        try:
            yield
        finally:
            collect = False
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    if self._we_disabled:
                        gc.enable()
                elif (self._we_disabled and time.monotonic() - self._since
                      > self.MAX_PAUSE):
                    self._since = time.monotonic()
                    collect = True
            if collect:
                gc.collect()


#: ``with gc_paused(): ...`` around work that allocates much and frees it
#: at the end (reentrant; see :class:`CollectorPause`).
gc_paused = CollectorPause()
