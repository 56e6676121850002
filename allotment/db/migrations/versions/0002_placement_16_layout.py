"""Allotment's history starts on Placement 16.0.0's layout

Revision ID: 0002
Revises:
Create Date: 2026-11-26

Nothing to do here: ``allotment/db/reference_layout.py`` has already brought
the database to Placement 16.0.0's layout (schema revision a082b8bb98d0 in
``alembic_version``) before Allotment's own migrations run.  Revisions after
this one are recorded in ``allotment_version`` and may only make changes
the reference tolerates (new tables or indexes; never renaming, dropping or
retyping what Placement has), so that the reference can be started again on
the database; ``tests/functional/test_takeover.py`` checks that.
"""

revision = "0002"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass
