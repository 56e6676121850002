"""Claims of several new consumers in one transaction (PostgreSQL), and
``[allotment] claims_together``, which makes such groups of the claims
waiting in one process at once.

A group's transaction must be what those claims would have done one by
one, as one commit: every consumer and row written, every provider's
generation advanced, the capacity checked against all of them at once,
and on any refusal nothing written at all.  Through the API, with many
threads claiming at once, the groups must form and leave the database as
the answers say: no provider over capacity, every 204's rows there, every
409's consumer absent, and candidates as a fresh read finds them.
"""

from __future__ import annotations

import collections
import threading

import pytest
import sqlalchemy as sa

from allotment.api.app import Application
from allotment.db import allocations as db_allocations
from allotment.db import tables
from allotment.service import database_from_config
from tests.conftest import BACKEND, ApiClient, _empty_tables, make_conf, new_uuid, pg_statements_sent

pytestmark = pytest.mark.skipif(BACKEND != "postgresql", reason="claims are grouped on PostgreSQL")

OWNER = ("incomplete-project", "incomplete-user")


def _application(db_url: str, **options) -> Application:
    conf = make_conf(db_url, **options)
    return Application(conf, database_from_config(conf))


@pytest.fixture
def together(db_url):
    application = _application(db_url, allotment__claims_together=True)
    _empty_tables(application.db.engine)
    yield application
    application.db.dispose()


def _provider(api: ApiClient, vcpu: int = 8, memory: int = 4096) -> str:
    uuid = new_uuid()
    assert api.post("/resource_providers", json={"uuid": uuid, "name": uuid}).status == 200
    inventories = {"VCPU": {"total": vcpu}, "MEMORY_MB": {"total": memory}}
    answer = api.put(f"/resource_providers/{uuid}/inventories",
                     json={"resource_provider_generation": 0, "inventories": inventories})
    assert answer.status == 200, answer
    return uuid


def _generation(api: ApiClient, uuid: str) -> int:
    return api.get(f"/resource_providers/{uuid}").json["generation"]


def _claim(consumer: str, provider: str, vcpu: int, memory: int) -> db_allocations.ConsumerAllocations:
    return db_allocations.ConsumerAllocations(consumer, {provider: {"VCPU": vcpu, "MEMORY_MB": memory}},
                                              project_id="p", user_id="u")


