"""Request ids: ``req-`` and a random version 4 UUID in its usual spelling."""

from __future__ import annotations

import uuid

from allotment.api.request_id import new_request_id


def test_request_ids_are_version_4_uuids_spelled_as_uuid4():
    seen = set()
    for _ in range(2000):
        request_id = new_request_id()
        assert request_id.startswith("req-")
        value = uuid.UUID(request_id[4:])
        assert value.version == 4 and value.variant == uuid.RFC_4122
        assert str(value) == request_id[4:]
        seen.add(request_id)
    assert len(seen) == 2000
    # Every variant digit occurs (its two free bits are random).
    assert {request_id[23] for request_id in seen} == set("89ab")
