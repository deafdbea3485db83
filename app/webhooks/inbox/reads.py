"""The operator's reads: pages of events (the CLI, ``/ops``, a workspace's timeline), one event, counts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from app.core.db import Database, driver_connection
from app.webhooks.inbox import sql
from app.webhooks.inbox.records import EventRecord, State

_UNPROCESSED = ("pending", "failed", "set_aside")


class InboxReads:
    def __init__(self, db: Database) -> None:
        self.db = db

    # Events -----------------------------------------------------------------------------------------------
    async def page(
        self,
        *,
        provider: str | None = None,
        state: State | None = None,
        event_type: str | None = None,
        event_id: str | None = None,
        tenant_key: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[EventRecord]:
        """Newest first; the next page starts ``before_id`` = the last id of this one."""
        statement = sql.PAGE.format(state=sql.STATE_CONDITIONS[state] if state else "true")
        async with driver_connection(self.db) as connection:
            rows = await connection.fetch(statement, provider, event_type, event_id, limit, before_id, tenant_key)
        return [EventRecord.of(row) for row in rows]

    async def of_tenants(
        self, tenant_keys: Sequence[str], before: tuple[datetime, int] | None, limit: int
    ) -> list[EventRecord]:
        """Every event of these tenants, newest first, older than ``before`` (received_at, id)."""
        async with driver_connection(self.db) as connection:
            if before is None:
                rows = await connection.fetch(sql.TENANTS_PAGE, list(tenant_keys), limit)
            else:
                rows = await connection.fetch(sql.TENANTS_PAGE_BEFORE, list(tenant_keys), limit, *before)
        return [EventRecord.of(row) for row in rows]

    async def unprocessed_of_tenants(self, tenant_keys: Sequence[str], limit: int) -> list[EventRecord]:
        """The events of these tenants still to process (pending or failed; not set aside), oldest first."""
        async with driver_connection(self.db) as connection:
            rows = await connection.fetch(sql.TENANTS_UNPROCESSED, list(tenant_keys), limit)
        return [EventRecord.of(row) for row in rows]

    async def find(self, identifier: str, provider: str | None = None) -> list[EventRecord]:
        """By row id or provider event id."""
        row_id = int(identifier) if identifier.isdigit() and len(identifier) < 19 else None
        async with driver_connection(self.db) as connection:
            rows = await connection.fetch(sql.FIND, identifier, row_id, provider)
        return [EventRecord.of(row) for row in rows]

    async def get(self, row_id: int) -> EventRecord | None:
        """One row with its payload (as stored, JSON text)."""
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(sql.GET_WITH_PAYLOAD, row_id)
        return EventRecord.of(row) if row is not None else None

    # Counts -----------------------------------------------------------------------------------------------
    async def latency_last_hour(self) -> dict[str, tuple[int, float, float]]:
        """Per provider: events processed in the last hour, and the p50 and p99 seconds from arrival to processing."""
        async with driver_connection(self.db) as connection:
            rows = await connection.fetch(sql.LATENCY_LAST_HOUR)
        return {row["provider"]: (int(row["n"]), float(row["p50"]), float(row["p99"])) for row in rows}

    async def unprocessed_counts(self) -> dict[str, dict[str, int]]:
        """Per provider: events pending, failed and set aside (the partial indexes only: each scrape asks)."""
        rows = await self._unprocessed_only(sql.UNPROCESSED_COUNTS)
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            provider = counts.setdefault(row["provider"], dict.fromkeys(_UNPROCESSED, 0))
            for state in _UNPROCESSED:
                provider[state] += int(row[state])
        return counts

    async def queue_tenants(self) -> dict[str, tuple[int, float]]:
        """Per provider: the tenants with unprocessed events, and the seconds since the oldest of those arrived."""
        rows = await self._unprocessed_only(sql.QUEUE_TENANTS)
        return {row["provider"]: (int(row["tenants"]), float(row["oldest_seconds"] or 0.0)) for row in rows}

    async def _unprocessed_only(self, statement: str) -> list[asyncpg.Record]:
        """A statement on the unprocessed rows, through the partial indexes whatever the statistics say."""
        async with driver_connection(self.db) as connection, connection.transaction():
            await connection.execute(sql.NO_TABLE_SCAN)
            return list(await connection.fetch(statement))

    async def top_tenants(self, limit: int = 10) -> list[asyncpg.Record]:
        """The tenants with the most unprocessed events: provider, tenant key, how many, the oldest's arrival."""
        async with driver_connection(self.db) as connection:
            return list(await connection.fetch(sql.TOP_TENANTS, limit))

    async def processed_last_day(self) -> dict[str, int]:
        """Per provider: events processed in the last 24 hours (a day of rows: the overview's, not a scrape's)."""
        async with driver_connection(self.db) as connection:
            return {row["provider"]: int(row["n"]) for row in await connection.fetch(sql.PROCESSED_LAST_DAY)}

    async def counts(self) -> dict[str, dict[str, int]]:
        """Per provider: events pending, failed, set aside, and processed in the last 24 hours."""
        counts = await self.unprocessed_counts()
        for provider, processed in (await self.processed_last_day()).items():
            counts.setdefault(provider, dict.fromkeys(_UNPROCESSED, 0))["processed_24h"] = processed
        return counts
