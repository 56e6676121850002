"""A short schemathesis run against a live ``allotment serve``: no 5xx, every
4xx in Placement's error format.

The same machinery as ``tools/fuzz`` (the long run, documented in the
README), reduced to schemathesis's coverage phase (boundary values and
invalid values of every parameter and body field: some 1,500 requests at
1.39) at one microversion picked at random, so successive runs of the
suite cover different versions; a failure prints how to replay it with
``tools/fuzz``.  The backends get the same requests, so it runs once, in
the SQLite pass: 35 to 65 s of one pytest worker on a 2-core machine
(quiet to busy).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import random
import re
from pathlib import Path

import pytest

from tests.conftest import BACKEND

pytest.importorskip("schemathesis")
pytestmark = pytest.mark.skipif(BACKEND != "sqlite", reason="runs once, in the SQLite pass (see tools/fuzz)")

TOOL = Path(__file__).resolve().parents[2] / "tools" / "fuzz"
VERSIONS = ("1.0", "1.14", "1.28", "1.36", "1.39", "1.39")


def _load_tool():
    loader = importlib.machinery.SourceFileLoader("allotment_fuzz_tool", str(TOOL))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def _tool_crashed(text: str) -> bool:
    """schemathesis stopped on an error of its own while generating cases
    (seen: hypothesis failing to describe one of schemathesis's lambdas),
    not on anything our server answered: no failure was reported and the
    only errors are runtime errors raised inside schemathesis/hypothesis."""
    counted = re.search(r"(\d+) generated, (\d+) passed", text)
    return (counted is not None and counted.group(1) == counted.group(2)
            and "Runtime Error" in text and "Failures:" not in text
            and ("site-packages/schemathesis/" in text or "site-packages/hypothesis/" in text))


def test_a_short_fuzz_run_finds_no_server_error_and_no_malformed_error(tmp_path):
    fuzz = _load_tool()
    # A run the tool itself broke off is tried again with another seed (at
    # most twice): it says nothing about the server either way. The known
    # cause (two generating threads racing in CPython 3.11's ast module) is
    # avoided by the one thread tools/fuzz now uses; this stays as a guard.
    for attempt in range(3):
        version, seed = random.choice(VERSIONS), random.randrange(2 ** 32)
        workdir = tmp_path / f"attempt{attempt}"
        workdir.mkdir()
        database = fuzz.Database("sqlite", workdir)
        server = fuzz.Server(database.url, workdir)
        output = workdir / "schemathesis.out"
        try:
            with open(output, "w") as out:
                status = fuzz.schemathesis(server.url, version, max_examples=5, seed=seed, workdir=workdir,
                                           phases="coverage", output=out)
            counts = server.statuses()
        finally:
            server.stop()
        replay = f"tools/fuzz --microversion {version} --seed {seed} --max-examples 5 --phases coverage"
        server_errors = {code: n for code, n in counts.items() if isinstance(code, int) and code >= 500}
        assert not server_errors, f"{replay}: {server_errors}\n{server.log()[-6000:]}"
        text = output.read_text()
        if status != 0 and _tool_crashed(text) and attempt < 2:
            continue
        assert status == 0, f"{replay}\n{text[-6000:]}"
        assert sum(counts.values()) > 300, counts  # it did send requests
        break
