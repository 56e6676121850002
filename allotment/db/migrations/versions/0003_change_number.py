"""A change number kept by triggers, for reusing allocation candidate answers

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26

Adds the table ``allotment_changes`` (and on PostgreSQL ``allotment_change_log``
and the function ``allotment_note_change``) and triggers on the tables that
allocation candidates are computed from; see ``allotment/db/changes.py``.
Placement never looks at them, and its writes fire them like anyone's.
Nothing is made on MySQL / MariaDB.
"""

from alembic import op

from allotment.db import changes

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    changes.create(op.get_bind())


def downgrade() -> None:
    changes.drop(op.get_bind())
