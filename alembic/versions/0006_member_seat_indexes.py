"""workspace_member: partial indexes by join time for the member limit (seated, suspended, all active)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 11:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_INDEXES = {
    "ix_workspace_member_seats": "deleted_at IS NULL",
    "ix_workspace_member_seated": "deleted_at IS NULL AND suspended_at IS NULL",
    "ix_workspace_member_suspended": "deleted_at IS NULL AND suspended_at IS NOT NULL",
}


def upgrade() -> None:
    for name, where in _INDEXES.items():
        op.create_index(name, "workspace_member", ["workspace_id", "created_at", "id"], postgresql_where=sa.text(where))


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, table_name="workspace_member")
