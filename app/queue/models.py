"""Durable state of the queue module: cron ticks that ran and claimed side effects."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, String, Text, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base


class CronRun(Base):
    """One row per cron tick that ran: the unique key makes a tick run once across all workers."""

    __tablename__ = "cron_run"
    __table_args__ = (UniqueConstraint("name", "slot", name="uq_cron_run_name_slot"),)

    name: Mapped[str] = mapped_column(String(255), nullable=False)
    slot: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class SideEffectClaim(Base):
    """A key claimed before an effect that must not happen twice (an email), done once it happened."""

    __tablename__ = "side_effect_claim"

    key: Mapped[str] = mapped_column(String(255), unique=True, nullable=False)
    claimed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
