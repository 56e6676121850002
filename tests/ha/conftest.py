"""The Galera cluster the tests of this directory run on.

They run in the Galera pass of ``scripts/test``, which starts one 3-node
cluster for the whole run (``python -m tests.ha.galera start``) and names its
directory in ``ALLOTMENT_GALERA_DIR``.  Run by hand with
``ALLOTMENT_TEST_GALERA=1``, the session starts a cluster of its own (about
20 s) and stops it at the end.  Otherwise they are skipped: they are the
Galera pass's, not the other backends'.  Without Debian's ``mariadb-server``
and ``galera-4`` they skip with the reason, except under ``CI=true`` where
that is a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import pytest

from tests.ha import galera as harness

IN_CI = os.environ.get("CI") == "true"


@pytest.fixture(scope="session")
def galera(tmp_path_factory):
    cluster = harness.shared()
    if cluster is not None:
        yield cluster
        return
    if os.environ.get("ALLOTMENT_TEST_GALERA") != "1":
        pytest.skip("Galera tests run in the Galera pass of scripts/test (ALLOTMENT_GALERA_DIR), "
                    "or with ALLOTMENT_TEST_GALERA=1")
    reason = harness.missing()
    if reason:
        if IN_CI:
            pytest.fail(f"the Galera tests cannot run under CI: {reason}")
        warnings.warn(f"SKIPPING the Galera tests: {reason}")
        pytest.skip(reason)
    # Not under pytest's base directory: it is private to the user running
    # pytest (0700), and the nodes run as another user when that is root.
    base = tempfile.mkdtemp(prefix="allotment-galera-")
    cluster = harness.GaleraCluster.create(base)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def whole_galera(galera):
    """The cluster with every node Synced, before and after the test (one that
    kills a node and fails half-way must not leave the next test a node short)."""
    galera.ensure_whole()
    yield galera
    galera.ensure_whole()
