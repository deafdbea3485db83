"""request ids: the delivery that stored an event, and the request a staged job came from

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 11:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_event", sa.Column("request_id", sa.String(length=128), nullable=True))
    op.add_column("job_outbox", sa.Column("request_id", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_column("job_outbox", "request_id")
    op.drop_column("webhook_event", "request_id")
