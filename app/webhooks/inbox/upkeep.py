"""The crons' and the operator commands' writes (``app/webhooks/maintenance.py``, ``operations.py``): recover, set
aside, retain, reopen, replay."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime

import asyncpg

from app.core.db import Database, driver_connection
from app.webhooks.inbox import sql
from app.webhooks.inbox.attempt import event_lock_key
from app.webhooks.inbox.records import SetAside


class InboxUpkeep:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def pending_page(
        self, received_before: datetime, after: tuple[datetime, int], limit: int
    ) -> list[asyncpg.Record]:
        """Unprocessed rows not set aside, oldest first, from after ``after`` (received_at, id)."""
        async with driver_connection(self.db) as connection:
            return list(await connection.fetch(sql.PENDING_PAGE, received_before, *after, limit))

    @asynccontextmanager
    async def setting_aside(self, row_ids: Sequence[int]) -> AsyncIterator[list[SetAside]]:
        """The rows set aside, committed only when the block (their alerts) ends without an error.

        A crash before the commit leaves them pending, so the next tick sets them
        aside and alerts again: an alert may repeat, but is never lost. Rows a
        running attempt holds are skipped; a concurrent tick waits on the row
        locks, then finds them set aside.
        """
        async with driver_connection(self.db) as connection, connection.transaction():
            rows = await connection.fetch(sql.SET_ASIDE_EXHAUSTED, list(row_ids), event_lock_key(0))
            yield [SetAside.of(row) for row in rows]

    async def delete_processed_batch(self, processed_before: datetime, limit: int) -> int:
        async with driver_connection(self.db) as connection:
            status = await connection.execute(sql.DELETE_PROCESSED_BATCH, processed_before, limit)
        return int(status.split()[-1])

    async def reopen(self, row_id: int | None = None) -> list[asyncpg.Record]:
        """Give set-aside events (or the one) their attempts back; the reopened rows (id, provider, request id, tenant
        key, trace context)."""
        async with driver_connection(self.db) as connection:
            return list(await connection.fetch(sql.REOPEN, row_id))

    async def reset_for_replay(self, row_id: int) -> None:
        """Make a processed (or any) event new again: unprocessed, not set aside, no attempts."""
        async with driver_connection(self.db) as connection:
            await connection.execute(sql.RESET_FOR_REPLAY, row_id)
