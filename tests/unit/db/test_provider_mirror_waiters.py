"""PostgreSQL: readers that waited for another thread's refresh of the
provider mirror take the mirror it made, when it is not older than what
they must see, instead of each refreshing it again in turn."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from allotment.db import changes, provider_mirror
from allotment.db.provider_cache import ProviderCaches

POSTGRESQL = SimpleNamespace(dialect=SimpleNamespace(name="postgresql"))
HISTORY = 5 << changes.TOKEN_SHIFT  # some database identity, above the count


def _mirror(monkeypatch, refreshed_to: list[int]):
    """A mirror at change 10 whose refresh blocks until released, then
    sets the number given next in ``refreshed_to``; its refreshes counted."""
    mirror = provider_mirror.ProviderMirror(ProviderCaches())
    mirror._state = (HISTORY + 10, "snapshot at 10", None)
    started, release, calls = threading.Event(), threading.Event(), []

    def refresh(conn, state):
        calls.append(state[0] - HISTORY)
        started.set()
        release.wait(5)
        number = refreshed_to.pop(0)
        mirror._state = (HISTORY + number, f"snapshot at {number}", None)
        return mirror._state[1]

    monkeypatch.setattr(mirror, "_pg_snapshot", refresh)
    return mirror, started, release, calls


def _waiting_reader(mirror, started, release, number: int) -> str:
    """A first reader starts a refresh; a second, at ``number``, arrives
    while it runs; returns what the second got."""
    first = threading.Thread(target=mirror.snapshot, args=(POSTGRESQL, HISTORY + 12))
    first.start()
    assert started.wait(5)
    got = {}
    second = threading.Thread(target=lambda: got.update(value=mirror.snapshot(POSTGRESQL, HISTORY + number)))
    second.start()
    second.join(0.2)  # it waits for the lock the first holds
    release.set()
    first.join(5)
    second.join(5)
    return got["value"]


def test_a_reader_that_waited_takes_the_newer_mirror(monkeypatch):
    mirror, started, release, calls = _mirror(monkeypatch, [13, 99])
    assert _waiting_reader(mirror, started, release, 11) == "snapshot at 13"
    assert calls == [10]  # one refresh, not two


def test_a_reader_that_waited_refreshes_when_the_mirror_is_still_older(monkeypatch):
    """The refresh it waited for began before the reader's number was read
    (its number is lower): the reader must not take it."""
    mirror, started, release, calls = _mirror(monkeypatch, [12, 14])
    assert _waiting_reader(mirror, started, release, 13) == "snapshot at 14"
    assert calls == [10, 12]


def test_a_reader_that_did_not_wait_still_refreshes(monkeypatch):
    """A newer mirror that was there before the reader came (a database gone
    back in time gives lower numbers) is checked by a refresh of its own."""
    mirror, _, release, calls = _mirror(monkeypatch, [8])
    release.set()
    assert mirror.snapshot(POSTGRESQL, HISTORY + 9) == "snapshot at 8"
    assert calls == [10]
