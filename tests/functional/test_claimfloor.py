"""tools/claimfloor: the database's CPU for a hand-written claim, at a pace.

The tool is a yardstick for Allotment's own claims (docs/performance.md,
"The floor of a claim"), so what it sends must be a whole claim each
time: one consumer and three allocation rows, on the Placement layout
alone and on the same cloud taken over by Allotment, whose triggers note
each write and whose log is folded as Allotment folds it.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.conftest import BACKEND, SERVER_URLS, pg_databases

pytestmark = [
    pytest.mark.skipif(BACKEND != "postgresql", reason="pgbench claims on PostgreSQL"),
    pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench (PostgreSQL's client tools) not installed"),
]


def _tool():
    """The tool's module (a folder run as ``python tools/claimfloor``)."""
    path = Path(__file__).resolve().parents[2] / "tools" / "claimfloor" / "__main__.py"
    spec = importlib.util.spec_from_file_location("claimfloor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_run_writes_whole_claims_and_reports_the_database_cpu_of_both_layouts():
    claimfloor = _tool()
    server = SERVER_URLS["postgresql"].format(name="").rstrip("/")
    before = pg_databases()
    runs = claimfloor.main(["--server", server, "--roots", "20", "--clients", "1", "--clients", "3",
                            "--claims", "600", "--providers", "4"])
    assert [(run["variant"], run["clients"]) for run in runs] == [
        ("bare", 1), ("allotment", 1), ("bare", 3), ("allotment", 3)]
    for run in runs:
        # The tool refuses a run whose rows are not one consumer and three
        # allocations a claim; without folds, every transaction is a claim.
        assert run["claims"] == 600 or (run["variant"] == "allotment" and 580 <= run["claims"] < 600), run
        assert run["db_cpu_ms_per_claim"] > 0, run
    # Only this run's cloud and seed: the suite's other tests make databases
    # meanwhile, the other claimfloor runs here and scalebench's among them.
    left = {name for name in pg_databases() - before if name.startswith("claimfloor_flat20_s42_")}
    assert left == set(), "the tool drops the clouds and copies it made"


def test_claims_made_together_are_whole_claims_each_and_counted_as_claims():
    """``--claims-per-transaction``: K claims a transaction, each still one
    consumer and three rows (the tool refuses a run otherwise), the count
    and the CPU per claim, not per transaction."""
    claimfloor = _tool()
    server = SERVER_URLS["postgresql"].format(name="").rstrip("/")
    before = pg_databases()
    runs = claimfloor.main(["--server", server, "--roots", "20", "--seed", "43", "--clients", "3",
                            "--claims", "900", "--providers", "4",
                            "--claims-per-transaction", "1", "--claims-per-transaction", "3"])
    assert [(run["variant"], run["claims_per_transaction"]) for run in runs] == [
        ("bare", 1), ("allotment", 1), ("bare", 3), ("allotment", 3)]
    for run in runs:
        # 900 claims in all, in transactions of 1 or 3; a fold takes the
        # place of a transaction of claims now and then.
        assert run["claims"] % run["claims_per_transaction"] == 0, run
        assert run["claims"] == 900 or (run["variant"] == "allotment" and 850 <= run["claims"] < 900), run
        assert run["db_cpu_ms_per_claim"] > 0, run
    left = {name for name in pg_databases() - before if name.startswith("claimfloor_flat20_s43_")}
    assert left == set(), "the tool drops the clouds and copies it made"


def test_a_transaction_of_claims_locks_its_providers_in_one_order_and_writes_each_claim():
    """The grouped script: one lock statement in id order (no deadlock
    between two transactions drawing the same providers), and a row of
    the chosen providers for each claim."""
    script = _tool().grouped_claims(3, 10)
    assert script.count("\\set p") == 3
    assert "WHERE id IN (:p1, :p2, :p3) ORDER BY id FOR NO KEY UPDATE" in script
    assert "generate_series(1, 3)" in script and "(3, :p3::int)" in script
    assert script.count("\nCOMMIT;") == 1 and script.count("BEGIN") == 1
