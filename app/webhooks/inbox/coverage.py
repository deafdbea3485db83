"""The synced events' statements: a sync of a subject covers its events (``app/webhooks/coverage.py`` asks these).

"Covered": the subject's events, unprocessed and not set aside, that arrived
by the time the sync's read began (``ix_webhook_event_sync_subject``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import Database, driver_connection
from app.webhooks.inbox import sql
from app.webhooks.inbox.records import SetAside


@dataclass(frozen=True, slots=True)
class PeekedEvent:
    """An event as its job sees it before asking for its sync (no lock taken, no attempt counted)."""

    id: int
    provider: str
    type: str
    sync_subject: str | None
    received_at: datetime
    request_id: str | None
    tenant_key: str | None
    trace_context: str | None
    done: bool


@dataclass(frozen=True, slots=True)
class MarkedEvent:
    """An event a sync marked processed."""

    provider: str
    took: float | None
    """Seconds from arrival to processing; None for a replay (its wait is the operator's)."""
    trace_context: str | None


class InboxCoverage:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def peek(self, row_id: int) -> PeekedEvent | None:
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(sql.PEEK, row_id)
        return PeekedEvent(**dict(row)) if row is not None else None

    async def covered(self, subject: str, read_began: datetime) -> tuple[datetime | None, int | None]:
        """Of the events a sync of ``subject`` whose read began at ``read_began`` covers: when the latest arrived,
        and the row id of the last stored (both None: it covers none)."""
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(sql.COVERED, subject, read_began)
        return row["newest_at"], row["newest"]

    @staticmethod
    async def mark_covered(session: AsyncSession, subject: str, read_began: datetime) -> list[MarkedEvent]:
        """In the sync's transaction: the events it covers processed with what it wrote."""
        rows = (await session.execute(sql.MARK_COVERED, {"subject": subject, "read_began": read_began})).all()
        return [MarkedEvent(row.provider, _seconds(row.took), row.trace_context) for row in rows]

    async def record_covered_failure(self, subject: str, read_began: datetime, error: str) -> list[int]:
        """A failed sync counts an attempt of each event it covers; their attempts now."""
        async with driver_connection(self.db) as connection:
            rows = await connection.fetch(sql.RECORD_COVERED_FAILURE, subject, read_began, error)
        return [row["attempts"] for row in rows]

    @asynccontextmanager
    async def setting_aside_covered(
        self, subject: str, read_began: datetime, error: str
    ) -> AsyncIterator[list[SetAside]]:
        """The events a sync covers set aside (a permanent error), committed only after the block (the alert)."""
        async with driver_connection(self.db) as connection, connection.transaction():
            rows = await connection.fetch(sql.SET_ASIDE_COVERED, subject, read_began, error)
            yield [SetAside.of(row) for row in rows]


def _seconds(took: Decimal | None) -> float | None:
    return None if took is None else float(took)
