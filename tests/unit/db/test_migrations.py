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

from allotment.db import migrate, tables
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
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": False})
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
    assert "alembic_version" in present


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
