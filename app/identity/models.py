"""Tenants, users and memberships, copied from Clerk; and the journal of what the pipeline changed in them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, Index, Integer, String, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base
from app.core.journal import NOT_JOURNALED
from app.core.models import ClerkSyncedColumns


class Workspace(ClerkSyncedColumns, Base):
    """A tenant (a Clerk organization) and its billing state as last read from Stripe.

    Only identity's repository writes the row, so every change is journaled.
    Billing decides the values of the billing columns (``stripe_customer_id``
    to ``billing_synced_at``) and asks identity to write them
    (``app/identity/billing_state.py``); identity decides ``member_limit``
    from the seats billing says are paid for (``app/identity/seats.py``).
    """

    __tablename__ = "workspace"
    __table_args__ = (
        # Billing finds the customer of a subscription it synced (a thin event names only the subscription).
        Index("ix_workspace_subscription_id", "subscription_id", postgresql_where=text("subscription_id IS NOT NULL")),
    )

    clerk_org_id: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    slug: Mapped[str | None] = mapped_column(String(255), nullable=True)
    stripe_customer_id: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)
    subscription_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    subscription_status: Mapped[str | None] = mapped_column(String(32), nullable=True)
    price_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    seat_quantity: Mapped[int | None] = mapped_column(Integer, nullable=True)
    member_limit: Mapped[int] = mapped_column(Integer, nullable=False)
    current_period_end: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    cancel_at_period_end: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("false"), default=False
    )
    # When the state written was read from Stripe: bookkeeping, so a sync that read what was stored journals nothing.
    billing_synced_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True, info=NOT_JOURNALED
    )


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


class WorkspaceChange(Base):
    """The change journal: one row per row the pipeline changed, with what changed and why.

    ``source`` is the cause: ``webhook_event:<inbox row id>``, else the job,
    cron or command's name (``app/core/journal.py``). ``changes`` maps each
    column changed to ``[stored, new]`` (JSON values; a new row's stored
    values are null). Written in the transaction of the change, by the
    repository that owns the row (``app/identity/repository/journal_sql.py``, or
    ``Journaled`` models: ``app/identity/journal.py``); nothing when nothing
    changed. ``workspace_id`` is the workspace the row belongs to (none for a
    user: a user belongs to no one workspace). No foreign key: the journal is a
    log, and checking one would share the workspace's row lock with every
    writer. Holds names and emails: it is kept ``WORKSPACE_CHANGE_RETENTION_DAYS``
    and never logged.
    """

    __tablename__ = "workspace_change"
    __table_args__ = (
        # A workspace's rows, newest first, in the index's own order (its id breaks ties of one transaction).
        Index("ix_workspace_change_workspace_id_at", "workspace_id", "at", "id"),
        Index("ix_workspace_change_at", "at"),  # the retention cron's batches, oldest first
    )

    workspace_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    source: Mapped[str] = mapped_column(String(255), nullable=False)
    entity: Mapped[str] = mapped_column(String(64), nullable=False)
    entity_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    changes: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
