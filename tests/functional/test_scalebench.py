"""tools/scalebench: a claim race against a live server, in rounds,
checked row by row afterwards, and ``--claim-floor``: the same race's
database CPU per claim against tools/claimfloor's least claim at the
race's pace.

The figures of issue 29 come from this tool (docs/performance.md), so its
claim race must count what the server did and verify it, and the floor
must be measured on the same cloud at the race's own rate."""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from tests.conftest import BACKEND, SERVER_URLS, pg_databases

pytestmark = [
    pytest.mark.skipif(BACKEND != "postgresql", reason="--claim-floor is PostgreSQL's"),
    pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench (PostgreSQL's client tools) not installed"),
]

ROOT = Path(__file__).resolve().parents[2]


def _runner():
    """The tool's runner module (a folder run as ``python tools/scalebench``)."""
    folder = ROOT / "tools" / "scalebench"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location("scalebench_runner", folder / "runner.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def test_a_claim_race_is_verified_and_set_against_the_floor_at_its_pace(tmp_path):
    runner = _runner()
    url = SERVER_URLS["postgresql"]
    command = Path(sys.executable).parent / "allotment"
    serve = f"{command} serve --workers 1 --config-file {{config}} --port {{port}}"
    argv = ["--db", "postgresql", "--pg-url", url, "--cloud", "flat=30", "--seed", "7", "--serve", serve,
            "--scenario", "claims", "--claim-clients", "4", "--claims-per-client", "15", "--claim-rounds", "3",
            "--claim-floor",
            "--claim-floor-seconds", "2", "--cache-dir", str(tmp_path / "cache"), "--json", str(tmp_path / "r.json")]
    args = runner.parse_args(argv)
    template = runner.CloudStore(args).name
    before = pg_databases()
    try:
        assert runner.main(argv) == 0
    finally:
        runner.CloudStore(args)._drop(template)
    report = json.loads((tmp_path / "r.json").read_text())
    race = report["claims"]["A"]
    assert race["claims"] == 60 and race.get("errors", 0) == 0, race
    assert race["verify"] == {"over_capacity": 0, "lost": 0, "phantom": 0, "different": 0,
                              "checked_consumers": 60}
    assert race["server_cpu_ms_per_claim"] > 0 and race["db_cpu_ms_per_claim"] > 0, race
    # Three rounds of 5 claims a client, each after a memory yardstick, and
    # the medians of the rounds' own figures.
    rounds = race["rounds"]
    assert [r["claims"] for r in rounds] == [20, 20, 20], rounds
    assert all(r["memory_yardstick_s"] > 0 for r in rounds), rounds
    for figure in ("server_cpu_ms_per_claim", "db_cpu_ms_per_claim"):
        assert race["median"][figure] == round(statistics.median(r[figure] for r in rounds), 2), race
    floor = report["claim_floor"]
    assert floor["providers"] == 10  # several clients: the front of the cloud, as the race's candidates
    measured = floor["A"]
    assert measured["rate"] == round(race["claims_per_s"]), measured
    assert measured["bare_db_cpu_ms_per_claim"] > 0 and measured["allotment_db_cpu_ms_per_claim"] > 0, measured
    assert measured["to_allotment_floor"] == round(
        race["db_cpu_ms_per_claim"] / measured["allotment_db_cpu_ms_per_claim"], 2)
    # The server's copy, the floor's clouds and copies, and the template:
    # nothing left.  Only this run's names count (other tests make databases
    # meanwhile, test_claimfloor among them, with its own cloud and seed).
    assert {name for name in pg_databases() - before
            if name.startswith((template, "claimfloor_flat30_s7_"))} == set()
