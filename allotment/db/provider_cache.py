"""What the candidate loader keeps per process about providers.

:class:`ProviderCaches` is the one object that holds it; the application's
:class:`~allotment.api.state.ProcessState` makes one per process and hands
it to :func:`allotment.db.allocation_candidates.load_candidates` and to the
provider mirror.  Nothing here is a module global.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from allotment.db import raw_rows


class GenerationCache:
    """Something about a provider, by (id, uuid, generation), for this process.

    Sound with any number of processes writing, for what every writer
    changes together with the provider's generation compare-and-swap
    (traits: :mod:`allotment.db.traits`; inventory records:
    :mod:`allotment.db.inventories` and the reshaper): a value is kept with
    the generation read *in the same statement*, and used only when the
    request's own snapshot read that generation.  The uuid guards against
    an id reused by a new provider.

    Bounded: emptied when it holds ``MAX_ENTRIES`` providers.  Equal values
    are kept once (:meth:`shared`): a cloud's hosts mostly share their
    trait sets and inventory records, so an entry costs little more than
    its key (measured at large scale: about 0.65 KiB per provider for the
    traits, records and inventories caches together, against 2.3 KiB with
    a copy per provider; docs/performance.md's Memory lists all four).
    """

    MAX_ENTRIES = 200_000

    def __init__(self) -> None:
        self._entries: dict[int, tuple[str, int, object]] = {}
        # value -> the one copy of it kept (at most one per entry)
        self._values: dict = {}

    def get(self, provider_id: int, uuid: str, generation: int):
        entry = self._entries.get(provider_id)
        if entry is not None and entry[1] == generation and entry[0] == uuid:
            return entry[2]
        return None

    def put(self, provider_id: int, uuid: str, generation: int, value) -> None:
        if len(self._entries) >= self.MAX_ENTRIES:
            self.clear()
        self._entries[provider_id] = (uuid, generation, value)

    def kept(self, key):
        """The value kept under ``key`` (hashable) by :meth:`keep`, or None."""
        return self._values.get(key)

    def keep(self, key, value):
        """Keep ``value`` under ``key`` (at most ``MAX_ENTRIES`` of them)."""
        if len(self._values) >= self.MAX_ENTRIES:
            self._values = {}
        self._values[key] = value
        return value

    def shared(self, value):
        """The one copy kept of values equal to ``value`` (hashable)."""
        known = self._values.get(value)
        return self.keep(value, value) if known is None else known

    def clear(self) -> None:
        self._entries = {}
        self._values = {}

    def fetch(self, conn: Connection, statement: sa.Executable,
              providers: Iterable[tuple[int, str, int]]) -> dict:
        """The value of each (id, uuid, generation) provider: cached where
        current, else read with ``statement`` (rows of id, uuid,
        generation, then the item's columns, the first of them None for a
        provider without items) and kept as a tuple of items (an item of
        several columns is a tuple)."""
        found = {}
        missing = {}
        for pid, uuid, generation in providers:
            known = self.get(pid, uuid, generation)
            if known is None:
                missing[pid] = uuid
            else:
                found[pid] = known
        if missing:
            read: dict[int, list] = {}
            seen: dict[int, tuple[str, int]] = {}
            for row in raw_rows.rows_in_parts(conn, statement, {"ids": list(missing)}):
                pid = row[0]
                items = read.get(pid)
                if items is None:
                    items = read[pid] = []
                    seen[pid] = (row[1], row[2])
                if row[3] is not None:
                    items.append(self.shared(row[3] if len(row) == 4 else tuple(row[3:])))
            for pid, items in read.items():
                found[pid] = value = self.shared(tuple(items))
                uuid, generation = seen[pid]
                # The caller's copy of an equal uuid: one copy per provider.
                asked = missing[pid]
                self.put(pid, asked if asked == uuid else uuid, generation, value)
        return found


class ProviderCaches:
    """The per-generation caches of the candidate loader, together.

    * ``traits``: a provider's trait names;
    * ``records``: its inventory records without usage;
    * ``inventories``: its inventories with usage as built last time, with
      the usage they were built from (reused while usage and class names
      stay the same);
    * ``providers``: the provider as built last time, (parent id, root id,
      class ids of its records, their usage, the Provider), reused while
      those are the same.

    Each is keyed on (provider id, uuid, generation), bounded by
    :attr:`GenerationCache.MAX_ENTRIES` providers, and dropped whole by
    :meth:`forget` (the database went back in time or was replaced, or a
    connection was lost where no change number tells). The last two are
    also dropped when the class names change (:meth:`note_class_names`:
    a class renamed before 1.7 bumps no generation).
    """

    def __init__(self) -> None:
        self.traits = GenerationCache()
        self.records = GenerationCache()
        self.inventories = GenerationCache()
        self.providers = GenerationCache()
        #: The class names the built inventories were named with.
        self.class_names: dict[int, str] = {}

    def forget(self) -> None:
        """Empty every cache: the database they were read from went back in
        time or was replaced, so a provider's generation no longer says
        which of its states it is."""
        for cache in (self.traits, self.records, self.inventories, self.providers):
            cache.clear()

    def note_class_names(self, class_names: dict[int, str]) -> None:
        """Forget built inventories when a class was renamed (possible
        before 1.7, and no provider generation changes with it)."""
        if class_names != self.class_names:
            self.inventories.clear()
            self.providers.clear()
            self.class_names = class_names
