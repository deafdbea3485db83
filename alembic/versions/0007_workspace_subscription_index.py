"""workspace: an index by subscription_id (billing finds the customer a Stripe thin event's subscription belongs to)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_workspace_subscription_id",
        "workspace",
        ["subscription_id"],
        postgresql_where=sa.text("subscription_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_workspace_subscription_id", table_name="workspace")
