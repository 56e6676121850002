"""``service.fill_provider_mirror``: the master's read of every provider,
before ``allotment serve`` forks its workers."""

from __future__ import annotations

import gc

import pytest

from allotment import service
from allotment.db import changes
from allotment.db.provider_mirror import ProviderMirror
from tests.conftest import BACKEND


@pytest.mark.skipif(BACKEND not in changes.NOTING_BACKENDS, reason="no provider mirror on MySQL / MariaDB")
def test_the_read_holds_the_collector_off_and_freezes_what_it_read(app, api, monkeypatch):
    """Collections set off by the read's millions of objects took a quarter
    of it at 430,000 providers; frozen, the mirror is never walked by the
    workers' collections (nor its pages written)."""
    for index in range(3):
        uuid = f"00000000-0000-4000-8000-00000000000{index}"
        api.post("/resource_providers", json={"name": f"h{index}", "uuid": uuid})
    collector_on = []
    real = ProviderMirror.snapshot

    def snapshot(self, conn, number):
        collector_on.append(gc.isenabled())
        return real(self, conn, number)

    monkeypatch.setattr(ProviderMirror, "snapshot", snapshot)
    app.state.mirror._state = None  # as in a master that has answered nothing
    frozen = gc.get_freeze_count()
    try:
        assert service.fill_provider_mirror(app) is not None
        assert collector_on == [False] and gc.isenabled()
        assert gc.get_freeze_count() > frozen
        mirrored = app.state.mirror._state[1]
        assert len(mirrored.snapshot) == 3
        # What the one run of trees holds is worked out too, before the workers fork.
        assert list(mirrored.kept.trees.capacities) == [0]
    finally:
        gc.unfreeze()
