"""``allotment db copy``: moving a Placement database to another backend.

The source is always a SQLite file, as the operator this is for has one:
the reference's 16.0.0 layout filled with the take-over test's small cloud
(a provider tree with a custom class, a sharing provider in two
aggregates, standard and custom traits, consumers of two projects and
users, a consumer type), taken over by ``allotment db sync`` and then
written to through the API (another provider with a custom class and
trait, consumers of other types, an allocation ratio MySQL rounds in its
4-byte FLOAT, a timestamp with microseconds, and a re-parented provider
whose parent and root have higher ids than its own).  The target is an
empty database on the backend under test (``ALLOTMENT_TEST_BACKEND``), so
SQLite -> SQLite runs always and SQLite -> PostgreSQL / MariaDB in those
backends' runs; there the copy is also copied back into SQLite.

The copy must keep every row and id, answer every question as the source
does, take new rows afterwards (sequences), refuse a target that holds
rows without touching it, leave the target as it was when interrupted or
when verification fails, and be re-runnable after that.
"""

from __future__ import annotations

import datetime
import shutil
import uuid as uuidlib

import pytest
import sqlalchemy as sa

from allotment.db import copy as db_copy
from allotment.db import migrate
from tests import reference
from tests.conftest import BACKEND
from tests.functional.test_server import run_allotment, write_config
from tests.functional.test_takeover import (U, _canonical, _write_own, allotment_client, ask_allotment,
                                            expect_answers, fill, questions, run_cli,
                                            write_as_allotment)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HEAD = migrate.head_revision()
LATE = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, "late.copy.test"))
STAMP = datetime.datetime(2024, 5, 6, 7, 8, 9, 654321)


def _write_more(client) -> list[tuple[str, str]]:
    """Rows the take-over data lacks: a ratio with no exact float, a re-parented provider, an odd
    name."""
    assert client.put(f"/resource_providers/{U['cn2']}/inventories/MEMORY_MB", json={
        "resource_provider_generation": 1, "total": 2048, "allocation_ratio": 1.1}).status == 200
    # A name with what COPY, CSV or a terminal would trip on, and beyond ASCII.
    assert client.post("/resource_providers", json={"name": "late\t\\N \\ 'x\"\n\u00fcml\u00e4ut \U0001f680",
                                                    "uuid": LATE}).status == 200
    # cn2 (a low id) under a provider created last: its parent and root come after it.
    assert client.put(f"/resource_providers/{U['cn2']}", json={
        "name": "cn2-takeover", "parent_provider_uuid": LATE}).status == 200
    return [("latest", f"/resource_providers/{U['cn2']}"), ("latest", f"/resource_providers/{LATE}"),
            ("latest", f"/resource_providers?in_tree={LATE}"),
            ("latest", f"/resource_providers/{U['cn2']}/inventories"),
            ("latest", "/allocation_candidates?resources=MEMORY_MB:256")]


def build_source(url: str, *, adopted: bool = True) -> list[tuple[str, str]]:
    """The source cloud at ``url``; the (microversion, path) questions to compare answers on."""
    reference.create_from_ddl(url, reference.HEAD)
    fill(url, reference.HEAD)
    asked = questions()
    if not adopted:
        return asked
    from allotment import service
    from allotment.db.engine import Database

    db = Database(url)
    service.prepare_database(db)  # what `allotment db sync` does
    db.dispose()
    app, client = allotment_client(url)
    try:
        asked += write_as_allotment(client) + _write_own(client) + _write_more(client)
    finally:
        app.db.dispose()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE resource_providers SET updated_at = :stamp WHERE uuid = :uuid"),
                     {"stamp": STAMP, "uuid": U["cn1"]})
    with engine.connect() as conn:  # everything into the file itself, which the tests copy
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return asked


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Source files built once: {"adopted": (path, questions), "reference": (path, questions)}."""
    directory = tmp_path_factory.mktemp("copy-sources")
    built = {}
    for kind in ("adopted", "reference"):
        path = directory / f"{kind}.sqlite"
        built[kind] = (path, build_source(f"sqlite:///{path}", adopted=kind == "adopted"))
    return built


@pytest.fixture
def source(sources, tmp_path):
    """A fresh copy of the adopted source file: (url, questions)."""
    path, asked = sources["adopted"]
    shutil.copyfile(path, tmp_path / "source.sqlite")
    return f"sqlite:///{tmp_path / 'source.sqlite'}", asked


@pytest.fixture
def target(tmp_path):
    """An empty database on the backend under test, created as an operator would."""
    url, drop = reference.scratch_database(BACKEND, "copy", str(tmp_path))
    yield url
    drop()


def answers(url: str, asked) -> dict:
    app, client = allotment_client(url)
    try:
        return {(v, p): _canonical(r.status, r.text) for v, p in asked
                for r in [client.get(p, version=v)]}
    finally:
        app.db.dispose()


def table_rows(url: str) -> dict[str, list[tuple]]:
    """Every row of the copied tables in id order, timestamps to the second and floats to
    6 digits (what MySQL/MariaDB keep), read without Allotment's code."""
    engine = sa.create_engine(url)

    def plain(value):
        if isinstance(value, datetime.datetime):
            return value.replace(microsecond=0)
        if isinstance(value, float):
            return float(f"{value:.6g}")
        return value

    found = {}
    with engine.connect() as conn:
        present = set(sa.inspect(conn).get_table_names())
        for table in db_copy.COPIED:
            if table.name in present:
                found[table.name] = [tuple(plain(v) for v in row) for row in conn.execute(
                    sa.select(*table.c).order_by(*table.primary_key.columns))]
    engine.dispose()
    return found


