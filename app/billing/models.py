"""Mirrors of Stripe objects as last read from the Stripe API (never from event bodies)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, SmallInteger, String, func, text
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from app.core.db import Base
from app.core.journal import NOT_JOURNALED
from app.identity.journal import Journaled


class StripeMirrorColumns(Journaled):
    """A Stripe object as last read; ``Journaled``: each change a sync writes is in the workspace's journal."""

    stripe_id: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    status: Mapped[str | None] = mapped_column(String(64), nullable=True)
    amount: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    currency: Mapped[str | None] = mapped_column(String(8), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(128), nullable=True)
    stripe_created_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # When what is written was read: bookkeeping, so a read that found what was stored journals nothing.
    synced_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), info=NOT_JOURNALED
    )

    @declared_attr
    def workspace_id(cls) -> Mapped[int | None]:
        return mapped_column(BigInteger, ForeignKey("workspace.id", ondelete="SET NULL"), nullable=True, index=True)


class BillingDispute(StripeMirrorColumns, Base):
    __tablename__ = "billing_dispute"


class BillingRefund(StripeMirrorColumns, Base):
    __tablename__ = "billing_refund"


class BillingFraudWarning(StripeMirrorColumns, Base):
    __tablename__ = "billing_fraud_warning"


class BillingSync(Base):
    """The syncs of one subject (``customer:cus_...``, ``dispute:dp_...``): which is wanted, and what was read.

    An event asks for a sync of its subject (``pending``; a new ``generation``
    unless one is pending already); the sync that begins its read clears
    ``pending``, stamps ``read_began`` and is ``in_flight_generation`` until it
    has written, so an event that arrives after that asks for the next
    generation. Under the row's lock the hand-off is race free: an event is
    covered by a pending sync, by one in flight whose read began after it
    arrived, or it starts the next.
    """

    __tablename__ = "billing_sync"

    subject: Mapped[str] = mapped_column(String(255), unique=True, nullable=False)
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"), default=0)
    pending: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"), default=False)
    # The generation whose read began (at ``read_began``) and has not written yet.
    in_flight_generation: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    read_began: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # When the pending generation's job is due (its reservation of the budget, or the end of its backoff).
    due_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Stripe calls its last sync made: a sync reserves that many slots of the API budget.
    calls: Mapped[int] = mapped_column(SmallInteger, nullable=False, server_default=text("1"), default=1)
