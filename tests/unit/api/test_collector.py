"""The API's pause of the garbage collector (allotment/api/collector.py)."""

import time

from allotment.api.collector import CollectorPause


class TestCollectorPause:
    def test_off_while_any_holder_is_inside(self):
        import gc
        import threading

        pause = CollectorPause()
        assert gc.isenabled()
        first_in, second_in, first_out = (threading.Event() for _ in range(3))
        seen = []

        def first():
            with pause():
                first_in.set()
                second_in.wait(5)
            first_out.set()

        def second():
            first_in.wait(5)
            with pause():
                second_in.set()
                first_out.wait(5)
                seen.append(gc.isenabled())  # the first left: still off

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert seen == [False]
        assert gc.isenabled()

    def test_leaves_a_disabled_collector_disabled(self):
        import gc

        pause = CollectorPause()
        gc.disable()
        try:
            with pause():
                pass
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_overlapping_holders_collect_after_the_limit(self, monkeypatch):
        import gc

        pause = CollectorPause()
        pause.MAX_PAUSE = 0.0
        collected = []
        monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
        with pause():
            with pause():
                time.sleep(0.01)
            assert collected == [1]
        assert gc.isenabled()