def _first_claim(api: ApiClient, provider: str) -> str:
    """A claim through the API: the project and user exist after it (a
    group takes the claims whose owners exist)."""
    consumer = new_uuid()
    answer = api.put(f"/allocations/{consumer}", json={
        "allocations": {provider: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u",
        "consumer_type": "INSTANCE",
        "consumer_generation": None})
    assert answer.status == 204, answer
    return consumer


def test_new_consumers_claimed_together_are_three_messages_and_each_claim_whole(together):
    api = ApiClient(together)
    first, second, third, fourth = (_provider(api) for _ in range(4))
    _first_claim(api, first)
    sent = pg_statements_sent(together.db.engine)
    # A group of the same shape first: the connection prepares the
    # statements once, in messages of their own.
    warm = [_claim(new_uuid(), third, 1, 1), _claim(new_uuid(), fourth, 1, 1), _claim(new_uuid(), third, 1, 1)]
    with together.db.write() as conn:
        db_allocations.write_allocations(conn, warm, incomplete_owner=OWNER, lock_read=True, follow=True,
                                         together=True)
    generations = {uuid: _generation(api, uuid) for uuid in (first, second)}
    a, b, c = new_uuid(), new_uuid(), new_uuid()
    requests = [_claim(a, first, 2, 512), _claim(b, second, 1, 256), _claim(c, first, 3, 1024)]
    mark = len(sent)
    with together.db.write() as conn:
        written = db_allocations.write_allocations(conn, requests, incomplete_owner=OWNER, lock_read=True,
                                                   follow=True, together=True)
    # BEGIN with the locking read, the one statement, COMMIT.
    sent = sent[mark:]
    assert len(sent) == 3, sent
    assert sent[0].startswith("BEGIN") and "EXECUTE" in sent[1] and sent[-1] == "COMMIT", sent
    for consumer, provider, vcpu, memory in ((a, first, 2, 512), (b, second, 1, 256), (c, first, 3, 1024)):
        answer = api.get(f"/allocations/{consumer}").json
        assert answer["allocations"] == {provider: {"resources": {"VCPU": vcpu, "MEMORY_MB": memory},
                                                    "generation": generations[provider] + 1}}
        assert (answer["project_id"], answer["user_id"], answer["consumer_generation"]) == ("p", "u", 1)
    # One transaction: each provider's generation advanced once.
    assert {uuid: _generation(api, uuid) for uuid in (first, second)} == {
        uuid: generation + 1 for uuid, generation in generations.items()}
    assert api.get(f"/resource_providers/{first}/usages").json["usages"] == {"VCPU": 6, "MEMORY_MB": 1536}
    # What the process's mirror follows: the usage after all three claims.
    with together.db.engine.connect() as conn:
        ids = {uuid: ident for uuid, ident in conn.execute(
            sa.select(tables.resource_providers.c.uuid, tables.resource_providers.c.id)).all()}
        vcpu = conn.execute(sa.select(tables.resource_classes.c.id)
                            .where(tables.resource_classes.c.name == "VCPU")).scalar_one()
    assert written is not None
    assert written.generations == {ids[uuid]: generation + 1 for uuid, generation in generations.items()}
    assert written.records[(ids[first], vcpu)].used == 6
    assert written.records[(ids[second], vcpu)].used == 1
    assert written.after == written.number + 1


def test_a_group_of_claims_refused_for_capacity_writes_nothing(together):
    api = ApiClient(together)
    first, second = _provider(api), _provider(api)
    _first_claim(api, first)
    generations = {uuid: _generation(api, uuid) for uuid in (first, second)}
    a, b = new_uuid(), new_uuid()
    # 1 VCPU held: 4 + 4 more do not fit in 8.
    requests = [_claim(a, first, 4, 256), _claim(b, first, 4, 256), _claim(new_uuid(), second, 1, 256)]
    with pytest.raises(db_allocations.CapacityExceeded):
        with together.db.write() as conn:
            db_allocations.write_allocations(conn, requests, incomplete_owner=OWNER, lock_read=True,
                                             together=True)
    for consumer in (a, b):
        assert api.get(f"/allocations/{consumer}").json["allocations"] == {}
    assert {uuid: _generation(api, uuid) for uuid in (first, second)} == generations
    assert api.get(f"/resource_providers/{first}/usages").json["usages"] == {"VCPU": 1, "MEMORY_MB": 0}


def test_a_group_with_a_consumer_that_exists_is_not_written_together(together):
    """Only new consumers' claims are written as one: a consumer that holds
    allocations (its write replaces them) sends the group back, unwritten,
    to be written claim by claim."""
    api = ApiClient(together)
    first, second = _provider(api), _provider(api)
    held = _first_claim(api, first)
    generations = {uuid: _generation(api, uuid) for uuid in (first, second)}
    fresh = new_uuid()
    requests = [_claim(fresh, second, 1, 256), _claim(held, first, 2, 256)]
    with pytest.raises(db_allocations.NotTogether):
        with together.db.write() as conn:
            db_allocations.write_allocations(conn, requests, incomplete_owner=OWNER, lock_read=True,
                                             together=True)
    assert api.get(f"/allocations/{fresh}").json["allocations"] == {}
    assert api.get(f"/allocations/{held}").json["allocations"][first]["resources"] == {"VCPU": 1}
    assert {uuid: _generation(api, uuid) for uuid in (first, second)} == generations


THREADS = 12
CLAIMS_EACH = 25
PROVIDERS = 6


def test_claims_of_many_threads_are_grouped_and_leave_what_the_answers_say(together, db_url):
    api = ApiClient(together)
    providers = [_provider(api, vcpu=16, memory=16384) for _ in range(PROVIDERS)]
    _first_claim(api, providers[0])
    answers: dict[str, tuple[int, str, int]] = {}
    lock = threading.Lock()

    def claim(thread: int) -> None:
        client = ApiClient(together)
        for number in range(CLAIMS_EACH):
            consumer, provider, vcpu = new_uuid(), providers[(thread + number) % PROVIDERS], 1 + number % 3
            answer = client.put(f"/allocations/{consumer}", json={
                "allocations": {provider: {"resources": {"VCPU": vcpu, "MEMORY_MB": 512}}},
                "project_id": "p", "user_id": "u", "consumer_type": "INSTANCE", "consumer_generation": None})
            with lock:
                answers[consumer] = (answer.status, provider, vcpu)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a claim never answered"
    statuses = collections.Counter(status for status, _, _ in answers.values())
    assert set(statuses) <= {204, 409}, statuses
    assert statuses[409] > 0, "the claims never reached the providers' capacity"
    groups = together.state.claim_groups
    assert groups.groups > 0 and groups.grouped >= 2 * groups.groups, "no claims were written together"

    fresh = ApiClient(_application(db_url, allotment__candidates_cache_mb=0, allotment__provider_mirror=False))
    used = collections.Counter()
    for consumer, (status, provider, vcpu) in answers.items():
        held = fresh.get(f"/allocations/{consumer}").json["allocations"]
        if status == 204:
            assert held[provider]["resources"] == {"VCPU": vcpu, "MEMORY_MB": 512}, consumer
            used[provider] += vcpu
        else:
            assert held == {}, consumer
    used[providers[0]] += 1  # the first claim
    for provider in providers:
        usages = fresh.get(f"/resource_providers/{provider}/usages").json["usages"]
        assert usages["VCPU"] == used[provider] <= 16
    # The process's mirror followed the groups it committed: its candidates
    # are what a fresh read finds.
    query = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:512"
    mine = sorted(sorted(r["allocations"]) for r in api.get(query).json["allocation_requests"])
    theirs = sorted(sorted(r["allocations"]) for r in fresh.get(query).json["allocation_requests"])
    assert mine == theirs
    assert api.get(query).json["provider_summaries"] == fresh.get(query).json["provider_summaries"]
    fresh.application.db.dispose()
