"""The placement schema as SQLAlchemy Core tables.

The layout follows upstream Placement closely (an operator may inspect it,
and the allocations table keys consumers by uuid so allocations written
before consumer records existed remain readable), with the indexes every
lookup path of the API needs.  Migrations in ``allotment/db/migrations``
create exactly these tables; ``tests/unit/db/test_migrations.py`` checks the
two never drift apart.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


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
    sa.UniqueConstraint("name"),
)

traits = sa.Table(
    "traits", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("name"),
)

resource_providers = sa.Table(
    "resource_providers", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
    sa.Column("root_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=True),
    sa.Column("parent_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=True),
    *_timestamps(),
    sa.UniqueConstraint("uuid"),
    sa.UniqueConstraint("name"),
    sa.Index("ix_resource_providers_root_provider_id", "root_provider_id"),
    sa.Index("ix_resource_providers_parent_provider_id", "parent_provider_id"),
)

inventories = sa.Table(
    "inventories", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=False),
    sa.Column("resource_class_id", sa.Integer, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("reserved", sa.Integer, nullable=False),
    sa.Column("min_unit", sa.Integer, nullable=False),
    sa.Column("max_unit", sa.Integer, nullable=False),
    sa.Column("step_size", sa.Integer, nullable=False),
    sa.Column("allocation_ratio", sa.Float, nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("resource_provider_id", "resource_class_id"),
    sa.Index("ix_inventories_resource_class_id", "resource_class_id"),
)

placement_aggregates = sa.Table(
    "placement_aggregates", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("uuid"),
)

resource_provider_aggregates = sa.Table(
    "resource_provider_aggregates", metadata,
    sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"),
              primary_key=True),
    sa.Column("aggregate_id", sa.Integer, sa.ForeignKey("placement_aggregates.id"),
              primary_key=True),
    *_timestamps(),
    sa.Index("ix_resource_provider_aggregates_aggregate_id", "aggregate_id"),
)

resource_provider_traits = sa.Table(
    "resource_provider_traits", metadata,
    sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"),
              primary_key=True),
    sa.Column("trait_id", sa.Integer, sa.ForeignKey("traits.id"), primary_key=True),
    *_timestamps(),
    sa.Index("ix_resource_provider_traits_trait_id", "trait_id"),
)

projects = sa.Table(
    "projects", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("external_id", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("external_id"),
)

users = sa.Table(
    "users", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("external_id", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("external_id"),
)

consumer_types = sa.Table(
    "consumer_types", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False),
    *_timestamps(),
    sa.UniqueConstraint("name"),
)

consumers = sa.Table(
    "consumers", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False),
    sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id"), nullable=False),
    sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
    sa.Column("consumer_type_id", sa.Integer, sa.ForeignKey("consumer_types.id"), nullable=True),
    *_timestamps(),
    sa.UniqueConstraint("uuid"),
    sa.Index("ix_consumers_project_id_user_id", "project_id", "user_id"),
)

# consumer_id holds the consumer's uuid (not a foreign key), as upstream:
# allocations may predate their consumer record until the online data
# migration creates it.
allocations = sa.Table(
    "allocations", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"),
              nullable=False),
    sa.Column("consumer_id", sa.String(36), nullable=False),
    sa.Column("resource_class_id", sa.Integer, nullable=False),
    sa.Column("used", sa.Integer, nullable=False),
    *_timestamps(),
    sa.Index("ix_allocations_resource_provider_class_used",
             "resource_provider_id", "resource_class_id", "used"),
    sa.Index("ix_allocations_consumer_id", "consumer_id"),
    sa.Index("ix_allocations_resource_class_id", "resource_class_id"),
)

# MySQL/MariaDB: store full Unicode and compare names byte-for-byte, as the
# other backends do (the server default is often latin1, case-insensitive).
for _table in metadata.tables.values():
    _table.dialect_options["mysql"]["charset"] = "utf8mb4"
    _table.dialect_options["mysql"]["collate"] = "utf8mb4_bin"
    _table.dialect_options["mysql"]["engine"] = "InnoDB"
