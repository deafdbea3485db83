"""trace context: the trace of the delivery that stored an event, and of the code that staged a job

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_event", sa.Column("trace_context", sa.Text(), nullable=True))
    op.add_column("job_outbox", sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("job_outbox", "trace_context")
    op.drop_column("webhook_event", "trace_context")
