"""The provider mirror follows this process's committed writes only when
they are exactly the commits between its number and a request's: known
before the request read its number, and as many as the number moved."""

from __future__ import annotations

from types import SimpleNamespace

from allotment.db import changes, provider_mirror
from allotment.db.provider_cache import ProviderCaches
from allotment.domain.provider_tree import Provider, ProviderInventory

POSTGRESQL = SimpleNamespace(dialect=SimpleNamespace(name="postgresql"))
HISTORY = 5 << changes.TOKEN_SHIFT  # some database identity, above the count
VCPU = 0


def _mirror(monkeypatch):
    """A mirror at change 10 of providers 1 and 2 (8 VCPU each, none used);
    what a refresh or a follow made is recorded instead of made."""
    mirror = provider_mirror.ProviderMirror(ProviderCaches())
    providers = {pid: Provider(pid, f"uuid-{pid}", generation=1, inventories={"VCPU": ProviderInventory(8)})
                 for pid in (1, 2)}
    mirror._state = (HISTORY + 10, SimpleNamespace(snapshot=providers), None)
    mirror._class_names = {VCPU: "VCPU"}
    made = []

    def refresh(conn, state):
        made.append("read")
        mirror._state = (HISTORY + 99, SimpleNamespace(snapshot=providers), None)
        return "read"

    def successor(old, changed, ids):
        made.append({p.id: (p.generation, p.inventories["VCPU"].used) for p in changed})
        return SimpleNamespace(snapshot=providers)

    monkeypatch.setattr(mirror, "_pg_snapshot", refresh)
    monkeypatch.setattr(mirror, "_successor", successor)
    return mirror, made


def _claim(began: int, pid: int, used: int) -> changes.OwnWrite:
    """A claim on provider ``pid`` that began from change ``began``, leaving ``used`` VCPU used."""
    return changes.OwnWrite(HISTORY + began, {pid: 2}, {(pid, VCPU): (pid, VCPU, 8, 0, 1, 8, 1, 1.0, used)},
                            after=HISTORY + began + 1)


def test_a_write_told_after_the_number_was_read_is_not_followed(monkeypatch):
    """Another writer's commit is change 11; this process's write began
    from 10 too, so committed as 12, after the request read 11.  Followed,
    it would stand in the mirror for change 11, which it is not."""
    mirror, made = _mirror(monkeypatch)
    known = mirror.mark()  # the request marks, then reads its number: 11
    mirror.wrote(_claim(10, 1, 4))  # this process's write commits, and is told
    mirror.snapshot(POSTGRESQL, HISTORY + 11, known)
    assert made == ["read"]
    assert mirror.own_writes_followed == 0


def test_a_write_told_before_the_number_was_read_is_followed(monkeypatch):
    mirror, made = _mirror(monkeypatch)
    mirror.wrote(_claim(10, 1, 4))
    mirror.snapshot(POSTGRESQL, HISTORY + 11, mirror.mark())
    assert made == [{1: (2, 4)}]
    assert mirror.own_writes_followed == 1


def test_writes_that_began_from_the_same_number_are_followed_together(monkeypatch):
    """Two claims whose last statements both saw change 10 (different
    providers: on one provider the later swap fails) are changes 11 and
    12, in either order."""
    mirror, made = _mirror(monkeypatch)
    mirror.wrote(_claim(10, 1, 4))
    mirror.wrote(_claim(10, 2, 3))
    mirror.snapshot(POSTGRESQL, HISTORY + 12, mirror.mark())
    assert made == [{1: (2, 4), 2: (2, 3)}]
    assert mirror.own_writes_followed == 2


def test_a_commit_not_known_makes_the_mirror_read(monkeypatch):
    """Two commits since the mirror's number, one of them known: the other
    (another process's) could have written anything."""
    mirror, made = _mirror(monkeypatch)
    mirror.wrote(_claim(10, 1, 4))
    mirror.snapshot(POSTGRESQL, HISTORY + 12, mirror.mark())
    assert made == ["read"]


def test_without_a_mark_nothing_is_followed(monkeypatch):
    mirror, made = _mirror(monkeypatch)
    mirror.wrote(_claim(10, 1, 4))
    mirror.snapshot(POSTGRESQL, HISTORY + 11)
    assert made == ["read"]


def test_writes_to_one_provider_are_applied_in_the_order_they_began(monkeypatch):
    """The later write read the provider after the earlier had committed:
    its generation and usage are the provider's, whatever order they were
    told in."""
    mirror, made = _mirror(monkeypatch)
    later = changes.OwnWrite(HISTORY + 11, {1: 3}, {(1, VCPU): (1, VCPU, 8, 0, 1, 8, 1, 1.0, 6)},
                             after=HISTORY + 12)
    mirror.wrote(later)
    mirror.wrote(_claim(10, 1, 4))
    mirror.snapshot(POSTGRESQL, HISTORY + 12, mirror.mark())
    assert made == [{1: (3, 6)}]


def test_a_write_that_began_below_the_mirror_takes_no_place(monkeypatch):
    """A write that began from 9 may be in the mirror at 10 already: with
    one from 10, two known writes are not the two commits since 10."""
    mirror, made = _mirror(monkeypatch)
    mirror.wrote(_claim(9, 2, 3))
    mirror.wrote(_claim(10, 1, 4))
    mirror.snapshot(POSTGRESQL, HISTORY + 12, mirror.mark())
    assert made == ["read"]


def test_a_write_with_usage_where_it_swapped_no_generation_is_not_followed(monkeypatch):
    mirror, made = _mirror(monkeypatch)
    mirror.wrote(changes.OwnWrite(HISTORY + 10, {1: 2}, {(2, VCPU): (2, VCPU, 8, 0, 1, 8, 1, 1.0, 3)},
                                  after=HISTORY + 11))
    mirror.snapshot(POSTGRESQL, HISTORY + 11, mirror.mark())
    assert made == ["read"]


SQLITE = SimpleNamespace(dialect=SimpleNamespace(name="sqlite"))


def test_sqlite_writes_count_each_row(monkeypatch):
    """On SQLite a write moves the number by the rows it wrote (here 3,
    from 10 to 13): followed when the number is 13, read at 14."""
    mirror, made = _mirror(monkeypatch)

    def read(conn, state, changed):
        made.append("read")
        return SimpleNamespace(snapshot=state[1].snapshot)

    monkeypatch.setattr(provider_mirror.changes, "changed_providers", lambda conn, since, number: {1})
    monkeypatch.setattr(mirror, "_changed", read)
    write = changes.OwnWrite(HISTORY + 10, {1: 2}, {(1, VCPU): (1, VCPU, 8, 0, 1, 8, 1, 1.0, 4)},
                             after=HISTORY + 13)
    mirror.wrote(write)
    mirror.snapshot(SQLITE, HISTORY + 14, mirror.mark())
    assert made == ["read"]
    mirror._state = (HISTORY + 10, mirror._state[1], HISTORY + 10)
    mirror.wrote(write)
    mirror.snapshot(SQLITE, HISTORY + 13, mirror.mark())
    assert made == ["read", {1: (2, 4)}]
