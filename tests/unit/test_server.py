"""The worker's set-up after gunicorn forks it (allotment/server.py)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from allotment import server


def test_a_forked_worker_disposes_of_the_masters_connections_and_freezes_what_it_inherited():
    disposed = []
    fake = SimpleNamespace(app=SimpleNamespace(_app=SimpleNamespace(db=SimpleNamespace(
        dispose=lambda: disposed.append(True)))))
    before = gc.get_freeze_count()
    try:
        server._post_fork(fake, worker=None)
        assert disposed == [True]
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
