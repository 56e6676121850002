"""Claims committed together (allotment.api.claim_groups): who writes what.

Real threads, no database: ``alone`` and ``together`` stand for the two
kinds of transaction and record what they were given.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from allotment.api.claim_groups import ClaimGroups


def _claim(consumer: str, rows: int = 3):
    """A request as the groups see it: a consumer and its allocation rows."""
    return SimpleNamespace(consumer_uuid=consumer, resources={"rp": {f"C{i}": 1 for i in range(rows)}})


class _Recorder:
    """``alone`` / ``together`` callables that record their calls; the first
    ``alone`` call waits for ``release`` (a write still running)."""

    def __init__(self, commit: bool = True):
        self.commit = commit
        self.alone: list[str] = []
        self.together: list[list[str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def alone_of(self, request, fail: Exception | None = None):
        def alone():
            with self.lock:
                first = not self.alone
                self.alone.append(request.consumer_uuid)
            if first:
                self.started.set()
                assert self.release.wait(10)
            if fail is not None:
                raise fail
        return alone

    def write_together(self, requests) -> bool:
        with self.lock:
            self.together.append([r.consumer_uuid for r in requests])
        return self.commit


def _run(groups: ClaimGroups, recorder: _Recorder, request, errors: dict, fail: Exception | None = None):
    def target():
        try:
            groups.claim(request, recorder.alone_of(request, fail), recorder.write_together)
        except Exception as error:  # noqa: BLE001 - recorded for the test
            errors[request.consumer_uuid] = error
    thread = threading.Thread(target=target)
    thread.start()
    return thread


def _queued(groups: ClaimGroups, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(groups._queue) < count:
        assert time.monotonic() < deadline, "the claims never queued"
        time.sleep(0.001)


def _behind_a_running_write(groups: ClaimGroups, recorder: _Recorder, errors: dict, names: str,
                            first_fails: Exception | None = None, failing: dict | None = None) -> None:
    """Claim "a", then, while its write runs, each of ``names`` in turn (each
    queued before the next starts); then let "a" finish and wait for all."""
    first = _run(groups, recorder, _claim("a"), errors, first_fails)
    assert recorder.started.wait(10)
    waiting = []
    for name in names:
        waiting.append(_run(groups, recorder, _claim(name), errors, (failing or {}).get(name)))
        _queued(groups, len(waiting))
    recorder.release.set()
    for thread in [first, *waiting]:
        thread.join(10)
    assert not any(thread.is_alive() for thread in [first, *waiting])


def test_a_claim_alone_is_written_alone_at_once():
    groups, recorder = ClaimGroups(), _Recorder()
    recorder.release.set()
    groups.claim(_claim("a"), recorder.alone_of(_claim("a")), recorder.write_together)
    assert recorder.alone == ["a"] and recorder.together == []
    assert groups.groups == 0 and groups._running == 0


def test_claims_that_wait_for_a_running_write_are_written_together_in_one_transaction():
    groups, recorder, errors = ClaimGroups(), _Recorder(), {}
    seen = []
    groups.on_group = lambda claims, committed: seen.append((claims, committed))
    _behind_a_running_write(groups, recorder, errors, "bcd")
    assert errors == {}
    assert recorder.alone == ["a"]
    assert recorder.together == [["b", "c", "d"]]
    assert (groups.groups, groups.grouped) == (1, 3) and seen == [(3, True)]
    assert groups._running == 0 and groups._queue == []


def test_a_group_that_cannot_commit_is_written_claim_by_claim_each_with_its_own_error():
    groups, recorder, errors = ClaimGroups(), _Recorder(commit=False), {}
    seen = []
    groups.on_group = lambda claims, committed: seen.append((claims, committed))
    refused = ValueError("c does not fit")
    _behind_a_running_write(groups, recorder, errors, "bc", failing={"c": refused})
    assert recorder.together == [["b", "c"]]
    assert sorted(recorder.alone) == ["a", "b", "c"]
    assert errors == {"c": refused}, "only the claim that failed alone fails"
    assert groups.groups == 0 and seen == [(2, False)]


def test_one_consumer_is_never_twice_in_a_group_and_a_group_keeps_to_its_rows():
    groups, recorder, errors = ClaimGroups(most_claims=8, most_rows=6), _Recorder(), {}
    _behind_a_running_write(groups, recorder, errors, "bbcd")  # 3 rows each: two claims a group
    assert errors == {}
    assert recorder.together[0] == ["b", "c"], recorder.together
    # What the first group left: the second "b" and "d", together next.
    assert recorder.together[1:] == [["b", "d"]], recorder.together
    assert groups._running == 0


@pytest.mark.parametrize("failing_first", [True, False])
def test_the_next_group_is_written_whether_the_running_write_failed_or_not(failing_first):
    groups, recorder, errors = ClaimGroups(), _Recorder(), {}
    boom = RuntimeError("the first write failed")
    _behind_a_running_write(groups, recorder, errors, "bc", first_fails=boom if failing_first else None)
    assert recorder.together == [["b", "c"]]
    assert errors == ({"a": boom} if failing_first else {})


def test_a_group_whose_outcome_is_unknown_tells_every_claim_and_writes_none_again():
    """What the group's write raises (a commit whose outcome is unknown)
    reaches every claim of the group; none is written again alone, which
    could write it twice."""
    groups, errors = ClaimGroups(), {}
    unknown = ConnectionError("lost during COMMIT")

    class Unknown(_Recorder):
        def write_together(self, requests):
            super().write_together(requests)
            raise unknown

    recorder = Unknown()
    _behind_a_running_write(groups, recorder, errors, "bc")
    assert recorder.together == [["b", "c"]] and recorder.alone == ["a"]
    assert errors == {"b": unknown, "c": unknown}
    assert groups._running == 0


def test_with_two_writers_a_second_claim_is_written_at_once_and_a_third_waits():
    groups, errors = ClaimGroups(writers=2), {}
    release = threading.Event()
    running, together = [], []
    lock = threading.Lock()

    def alone_of(name):
        def alone():
            with lock:
                running.append(name)
            assert release.wait(10)
        return alone

    def write_together(requests):
        together.append([r.consumer_uuid for r in requests])
        return True

    def claim(request, name):
        try:
            groups.claim(request, alone_of(name), write_together)
        except Exception as error:  # noqa: BLE001 - recorded for the test
            errors[name] = error

    threads = []
    for name in "abcd":
        thread = threading.Thread(target=claim, args=(_claim(name), name))
        thread.start()
        threads.append(thread)
        if name in "ab":  # each starts its write at once
            deadline = time.monotonic() + 10
            while name not in running:
                assert time.monotonic() < deadline
                time.sleep(0.001)
        else:
            _queued(groups, "abcd".index(name) - 1)
    assert running == ["a", "b"] and groups._running == 2
    release.set()
    for thread in threads:
        thread.join(10)
    # The first write to end hands its place to "c", which writes the queue.
    assert together == [["c", "d"]] and running == ["a", "b"]
    assert groups._running == 0 and errors == {}


def test_after_a_refused_group_the_next_claims_are_written_alone_at_once():
    """Where most claims are refused most groups are: after one, the next
    claims go alone, beside a write still running, none waiting."""
    from allotment.api import claim_groups

    groups, recorder, errors = ClaimGroups(), _Recorder(commit=False), {}
    _behind_a_running_write(groups, recorder, errors, "bc")
    assert recorder.together == [["b", "c"]]
    assert groups._alone_left == 0, "one refused group is no sign"
    recorder.alone.clear()
    recorder.started.clear()
    recorder.release.clear()
    _behind_a_running_write(groups, recorder, errors, "de")
    assert recorder.together == [["b", "c"], ["d", "e"]]
    assert claim_groups.REFUSED_IN_A_ROW == 2
    assert groups._alone_left == claim_groups.ALONE_AFTER_REFUSAL
    # A write running (it holds the one writer's place) ...
    recorder.release.clear()
    blocking = threading.Event()
    holder = threading.Thread(target=groups.claim, args=(_claim("x"), lambda: blocking.wait(10),
                                                         recorder.write_together))
    groups._alone_left = 0
    holder.start()
    deadline = time.monotonic() + 10
    while groups._running == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    groups._alone_left = 2
    # ... and still the next claims are written at once, alone.
    written = []
    for name in "yz":
        groups.claim(_claim(name), lambda name=name: written.append(name), recorder.write_together)
    assert written == ["y", "z"] and groups._alone_left == 0 and groups._queue == []
    blocking.set()
    holder.join(10)
    assert recorder.together == [["b", "c"], ["d", "e"]] and groups._running == 0


def test_a_count_that_fails_keeps_no_claim_waiting():
    """The metrics' hook raising: every claim of the group still answered,
    and the next claims still written."""
    groups, recorder, errors = ClaimGroups(), _Recorder(), {}

    def broken(claims, committed):
        raise RuntimeError("the counter is broken")

    groups.on_group = broken
    _behind_a_running_write(groups, recorder, errors, "bc")
    assert errors == {} and recorder.together == [["b", "c"]]
    assert groups._running == 0
    recorder.release.set()
    groups.claim(_claim("d"), recorder.alone_of(_claim("d")), recorder.write_together)
    assert recorder.alone == ["a", "d"]


def test_only_claims_that_say_their_consumer_is_new_are_grouped():
    from allotment.api.allocations import _new_claim
    from allotment.db.allocations import ConsumerAllocations

    resources = {"rp": {"VCPU": 1}}
    assert _new_claim(ConsumerAllocations("c", resources, check_generation=True, generation=None))
    # A consumer with a generation (its allocations replaced), a write
    # before 1.28 (it may be either), and one that empties a consumer.
    assert not _new_claim(ConsumerAllocations("c", resources, check_generation=True, generation=3))
    assert not _new_claim(ConsumerAllocations("c", resources, check_generation=False))
    assert not _new_claim(ConsumerAllocations("c", {}, check_generation=True, generation=None))


def test_a_group_holds_no_more_rows_than_the_database_writes_as_one():
    from allotment.api import claim_groups
    from allotment.db import allocations

    assert claim_groups.MOST_ROWS == allocations._INSERT_ROWS_KEPT
