"""Tenants, users and memberships, copied from Clerk."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base
from app.core.models import ClerkSyncedColumns

# Billing's columns: on the workspace row, written only by billing (its repository), read by anyone.
BILLING = {"owner": "billing"}


class Workspace(ClerkSyncedColumns, Base):
    """A tenant (a Clerk organization) and its billing state as last read from Stripe.

    Identity writes the row and ``member_limit`` (seats); the columns marked
    ``BILLING`` are billing's, the one module that writes them.
    """

    __tablename__ = "workspace"
    __table_args__ = (
        # Billing finds the customer of a subscription it synced (a thin event names only the subscription).
        Index("ix_workspace_subscription_id", "subscription_id", postgresql_where=text("subscription_id IS NOT NULL")),
    )

    clerk_org_id: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    slug: Mapped[str | None] = mapped_column(String(255), nullable=True)
    stripe_customer_id: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True, info=BILLING)
    subscription_id: Mapped[str | None] = mapped_column(String(64), nullable=True, info=BILLING)
    subscription_status: Mapped[str | None] = mapped_column(String(32), nullable=True, info=BILLING)
    price_id: Mapped[str | None] = mapped_column(String(64), nullable=True, info=BILLING)
    seat_quantity: Mapped[int | None] = mapped_column(Integer, nullable=True, info=BILLING)
    member_limit: Mapped[int] = mapped_column(Integer, nullable=False)
    current_period_end: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, info=BILLING)
    cancel_at_period_end: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("false"), default=False, info=BILLING
    )
    billing_synced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, info=BILLING)


class AppUser(ClerkSyncedColumns, Base):
    __tablename__ = "app_user"

    clerk_user_id: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    first_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    last_name: Mapped[str | None] = mapped_column(String(255), nullable=True)


class WorkspaceMember(ClerkSyncedColumns, Base):
    __tablename__ = "workspace_member"
    __table_args__ = (
        # Seats, by join time (the member limit's statement reads only what it may change): the active members,
        # and among them those not suspended and those suspended.
        Index(
            "ix_workspace_member_seats",
            "workspace_id",
            "created_at",
            "id",
            postgresql_where=text("deleted_at IS NULL"),
        ),
        Index(
            "ix_workspace_member_seated",
            "workspace_id",
            "created_at",
            "id",
            postgresql_where=text("deleted_at IS NULL AND suspended_at IS NULL"),
        ),
        Index(
            "ix_workspace_member_suspended",
            "workspace_id",
            "created_at",
            "id",
            postgresql_where=text("deleted_at IS NULL AND suspended_at IS NOT NULL"),
        ),
    )

    clerk_membership_id: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    workspace_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("workspace.id", ondelete="CASCADE"), nullable=False, index=True
    )
    user_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("app_user.id", ondelete="CASCADE"), nullable=False, index=True
    )
    role: Mapped[str | None] = mapped_column(String(64), nullable=True)
    suspended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
