"""tenant keys and sync subjects of webhook events, fair staged jobs, and billing syncs

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 11:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_UNPROCESSED = "processed_at IS NULL AND abandoned_at IS NULL"


def upgrade() -> None:
    op.add_column("webhook_event", sa.Column("tenant_key", sa.String(length=255), nullable=True))
    op.add_column("webhook_event", sa.Column("sync_subject", sa.String(length=255), nullable=True))
    op.create_index(
        "ix_webhook_event_sync_subject",
        "webhook_event",
        ["sync_subject", "received_at"],
        postgresql_where=sa.text(f"{_UNPROCESSED} AND sync_subject IS NOT NULL"),
    )
    op.create_index(
        "ix_webhook_event_tenant",
        "webhook_event",
        ["provider", "tenant_key"],
        postgresql_where=sa.text(_UNPROCESSED),
    )
    op.add_column("job_outbox", sa.Column("tenant_key", sa.String(length=255), nullable=True))
    op.add_column("job_outbox", sa.Column("fair", sa.Boolean(), server_default=sa.text("false"), nullable=False))
    op.create_table(
        "billing_sync",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False, start=1, increment=1), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("generation", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("pending", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("in_flight_generation", sa.BigInteger(), nullable=True),
        sa.Column("read_began", sa.DateTime(timezone=True), nullable=True),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("calls", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_billing_sync")),
        sa.UniqueConstraint("subject", name=op.f("uq_billing_sync_subject")),
    )


def downgrade() -> None:
    op.drop_table("billing_sync")
    op.drop_column("job_outbox", "fair")
    op.drop_column("job_outbox", "tenant_key")
    op.drop_index("ix_webhook_event_tenant", table_name="webhook_event")
    op.drop_index("ix_webhook_event_sync_subject", table_name="webhook_event")
    op.drop_column("webhook_event", "sync_subject")
    op.drop_column("webhook_event", "tenant_key")
