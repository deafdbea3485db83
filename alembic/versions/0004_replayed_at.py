"""replayed_at: when an operator last asked to process an event again

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 23:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_event", sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("webhook_event", "replayed_at")
