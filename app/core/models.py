"""Column helpers shared by the feature modules' models."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, func
from sqlalchemy.orm import Mapped, mapped_column

from app.core.journal import NOT_JOURNALED


class ClerkSyncedColumns:
    """Rows copied from Clerk: ordered by Clerk's ``updated_at``, soft-deleted at the event time."""

    # The version of the copy: bookkeeping, so not journaled (the fields it versions are).
    clerk_updated_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True, info=NOT_JOURNALED
    )
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
