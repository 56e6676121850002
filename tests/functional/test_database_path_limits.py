"""Candidates read from the database (no provider mirror) over a cloud
whose first trees are full: the search loads trees in rounds that double
while trees give nothing, and no statement may hold more parameters than
SQLite takes (32,766: a round of 100,000 hosts failed with `too many SQL
variables`).  Here SQLite's limit and the loader's are made small, so that
a small cloud crosses them."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from allotment.api.app import Application
from allotment.db import allocation_candidates as candidates_db
from allotment.db import raw_rows
from allotment.service import database_from_config, prepare_database
from tests.conftest import BACKEND, ApiClient, create_database, make_conf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "cloudgen"))

import cloud  # noqa: E402

pytestmark = pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's parameter limit, made small")

#: SQLite's parameter limit here, and the loader's, to match it.
VARIABLES = 256


def _app(url: str, **overrides) -> Application:
    conf = make_conf(url, allotment__candidates_cache_mb=0, **overrides)
    db = database_from_config(conf)
    prepare_database(db)
    return Application(conf, db)


def test_a_long_run_of_full_trees_is_read_within_the_parameter_limit(tmp_path_factory, monkeypatch):
    url, drop = create_database(tmp_path_factory, "limits")
    try:
        cloud.generate(url, cloud.Spec([("flat", 1200)], 42, full_first=0.95))
        mirrored = ApiClient(_app(url), version="1.39")
        app = _app(url, allotment__provider_mirror=False)

        @sa.event.listens_for(app.db.engine, "connect")
        def _small(dbapi_conn, _record):
            dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, VARIABLES)

        app.db.engine.dispose()
        monkeypatch.setattr(raw_rows, "IDS_PER_STATEMENT", 64)
        monkeypatch.setattr(candidates_db, "LOAD_TREES", 64)
        direct = ApiClient(app, version="1.39")
        for query in ("resources=VCPU:2,MEMORY_MB:4096,DISK_GB:20&limit=1",
                      "resources=VCPU:2,MEMORY_MB:4096,DISK_GB:20&limit=50"):
            expected = mirrored.get(f"/allocation_candidates?{query}").json
            assert expected["allocation_requests"]
            assert direct.get(f"/allocation_candidates?{query}").json == expected
    finally:
        drop()
