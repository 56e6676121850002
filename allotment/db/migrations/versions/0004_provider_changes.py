"""Note which providers each write changed, for the provider mirror

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26

Makes the change-number table and triggers of 0003 again, now with
triggers that also note the provider of every row written: on SQLite in
``allotment_provider_changes`` (and a token in the counter table), on
PostgreSQL in ``allotment_provider_log`` (folded into
``allotment_provider_changes`` with the log); see
``allotment/db/changes.py``.  Nothing is made on MySQL / MariaDB.
"""

from alembic import op

from allotment.db import changes

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    changes.create(op.get_bind())


def downgrade() -> None:
    changes.create(op.get_bind(), note_providers=False)
