"""The Alembic migrations build exactly the schema that allotment/db/tables.py declares.

Queries are written against ``tables.py``, while databases are built by the
migrations; if the two drifted apart, a query could work in a test database
made from the metadata and fail on an operator's migrated one.  Alembic's
autogenerate comparison lists every difference (tables, columns, types,
nullability, indexes, unique constraints, foreign keys); after ``upgrade``
to head it must find none, on each backend.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from allotment.db import changes, migrate, tables
from allotment.db.engine import create_engine
from tests.conftest import create_database


@pytest.fixture
def empty_engine(tmp_path_factory):
    url, drop = create_database(tmp_path_factory, "migr")
    engine = create_engine(url)
    yield engine
    engine.dispose()
    drop()


def _differences(engine) -> list:
    def ours(name, type_, parent):  # the version and change tables are no part of tables.py
        own = ("alembic_version", "allotment_version", changes.COUNTER, changes.LOG, changes.PROVIDER_CHANGES,
               changes.PROVIDER_LOG, migrate.LOCK_TABLE)
        return not (name in own if type_ == "table" else parent.get("table_name") in own)

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": False,
                        "include_name": ours})
        return compare_metadata(context, tables.metadata)


def test_head_creates_exactly_the_declared_schema(empty_engine):
    assert migrate.current_revision(empty_engine) is None
    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    assert _differences(empty_engine) == []


def test_every_declared_table_exists_after_upgrade(empty_engine):
    migrate.upgrade(empty_engine)
    present = set(sa.inspect(empty_engine).get_table_names())
    assert set(tables.metadata.tables) <= present
    assert {"alembic_version", "allotment_version"} <= present


def test_upgrade_twice_changes_nothing(empty_engine):
    first = migrate.upgrade(empty_engine)
    second = migrate.upgrade(empty_engine)
    assert first == second == migrate.head_revision()
    assert _differences(empty_engine) == []


def test_comparison_notices_drift(empty_engine):
    """The check can fail: a table missing from the database is reported."""
    migrate.upgrade(empty_engine)
    with empty_engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE allocations"))
    differences = _differences(empty_engine)
    assert any(diff[0] == "add_table" and diff[1].name == "allocations" for diff in differences)


def test_comparison_notices_a_missing_index(empty_engine):
    migrate.upgrade(empty_engine)
    # One that backs no foreign key (MySQL refuses to drop those).
    index = next(index for table in tables.metadata.sorted_tables for index in table.indexes
                 if not any(column.foreign_keys for column in index.columns))
    with empty_engine.begin() as conn:
        if empty_engine.dialect.name == "mysql":
            conn.execute(sa.text(f"DROP INDEX {index.name} ON {index.table.name}"))
        else:
            conn.execute(sa.text(f"DROP INDEX {index.name}"))
    differences = _differences(empty_engine)
    assert any(diff[0] == "add_index" and diff[1].name == index.name for diff in differences)


# -- the reference's layout (the way back) ---------------------------------

def _missing_reference_facts(engine) -> list[str]:
    """What Placement 16.0.0's layout has that this database lacks, as readable lines.

    The reference's facts come from ``tests/data/reference_schema.json``
    (``tools/reference_schema`` reflects databases the reference's own
    migrations built).  Additions of ours are allowed; anything missing,
    renamed or retyped would stop the reference from using the database.
    """
    from tests import reference

    expected = reference.load_schema()[engine.dialect.name][reference.HEAD]
    return reference.missing_facts(expected, reference.reflect(engine.url.render_as_string(hide_password=False)))


def test_head_has_everything_placement_16_has(empty_engine):
    migrate.upgrade(empty_engine)
    assert _missing_reference_facts(empty_engine) == []
    assert migrate.placement_revision(empty_engine) == "a082b8bb98d0"


def test_reference_comparison_notices_a_renamed_index(empty_engine):
    """The check can fail: an index of the reference under another name is reported."""
    migrate.upgrade(empty_engine)
    with empty_engine.begin() as conn:
        if empty_engine.dialect.name == "mysql":
            conn.execute(sa.text("DROP INDEX allocations_consumer_id_idx ON allocations"))
        else:
            conn.execute(sa.text("DROP INDEX allocations_consumer_id_idx"))
        conn.execute(sa.text("CREATE INDEX ix_allocations_consumer_id ON allocations (consumer_id)"))
    assert any("allocations_consumer_id_idx" in line for line in _missing_reference_facts(empty_engine))


@pytest.mark.parametrize("revision", ["b4ed3a175331", "611cd6dffd7b", "b5c396305c25", "422ece571366",
                                      "a082b8bb98d0"])
def test_stored_reference_ddl_lays_out_the_recorded_schema(revision, tmp_path_factory):
    """The DDL the take-over tests build from is the layout recorded in reference_schema.json.

    Both were taken from databases the reference's own migrations built
    (``tools/reference_schema_ddl``, ``tools/reference_schema``); if either
    is regenerated alone, this says so.
    """
    from tests import reference

    url, drop = create_database(tmp_path_factory, "ddl")
    engine = create_engine(url)
    try:
        reference.create_from_ddl(url, revision)
        expected = reference.load_schema()[engine.dialect.name][revision]
        assert reference.reflect(url) == expected
        assert migrate.placement_revision(engine) == revision
    finally:
        engine.dispose()
        drop()