def versions(url: str) -> tuple:
    engine = db_copy.open_engine(url, "database", reading=True)
    try:
        with engine.connect() as conn:
            return db_copy.versions(conn)
    finally:
        engine.dispose()


def copy_cli(capsys, *argv: str) -> tuple[int, str, str]:
    from allotment import cli

    code = cli.main(["db", "copy", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the copy -----------------------------------------------------------------

def test_copy_keeps_every_row_and_answer(source, target, tmp_path, capsys):
    url, asked = source
    config = write_config(tmp_path / "etc", url)
    before = answers(url, asked)
    code, out, err = copy_cli(capsys, "--config-file", str(config), "--to", target, "--batch-size", "3")
    assert code == 0, out + err
    assert out.strip().splitlines()[-1].startswith("copied 12 tables, ")
    assert "MISMATCH" not in out and out.count(" ok\n") == 14, out
    # Not a terminal: one line per table on stderr, none for alembic's notes.
    assert [line.split(":")[0] for line in err.strip().splitlines()] == [
        f"{done} {table.name}" for done in ("copied", "verified") for table in db_copy.COPIED], err

    assert table_rows(target) == table_rows(url)
    assert versions(target) == versions(url) == (reference.HEAD, HEAD)
    assert answers(target, asked) == before
    # The re-parented provider kept its links to the provider copied after it.
    app, client = allotment_client(target)
    try:
        shown = client.get(f"/resource_providers/{U['cn2']}").json
        assert (shown["parent_provider_uuid"], shown["root_provider_uuid"]) == (LATE, LATE)
        assert client.get(f"/resource_providers/{U['cn2']}/inventories/MEMORY_MB"
                          ).json["allocation_ratio"] == 1.1
        _create_after_copy(client)
    finally:
        app.db.dispose()
    code, out = run_cli(capsys, "status", "--config-file", str(write_config(tmp_path / "t", target)))
    assert code == 0 and "verdict: ready" in out, out


def _create_after_copy(client) -> None:
    """New rows in every table with an id sequence: none collides with a copied id."""
    provider, consumer = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    assert client.post("/resource_providers", json={"name": "after-copy", "uuid": provider}).status == 200
    assert client.put("/resource_classes/CUSTOM_AFTER_COPY").status == 201
    assert client.put("/traits/CUSTOM_AFTER_COPY").status == 201
    assert client.put(f"/resource_providers/{provider}/inventories", json={
        "resource_provider_generation": 0,
        "inventories": {"VCPU": {"total": 4}, "CUSTOM_AFTER_COPY": {"total": 2}}}).status == 200
    assert client.put(f"/resource_providers/{provider}/traits", json={
        "resource_provider_generation": 1, "traits": ["CUSTOM_AFTER_COPY"]}).status == 200
    assert client.put(f"/resource_providers/{provider}/aggregates", json={
        "resource_provider_generation": 2, "aggregates": [str(uuidlib.uuid4())]}).status == 200
    assert client.put(f"/allocations/{consumer}", json={
        "allocations": {provider: {"resources": {"VCPU": 1, "CUSTOM_AFTER_COPY": 1}}},
        "project_id": "new-project", "user_id": "new-user", "consumer_generation": None,
        "consumer_type": "AFTER_COPY"}).status == 204
    assert client.get(f"/allocations/{consumer}").json["consumer_type"] == "AFTER_COPY"
    assert client.get(f"/resource_providers/{provider}/usages").json["usages"] == {
        "VCPU": 1, "CUSTOM_AFTER_COPY": 1}


def test_copy_of_a_reference_database_not_taken_over(sources, target, tmp_path, capsys):
    """The reference's own 16.0.0 database: copied as it is, still waiting for `allotment db sync`."""
    path, _ = sources["reference"]
    url = f"sqlite:///{tmp_path / 'reference.sqlite'}"
    shutil.copyfile(path, url.removeprefix("sqlite:///"))
    code, out, err = copy_cli(capsys, "--from", url, "--to", target)
    assert code == 0, out + err
    assert versions(target) == (reference.HEAD, None)
    assert table_rows(target) == table_rows(url)
    config = str(write_config(tmp_path / "t", target))
    code, out = run_cli(capsys, "status", "--config-file", config)
    assert code == 1 and "run 'allotment db sync'" in out, out
    code, out = run_cli(capsys, "db", "sync", "--config-file", config)
    assert code == 0, out
    app, client = allotment_client(target)
    try:
        expect_answers(client, reference.HEAD)
    finally:
        app.db.dispose()


@pytest.mark.skipif(BACKEND == "sqlite", reason="copies a server database back to SQLite")
def test_copy_back_from_the_server(source, target, tmp_path, capsys):
    """The copy on PostgreSQL / MariaDB read as a source (in a snapshot) into SQLite: the same rows."""
    url, asked = source
    assert copy_cli(capsys, "--from", url, "--to", target)[0] == 0
    back = f"sqlite:///{tmp_path / 'back.sqlite'}"
    code, out, err = copy_cli(capsys, "--from", target, "--to", back, "--batch-size", "2")
    assert code == 0, out + err
    assert table_rows(back) == table_rows(url)
    assert answers(back, asked) == answers(url, asked)


# -- refusals -------------------------------------------------------------------

def test_refuses_a_target_that_holds_rows_and_changes_nothing(source, target, tmp_path, capsys):
    url, _ = source
    config = str(write_config(tmp_path / "t", target))
    assert run_cli(capsys, "db", "sync", "--config-file", config)[0] == 0
    app, client = allotment_client(target)
    try:
        assert client.post("/resource_providers", json={"name": "already-here"}).status == 200
    finally:
        app.db.dispose()
    before = table_rows(target), versions(target)
    code, out, err = copy_cli(capsys, "--from", url, "--to", target)
    assert code == 1
    said = out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(
        "allotment db copy: refusing to copy: the target database is not empty "
        "(resource_providers: 1 row, "), said
    assert "Traceback" not in out + err
    assert (table_rows(target), versions(target)) == before


def test_refuses_a_source_that_needs_migrating_first(tmp_path, capsys):
    """Older reference revisions: one line naming the command to run on the source; the target
    is not even created."""
    target = tmp_path / "never.sqlite"
    for revision, command in (("b4ed3a175331", "'allotment db online-data-migrations' on it, then "
                                               "'allotment db sync'"),
                              ("422ece571366", "run 'allotment db sync' on it first")):
        url = f"sqlite:///{tmp_path / revision}.sqlite"
        reference.create_from_ddl(url, revision)
        fill(url, revision)
        code, out, _ = copy_cli(capsys, "--from", url, "--to", f"sqlite:///{target}")
        said = out.strip().splitlines()
        assert code == 1 and len(said) == 1 and command in said[0], said
        assert not target.exists()


@pytest.mark.skipif(BACKEND != "sqlite", reason="does not depend on the target's backend")
def test_operator_mistakes_get_one_line_and_no_traceback(source, tmp_path, capsys):
    url, _ = source
    empty = tmp_path / "empty.sqlite"
    sa.create_engine(f"sqlite:///{empty}").connect().close()
    other = tmp_path / "other.sqlite"
    engine = sa.create_engine(f"sqlite:///{other}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE guests (id INTEGER PRIMARY KEY)")
    engine.dispose()
    target = f"sqlite:///{tmp_path / 'target.sqlite'}"
    cases = [
        (("--from", "nosuchdb://x/y", "--to", target), "unsupported database 'nosuchdb'"),
        (("--from", "not a url", "--to", target), "the source is not a database URL"),
        (("--from", url, "--to", "postgresql+nosuchdriver://u@127.0.0.1/x"), "driver"),
        (("--from", url, "--to", "postgresql://postgres@127.0.0.1:1/x"),
         "cannot connect to the target database postgresql+psycopg2://postgres@127.0.0.1:1/x"),
        (("--from", f"sqlite:///{tmp_path / 'missing.sqlite'}", "--to", target), "does not exist"),
        (("--from", f"sqlite:///{empty}", "--to", target),
         "the source is not a Placement database (no Placement tables)"),
        (("--from", f"sqlite:///{other}", "--to", target), "the source is not a Placement database"),
        (("--from", url, "--to", f"sqlite:///{other}"), "tables that are not Placement's (guests)"),
        (("--from", url, "--to", url), "the source and the target are the same database"),
    ]
    for argv, expected in cases:
        code, out, err = copy_cli(capsys, *argv)
        said = out.strip().splitlines()
        assert code == 1 and len(said) == 1 and expected in said[0], (argv, out, err)
        assert "Traceback" not in out + err
    assert not (tmp_path / "target.sqlite").exists()
    assert not (tmp_path / "missing.sqlite").exists()
    # As a process of its own, as an operator meets it.
    done = run_allotment("db", "copy", "--from", f"sqlite:///{empty}", "--to", target)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert done.stdout.strip() == ("allotment db copy: the source is not a Placement database "
                                   "(no Placement tables)"), done


# -- interruption and verification --------------------------------------------------

def _copied_rows(url: str) -> int:
    return sum(len(rows) for rows in table_rows(url).values())


def test_an_interrupted_copy_leaves_no_rows_and_runs_again(source, target, monkeypatch, capsys):
    url, asked = source
    real = db_copy.insert_rows

    def interrupted(conn, table, rows):
        if table.name == "consumers":
            raise KeyboardInterrupt
        real(conn, table, rows)

    monkeypatch.setattr(db_copy, "insert_rows", interrupted)
    code, out, _ = copy_cli(capsys, "--from", url, "--to", target, "--batch-size", "2")
    assert code == 1 and "interrupted" in out, out
    assert _copied_rows(target) == 0
    if BACKEND != "mysql":  # the schema went in the same transaction
        assert table_rows(target) == {}
    monkeypatch.setattr(db_copy, "insert_rows", real)
    code, out, err = copy_cli(capsys, "--from", url, "--to", target)
    assert code == 0, out + err
    assert table_rows(target) == table_rows(url)
    assert answers(target, asked) == answers(url, asked)


def test_a_copy_that_does_not_verify_is_rolled_back(source, target, monkeypatch, capsys):
    """A row altered on its way (as a lossy driver would): the checksum differs, nothing stays."""
    url, _ = source
    real = db_copy.insert_rows

    def lossy(conn, table, rows):
        if table.name == "inventories":
            rows[0] = {**rows[0], "total": rows[0]["total"] + 1}
        real(conn, table, rows)

    monkeypatch.setattr(db_copy, "insert_rows", lossy)
    code, out, _ = copy_cli(capsys, "--from", url, "--to", target)
    assert code == 1
    lines = {line.split()[0]: line for line in out.splitlines() if line}
    assert lines["inventories"].endswith("MISMATCH") and lines["allocations"].endswith(" ok"), out
    assert out.strip().splitlines()[-1].startswith("verification FAILED (inventories)"), out
    assert _copied_rows(target) == 0


def test_verify_only_finds_a_tampered_copy(source, target, capsys):
    url, _ = source
    assert copy_cli(capsys, "--from", url, "--to", target)[0] == 0
    code, out, _ = copy_cli(capsys, "--from", url, "--to", target, "--verify-only")
    assert code == 0 and out.strip().splitlines()[-1].startswith("verified 12 tables"), out
    engine = sa.create_engine(target)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE allocations SET used = used + 1 WHERE id = "
                             "(SELECT id FROM (SELECT MIN(id) AS id FROM allocations) AS first)"))
    engine.dispose()
    code, out, _ = copy_cli(capsys, "--from", url, "--to", target, "--verify-only")
    assert code == 1
    bad = [line.split()[0] for line in out.splitlines() if line.endswith("MISMATCH")]
    assert bad == ["allocations"], out


