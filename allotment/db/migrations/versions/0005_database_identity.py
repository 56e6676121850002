"""A database identity in the change number, so a restored or replaced database is noticed

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28

Gives the change-number table of 0003/0004 a new random token of 62 bits
(SQLite had one of 15 bits; PostgreSQL none): numbers read from the
database carry it, and those read from another database, or from this one
after a restored dump (on PostgreSQL the table's own oid counts too), are
never equal to them; see ``allotment/db/changes.py``.  Nothing on MySQL /
MariaDB.
"""

from alembic import op

from allotment.db import changes

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    changes.new_identity(op.get_bind())


def downgrade() -> None:
    # 0004's code reads SQLite's token whatever its size and PostgreSQL's not at all.
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"DELETE FROM {changes.COUNTER} WHERE id = 2")
