"""pytest plugin: Placement's clients' own functional tests (nova's, osc-placement's),
with Placement served by Allotment.

Loaded by ``scripts/nova-tests`` (``-p allotment_nova_plugin``) in the venv
that script builds (nova from PyPI, Allotment installed from this checkout).
Nova's test code runs unchanged.  Its ``PlacementFixture`` subclasses the one
of the ``openstack-placement`` package; here ``placement`` is Allotment's
stand-in package (``tests/nova/standin``), whose fixture routes nova's
Placement endpoint to Allotment's WSGI application.

``ALLOTMENT_NOVA_PLACEMENT=reference`` runs the same tests against the real
``openstack-placement`` package instead (the script puts it on the path in
that mode only), so a failure can be told apart: one that fails on both is
nova's (or this machine's), one that fails only on Allotment is ours.

Adjustments for running nova's testtools-based tests under pytest; they
change no test's logic:

* nova's ``TestCase`` deletes the public attributes of the test case in a
  cleanup, including the one pytest's unittest runner sets for the test's
  duration and deletes afterwards; the attribute of the running test is
  kept.
* ``--nova-shard K/N`` runs every N-th test, from the K-th: pytest-xdist's
  workers hang once nova has monkey-patched them with eventlet, so the
  script runs shares in processes of their own instead.
* ``--nova-results FILE`` writes every test's outcome as JSON lines
  (``{"test": id, "outcome": ...}``), which ``scripts/nova-tests --compare``
  uses to list the tests whose outcome differs between the two servers.

The closing lines say which Placement served the run, how many tests ran
and how many passed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parent / "standin"
MODE = os.environ.get("ALLOTMENT_NOVA_PLACEMENT", "allotment")
if MODE not in ("allotment", "reference"):
    raise pytest.UsageError(f"ALLOTMENT_NOVA_PLACEMENT must be 'allotment' or 'reference', not {MODE!r}")
if MODE == "allotment":
    # Before anything imports nova's fixtures (and through them ``placement``).
    sys.path.insert(0, str(STANDIN))


def _placement_origin() -> str:
    import placement

    path = Path(placement.__file__).resolve()
    if path.is_relative_to(STANDIN):
        if MODE != "allotment":
            raise pytest.UsageError(f"reference mode, but 'placement' is Allotment's stand-in ({path})")
        import allotment

        return f"Allotment {Path(allotment.__file__).resolve().parent} (stand-in fixture {path.parent})"
    if MODE == "allotment":
        raise pytest.UsageError(f"'placement' is imported from {path}, not from Allotment's stand-in")
    from importlib import metadata

    return f"openstack-placement {metadata.version('openstack-placement')} ({path.parent})"


def pytest_addoption(parser):
    parser.addoption("--nova-results", metavar="FILE",
                     help="write each test's outcome as JSON lines to FILE")
    parser.addoption("--nova-shard", metavar="K/N", default="0/1",
                     help="run only the K-th of N equal shares of the tests (K from 0); "
                          "pytest-xdist hangs once nova has monkey-patched with eventlet, "
                          "so scripts/nova-tests runs shares in processes of their own")


def pytest_configure(config):
    config._nova_placement = _placement_origin()


def pytest_report_header(config):
    return f"placement served by: {config._nova_placement}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    shard, _, shards = config.getoption("--nova-shard").partition("/")
    shard, shards = int(shard), int(shards)
    if shards > 1:
        order = {item.nodeid: index for index, item in enumerate(sorted(items, key=lambda i: i.nodeid))}
        kept = [item for item in items if order[item.nodeid] % shards == shard]
        config.hook.pytest_deselected(items=[item for item in items if order[item.nodeid] % shards != shard])
        items[:] = kept
    from nova import test

    clear = test.TestCase._clear_attrs
    if getattr(clear, "_keeps_running_test", False):
        return

    def _clear_attrs(self):
        running = self.__dict__.get(self._testMethodName)
        clear(self)
        if running is not None:
            self.__dict__[self._testMethodName] = running

    _clear_attrs._keeps_running_test = True
    test.TestCase._clear_attrs = _clear_attrs


#: test id -> passed | failed | error | skipped
OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        OUTCOMES[report.nodeid] = "error" if report.when == "setup" and report.failed else report.outcome
    elif report.when == "teardown" and report.failed and OUTCOMES.get(report.nodeid) == "passed":
        OUTCOMES[report.nodeid] = "error"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    outcomes = dict(OUTCOMES)
    counts = {name: sum(1 for o in outcomes.values() if o == name)
              for name in ("passed", "failed", "error", "skipped")}
    ran = counts["passed"] + counts["failed"] + counts["error"]
    path = config.getoption("--nova-results")
    if path:
        with open(path, "w") as out:
            for test_id, outcome in sorted(outcomes.items()):
                out.write(json.dumps({"test": test_id, "outcome": outcome}) + "\n")
    terminalreporter.write_sep("=", "functional tests of Placement's clients")
    terminalreporter.write_line(f"placement served by: {config._nova_placement}")
    terminalreporter.write_line(f"{ran} ran, {counts['passed']} passed, {counts['failed']} failed, "
                                f"{counts['error']} errors, {counts['skipped']} skipped")