def test_writes_to_a_live_source_during_the_copy_are_not_carried(source, target, monkeypatch, capsys):
    """The source is read in one snapshot: a provider and an allocation written while the copy
    runs are not in the target, and what was copied still verifies."""
    url, asked = source
    real = db_copy.insert_rows
    written = []

    def meanwhile(conn, table, rows):
        if table.name == "consumers" and not written:
            app, client = allotment_client(url)
            try:
                written.append(str(uuidlib.uuid4()))
                assert client.post("/resource_providers", json={
                    "name": "during-copy", "uuid": written[0]}).status == 200
                assert client.put(f"/allocations/{uuidlib.uuid4()}", json={
                    "allocations": {U["ss1"]: {"resources": {"DISK_GB": 10}}}, "project_id": "p",
                    "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}).status == 204
            finally:
                app.db.dispose()
        real(conn, table, rows)

    before = answers(url, asked)
    monkeypatch.setattr(db_copy, "insert_rows", meanwhile)
    code, out, err = copy_cli(capsys, "--from", url, "--to", target)
    assert code == 0, out + err
    assert written and answers(target, asked) == before
    app, client = allotment_client(target)
    try:
        assert client.get(f"/resource_providers/{written[0]}").status == 404
    finally:
        app.db.dispose()
    app, client = allotment_client(url)
    try:
        assert client.get(f"/resource_providers/{written[0]}").status == 200
    finally:
        app.db.dispose()
