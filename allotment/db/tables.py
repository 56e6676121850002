"""The placement schema as SQLAlchemy Core tables.

The layout is Placement 16.0.0's (schema revision a082b8bb98d0), down to
the names of indexes and unique constraints and which columns carry foreign
keys, so that Allotment can take over a database the reference created and
the reference can be started again on a database Allotment served (see
``allotment/db/reference_layout.py``).  The allocations table keys consumers
by uuid, so allocations written before consumer records existed remain
readable.  ``tests/data/reference_schema.json`` holds the reference's layout
as reflected from databases its own migrations built;
``tests/unit/db/test_migrations.py`` and ``tests/functional/test_takeover.py``
check that ours matches it on each backend.
"""

from __future__ import annotations

import sqlalchemy as sa

# Names are given explicitly; foreign keys and primary keys stay unnamed so
# that each backend names them as it did for the reference.
metadata = sa.MetaData()


def _timestamps() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime, nullable=True),
        sa.Column("updated_at", sa.DateTime, nullable=True),
    ]


# Standard classes take ids from their position in os-resource-classes;
# custom classes start here, as upstream does.
CUSTOM_RESOURCE_CLASS_MIN_ID = 10000

resource_classes = sa.Table(
    "resource_classes", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("name", name="uniq_resource_classes0name"),
)

traits = sa.Table(
    "traits", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("name", name="uniq_traits0name"),
)

resource_providers = sa.Table(
    "resource_providers", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False),
    sa.Column("name", sa.String(200), nullable=True),
    sa.Column("generation", sa.Integer, nullable=True, default=0),
    # (This column order makes MySQL number the two foreign keys as it did
    # for the reference.)
    sa.Column("parent_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=True),
    sa.Column("root_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=True),
    *_timestamps(),
    sa.UniqueConstraint("uuid", name="uniq_resource_providers0uuid"),
    sa.UniqueConstraint("name", name="uniq_resource_providers0name"),
    sa.Index("resource_providers_root_provider_id_idx", "root_provider_id"),
    sa.Index("resource_providers_parent_provider_id_idx", "parent_provider_id"),
)

inventories = sa.Table(
    "inventories", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("resource_provider_id", sa.Integer, nullable=False),
    sa.Column("resource_class_id", sa.Integer, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("reserved", sa.Integer, nullable=False),
    sa.Column("min_unit", sa.Integer, nullable=False),
    sa.Column("max_unit", sa.Integer, nullable=False),
    sa.Column("step_size", sa.Integer, nullable=False),
    sa.Column("allocation_ratio", sa.Float, nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("resource_provider_id", "resource_class_id",
                        name="uniq_inventories0resource_provider_resource_class"),
    sa.Index("inventories_resource_class_id_idx", "resource_class_id"),
)

placement_aggregates = sa.Table(
    "placement_aggregates", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=True),
    *_timestamps(),
    sa.UniqueConstraint("uuid", name="uniq_placement_aggregates0uuid"),
)

resource_provider_aggregates = sa.Table(
    "resource_provider_aggregates", metadata,
    sa.Column("resource_provider_id", sa.Integer, primary_key=True),
    sa.Column("aggregate_id", sa.Integer, primary_key=True),
    *_timestamps(),
    sa.Index("resource_provider_aggregates_aggregate_id_idx", "aggregate_id"),
)

resource_provider_traits = sa.Table(
    "resource_provider_traits", metadata,
    sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"),
              nullable=False),
    sa.Column("trait_id", sa.Integer, sa.ForeignKey("traits.id"), nullable=False),
    *_timestamps(),
    sa.PrimaryKeyConstraint("trait_id", "resource_provider_id"),
    sa.Index("resource_provider_traits_resource_provider_trait_idx",
             "resource_provider_id", "trait_id"),
)

projects = sa.Table(
    "projects", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("external_id", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("external_id", name="uniq_projects0external_id"),
)

users = sa.Table(
    "users", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("external_id", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("external_id", name="uniq_users0external_id"),
)

consumer_types = sa.Table(
    "consumer_types", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("name", name="uniq_consumer_types0name"),
)

consumers = sa.Table(
    "consumers", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False),
    sa.Column("project_id", sa.Integer, nullable=False),
    sa.Column("user_id", sa.Integer, nullable=False),
    sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
    sa.Column("consumer_type_id", sa.Integer,
              sa.ForeignKey("consumer_types.id", name="consumers_consumer_type_id_fkey"),
              nullable=True),
    *_timestamps(),
    sa.UniqueConstraint("uuid", name="uniq_consumers0uuid"),
    sa.Index("consumers_project_id_user_id_uuid_idx", "project_id", "user_id", "uuid"),
    sa.Index("consumers_project_id_uuid_idx", "project_id", "uuid"),
    sa.Index("consumers_consumer_type_id_idx", "consumer_type_id"),
)

# consumer_id holds the consumer's uuid (not a foreign key), as upstream:
# allocations may predate their consumer record until the online data
# migration creates it.
allocations = sa.Table(
    "allocations", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("resource_provider_id", sa.Integer, nullable=False),
    sa.Column("consumer_id", sa.String(36), nullable=False),
    sa.Column("resource_class_id", sa.Integer, nullable=False),
    sa.Column("used", sa.Integer, nullable=False),
    *_timestamps(),
    sa.Index("allocations_resource_provider_class_used_idx",
             "resource_provider_id", "resource_class_id", "used"),
    sa.Index("allocations_consumer_id_idx", "consumer_id"),
    sa.Index("allocations_resource_class_id_idx", "resource_class_id"),
)

# MySQL/MariaDB: store full Unicode and compare names byte-for-byte, as the
# other backends do (the server default is often latin1, case-insensitive).
for _table in metadata.tables.values():
    _table.dialect_options["mysql"]["charset"] = "utf8mb4"
    _table.dialect_options["mysql"]["collate"] = "utf8mb4_bin"
    _table.dialect_options["mysql"]["engine"] = "InnoDB"
