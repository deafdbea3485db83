"""The inbox: one row per (provider, event id), whatever the number of deliveries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Index, Integer, String, Text, UniqueConstraint, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base


class WebhookEvent(Base):
    __tablename__ = "webhook_event"
    __table_args__ = (
        UniqueConstraint("provider", "event_id", name="uq_webhook_event_provider_event_id"),
        # Recovery reads only pending rows (unprocessed, not set aside) by arrival time.
        Index(
            "ix_webhook_event_pending",
            "received_at",
            postgresql_where=text("processed_at IS NULL AND abandoned_at IS NULL"),
        ),
        # Retention deletes processed rows by processing time.
        Index("ix_webhook_event_processed", "processed_at", postgresql_where=text("processed_at IS NOT NULL")),
        # retry-abandoned and the operator list read set-aside rows.
        Index("ix_webhook_event_abandoned", "abandoned_at", postgresql_where=text("abandoned_at IS NOT NULL")),
        # A sync finds the events it covers: the unprocessed ones of its subject, by arrival.
        Index(
            "ix_webhook_event_sync_subject",
            "sync_subject",
            "received_at",
            postgresql_where=text("processed_at IS NULL AND abandoned_at IS NULL AND sync_subject IS NOT NULL"),
        ),
        # Operators and metrics read the tenants with unprocessed events.
        Index(
            "ix_webhook_event_tenant",
            "provider",
            "tenant_key",
            postgresql_where=text("processed_at IS NULL AND abandoned_at IS NULL"),
        ),
        # A workspace's timeline reads every event of its tenants (its Stripe customer, its Clerk organization),
        # newest first, a page at a time: in the index's own order, from where the last page ended.
        Index(
            "ix_webhook_event_tenant_received",
            "tenant_key",
            "received_at",
            "id",
            postgresql_where=text("tenant_key IS NOT NULL"),
        ),
    )

    provider: Mapped[str] = mapped_column(String(32), nullable=False)
    event_id: Mapped[str] = mapped_column(String(255), nullable=False)
    type: Mapped[str] = mapped_column(String(255), nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    processed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"), default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    abandoned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The X-Request-Id of the delivery that stored it: its processing logs carry the same id.
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # When an operator last asked to process it again (replay): its processing then is no measure of the pipeline.
    replayed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Whose event it is (a Stripe customer, a Clerk organization or user), decided at intake from the verified
    # body by the module that handles it: tenants take turns in the provider's queue.
    tenant_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # What a sync reads back to cover it (``customer:cus_...``): set for synced events (Stripe's) only.
    sync_subject: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The trace of the delivery that stored it (tracing on: W3C headers as JSON): its attempts are spans of it.
    trace_context: Mapped[str | None] = mapped_column(Text, nullable=True)
