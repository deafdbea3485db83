"""workspace_change: the journal of what the pipeline changed; webhook_event by tenant and arrival (timelines)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 18:15:40.611541

Generated (``database make-migrations``), then reviewed: the index on
``webhook_event`` is built concurrently, outside the migration's transaction,
so the intake keeps storing events while a large inbox is indexed.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TENANT_RECEIVED = "ix_webhook_event_tenant_received"


def upgrade() -> None:
    op.create_table(
        "workspace_change",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.Identity(always=False, start=1, increment=1),
            nullable=False,
        ),
        sa.Column("workspace_id", sa.BigInteger(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("source", sa.String(length=255), nullable=False),
        sa.Column("entity", sa.String(length=64), nullable=False),
        sa.Column("entity_id", sa.BigInteger(), nullable=False),
        sa.Column("changes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspace_change")),
    )
    op.create_index("ix_workspace_change_at", "workspace_change", ["at"], unique=False)
    op.create_index(
        "ix_workspace_change_workspace_id_at", "workspace_change", ["workspace_id", "at", "id"], unique=False
    )
    with op.get_context().autocommit_block():
        op.create_index(
            _TENANT_RECEIVED,
            "webhook_event",
            ["tenant_key", "received_at", "id"],
            unique=False,
            postgresql_where=sa.text("tenant_key IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,  # a build interrupted before leaves an invalid index behind: drop it by hand
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(_TENANT_RECEIVED, table_name="webhook_event", postgresql_concurrently=True, if_exists=True)
    op.drop_index("ix_workspace_change_workspace_id_at", table_name="workspace_change")
    op.drop_index("ix_workspace_change_at", table_name="workspace_change")
    op.drop_table("workspace_change")
