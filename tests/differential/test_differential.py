"""A short differential run: the same random streams to Allotment and to the
reference Placement (``../shared/reference/serve``), both on SQLite; any
divergence fails, with its shrunk reproduction in the failure message.

Selected with ``-m differential`` (scripts/test runs it once, not per
backend).  Outside CI it skips when the reference cannot be started; under
``CI=true`` that is a failure.  Longer runs: ``tools/difftest --help``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "difftest"
sys.path.insert(0, str(TOOLS))

import runner  # noqa: E402

pytestmark = pytest.mark.differential

# Three seeds of 300 requests: about a minute on a loaded 2-core machine.
SEEDS = "1..3"
REQUESTS = 300


def test_allotment_answers_as_the_reference(tmp_path):
    try:
        probe = runner.Pair(tmp_path / "probe")
    except runner.StartError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the reference server could not be started: {error}")
        pytest.skip(f"the reference server could not be started: {error}")
    probe.stop()
    lines: list[str] = []
    args = argparse.Namespace(seed=SEEDS, requests=REQUESTS, microversion="1.0-1.39", keep=None,
                              ours_url=None, ref_url=None, shrink=1, shrink_budget=20, suite_profile=True)
    outcome = runner.run(args, out=lines.append)
    assert outcome["requests"] == 3 * REQUESTS
    assert outcome["divergences"] == 0, "\n".join(lines)
