"""Durable state of the queue module: cron ticks that ran, claimed side effects, and staged jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, Integer, String, Text, UniqueConstraint, func, text
from sqlalchemy.dialects.postgresql import JSONB
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


class JobOutbox(Base):
    """A job staged by ``queue.add(..., session=...)``: it exists if and only if that transaction committed.

    A relay (every worker, and the webhook pipeline right after its commit)
    queues the row and deletes it. The job id is fixed when the row is staged,
    so a row relayed twice (a crash between queueing and deleting) is dropped
    by the queue's deduplication while that job waits or runs.
    """

    __tablename__ = "job_outbox"

    job_name: Mapped[str] = mapped_column(String(255), nullable=False)
    queue: Mapped[str] = mapped_column(String(64), nullable=False)
    # With the namespace: the id the worker sees, the same however often the row is relayed.
    job_id: Mapped[str] = mapped_column(String(255), nullable=False)
    # The job's encoded data (``Job.encode_data``), as ``add`` would have queued it.
    data: Mapped[Any] = mapped_column(JSONB, nullable=False)
    retry_limit: Mapped[int] = mapped_column(Integer, nullable=False)
    # When the job is due: staged time plus its delay, so a relay after an outage does not delay it again.
    run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # How long the queue must keep the job after ``run_at`` to survive every retry (arq does not refresh it).
    expires_after_seconds: Mapped[int] = mapped_column(Integer, nullable=False)
    # The request the job was staged for: its lines carry the same request_id.
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # Whose work it is, and whether the relay places it by its tenant's turn (asked for now) or at ``run_at``.
    tenant_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    fair: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"), default=False)
    # The trace the job continues (tracing on: W3C headers as JSON), as ``add`` would have queued it.
    trace_context: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
