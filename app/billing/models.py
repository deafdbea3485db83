"""Mirrors of Stripe objects as last read from the Stripe API (never from event bodies)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, ForeignKey, String, func
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from app.core.db import Base


class StripeMirrorColumns:
    stripe_id: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    status: Mapped[str | None] = mapped_column(String(64), nullable=True)
    amount: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    currency: Mapped[str | None] = mapped_column(String(8), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(128), nullable=True)
    stripe_created_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    synced_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    @declared_attr
    def workspace_id(cls) -> Mapped[int | None]:
        return mapped_column(BigInteger, ForeignKey("workspace.id", ondelete="SET NULL"), nullable=True, index=True)


class BillingDispute(StripeMirrorColumns, Base):
    __tablename__ = "billing_dispute"


class BillingRefund(StripeMirrorColumns, Base):
    __tablename__ = "billing_refund"


class BillingFraudWarning(StripeMirrorColumns, Base):
    __tablename__ = "billing_fraud_warning"
